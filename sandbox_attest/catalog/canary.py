"""Canaries on the host: planting them, and what the host sees of them afterwards.

The filesystem probes plant files and folders where a sandbox must not reach ($HOME, /tmp,
beside the workspace) and compare what the host sees before and after the payload ran. The
readings here are deliberately plain (lstat, a sha256, a directory listing) so a reviewer can
check that a "changed" verdict really means the bytes, inode, mode or links moved.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import json
import os
import stat
from typing import TYPE_CHECKING, Any

from sandbox_attest.errors import FixtureError
from sandbox_attest.host.safefs import UnsafePathError
from sandbox_attest.host.trust import measure_as

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sandbox_attest.host.safefs import SafeDir
    from sandbox_attest.host.trust import PayloadUser

__all__ = [
    "call_as",
    "dir_canary_diff",
    "dir_canary_state",
    "dir_entries",
    "file_diff",
    "file_state",
    "planting",
    "read_text",
    "sha256",
    "site_moved",
]


@contextlib.contextmanager
def planting(probe: str, path: Path) -> Iterator[None]:
    """Turn a failure to plant `path` into a FixtureError naming the probe and the fix."""
    try:
        yield
    except UnsafePathError as exc:
        # Someone else's link or object where the canary goes: named, never followed.
        raise FixtureError(f"{probe}: could not plant the canary {path}: {exc}") from exc
    except OSError as exc:
        raise FixtureError(
            f"{probe}: could not plant the canary {path} ({exc.strerror or exc}); make "
            f"{path.parent.parent} writable by the user running the harness, or deselect {probe}"
        ) from exc


def _read_regular(path: Path) -> bytes:
    """The bytes of the regular file at `path`, never through a final symlink nor from a FIFO.

    Canaries sit where the payload user can write: a FIFO planted at a canary's name would
    block the harness's read for good, and a symlink would make it read (and hash) a file of
    the payload's choosing. Opened non-blocking and checked to be a regular file first.

    Raises:
        OSError: missing, unreadable, a symlink (ELOOP), or not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return handle.read()


def sha256(path: Path) -> str | None:
    """The sha256 of a regular file's bytes, or None when the host cannot read it as one."""
    try:
        return hashlib.sha256(_read_regular(path)).hexdigest()
    except OSError:
        return None


def read_text(path: Path) -> str | None:
    """A regular file's text, or None when it is missing, unreadable, not one, or not text."""
    try:
        return _read_regular(path).decode()
    except (OSError, UnicodeDecodeError):
        return None


def file_state(path: Path) -> dict[str, Any]:
    """What the host sees of one planted path: kind, inode, links, mode, content hash."""
    try:
        info = path.lstat()
    except OSError as exc:
        return {"missing": type(exc).__name__}
    kind = (
        "socket"
        if stat.S_ISSOCK(info.st_mode)
        else "symlink"
        if stat.S_ISLNK(info.st_mode)
        else "file"
        if stat.S_ISREG(info.st_mode)
        else "other"
    )
    return {
        "kind": kind,
        "inode": info.st_ino,
        "nlink": info.st_nlink,
        "mode": oct(stat.S_IMODE(info.st_mode)),
        "sha256": sha256(path) if kind == "file" else None,
    }


def dir_entries(directory: Path) -> list[str] | str:
    """A directory's sorted entry names, or why the host could not list it."""
    try:
        return sorted(p.name for p in directory.iterdir())
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}"


def file_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A short phrase naming what changed between two `file_state`s, or ""."""
    if "missing" in after and "missing" not in before:
        return f"gone ({after['missing']})"
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    return f"{','.join(changed)} changed" if changed else ""


def dir_canary_state(canary: Path) -> dict[str, Any]:
    """A planted file and the folder around it, as the host sees them."""
    return {"file": file_state(canary), "entries": dir_entries(canary.parent)}


def dir_canary_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A short phrase naming what changed between two `dir_canary_state`s, or "".

    New and gone entry names are spelled out: a nonce file appearing beside the canary is
    the usual trace of a write that got through.
    """
    phrases = [file_diff(before.get("file", {}), after.get("file", {}))]
    old, now = before.get("entries"), after.get("entries")
    if isinstance(old, list) and isinstance(now, list):
        if added := sorted(set(now) - set(old)):
            phrases.append(f"new {','.join(added)}")
        if removed := sorted(set(old) - set(now)):
            phrases.append(f"gone {','.join(removed)}")
    elif old != now:
        phrases.append(f"dir entries {now}" if isinstance(now, str) else "dir entries changed")
    return ", ".join(p for p in phrases if p)


def site_moved(site: SafeDir) -> str:
    """Why `site.path` no longer names the directory held since plant time, or "".

    The harness opened the directory it planted in (a canary's place, a witness's directory)
    when it planted, and holds that descriptor until the cell is judged: while it is open the
    inode cannot be freed and reused, so "the same (device, inode) at the same path" really
    is the same directory. A directory its owner removed (nlink 0 on the held descriptor) or
    replaced (the path names another inode now) is the owner's doing, not the sandbox's: a
    payload user could not have removed it unconfined either.
    """
    try:
        held = os.fstat(site.fd)
    except OSError as exc:
        return f"{site.shown} could not be looked at ({exc.strerror})"
    if held.st_nlink == 0:
        return f"{site.shown} was removed by its owner during the cell"
    return site.still_same()


def call_as(
    user: PayloadUser | None, module: str, function: str, argument: object, timeout: float
) -> tuple[Any, str]:
    """`module.function(argument)` as the payload user, unconfined; its JSON result.

    The positive control of a planted site must be the payload user's own reach (a root
    harness reaches every directory, another program's private one too), so it runs in a
    child as that user, with the argument as JSON on stdin. Without a payload user the
    payload runs as the harness's own user, and so does the call (in this process).

    Returns:
        (the JSON-decoded result, "") or (None, why the call could not be made).
    """
    if user is None:
        try:
            result = getattr(importlib.import_module(module), function)(argument)
        except (OSError, ValueError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        return json.loads(json.dumps(result)), ""
    # Through measure_as: it works wherever root installed the harness (pipx under /root too).
    return measure_as(user, module, function, timeout, argument=argument)
