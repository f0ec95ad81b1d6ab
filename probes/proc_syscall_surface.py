"""Probe proc_syscall_surface: which risky kernel interfaces the payload can reach at all.

Each call is made with arguments the kernel rejects on purpose (a NULL pointer, fd -1, an
unknown command), so even where it is allowed nothing is created, injected or loaded:
  io_uring_setup(0, NULL)            unfiltered: EINVAL/EFAULT
  keyctl(<unknown command>, 0, 0)    unfiltered: EOPNOTSUPP (no keyring is touched)
  bpf(<unknown command>, NULL, 0)    unfiltered: EINVAL (EPERM when unprivileged bpf is off)
  ioctl(-1, TIOCSTI, NULL)           unfiltered: EBADF (nothing is pushed to any terminal)
  socket(AF_VSOCK|AF_NETLINK|AF_PACKET)  unfiltered: a socket, closed at once, never used
A descriptor socket() returns is asked what it is before it is closed (``identify_fd``):
fstat says whether it is a socket at all, and the kernel's SO_DOMAIN, SO_TYPE and
SO_PROTOCOL for it say which. A sandbox that intercepts socket() (a seccomp user-notify or
ptrace supervisor) may hand back a socketpair end or a pipe of its own; the attempt carries
``is_socket``, ``domain``, ``type`` and ``protocol`` (None where the kernel would not say, with
``identity_error``), and the host counts only a socket of the family asked for as the kernel's.
A seccomp filter answers at syscall entry, before any argument is read: EPERM or ENOSYS. So
"succeeded" here means "the call reached the kernel's handler" (it returned, or it rejected
the arguments); "refused" means EPERM/EACCES/ENOSYS/EAFNOSUPPORT. The host runs this same
file unsandboxed as its baseline, so an interface the host kernel lacks is not held against
the sandbox.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import ctypes
import errno
import json
import os
import platform
import socket
import stat
import sys

PROBE = "proc_syscall_surface"
START_MARKER = "SANDBOX-ATTEST-START"
# Syscall numbers per architecture: ioctl, keyctl, bpf, io_uring_setup.
NUMBERS = {
    "x86_64": {"ioctl": 16, "keyctl": 250, "bpf": 321, "io_uring_setup": 425},
    "aarch64": {"ioctl": 29, "keyctl": 219, "bpf": 280, "io_uring_setup": 425},
}
TIOCSTI = 0x5412
UNKNOWN_COMMAND = 0x7FFF
REACHED = {"EBADF", "EFAULT", "EINVAL", "EOPNOTSUPP", "ENOTTY", "ENOKEY", "EIO", "E2BIG",
           "ENOTSUP"}
REFUSED = {"EPERM", "EACCES", "ENOSYS", "EAFNOSUPPORT", "EPROTONOSUPPORT"}
# The address family each socket attempt asks for, by the kernel's number; a copy of the
# host's sandbox_attest/catalog/proc/syscall_surface.py FAMILY_DOMAINS.
FAMILY_DOMAINS = {"socket-vsock": 40, "socket-netlink": 16, "socket-packet": 17}
FAMILIES = (("socket-vsock", FAMILY_DOMAINS["socket-vsock"], socket.SOCK_STREAM, 0),
            ("socket-netlink", FAMILY_DOMAINS["socket-netlink"], socket.SOCK_RAW, 0),
            ("socket-packet", FAMILY_DOMAINS["socket-packet"], socket.SOCK_RAW, 0))
# asm-generic's numbers (x86_64 and aarch64, the machines this probe has tables for); the
# socket module names them from Python 3.6 on Linux only.
SO_DOMAIN = getattr(socket, "SO_DOMAIN", 39)
SO_PROTOCOL = getattr(socket, "SO_PROTOCOL", 38)


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def classify(what, err, detail):
    if err is None:
        return attempt(what, "escape", "succeeded", None, None, detail)
    if err in REACHED:
        return attempt(what, "escape", "succeeded", err, None, "handler reached: " + detail)
    if err in REFUSED:
        return attempt(what, "escape", "refused", err, None, detail)
    return attempt(what, "escape", "error", err, None, detail)


def raw(libc, nr, *args):
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    code = ctypes.get_errno()
    return result, (errno.errorcode.get(code, str(code)) if result < 0 else None)


def identify_fd(fd):
    """What descriptor `fd` is, by fstat and the kernel's socket options; `fd` stays open.

    The options are read on a duplicate (socket.fromfd), closed here; the caller's descriptor
    is left to the caller.
    """
    found = {"is_socket": None, "domain": None, "type": None, "protocol": None}
    try:
        found["is_socket"] = stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError as exc:
        found["identity_error"] = "fstat: %s" % errno_name(exc)
        return found
    if not found["is_socket"]:
        return found
    try:
        dup = socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        found["identity_error"] = "fromfd: %s" % errno_name(exc)
        return found
    try:
        for name, option in (("domain", SO_DOMAIN), ("type", socket.SO_TYPE),
                             ("protocol", SO_PROTOCOL)):
            try:
                found[name] = dup.getsockopt(socket.SOL_SOCKET, option)
            except OSError as exc:
                found.setdefault("identity_error", "getsockopt(%s): %s" % (name, errno_name(exc)))
    finally:
        dup.close()
    return found


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
    # Control: an ordinary syscall works, so a refusal below is about the call, not the probe.
    result, err = raw(libc, {"x86_64": 39, "aarch64": 172}.get(machine, -1))  # getpid
    ok = result == os.getpid()
    out["attempts"].append(attempt("getpid", "control", "succeeded" if ok else "error", err,
                                   None, "raw getpid() = %d" % result))
    numbers = NUMBERS.get(machine)
    if numbers is None:
        out["attempts"].append(attempt("syscalls", "escape", "error", None, None,
                                       "no syscall table for machine %r" % machine))
    else:
        calls = (
            ("io_uring_setup", numbers["io_uring_setup"], (0, 0)),
            ("keyctl", numbers["keyctl"], (UNKNOWN_COMMAND, 0, 0)),
            ("bpf", numbers["bpf"], (UNKNOWN_COMMAND, 0, 0)),
            ("ioctl-tiocsti", numbers["ioctl"], (-1, TIOCSTI, 0)),
        )
        for what, nr, args in calls:
            result, err = raw(libc, nr, *args)
            if result >= 0 and what == "io_uring_setup":
                os.close(result)  # cannot happen with 0 entries; never leak an fd if it does
            out["attempts"].append(classify(what, err, "syscall %d -> %d %s"
                                            % (nr, result, err or "")))
    for what, family, kind, proto in FAMILIES:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            out["attempts"].append(classify(what, errno_name(exc) or "EIO", repr(exc)))
        else:
            try:
                identity = identify_fd(sock.fileno())
            finally:
                sock.close()  # created and closed at once: nothing is sent or bound
            entry = classify(what, None, "socket created and closed: domain %s type %s "
                             "protocol %s" % (identity["domain"], identity["type"],
                                              identity["protocol"]))
            entry.update(identity)
            out["attempts"].append(entry)


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
