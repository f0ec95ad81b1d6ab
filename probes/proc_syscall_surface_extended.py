"""Probe proc_syscall_surface_extended: more kernel doors than proc_syscall_surface tries.

Each call is made with arguments the kernel rejects on purpose, so even where it is allowed
nothing is created, loaded or injected:
  add_key(NULL, ...)                     unfiltered: EFAULT (the type is read first; no key)
  request_key(NULL, ...)                 unfiltered: EFAULT (no key is searched or made)
  userfaultfd(USER_MODE_ONLY | bad bit)  unfiltered: EINVAL (no userfaultfd is made)
  perf_event_open(NULL, 0, -1, -1, 0)    unfiltered: EFAULT (no event is opened)
  ioctl(-1, TIOCLINUX, NULL)             unfiltered: EBADF (no console is touched)
  socketcall(SYS_SOCKET, [AF_NETLINK, SOCK_RAW, 0]) through int 0x80 (x86_64 only): the
      32-bit compat entry, whose arguments sit behind a pointer a seccomp filter cannot read;
      a filter that refuses netlink on the 64-bit socket() is bypassed there unless it refuses
      the compat ABI as a whole. Unfiltered: a netlink socket, made in a child process that
      exits at once (nothing is sent or bound). Made in a child because a kernel without
      IA32 emulation answers int 0x80 with SIGSEGV. The 17-byte trampoline lives in
      writable+executable memory, or, where a sandbox refuses that, in a memfd mapped
      read+exec.
A seccomp filter answers at syscall entry, before any argument is read: EPERM or ENOSYS. So
"succeeded" means "the call reached the kernel's handler" and "refused" means EPERM/EACCES/
ENOSYS/EAFNOSUPPORT. The host runs this same file unsandboxed as its baseline.

One more attempt is recorded but not judged (role "observation"): memfd_create + execveat of a
copy of /bin/true, a real exec of a harmless program that exists on no filesystem. Where a
sandbox lets the payload exec files it writes (every backend here does), fileless exec gains
it nothing; the reading is there for a sandbox that claims it runs only files it ships.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import ctypes
import errno
import json
import os
import platform
import select
import sys
import time

PROBE = "proc_syscall_surface_extended"
START_MARKER = "SANDBOX-ATTEST-START"
NUMBERS = {
    "x86_64": {"getpid": 39, "ioctl": 16, "add_key": 248, "request_key": 249,
               "userfaultfd": 323, "perf_event_open": 298, "memfd_create": 319,
               "execveat": 322},
    "aarch64": {"getpid": 172, "ioctl": 29, "add_key": 217, "request_key": 218,
                "userfaultfd": 282, "perf_event_open": 241, "memfd_create": 279,
                "execveat": 281},
}
TIOCLINUX = 0x541C
UFFD_USER_MODE_ONLY = 1
UFFD_BAD_FLAG = 2  # neither O_CLOEXEC, O_NONBLOCK nor USER_MODE_ONLY: EINVAL once reached
AT_EMPTY_PATH = 0x1000
MFD_CLOEXEC = 1
AF_NETLINK, SOCK_RAW = 16, 3
I386_SOCKETCALL, SYS_SOCKET = 102, 1
# push rbx; mov ebx, edi; mov ecx, esi; mov eax, 102; int 0x80; movsxd rax, eax; pop rbx; ret
# (a long f(int call, int args32)): the i386 socketcall with a 32-bit pointer to its arguments.
TRAMPOLINE = bytes([0x53, 0x89, 0xFB, 0x89, 0xF1, 0xB8, I386_SOCKETCALL, 0, 0, 0, 0xCD, 0x80,
                    0x48, 0x63, 0xC0, 0x5B, 0xC3])
CHILD_WAIT_S = 2.0
SIGSEGV, SIGSYS = 11, 31
REACHED = {"EBADF", "EFAULT", "EINVAL", "EOPNOTSUPP", "ENOTTY", "ENOKEY", "EIO", "E2BIG",
           "ENOTSUP", "ENOENT"}
REFUSED = {"EPERM", "EACCES", "ENOSYS", "EAFNOSUPPORT", "EPROTONOSUPPORT"}


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def classify(what, err, detail, role="escape"):
    if err is None:
        return attempt(what, role, "succeeded", None, None, detail)
    if err in REACHED:
        return attempt(what, role, "succeeded", err, None, "handler reached: " + detail)
    if err in REFUSED:
        return attempt(what, role, "refused", err, None, detail)
    return attempt(what, role, "error", err, None, detail)


def raw(libc, nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    code = ctypes.get_errno()
    return result, (errno.errorcode.get(code, str(code)) if result < 0 else None)


def in_child(body):
    """Run body() in a forked child; returns (what it wrote, how the child ended).

    The child writes one line to a pipe and _exits; a child that hangs is killed after
    CHILD_WAIT_S, so no attempt can outlive the probe.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            line = body()
        except BaseException as exc:  # the child must never return into the parent's code
            line = "crash " + repr(exc)
        try:
            os.write(write_end, (line + "\n").encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    ready, _, _ = select.select([read_end], [], [], CHILD_WAIT_S)
    if ready:
        data = os.read(read_end, 4096)
    os.close(read_end)
    # EOF also comes when the child execs (the pipe is close-on-exec): give the program it
    # became the rest of the bound to exit before it is killed.
    deadline = time.monotonic() + CHILD_WAIT_S
    done, status = os.waitpid(pid, os.WNOHANG)
    while done == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
        done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        os.kill(pid, 9)
        done, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return data.decode(errors="replace").strip(), "signal %d" % os.WTERMSIG(status)
    return data.decode(errors="replace").strip(), "exit %d" % os.WEXITSTATUS(status)


def socketcall_i386(libc):
    """The 32-bit socketcall through int 0x80, from a child; an attempt dict."""
    what = "socketcall-i386"
    if platform.machine() != "x86_64":
        return attempt(what, "escape", "unsupported", None, None,
                       "int 0x80 exists only on x86_64; %s has no compat entry a 64-bit "
                       "process can reach" % platform.machine())

    def body():
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        failed = ctypes.c_void_p(-1).value
        # MAP_PRIVATE|MAP_ANONYMOUS|MAP_32BIT, read+write: the argument block below 4 GiB,
        # where the 32-bit pointer socketcall takes can name it.
        data = libc.mmap(None, 4096, 3, 0x02 | 0x20 | 0x40, -1, 0)
        if data in (None, failed):
            return "mmap-failed data %d" % ctypes.get_errno()
        args = (ctypes.c_uint32 * 3).from_address(data)
        args[0], args[1], args[2] = AF_NETLINK, SOCK_RAW, 0
        code = libc.mmap(None, 4096, 7, 0x02 | 0x20, -1, 0)  # read+write+exec, anonymous
        if code not in (None, failed):
            ctypes.memmove(code, TRAMPOLINE, len(TRAMPOLINE))
        else:
            # A sandbox that refuses writable+executable memory (MemoryDenyWriteExecute)
            # still maps files executable: the trampoline goes into a memfd, mapped read+exec.
            fd, err = raw(libc, NUMBERS["x86_64"]["memfd_create"],
                          ctypes.addressof(ctypes.create_string_buffer(b"trampoline")), 0)
            if fd < 0:
                return "no-exec-memory memfd_create %s" % err
            os.write(fd, TRAMPOLINE)
            code = libc.mmap(None, 4096, 5, 0x01, fd, 0)  # read+exec, MAP_SHARED
            if code in (None, failed):
                return "no-exec-memory mmap %d" % ctypes.get_errno()
        call = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_int, ctypes.c_int)(code)
        return "result %d" % call(SYS_SOCKET, data)

    line, ended = in_child(body)
    detail = "%s (%s)" % (line or "no answer", ended)
    if ended == "signal %d" % SIGSYS:
        # A seccomp filter whose bad-arch action kills (libseccomp's default, so docker's):
        # the compat entry was refused before socketcall ran.
        return attempt(what, "escape", "refused", "SIGSYS", None, detail)
    if not line.startswith("result "):
        # SIGSEGV: the kernel has no IA32 emulation (ia32_emulation=0), so no compat entry
        # exists to reach; the host baseline shows the same, and the attempt is not judged.
        return attempt(what, "escape",
                       "unsupported" if ended == "signal %d" % SIGSEGV else "error",
                       None, None, detail)
    result = int(line.split()[1])
    if result >= 0:
        return attempt(what, "escape", "succeeded", None, None,
                       "netlink socket %d made through the compat entry: %s" % (result, detail))
    return classify(what, errno.errorcode.get(-result, str(-result)), detail)


def memfd_execveat(libc, numbers):
    """Copy /bin/true into a memfd and execveat it in a child; an observation attempt."""
    what = "memfd-execveat"
    fd, err = raw(libc, numbers["memfd_create"], ctypes.addressof(ctypes.create_string_buffer(
        b"kiln")), MFD_CLOEXEC)
    if fd < 0:
        return classify(what, err, "memfd_create -> %s" % err, "observation")
    try:
        with open("/bin/true", "rb") as src:
            os.write(fd, src.read())
    except OSError as exc:
        os.close(fd)
        return attempt(what, "observation", "error", errno_name(exc), None,
                       "copy /bin/true: %r" % exc)
    empty = ctypes.create_string_buffer(b"")
    argv = (ctypes.c_char_p * 2)(b"true", None)
    envp = (ctypes.c_char_p * 1)(None)

    def body():
        # Only returns when the exec failed: then its errno is the answer.
        _, code = raw(libc, numbers["execveat"], fd, ctypes.addressof(empty),
                      ctypes.addressof(argv), ctypes.addressof(envp), AT_EMPTY_PATH)
        return "execveat %s" % code

    line, ended = in_child(body)
    os.close(fd)
    if not line and ended == "exit 0":
        return attempt(what, "observation", "succeeded", None, None,
                       "a copy of /bin/true ran from a memfd (exit 0)")
    code = line.split()[1] if line.startswith("execveat ") else None
    return classify(what, code, "%s (%s)" % (line or "no answer", ended), "observation") \
        if code else attempt(what, "observation", "error", None, None, "%s (%s)" % (line, ended))


def run(task, out):
    del task
    facts = out["facts"]
    machine = platform.machine()
    facts["machine"] = machine
    try:
        with open("/proc/self/status") as fh:
            facts["seccomp"] = [line.split(":", 1)[1].strip() for line in fh
                                if line.startswith("Seccomp:")][0]
    except (OSError, IndexError):
        facts["seccomp"] = None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    numbers = NUMBERS.get(machine)
    if numbers is None:
        out["attempts"].append(attempt("syscalls", "escape", "error", None, None,
                                       "no syscall table for machine %r" % machine))
        return
    # Control: an ordinary syscall works, so a refusal below is about the call, not the probe.
    result, err = raw(libc, numbers["getpid"])
    ok = result == os.getpid()
    out["attempts"].append(attempt("getpid", "control", "succeeded" if ok else "error", err,
                                   None, "raw getpid() = %d" % result))
    calls = (
        ("add_key", (0, 0, 0, 0, 0)),
        ("request_key", (0, 0, 0, 0)),
        ("userfaultfd", (UFFD_USER_MODE_ONLY | UFFD_BAD_FLAG,)),
        ("perf_event_open", (0, 0, -1, -1, 0)),
        ("ioctl-tioclinux", (-1, TIOCLINUX, 0)),
    )
    for what, args in calls:
        nr = numbers[what.split("-")[0]]
        result, err = raw(libc, nr, *args)
        if result >= 0:
            os.close(result)  # cannot happen with these arguments; never leak an fd if it does
        out["attempts"].append(classify(what, err, "syscall %d -> %d %s"
                                        % (nr, result, err or "")))
    out["attempts"].append(socketcall_i386(libc))
    out["attempts"].append(memfd_execveat(libc, numbers))


def main(argv):
    task, nonce = {}, ""
    try:
        with open(argv[1]) as fh:
            task = json.load(fh)
        nonce = str(task.get("nonce", ""))
    except Exception as exc:
        task = {"_error": repr(exc)}
    print(START_MARKER + " " + nonce, flush=True)
    out = {"probe": PROBE, "nonce": nonce, "attempts": [], "facts": {}}
    try:
        if "_error" in task:
            raise RuntimeError("cannot read the task: " + task["_error"])
        run(task, out)
    except Exception as exc:
        out["attempts"].append(attempt("probe", "escape", "error", errno_name(exc), None, repr(exc)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
