"""Whether a host path is in a confined payload's view of the filesystem, and as which file.

How a path is looked at: one component at a time from `/proc/<pid>/root`, each directory
opened O_PATH | O_NOFOLLOW relative to the last, never following the final component. Were
the whole path handed to the kernel at once, an absolute symlink on the way would resolve in
the *host's* root (only the magic /proc/<pid>/root link jumps into the payload's), and a
`..` at the payload's root would climb into the host's tree: the host would be reading its
own files and calling them the payload's. Here an absolute link is re-rooted at the
payload's root, `..` stops there, and each link followed is recorded.

The host's view of the payload (sandbox_attest/run/hostview.py) looks at the paths a spec
asks about (`look_paths`) this way, at the rendezvous and for every process that joins later.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

# At most this many paths are looked at per cell, and this many links followed per path (the
# kernel's own MAXSYMLINKS): a spec's list, or a view full of link loops, stays cheap.
MAX_LOOK: Final = 64
MAX_LINKS: Final = 40


def errno_name(exc: OSError) -> str:
    """The errno of `exc` by its name ("ENOENT"), or its number where it has none."""
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def _link_target(name: str, here: int, links: list[str]) -> str:
    """The target of link `name` in directory `here`, noted in `links`.

    Raises:
        OSError: `name` is not a link (ENOTDIR), or MAX_LINKS were already followed (ELOOP).
    """
    if not stat.S_ISLNK(os.stat(name, dir_fd=here, follow_symlinks=False).st_mode):
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    if len(links) >= MAX_LINKS:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
    target = os.readlink(name, dir_fd=here)
    links.append(f"{name} -> {target}")
    return target


def _walk(root_fd: int, path: str) -> tuple[int, str, list[str]]:
    """The directory fd holding `path`'s final component in the view `root_fd` is the root of.

    Returns (fd, final name, links followed); the caller closes fd (never `root_fd`). `..`
    stops at the root and an absolute link restarts at it (see the module docstring).

    Raises:
        OSError: a component is missing, not a directory, or too many links (ELOOP).
    """
    pending = [c for c in path.split("/") if c and c != "."]
    stack: list[int] = []
    links: list[str] = []
    try:
        while len(pending) > 1:
            name = pending.pop(0)
            here = stack[-1] if stack else root_fd
            if name == "..":
                if stack:
                    os.close(stack.pop())
                continue
            try:
                fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
            except NotADirectoryError:
                target = _link_target(name, here, links)
                if target.startswith("/"):
                    # Absolute: from the payload's root, not from the host's.
                    while stack:
                        os.close(stack.pop())
                pending[:0] = [c for c in target.split("/") if c and c != "."]
                continue
            stack.append(fd)
        final = pending[0] if pending else "."
        if final == "..":
            if stack:
                os.close(stack.pop())
            final = "."
        fd = os.dup(stack.pop()) if stack else os.open(".", os.O_PATH, dir_fd=root_fd)
        return fd, final, links
    finally:
        for fd in stack:
            os.close(fd)


def look_at(pid: int, path: str) -> dict[str, Any]:
    """Whether host path `path` is in `pid`'s view of the filesystem, and as which file.

    `visible`: the final component exists there (lstat, a link is not followed);
    `same_inode_as_host`: it is the very file the host has at that path (same st_dev and
    st_ino as the host's own lstat), False where it is another file (the sandbox's own),
    None where either side has nothing; `errno` why it is not visible; `links` the links
    followed on the way. Never raises.
    """
    entry: dict[str, Any] = {
        "path": path,
        "visible": False,
        "same_inode_as_host": None,
        "errno": None,
    }
    try:
        root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        entry["errno"] = errno_name(exc)
        entry["why"] = f"cannot open /proc/{pid}/root: {exc.strerror}"
        return entry
    try:
        fd, final, links = _walk(root_fd, path)
        if links:
            entry["links"] = links
        try:
            theirs = os.stat(final, dir_fd=fd, follow_symlinks=False)
        finally:
            os.close(fd)
    except OSError as exc:
        entry["errno"] = errno_name(exc)
        return entry
    finally:
        os.close(root_fd)
    entry["visible"] = True
    try:
        ours = os.lstat(path)
    except OSError:
        return entry
    entry["same_inode_as_host"] = (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
    return entry


def looked(pid: int, look: Sequence[str]) -> dict[str, Any]:
    """`look_at` for each path of `look` (at most MAX_LOOK), under "looked"; {} for none."""
    if not look:
        return {}
    result: dict[str, Any] = {"looked": [look_at(pid, path) for path in look[:MAX_LOOK]]}
    if len(look) > MAX_LOOK:
        result["looked_cut"] = f"{len(look)} paths asked, only the first {MAX_LOOK} looked at"
    return result
