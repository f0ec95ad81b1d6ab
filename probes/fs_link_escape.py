"""Probe fs_link_escape: reach a host canary outside the workspace through links and renames.

targets["canaries"] maps a key ("sibling", "tmp") to the absolute path of a canary file the
host planted outside the workspace. For each, from inside the workspace, in this order:
  symlink-read   make ``<key>-<nonce>.symlink`` -> canary, read through it (sha256 reported)
  symlink-write  append the nonce through that symlink
  hardlink       ``os.link`` the canary into the workspace, append the nonce through it
  rename-in      write ``<key>-<nonce>.new`` in the workspace, rename it over the canary
  rename-out     rename the canary into the workspace as ``<key>-<nonce>.stolen``
Control: the same five in ``<workspace>/<targets["control_dir"]>`` against a canary the probe
plants there itself; the host then checks the result from outside.
A link that is made but leads nowhere (the target is not visible) is a refusal with the errno
of the step that failed; the host decides from the canary's state whether anything got out.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import hashlib
import json
import os
import sys

PROBE = "fs_link_escape"
START_MARKER = "SANDBOX-ATTEST-START"


def attempt(what, role, outcome, err=None, status=None, detail="", **extra):
    out = {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
           "detail": detail}
    out.update(extra)
    return out


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def read(path):
    with open(path, "rb") as fh:
        return fh.read(1 << 20)


def op_symlink_read(canary, here, stem, nonce):
    link = os.path.join(here, stem + ".symlink")
    os.symlink(canary, link)
    data = read(link)
    return "read %d bytes" % len(data), {"sha256": hashlib.sha256(data).hexdigest()}


def op_symlink_write(canary, here, stem, nonce):
    link = os.path.join(here, stem + ".symlink")
    if not os.path.islink(link):
        os.symlink(canary, link)
    # "a" without O_CREAT semantics would be nicer, but open() has none: a dangling link to a
    # missing directory fails with ENOENT, which is what a confined view should give.
    with open(link, "ab") as fh:
        fh.write(("appended via symlink " + nonce + "\n").encode())
    return "appended", {}


def op_hardlink(canary, here, stem, nonce):
    link = os.path.join(here, stem + ".hardlink")
    os.link(canary, link)
    with open(link, "ab") as fh:
        fh.write(("appended via hardlink " + nonce + "\n").encode())
    return "linked and appended", {}


def op_rename_in(canary, here, stem, nonce):
    new = os.path.join(here, stem + ".new")
    with open(new, "w") as fh:
        fh.write("renamed over by " + nonce + "\n")
    os.rename(new, canary)
    return "renamed over the canary", {}


def op_rename_out(canary, here, stem, nonce):
    os.rename(canary, os.path.join(here, stem + ".stolen"))
    return "moved into the workspace", {}


OPS = (("symlink-read", op_symlink_read), ("symlink-write", op_symlink_write),
       ("hardlink", op_hardlink), ("rename-in", op_rename_in), ("rename-out", op_rename_out))


def try_all(key, canary, here, role, nonce):
    results = []
    stem = "%s-%s" % (key, nonce)
    for name, op in OPS:
        what = "%s:%s" % (key, name)
        try:
            detail, extra = op(canary, here, stem, nonce)
        except OSError as exc:
            results.append(attempt(what, role, "refused", errno_name(exc), None, repr(exc)))
        except Exception as exc:
            results.append(attempt(what, role, "error", None, None, repr(exc)))
        else:
            results.append(attempt(what, role, "succeeded", None, None, detail, **extra))
    return results


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    workspace = task["workspace"]
    try:
        out["facts"]["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError:
        out["facts"]["mntns"] = None
    control_dir = os.path.join(workspace, targets["control_dir"])
    control_canary = os.path.join(control_dir, "notes.txt")
    try:
        os.makedirs(os.path.join(control_dir, "inner"))
        with open(control_canary, "w") as fh:
            fh.write("control canary\n")
    except OSError as exc:
        out["attempts"].append(attempt("workspace:setup", "control", "error", errno_name(exc),
                                       None, repr(exc)))
    else:
        out["attempts"].extend(try_all("workspace", control_canary,
                                       os.path.join(control_dir, "inner"), "control", nonce))
    for key, canary in sorted(targets["canaries"].items()):
        out["facts"]["visible:" + key] = os.path.exists(canary)
        out["attempts"].extend(try_all(key, canary, workspace, "escape", nonce))


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
