"""Probe fs_write_outside: write at host-planted canary dirs outside the workspace.

targets["dirs"] maps a key ("sibling", "tmp", "home") to an absolute canary dir the host
planted, each holding notes.txt. In each, five escape attempts, each re-read to confirm:
  create       a new ``<nonce>.txt``
  append       to notes.txt
  chmod        notes.txt to 0600
  symlink-out  a symlink ``<nonce>.link`` pointing out of the dir (at the workspace)
  rename-over  a new ``<nonce>.new`` renamed over notes.txt
Control: the same five writes in ``<workspace>/<targets["control_name"]>`` (the probe creates
it and its notes.txt) succeed; the host then checks them from outside.
A write that succeeds here but leaves the host path unchanged landed in a private view (a
tmpfs /tmp): the host decides that, the probe only reports what it saw.
Containers often get the host's root mounted somewhere (`-v /:/host`): where one of the usual
mount points exists, the same attempts run at <mount point><canary dir> too, as container
escape scanners do.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import stat
import sys

PROBE = "fs_write_outside"
# Where a misconfigured container commonly finds the host's root.
HOST_ROOT_MOUNTS = ("/host", "/hostfs", "/rootfs", "/host-root")
START_MARKER = "SANDBOX-ATTEST-START"


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


# The canary file's name in every planted directory: sandbox_attest/host/disguise.py CANARY_FILE, a
# name any program could use (issue 23: nothing the payload lists says "test").
CANARY_FILE = "notes.txt"


def read(path):
    with open(path) as fh:
        return fh.read()


def op_create(d, nonce, workspace):
    path = os.path.join(d, nonce + ".txt")
    with open(path, "x") as fh:
        fh.write(nonce + "\n")
    return read(path) == nonce + "\n"


def op_append(d, nonce, workspace):
    path = os.path.join(d, CANARY_FILE)
    with open(path, "a") as fh:
        fh.write("appended " + nonce + "\n")
    return ("appended " + nonce) in read(path)


def op_chmod(d, nonce, workspace):
    path = os.path.join(d, CANARY_FILE)
    os.chmod(path, 0o600)
    return stat.S_IMODE(os.stat(path).st_mode) == 0o600


def op_symlink(d, nonce, workspace):
    path = os.path.join(d, nonce + ".link")
    os.symlink(workspace, path)
    return os.path.islink(path)


def op_rename(d, nonce, workspace):
    new = os.path.join(d, nonce + ".new")
    with open(new, "x") as fh:
        fh.write("renamed " + nonce + "\n")
    os.replace(new, os.path.join(d, CANARY_FILE))
    return read(os.path.join(d, CANARY_FILE)) == "renamed " + nonce + "\n"


OPS = (("create", op_create), ("append", op_append), ("chmod", op_chmod),
       ("symlink-out", op_symlink), ("rename-over", op_rename))


def try_all(key, d, role, nonce, workspace):
    results = []
    for name, op in OPS:
        what = "%s:%s" % (key, name)
        try:
            confirmed = op(d, nonce, workspace)
        except OSError as exc:
            results.append(attempt(what, role, "refused", errno_name(exc), None, repr(exc)))
        except Exception as exc:
            results.append(attempt(what, role, "error", None, None, repr(exc)))
        else:
            detail = "re-read confirms it" if confirmed else "done, but the re-read differs"
            results.append(attempt(what, role, "succeeded", None, None, detail))
    return results


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    workspace = task["workspace"]
    try:
        out["facts"]["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError:
        out["facts"]["mntns"] = None
    control_dir = os.path.join(workspace, targets["control_name"])
    try:
        os.makedirs(control_dir)
        with open(os.path.join(control_dir, CANARY_FILE), "w") as fh:
            fh.write("control canary\n")
        os.chmod(os.path.join(control_dir, CANARY_FILE), 0o644)
    except OSError as exc:
        out["attempts"].append(attempt("workspace:setup", "control", "error", errno_name(exc),
                                       None, repr(exc)))
    else:
        out["attempts"].extend(try_all("workspace", control_dir, "control", nonce, workspace))
    for key, d in sorted(targets["dirs"].items()):
        out["facts"]["visible:" + key] = os.path.isdir(d)
        out["attempts"].extend(try_all(key, d, "escape", nonce, workspace))
        for root in HOST_ROOT_MOUNTS:
            mounted = root + d
            if os.path.isdir(mounted):
                out["facts"]["visible:" + key + "@" + root] = True
                out["attempts"].extend(try_all(key + "@" + root, mounted, "escape", nonce,
                                               workspace))


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
