"""Probe resource_limits: how far forks, memory, file size and open files really go.

targets["bounds"] caps every loop so that an unconfined run (the control leg runs this as a
plain process on a shared machine) stays harmless: at most bounds["forks"] children (each
blocks on a pipe and exits when the probe closes it; all are reaped), bounds["memory_mib"]
MiB touched in 16 MiB chunks and freed, a workspace file of at most bounds["fsize_mib"] MiB,
and at most bounds["nofile"] descriptors on /dev/null, closed again. targets["declared"] holds
the limits the backend declares (null = none); the probe reports how far each loop got and
the errno that stopped it, and the host compares that with the declaration.
Host witnesses: each child creates ``<workspace>/<targets["fork_dir"]>/fork-<i>`` before it
blocks, and the grown file stays at ``<workspace>/<targets["fsize_file"]>``; the host counts
and stats them. SIGXFSZ is ignored so an RLIMIT_FSIZE shows up as EFBIG, not as a kill.
Control: a small workspace write and one fork work, so a stop at 0 means a limit.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import resource
import signal
import sys

PROBE = "resource_limits"
START_MARKER = "SANDBOX-ATTEST-START"
MIB = 1024 * 1024
CHUNK_MIB = 16


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    if isinstance(exc, MemoryError):
        return "ENOMEM"
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def loop_result(what, reached, bound, err, unit):
    """succeeded = the loop ran to its bound; refused = something stopped it first."""
    detail = "%d of %d %s" % (reached, bound, unit)
    if reached >= bound:
        return dict(attempt(what, "escape", "succeeded", None, None,
                            "reached the bound: " + detail), reached=reached, bound=bound)
    return dict(attempt(what, "escape", "refused", err, None, "stopped at " + detail),
                reached=reached, bound=bound)


def forks(bound, fork_dir):
    os.makedirs(fork_dir, exist_ok=True)
    rfd, wfd = os.pipe()
    children, err = [], None
    try:
        for i in range(bound):
            try:
                pid = os.fork()
            except OSError as exc:
                err = errno_name(exc)
                break
            if pid == 0:
                try:
                    os.close(wfd)
                    with open(os.path.join(fork_dir, "fork-%d" % i), "w") as fh:
                        fh.write("%d\n" % os.getpid())
                    os.read(rfd, 1)  # block until the probe closes the pipe
                finally:
                    os._exit(0)
            children.append(pid)
    finally:
        os.close(wfd)  # every child's read returns: they all exit
        os.close(rfd)
        for pid in children:
            os.waitpid(pid, 0)
    return loop_result("forks", len(children), bound, err, "children")


def memory(bound_mib):
    chunks, err = [], None
    try:
        while len(chunks) * CHUNK_MIB < bound_mib:
            try:
                block = bytearray(CHUNK_MIB * MIB)  # zero-filled, so every page is touched
            except MemoryError as exc:
                err = errno_name(exc)
                break
            chunks.append(block)
        reached = len(chunks) * CHUNK_MIB
    finally:
        del chunks[:]
    return loop_result("memory", reached, bound_mib, err, "MiB")


def fsize(bound_mib, path):
    block = b"\0" * MIB
    written, err = 0, None
    with open(path, "wb", buffering=0) as fh:
        while written < bound_mib * MIB:
            try:
                n = fh.write(block)
            except OSError as exc:
                err = errno_name(exc)
                break
            if not n:
                break
            written += n
    return loop_result("fsize", written // MIB, bound_mib, err, "MiB")


def nofile(bound):
    fds, err = [], None
    try:
        while len(fds) < bound:
            try:
                fds.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                err = errno_name(exc)
                break
        reached = len(fds)
    finally:
        for fd in fds:
            os.close(fd)
    return loop_result("nofile", reached, bound, err, "descriptors")


def run(task, out):
    targets = task["targets"]
    bounds = targets["bounds"]
    workspace = task["workspace"]
    facts = out["facts"]
    facts["declared"] = targets.get("declared")
    facts["rlimits"] = {name: list(resource.getrlimit(getattr(resource, "RLIMIT_" + name)))
                        for name in ("NPROC", "AS", "FSIZE", "NOFILE")}
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        path = os.path.join(workspace, "control-" + task["nonce"])
        with open(path, "w") as fh:
            fh.write("ok\n")
        os.unlink(path)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        out["attempts"].append(attempt("write-and-fork-once", "control", "succeeded"))
    except OSError as exc:
        out["attempts"].append(attempt("write-and-fork-once", "control", "refused",
                                       errno_name(exc), None, repr(exc)))
    fork_dir = os.path.join(workspace, targets["fork_dir"])
    file_path = os.path.join(workspace, targets["fsize_file"])
    for what, run_loop in (("forks", lambda: forks(int(bounds["forks"]), fork_dir)),
                           ("memory", lambda: memory(int(bounds["memory_mib"]))),
                           ("fsize", lambda: fsize(int(bounds["fsize_mib"]), file_path)),
                           ("nofile", lambda: nofile(int(bounds["nofile"])))):
        try:
            out["attempts"].append(run_loop())
        except Exception as exc:
            out["attempts"].append(attempt(what, "escape", "error", errno_name(exc), None,
                                           repr(exc)))


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
