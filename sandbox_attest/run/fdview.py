"""The payload's descriptors by identity: which object each holds, read from the host.

A descriptor's link text (`/proc/<pid>/fd/N`) is a name in the payload's view, or in the
view of whoever opened it; the object behind it is what it reaches. `os.stat` on the magic
link follows it to the object itself, so the host records each descriptor's (st_dev,
st_ino, file type), and for a directory the identities of the directories above it, read
by climbing `..` from the object (not from a path); for a regular file, from the directory
that holds it at its link's path in the payload's view, if that entry is the same object.
catalog/env.py compares them with the
host's own directories and files (issue 26: a sandbox that keeps descriptors its launcher
inherited hands the payload the host's `/` whatever its mounts hide).

The cost is one stat per descriptor and, for a directory, one open and fstat per level
above it: a payload at its rendezvous holds a handful (bench/bench_matrix.py's held_ms).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.run.pathview import errno_name

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

# The descriptors whose objects the host identifies per process (`fd_identities`), and how
# many directories above one it climbs: a payload may open many, the reading stays bounded.
FD_IDS_MAX: Final = 256
FD_CLIMB_MAX: Final = 64


def _kind(mode: int) -> str:
    """The file type of a descriptor's object, in a word."""
    kinds = (
        (stat.S_ISDIR, "dir"),
        (stat.S_ISREG, "reg"),
        (stat.S_ISCHR, "chr"),
        (stat.S_ISBLK, "blk"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "sock"),
        (stat.S_ISLNK, "lnk"),
    )
    return next((word for test, word in kinds if test(mode)), "other")


_DIR_FLAGS: Final = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


def _climb_from(current: int, up: list[list[int]]) -> dict[str, Any]:
    """Append the (dev, ino) of every directory above `current` to `up`; closes `current`.

    `..` is taken from the object itself (O_PATH descriptors), so it climbs the payload's
    own mount tree: a workspace bound anywhere inside still climbs into the workspace's
    identity, and a host directory outside every bound tree never does. `top` says the
    climb reached the tree's root (`..` is itself) within FD_CLIMB_MAX.
    """
    try:
        here = os.fstat(current)
        for _ in range(FD_CLIMB_MAX):
            parent = os.open("..", _DIR_FLAGS, dir_fd=current)
            above = os.fstat(parent)
            os.close(current)
            current = parent
            if (above.st_dev, above.st_ino) == (here.st_dev, here.st_ino):
                return {"up": up, "top": True}
            up.append([above.st_dev, above.st_ino])
            here = above
    except OSError as exc:
        return {"up": up, "top": False, "why": errno_name(exc)}
    finally:
        os.close(current)
    return {"up": up, "top": False, "why": f"deeper than {FD_CLIMB_MAX} directories"}


def _climb(link: Path) -> dict[str, Any]:
    """The identities above the directory `link` (a /proc/<pid>/fd/N magic link) holds."""
    try:
        current = os.open(link, _DIR_FLAGS)
    except OSError as exc:
        return {"up": [], "top": False, "why": errno_name(exc)}
    return _climb_from(current, [])


def _place(proc: Path, link: str, identity: tuple[int, int]) -> dict[str, Any]:
    """The directory holding a regular file in the payload's view, and those above it.

    A file has no `..`: its directory is found by the link text, one component at a time
    from /proc/<pid>/root, never following a symlink (the text the kernel writes for a file
    reachable in the payload's tree has none), and the entry there must be the descriptor's
    own object. A file opened elsewhere (in the launcher's tree, then handed on), deleted,
    or moved since cannot be placed: `up` is then empty and `why` says so.
    """
    parts = link.split("/")
    if not link.startswith("/") or link.endswith(" (deleted)") or {".", ".."} & set(parts):
        return {"up": [], "top": False, "why": "not a path in the payload's view"}
    try:
        current = os.open(proc / "root", _DIR_FLAGS)
    except OSError as exc:
        return {"up": [], "top": False, "why": errno_name(exc)}
    try:
        for part in (p for p in parts[1:-1] if p):
            step = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            os.close(current)
            current = step
        st = os.stat(parts[-1], dir_fd=current, follow_symlinks=False)
    except OSError as exc:
        os.close(current)
        return {"up": [], "top": False, "why": f"not at its path in the payload's view: {exc}"}
    if (st.st_dev, st.st_ino) != identity:
        os.close(current)
        return {"up": [], "top": False, "why": "another file is at its path in the payload's view"}
    here = os.fstat(current)
    return _climb_from(current, [[here.st_dev, here.st_ino]])


def fd_identities(proc: Path, fds: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each descriptor of `proc` by the identity of the object it holds, not by its name.

    `os.stat` on /proc/<pid>/fd/N follows the magic link to the object itself (root reads
    its identity, never a path the payload can swap): `dev`, `ino`, `type` ("dir", "reg",
    "chr", "sock", ...) and `link` (the link text, `fds`' value). A directory (3+) also
    carries `up`, the identities above it (`_climb`), and a regular file `up` from the
    directory holding it (`_place`), each with `top` and, where it stopped short, `why`.
    A descriptor the host could not stat carries `unread` with why; past FD_IDS_MAX
    descriptors the rest carry `unread` too, so a payload cannot make the reading slow,
    only undecided. What it does not do: judge which objects
    are the host's (catalog/env.py does, against the host's own stats).
    """
    found: dict[str, dict[str, Any]] = {}
    for count, (name, link) in enumerate(fds.items()):
        if not name.isdigit():
            continue  # {"error": why}: the table itself was unreadable, said in `fds`
        if count >= FD_IDS_MAX:
            found[name] = {"link": link, "unread": f"more than {FD_IDS_MAX} descriptors"}
            continue
        path = proc / "fd" / name
        try:
            st = path.stat()
        except FileNotFoundError:
            continue  # closed between the listing and the stat: it holds nothing now
        except OSError as exc:
            found[name] = {"link": link, "unread": errno_name(exc)}
            continue
        entry: dict[str, Any] = {
            "link": link,
            "dev": st.st_dev,
            "ino": st.st_ino,
            "type": _kind(st.st_mode),
        }
        if int(name) > 2 and entry["type"] == "dir":  # 0-2 are stdio
            entry |= _climb(path)
        elif int(name) > 2 and entry["type"] == "reg":
            entry |= _place(proc, link, (st.st_dev, st.st_ino))
        found[name] = entry
    return found
