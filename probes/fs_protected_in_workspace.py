"""Probe fs_protected_in_workspace: write the files inside the workspace that run code later.

A writable workspace usually holds a git checkout and sometimes a home-like layout; writing its
`.git/hooks/*`, `.git/config` or a shell rc file plants code that runs *outside* the sandbox
the next time a human (or the harness) runs git or a shell there. targets["paths"] maps a key
to a path relative to the workspace; the host planted `.git/config`, `.git/hooks/` and
`.bashrc` before the run. Escape attempts, each re-read to confirm:
  git-hook     create an executable hook carrying the nonce
  git-config   append a `[core] hooksPath` line carrying the nonce
  bashrc       append a line carrying the nonce
Control: create targets["control"] (an ordinary sibling file) in the workspace.
Whether these writes must fail is the declared policy's business, not the probe's: it only
reports what happened; the host reads the files afterwards.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import stat
import sys

PROBE = "fs_protected_in_workspace"
START_MARKER = "SANDBOX-ATTEST-START"


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def read(path):
    with open(path) as fh:
        return fh.read()


def op_hook(path, nonce):
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\n# sandbox-attest " + nonce + "\nexit 0\n")
    os.chmod(path, 0o755)
    return nonce in read(path) and bool(os.stat(path).st_mode & stat.S_IXUSR)


def op_append(line):
    def op(path, nonce):
        with open(path, "a") as fh:
            fh.write(line % nonce)
        return nonce in read(path)
    return op


OPS = {
    "git-hook": op_hook,
    "git-config": op_append("[core]\n\thooksPath = .git/hooks-%s\n"),
    "bashrc": op_append("# sandbox-attest %s\n"),
}


def try_one(what, role, op, path, nonce):
    try:
        confirmed = op(path, nonce)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, repr(exc))
    except Exception as exc:
        return attempt(what, role, "error", None, None, repr(exc))
    detail = "re-read confirms it" if confirmed else "done, but the re-read differs"
    return attempt(what, role, "succeeded", None, None, detail)


def run(task, out):
    nonce = task["nonce"]
    workspace = task["workspace"]
    targets = task["targets"]
    control = os.path.join(workspace, targets["control"])
    out["attempts"].append(try_one("workspace-file", "control", op_append("%s\n"), control, nonce))
    for key, rel in sorted(targets["paths"].items()):
        op = OPS.get(key, op_append("# sandbox-attest %s\n"))
        out["attempts"].append(try_one(key, "escape", op, os.path.join(workspace, rel), nonce))


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
