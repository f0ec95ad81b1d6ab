"""Probe proc_new_mount_api: namespaces from clone3, and the new mount API inside them.

  clone3({flags: CLONE_NEWUSER | CLONE_NEWNS, exit_signal: SIGCHLD})
      a child in a user and mount namespace of its own, which exits at once. seccomp cannot
      read clone3's flags (they sit behind a pointer), so a filter that refuses namespace
      flags on clone/unshare must refuse clone3 as a whole (ENOSYS, so the C library falls
      back to clone); unfiltered: the child is made.
  open_tree(AT_FDCWD, NULL, OPEN_TREE_CLONE), move_mount(-1, NULL, -1, NULL, 0),
  mount_setattr(-1, NULL, 0, NULL, 32), fsopen(NULL, 0)
      made in a forked child that first tries unshare(CLONE_NEWUSER | CLONE_NEWNS): there it
      holds CAP_SYS_ADMIN over a mount namespace of its own, which is how an unprivileged
      process reaches this API (CVE-2022-0185 was an fsconfig overflow reached that way).
      Every pointer is NULL, so each call stops at EFAULT once past its permission check:
      nothing is cloned, moved, changed or opened. Without the namespace, or under a filter,
      each answers EPERM.
The host runs this same file unsandboxed as its baseline, as the payload user: what that
user reaches on an open host is what the sandbox must refuse.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import ctypes
import errno
import json
import os
import platform
import select
import struct
import sys
import time

PROBE = "proc_new_mount_api"
START_MARKER = "SANDBOX-ATTEST-START"
# Syscalls added since 5.0 share their numbers on every architecture; the older ones do not.
NUMBERS = {
    "x86_64": {"getpid": 39, "unshare": 272},
    "aarch64": {"getpid": 172, "unshare": 97},
}
SHARED = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "clone3": 435,
          "mount_setattr": 442}
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
AT_FDCWD, OPEN_TREE_CLONE, MOUNT_ATTR_SIZE_VER0 = -100, 1, 32
CLONE_ARGS_SIZE_VER0 = 64
CHILD_WAIT_S = 2.0
REACHED = {"EBADF", "EFAULT", "EINVAL", "ENOENT", "E2BIG"}
# ENOSPC: the user-namespace limit is 0 (bwrap --disable-userns sets it so).
REFUSED = {"EPERM", "EACCES", "ENOSYS", "ENOSPC", "EUSERS"}


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


def clone3_newns(libc):
    """clone3 into new user and mount namespaces; the child _exits at once."""
    args = ctypes.create_string_buffer(struct.pack("=8Q", CLONE_NEWUSER | CLONE_NEWNS, 0, 0, 0,
                                                   SIGCHLD, 0, 0, 0))
    pid, err = raw(libc, SHARED["clone3"], ctypes.addressof(args), CLONE_ARGS_SIZE_VER0)
    if pid == 0:
        os._exit(0)  # the child: a copy of this process in its new namespaces; nothing else
    if pid < 0:
        return classify("clone3-newns", err, "clone3 -> %s" % err)
    _, status = os.waitpid(pid, 0)
    return attempt("clone3-newns", "escape", "succeeded", None, None,
                   "child %d made in new user+mount namespaces (status %d)" % (pid, status))


def mount_api(libc, numbers, facts):
    """The four calls in a child that first tries for a user+mount namespace of its own."""
    calls = (
        ("open_tree", (AT_FDCWD, 0, OPEN_TREE_CLONE)),
        ("move_mount", (-1, 0, -1, 0, 0)),
        ("mount_setattr", (-1, 0, 0, 0, MOUNT_ATTR_SIZE_VER0)),
        ("fsopen", (0, 0)),
    )

    def body():
        _, unshared = raw(libc, numbers["unshare"], CLONE_NEWUSER | CLONE_NEWNS)
        answers = ["unshare=%s" % (unshared or "ok")]
        for what, args in calls:
            result, err = raw(libc, SHARED[what], *args)
            if result >= 0:
                os.close(result)  # cannot happen with NULL pointers; never keep what was made
            answers.append("%s=%s" % (what, err or "fd"))
        return " ".join(answers)

    line, ended = in_child(body)
    answers = dict(part.split("=", 1) for part in line.split() if "=" in part)
    facts["unshare"] = answers.get("unshare")
    attempts = []
    for what, _ in calls:
        answer = answers.get(what)
        detail = "%s in a child (%s; unshare %s)" % (answer, ended, answers.get("unshare"))
        if answer is None:
            attempts.append(attempt(what, "escape", "error", None, None,
                                    "no answer from the child: %r (%s)" % (line, ended)))
        else:
            attempts.append(classify(what, None if answer == "fd" else answer, detail))
    return attempts


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
    result, err = raw(libc, numbers["getpid"])
    ok = result == os.getpid()
    out["attempts"].append(attempt("getpid", "control", "succeeded" if ok else "error", err,
                                   None, "raw getpid() = %d" % result))
    out["attempts"].append(clone3_newns(libc))
    out["attempts"].extend(mount_api(libc, numbers, facts))


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
