"""Probe fs_machinery_overwrite: overwrite the sandbox's own helper, config or allowlist.

The class of the runc ``/proc/self/exe`` overwrite (CVE-2019-5736): a sandbox whose helper
binary, configuration or proxy allowlist the payload can write is a sandbox the payload
re-configures for the next run.

Escape attempts (each an open for write; where it opens, a marker line is appended, never a
truncation):
- ``exe:self`` and ``exe:<pid>`` for every ancestor whose ``/proc/<pid>/exe`` is visible:
  opened ``O_WRONLY`` and closed at once, nothing is ever written to an executable the
  payload did not get from the harness;
- ``write:<key>`` for every file the host names in targets["files"]: the harness's copy of a
  helper binary, a sandbox config and a proxy allowlist, planted outside the workspace where
  the payload user may write them unconfined;
- ``input:<name>`` for every file beside the task (the staged launcher, program and task) and
  ``write:shim`` for the egress shim copy, where the backend put one inside.

In-sandbox control ``control:workspace``: the same append to the harness's copy of the helper
in the workspace, which the host must then see changed.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import sys

PROBE = "fs_machinery_overwrite"
START_MARKER = "SANDBOX-ATTEST-START"
MAX_ANCESTORS = 16


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def open_exe(what, path):
    """Open an executable for write and close it: the open is the escape, no byte is written."""
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, "%s: %r" % (path, exc))
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    found = attempt(what, "escape", "succeeded", None, None, "%s (%s) opened for write"
                    % (path, target))
    # The host compares these with its own file at `target`: the host's very binary, opened
    # for write from inside, is the runc class's escape even though no byte was written.
    found["identity"] = [st.st_dev, st.st_ino]
    found["target"] = target
    return found


def append(what, role, path, marker):
    """Append the marker line to `path` (never truncating): the host's hash sees it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, "%s: %r" % (path, exc))
    try:
        os.write(fd, ("\n# %s\n" % marker).encode())
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None,
                       "%s opened, write refused: %r" % (path, exc))
    finally:
        os.close(fd)
    return attempt(what, role, "succeeded", None, None, "%s appended" % path)


def ancestors():
    """The pids above this process that /proc shows, nearest first."""
    found, pid = [], os.getpid()
    for _ in range(MAX_ANCESTORS):
        try:
            with open("/proc/%d/status" % pid) as fh:
                ppid = next(int(ln.split()[1]) for ln in fh if ln.startswith("PPid:"))
        except (OSError, StopIteration, ValueError, IndexError):
            break
        if ppid <= 0:
            break
        found.append(ppid)
        pid = ppid
    return found


def run(task, out, task_path):
    targets = task["targets"]
    # Built here, never sent: the host scans the staged task too, which must not hold it.
    marker = "overwritten-by-" + task["nonce"]
    try:
        out["facts"]["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError as exc:
        out["facts"]["mntns"] = None
        out["facts"]["mntns_error"] = errno_name(exc)
    out["attempts"].append(append("control:workspace", "control", targets["control"], marker))
    out["attempts"].append(open_exe("exe:self", "/proc/self/exe"))
    seen = ancestors()
    out["facts"]["ancestors"] = seen
    for pid in seen:
        out["attempts"].append(open_exe("exe:%d" % pid, "/proc/%d/exe" % pid))
    for key, path in sorted(targets["files"].items()):
        out["attempts"].append(append("write:" + key, "escape", path, marker))
    if targets.get("shim"):
        out["attempts"].append(append("write:shim", "escape", targets["shim"], marker))
    inputs = os.path.dirname(os.path.abspath(task_path))
    try:
        names = sorted(os.listdir(inputs))
    except OSError as exc:
        names = []
        out["facts"]["inputs_error"] = errno_name(exc)
    for name in names:
        path = os.path.join(inputs, name)
        if os.path.isfile(path):
            out["attempts"].append(append("input:" + name, "escape", path, marker))


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
        run(task, out, argv[1])
    except Exception as exc:
        out["attempts"].append(attempt("probe", "escape", "error", errno_name(exc), None,
                                       repr(exc)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
