"""Probe lifecycle_orphans: leave children behind that try to outlive the payload.

Three children each append a wall-clock stamp to their own tick file in
``<workspace>/<targets["dir"]>`` every targets["interval_s"]:
  background   a plain child in the payload's process group
  setsid       a child in a new session (out of the payload's process group)
  daemon       a double-forked, setsid daemon re-parented away from the payload (POSIX only)
Each child's argv carries targets["marker"] and the nonce, so the host can find and kill it,
and each stops by itself after targets["lifetime_s"]: a probe must never leave an immortal
process behind, even when the host's cleanup cannot run.
Each child starts with a clean environment (PATH only), as hostile code would (`env -i`): it
must not carry a run tag by which a wrapper's or the harness's sweep would find and kill it,
so that what the host sees afterwards is what the sandbox did, not the harness's cleanup.
Once every child has ticked targets["min_ticks"] times (the control: the ticks were written
while the payload ran), the payload writes its own exit stamp to ``payload-exit`` in the same
dir and exits at once. Whether the children outlived it is the host's call: it watches the tick
files and the process table after the run.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import subprocess
import sys
import time

PROBE = "lifecycle_orphans"
START_MARKER = "SANDBOX-ATTEST-START"

CHILD = (
    "import sys, time\n"
    "path, lifetime, interval = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])\n"
    "end = time.time() + lifetime\n"
    "while time.time() < end:\n"
    "    with open(path, 'a') as fh:\n"
    "        fh.write('%.3f\\n' % time.time())\n"
    "    time.sleep(interval)\n"
)


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def child_argv(path, targets, nonce):
    return [sys.executable, "-c", CHILD, path, str(targets["lifetime_s"]),
            str(targets["interval_s"]), targets["marker"], nonce]


def clean_env():
    # Nothing inherited but PATH: no run tag, no variable a sweep could find the child by.
    return {"PATH": os.environ.get("PATH") or os.defpath}


def quiet():
    # The children must not hold the payload's stdout/stderr: the runner reads those pipes to
    # the end, and a held pipe would make the host wait for the child instead of judging it.
    return {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
            "stderr": subprocess.DEVNULL, "close_fds": True, "env": clean_env()}


def spawn_background(argv, cwd):
    return subprocess.Popen(argv, cwd=cwd, **quiet()).pid


def spawn_setsid(argv, cwd):
    if os.name == "nt":  # pragma: no cover - Windows: the nearest thing to a new session
        flags = subprocess.CREATE_NEW_PROCESS_GROUP | getattr(subprocess, "DETACHED_PROCESS", 8)
        return subprocess.Popen(argv, cwd=cwd, creationflags=flags, **quiet()).pid
    return subprocess.Popen(argv, cwd=cwd, start_new_session=True, **quiet()).pid


def spawn_daemon(argv, cwd):
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            os.close(read_end)
            os.setsid()
            second = os.fork()
            if second == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.chdir(cwd)
                os.closerange(3, 1024)
                os.execve(argv[0], argv, clean_env())
            os.write(write_end, str(second).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(first, 0)
    with os.fdopen(read_end) as fh:
        pid = fh.read()
    if not pid:
        raise OSError(errno.ECHILD, "the daemon's first fork reported no grandchild")
    return int(pid)


def ticks(path):
    try:
        with open(path) as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    workspace = task["workspace"]
    here = os.path.join(workspace, targets["dir"])
    os.makedirs(here)
    kinds = [("background", spawn_background), ("setsid", spawn_setsid)]
    if hasattr(os, "fork") and hasattr(os, "setsid"):
        kinds.append(("daemon", spawn_daemon))
    spawned = {}
    for kind, spawn in kinds:
        path = os.path.join(here, kind + ".ticks")
        try:
            pid = spawn(child_argv(path, targets, nonce), workspace)
        except OSError as exc:
            out["attempts"].append(attempt(kind, "escape", "refused", errno_name(exc), None,
                                           repr(exc)))
        except Exception as exc:
            out["attempts"].append(attempt(kind, "escape", "error", None, None, repr(exc)))
        else:
            spawned[kind] = (pid, path)
    deadline = time.time() + float(targets.get("wait_s", 5))
    want = int(targets["min_ticks"])
    while time.time() < deadline and any(ticks(p) < want for _, p in spawned.values()):
        time.sleep(0.05)
    counts = {kind: ticks(path) for kind, (_, path) in spawned.items()}
    for kind, (pid, _) in sorted(spawned.items()):
        ok = counts[kind] >= want
        out["attempts"].append(attempt(
            kind, "escape", "succeeded" if ok else "error", None, None,
            "pid %d ticked %d times while the payload ran" % (pid, counts[kind])))
    out["facts"]["ticks_at_exit"] = counts
    ticking = bool(spawned) and all(n >= want for n in counts.values())
    out["attempts"].append(attempt(
        "ticks-while-running", "control", "succeeded" if ticking else "error", None, None,
        "tick counts %s (want >= %d each)" % (counts, want)))
    stamp = time.time()
    with open(os.path.join(here, "payload-exit"), "w") as fh:
        fh.write("%.3f\n" % stamp)
    out["facts"]["payload_exit"] = stamp


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
