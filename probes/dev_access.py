"""Probe dev_access: which device nodes can the payload open?

It opens device nodes read-only and never writes to one, reads from one or sends an ioctl:
``os.open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY)``, then ``fstat`` for the device number,
then ``close``. O_NONBLOCK keeps a serial line or a FIFO from blocking the open; O_NOCTTY
keeps a terminal from becoming the payload's controlling terminal.
  control:<name>  each of targets["control"] (null, zero, full, random, urandom): harmless
                  devices a sandbox gives its payload; those present must open (null always),
                  or nothing shows that this probe could open a device at all; one absent
                  is reported refused (ENOENT), which the host checks against its listing
  dev:<path>      each of targets["devices"] (the host's devices the payload user can open
                  when unconfined: /dev/kvm, /dev/net/tun, /dev/fuse... where they exist), and
                  every other character or block device found under /dev (at most
                  targets["max_nodes"], at most targets["max_depth"] levels down)
  dev:/<inside>   each of targets["elsewhere"]: device nodes OUTSIDE /dev that the host found
                  in this process's view while it waited (a sandbox that binds the host's
                  /dev at /host/dev), by their absolute inside path
Each attempt carries the device number it opened (``rdev`` "major:minor") and its kind, so the
host can compare it with its own devices: device numbers are the kernel's, not a namespace's,
so a node that opens is the host's device whatever path it has inside.
Never opened (listed in facts["skipped"]): watchdog devices, whose open arms a timer that
reboots the host if the close does not say so in a write this probe never makes.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import stat
import sys

PROBE = "dev_access"
START_MARKER = "SANDBOX-ATTEST-START"
DEV = "/dev"
# Opening a watchdog starts it; only a magic write before close stops it again.
NEVER_OPEN = ("watchdog",)


def attempt(what, role, outcome, err=None, status=None, detail="", **extra):
    out = {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
           "detail": detail}
    out.update(extra)
    return out


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def kind_of(mode):
    if stat.S_ISCHR(mode):
        return "char"
    if stat.S_ISBLK(mode):
        return "block"
    return None


def rdev_of(info):
    return "%d:%d" % (os.major(info.st_rdev), os.minor(info.st_rdev))


def open_device(what, role, path):
    """One read-only open of `path`: the outcome, the device number and kind it opened."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, repr(exc), path=path)
    except Exception as exc:
        return attempt(what, role, "error", None, None, repr(exc), path=path)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    kind = kind_of(info.st_mode)
    detail = "opened read-only: %s device %s" % (kind or "not a", rdev_of(info))
    return attempt(what, role, "succeeded", None, None, detail, path=path, rdev=rdev_of(info),
                   kind=kind)


def scan(max_nodes, max_depth, facts):
    """Device nodes under /dev (paths relative to it), breadth first, bounded.

    Symlinks are not followed (/dev/fd, /dev/stdin point into /proc): what they name is a
    descriptor the payload already holds, not a device it could reach.
    """
    found, skipped = [], []
    queue = [("", 0)]
    while queue and len(found) < max_nodes:
        rel, depth = queue.pop(0)
        where = os.path.join(DEV, rel) if rel else DEV
        try:
            names = sorted(os.listdir(where))
        except OSError as exc:
            facts["unlisted"].append("%s (%s)" % (where, errno_name(exc)))
            continue
        for name in names:
            sub = os.path.join(rel, name) if rel else name
            try:
                info = os.lstat(os.path.join(DEV, sub))
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 < max_depth:
                    queue.append((sub, depth + 1))
            elif kind_of(info.st_mode) is not None:
                if any(name.startswith(bad) for bad in NEVER_OPEN):
                    skipped.append(sub)
                elif len(found) < max_nodes:
                    found.append(sub)
                else:
                    facts["truncated"] = True
    if queue:
        facts["truncated"] = True
    facts["skipped"] = skipped
    return found


def run(task, out):
    targets = task["targets"]
    facts = out["facts"]
    facts["unlisted"] = []
    facts["truncated"] = False
    try:
        facts["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError:
        facts["mntns"] = None
    for name in targets["control"]:
        out["attempts"].append(open_device("control:" + name, "control", os.path.join(DEV, name)))
    controls = set(targets["control"])
    wanted = [rel for rel in targets["devices"]]
    seen = scan(int(targets["max_nodes"]), int(targets["max_depth"]), facts)
    facts["nodes_seen"] = len(seen)
    for rel in sorted(set(wanted) | set(seen)):
        if rel in controls or any(os.path.basename(rel).startswith(b) for b in NEVER_OPEN):
            continue
        out["attempts"].append(open_device("dev:" + rel, "escape", os.path.join(DEV, rel)))
    elsewhere = targets.get("elsewhere") or {}
    for key in sorted(elsewhere):
        path = str(elsewhere[key])
        if any(os.path.basename(path).startswith(b) for b in NEVER_OPEN):
            continue
        out["attempts"].append(open_device("dev:" + key, "escape", path))


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
