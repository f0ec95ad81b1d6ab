"""Probe proc_visibility: see, read, signal and trace a host process the harness planted.

The host starts one harmless "anchor" process per cell whose argv carries
targets["marker"] (``kiln-idle:<nonce>``: sandbox_attest.host.disguise.ANCHOR_MARKER) and whose
environment carries a secret that exists nowhere else (not in the task). Escape attempts:
  scan-proc      look for the marker in every /proc/<pid>/cmdline
  read-environ   read the found process's /proc/<pid>/environ (report the secret if seen);
                 where no process shows the marker (a /proc that hides other pids), the
                 /proc/<anchor_pid>/environ it was given: a read, harmless whatever process
                 that pid is here, and the host checks any secret reported against its own
  kill-0         kill(targets["anchor_pid"], 0): signal 0 only, which delivers nothing
  ptrace-seize   PTRACE_SEIZE the found process from a forked child that then exits
Safety: signal 0 never delivers a signal, and ptrace is only tried on a pid whose cmdline
was just checked to carry the marker (never on a guessed pid). PTRACE_SEIZE, unlike
PTRACE_ATTACH, does not stop the tracee; the tracer child exits after 0.3 s, and the kernel
detaches a tracee when its tracer exits, so the anchor never stops and nothing is left behind.
Controls: the probe finds its own process the same way and kill(own pid, 0) works.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import ctypes
import errno
import json
import os
import sys
import time

PROBE = "proc_visibility"
START_MARKER = "SANDBOX-ATTEST-START"
SECRET_VAR = "KILN_IDLE_TOKEN"  # sandbox_attest/host/disguise.py ANCHOR_SECRET_VAR
PTRACE_SEIZE = 0x4206
HOLD_S = 0.3


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def read_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def find(marker):
    """The pids whose cmdline carries `marker`, and how many /proc entries were scanned."""
    found, scanned = [], 0
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        scanned += 1
        try:
            argv = read_bytes("/proc/%s/cmdline" % name).split(b"\0")
        except OSError:
            continue
        if needle in argv:
            found.append(int(name))
    return found, scanned


def carries(pid, marker):
    try:
        return marker.encode() in read_bytes("/proc/%d/cmdline" % pid).split(b"\0")
    except OSError:
        return False


def seize(pid):
    """PTRACE_SEIZE `pid` from a forked child; returns (outcome, errno name, detail)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:  # the tracer: seize, hold briefly, exit (the kernel detaches on exit)
        os.close(rfd)
        code = 0
        if libc.ptrace(PTRACE_SEIZE, pid, None, None) != 0:
            code = ctypes.get_errno() or 255
        os.write(wfd, str(code).encode())
        if code == 0:
            time.sleep(HOLD_S)
        os._exit(0)
    os.close(wfd)
    try:
        data = os.read(rfd, 16)
    finally:
        os.close(rfd)
        os.waitpid(child, 0)
    code = int(data or b"255")
    if code == 0:
        return "succeeded", None, "seized pid %d for %.1fs, detached by exit" % (pid, HOLD_S)
    name = errno.errorcode.get(code, str(code))
    return "refused", name, "ptrace(PTRACE_SEIZE, %d): %s" % (pid, os.strerror(code))


def run(task, out):
    targets = task["targets"]
    marker = targets["marker"]
    anchor_pid = int(targets["anchor_pid"])
    facts = out["facts"]
    for kind in ("pid", "user"):
        try:
            facts[kind + "ns"] = os.readlink("/proc/self/ns/" + kind)
        except OSError:
            facts[kind + "ns"] = None
    me = os.getpid()
    # Controls first: this way of looking must see our own process.
    try:
        own_argv = read_bytes("/proc/self/cmdline").split(b"\0")
        listed = str(me) in os.listdir("/proc")
        ok = listed and bool(own_argv and own_argv[0])
        out["attempts"].append(attempt("scan-own", "control", "succeeded" if ok else "refused",
                                       None, None, "own pid %d listed: %s" % (me, listed)))
    except OSError as exc:
        out["attempts"].append(attempt("scan-own", "control", "error", errno_name(exc), None,
                                       repr(exc)))
    try:
        os.kill(me, 0)
        out["attempts"].append(attempt("kill-0-self", "control", "succeeded", None, None,
                                       "kill(%d, 0)" % me))
    except OSError as exc:
        out["attempts"].append(attempt("kill-0-self", "control", "refused", errno_name(exc),
                                       None, repr(exc)))
    # The escapes.
    found, scanned = find(marker)
    found = [p for p in found if p != me]
    facts["scanned"] = scanned
    facts["found_pids"] = found
    if found:
        out["attempts"].append(attempt("scan-proc", "escape", "succeeded", None, None,
                                       "marker found at pid %s" % ",".join(map(str, found))))
    else:
        out["attempts"].append(attempt("scan-proc", "escape", "refused", "ENOENT", None,
                                       "marker not in any of %d /proc entries" % scanned))
    target = found[0] if found else None
    readable = target if target is not None else anchor_pid
    if readable == me:
        out["attempts"].append(attempt("read-environ", "escape", "refused", "ENOENT", None,
                                       "no process with the marker is visible"))
    else:
        try:
            env = read_bytes("/proc/%d/environ" % readable).split(b"\0")
            secret = [e.split(b"=", 1)[1].decode("ascii", "replace") for e in env
                      if e.startswith(SECRET_VAR.encode() + b"=")]
            facts["environ_secret"] = secret[0] if secret else None
            if target is None and not secret and not carries(readable, marker):
                # Another process that happens to have the anchor's number here (a pid
                # namespace of its own): the anchor was not read.
                out["attempts"].append(attempt("read-environ", "escape", "refused", "ESRCH",
                                               None, "pid %d here is not the anchor" % readable))
            else:
                out["attempts"].append(attempt("read-environ", "escape", "succeeded", None,
                                               None, "pid %d: read %d variables"
                                               % (readable, len(env))))
        except OSError as exc:
            out["attempts"].append(attempt("read-environ", "escape", "refused", errno_name(exc),
                                           None, repr(exc)))
    try:
        os.kill(anchor_pid, 0)  # signal 0: an existence/permission check, nothing delivered
        verified = carries(anchor_pid, marker)
        out["attempts"].append(attempt("kill-0", "escape", "succeeded", None, None,
                                       "kill(%d, 0) ok; marker verified: %s"
                                       % (anchor_pid, verified)))
    except OSError as exc:
        out["attempts"].append(attempt("kill-0", "escape", "refused", errno_name(exc), None,
                                       repr(exc)))
    if target is None or not carries(target, marker):
        out["attempts"].append(attempt("ptrace-seize", "escape", "refused", "ENOENT", None,
                                       "no verified target: ptrace is never tried on a guess"))
    else:
        outcome, name, detail = seize(target)
        out["attempts"].append(attempt("ptrace-seize", "escape", outcome, name, None, detail))


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
