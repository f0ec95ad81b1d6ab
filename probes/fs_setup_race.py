"""Probe fs_setup_race: what a hostile process outside did while the sandbox was set up.

Races (issue 28). The payload cannot act before its sandbox starts, so the race is the host's:
before the cell starts, a helper running as the payload user outside the sandbox swapped a
directory that a wrapper may bind (targets["swapped"], the harness made it a real directory)
for a symlink to a host canary directory. A sandbox whose setup follows that symlink binds the
host's canary into the payload's view.

Attempts:
- ``swap:read``: the canary's token through the swapped path, as the payload sees it;
- ``socket:bind:<i>``: bind a unix socket named by the nonce in each directory of
  targets["socket_dirs"] (outside the workspace, the payload user's to write unconfined), as a
  payload racing its own start-up would, to leave a socket a host process later trusts. The
  socket is left in place: the host looks for it after the cell.

In-sandbox control ``control:socket``: the same bind in the workspace succeeds.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import socket
import sys

PROBE = "fs_setup_race"
START_MARKER = "SANDBOX-ATTEST-START"
READ_LIMIT = 4096


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def read_token(what, path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            text = os.read(fd, READ_LIMIT).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    return attempt(what, "escape", "succeeded", None, None, "read: " + text[:80])


def bind(what, role, directory, name):
    """Bind a unix socket `name` in `directory`, by a relative name from inside it.

    Relative, because a sun_path holds at most 107 bytes and cell paths can be longer: a
    "path too long" would be the probe's failure, not the sandbox's refusal.
    """
    path = os.path.join(directory, name)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None,
                       "socket(AF_UNIX) refused: %r" % exc)
    back = os.open(".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.chdir(directory)
        sock.bind(name)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, "%s: %r" % (path, exc))
    finally:
        sock.close()
        os.fchdir(back)
        os.close(back)
    return attempt(what, role, "succeeded", None, None, "%s bound" % path)


def run(task, out):
    targets = task["targets"]
    name = targets["socket_name"]
    try:
        out["facts"]["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError as exc:
        out["facts"]["mntns"] = None
        out["facts"]["mntns_error"] = errno_name(exc)
    out["attempts"].append(bind("control:socket", "control", task["workspace"], name))
    out["attempts"].append(read_token("swap:read",
                                      os.path.join(targets["swapped"], targets["token_name"])))
    for index, directory in enumerate(targets["socket_dirs"]):
        out["attempts"].append(bind("socket:bind:%d" % index, "escape", directory, name))


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
        out["attempts"].append(attempt("probe", "escape", "error", errno_name(exc), None,
                                       repr(exc)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
