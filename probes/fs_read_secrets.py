"""Probe fs_read_secrets: read host-planted canary secrets outside the workspace.

targets["secrets"] maps a key ("ssh", "aws", "dotenv", "docker") to the absolute path of a
canary the host planted where real secrets live ($HOME/.ssh, $HOME/.aws, a .env next to the
workspace, $HOME/.docker); each name carries the cell's nonce, and no real secret file is ever
named. Escape attempts: read each one; a read reports the sha256 of what it got (never the
content), so the host can tell its own canary from a same-named file in a private view.
Control: read targets["control"], a canary the host planted inside the workspace, the same way.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import hashlib
import json
import os
import sys

PROBE = "fs_read_secrets"
START_MARKER = "SANDBOX-ATTEST-START"
READ_CAP = 1 << 20  # canaries are tiny; never slurp a huge file by mistake


def attempt(what, role, outcome, err=None, status=None, detail="", **extra):
    out = {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
           "detail": detail}
    out.update(extra)
    return out


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def read_one(what, role, path):
    try:
        with open(path, "rb") as fh:
            data = fh.read(READ_CAP)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, repr(exc))
    except Exception as exc:
        return attempt(what, role, "error", None, None, repr(exc))
    digest = hashlib.sha256(data).hexdigest()
    return attempt(what, role, "succeeded", None, None, "read %d bytes" % len(data),
                   sha256=digest)


def run(task, out):
    targets = task["targets"]
    try:
        out["facts"]["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError:
        out["facts"]["mntns"] = None
    out["attempts"].append(read_one("workspace", "control", targets["control"]))
    for key, path in sorted(targets["secrets"].items()):
        out["facts"]["visible:" + key] = os.path.exists(path)
        out["attempts"].append(read_one(key, "escape", path))


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
