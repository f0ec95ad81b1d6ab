"""The cgroup v2 filesystem, as the harness reads and clears it: found, listed, killed, removed.

Below both `sandbox_attest.run.cellgroup` (which makes the groups) and `sandbox_attest.run.sweep`
(which clears what a killed run left), so neither imports the other's way round.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path
from typing import Final

# How long removing a group waits for its killed members to be gone.
EMPTY_WAIT_S: Final = 5.0
POLL_S: Final = 0.01


def _mountinfo_v2(mountinfo: str) -> list[tuple[str, Path]]:
    """(root inside the hierarchy, mount point) of every cgroup2 mount in a mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            # Octal escapes (a space is \040) in both the root and the mount point.
            root = fields[3].encode().decode("unicode_escape")
            point = fields[4].encode().decode("unicode_escape")
            found.append((root, Path(point)))
    return found


def own_v2_dir(mountinfo: str | None = None, cgroup: str | None = None) -> Path | None:
    """The directory of this process's own v2 cgroup, where some cgroup2 mount shows it.

    Args:
        mountinfo: /proc/self/mountinfo's text (tests pass one).
        cgroup: /proc/self/cgroup's text (tests pass one).

    Returns:
        None where no cgroup2 is mounted, or none of its mounts shows our group.
    """
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
        cgroup = Path("/proc/self/cgroup").read_text() if cgroup is None else cgroup
    except OSError:
        return None
    ours = next((ln[3:] for ln in cgroup.splitlines() if ln.startswith("0::")), None)
    if ours is None:
        return None
    for root, point in _mountinfo_v2(mountinfo):
        rel = os.path.relpath(ours, root)
        if rel == "." or not rel.startswith(".."):
            where = point if rel == "." else point / rel
            if where.is_dir():
                return where
    return None


def on_cgroup2(path: Path) -> bool:
    """Whether `path` is a directory on a cgroup2 filesystem (by a cgroup2 mount above it)."""
    try:
        mounts = _mountinfo_v2(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return False
    return path.is_dir() and any(point in path.parents for _, point in mounts)


def kernel_at_least(version: tuple[int, int]) -> bool:
    """Whether the running kernel's (major, minor) is at least `version`."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= version


def _kill_cgroup(path: Path) -> None:
    """SIGKILL every process in cgroup `path` (and below): `cgroup.kill`, else one by one."""
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        pass
    else:
        return
    for pid in cgroup_members(path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def cgroup_members(path: Path) -> list[int]:
    """The processes in cgroup `path` and every group below it."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        found += [int(p) for p in (path / "cgroup.procs").read_text().split()]
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                found += cgroup_members(child)
    return found


def remove_cgroup_tree(path: Path) -> list[str]:
    """Kill everything in `path` and below, then remove the groups; notes on what stayed.

    Never raises: a group that cannot go (a member the kernel keeps, an unkillable process)
    is named in a note, and the next run's sweep tries again.
    """
    notes: list[str] = []
    if not path.is_dir():
        return notes
    deadline = time.monotonic() + EMPTY_WAIT_S
    _kill_cgroup(path)
    while members := cgroup_members(path):
        if time.monotonic() > deadline:
            notes.append(f"{len(members)} process(es) still in {path} after SIGKILL: {members}")
            return notes
        _kill_cgroup(path)
        time.sleep(POLL_S)
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir() and not child.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                _rmdir_when_empty(child, deadline, notes)
    _rmdir_when_empty(path, deadline, notes)
    return notes


def _rmdir_when_empty(path: Path, deadline: float, notes: list[str]) -> None:
    """Remove an empty cgroup, retrying EBUSY (its last member's exit is still being accounted)."""
    while True:
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                time.sleep(POLL_S)
                continue
            notes.append(f"could not remove {path}: {exc.strerror}")
        return
