"""The host's walk of a process's view of the filesystem: its unix sockets and device nodes.

A sandbox puts a host object wherever it likes: the host's docker socket at
`/run/host-docker.sock`, a device node at `/host/dev/autofs`. Looking for the host's objects at
their host paths misses every one of them. This walk lists what a process can see, through
`/proc/<pid>/root` (the root the kernel gives that process, which no wrapper can rewrite), and
records every unix socket and every device node by identity: a socket by (st_dev, st_ino), the
pair a bind mount keeps; a device by its kind and (major, minor), which belong to the kernel.
The caller compares them with the host's own (`match_sockets`).

How it never leaves the view: every directory is opened one component at a time from a
descriptor of the process's root, `openat(O_NOFOLLOW | O_DIRECTORY)`, and checked against the
identity its parent listed; nothing is ever followed. Through `/proc/<pid>/root` the kernel
resolves an absolute symlink in the *caller's* root, so a symlink inside the view (`/x -> /`)
would send a path-based walk into the host's tree; here a symlink is an entry, never a way.

What it skips, and why (each named in `ViewWalk.not_covered`):
  - mounts of the kernel's pseudo file systems, wherever the process's mount table puts them
    (`SKIP_FSTYPES`: procfs lists every process's descriptors as symlinks, sysfs has tens of
    thousands of entries and no socket or device node, devpts holds only pty slaves; autofs
    mounts on first look, which could hang the walk);
  - a directory that is the host's own directory at the same path (same identity), with no
    mount of the view below it and no host socket the caller knows below it: its tree is the
    host's tree there, where the caller already knows every socket (`pruned`);
  - what lies past the bounds (`Bounds`: depth, entries, time).

What it does not do: connect, open or read anything but directories. Whether a socket found
here answers is the caller's to find out (a witness on the host hears it, or nothing does).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.host import mountview

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

Identity = tuple[int, int]

# Pseudo file systems the walk never enters, with why (see the module docstring).
SKIP_FSTYPES: Final[dict[str, str]] = {
    "proc": "procfs: the kernel's process tables; its descriptors are symlinks, not sockets",
    "sysfs": "sysfs: kernel objects, no socket or device node",
    "devpts": "devpts: pty slaves only, the harmless class",
    "cgroup": "cgroupfs: control files",
    "cgroup2": "cgroupfs: control files",
    "debugfs": "debugfs: kernel debug files",
    "tracefs": "tracefs: kernel trace files",
    "securityfs": "securityfs: LSM control files",
    "bpf": "bpffs: pinned BPF objects",
    "configfs": "configfs: kernel object configuration",
    "pstore": "pstore: crash records",
    "fusectl": "fusectl: FUSE control files",
    "binfmt_misc": "binfmt_misc: interpreter registrations",
    "efivarfs": "efivarfs: firmware variables",
    "mqueue": "mqueue: POSIX message queues, not unix sockets",
    "autofs": "autofs: a look mounts it (and may hang); not entered",
}
# Where the process's mount table cannot be read, these are skipped by path instead.
FALLBACK_SKIP: Final = ("/proc", "/sys")
# Why a directory was not entered though it is in the view (`_Walker.prune_reason`).
PRUNED_WHY: Final = (
    "the host's own directory at this path, with no mount of the view and no host socket "
    "below it: its tree is the host's, whose sockets the caller already knows"
)
# How many examples a cut-off names before it says how many more.
EXAMPLES: Final = 3
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Bounds:
    """How far one walk goes: directory depth below the root, entries looked at, seconds."""

    depth: int = 12
    entries: int = 20000
    seconds: float = 0.5


@dataclass
class ViewWalk:
    """What one walk of a process's view found, and what it did not look at.

    Attributes:
        pid: the host pid whose root was walked.
        seen: whether the root could be opened at all (else `why`).
        sockets: inside path -> (st_dev, st_ino) of every unix socket listed.
        devices: inside path -> {"kind": "char"|"block", "rdev": "M:m"} of every device node.
        pruned: inside path -> why it was not entered (the host's own tree there).
        skipped: inside path -> why it was not entered (a pseudo file system).
        not_covered: the cut-offs, as sentences: bounds reached, unreadable directories.
        dirs: directories listed; entries: entries looked at; ms: the walk's duration.
    """

    pid: int
    seen: bool = True
    why: str = ""
    sockets: dict[str, Identity] = field(default_factory=dict)
    devices: dict[str, dict[str, str]] = field(default_factory=dict)
    pruned: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    not_covered: list[str] = field(default_factory=list)
    dirs: int = 0
    entries: int = 0
    ms: float = 0.0

    def as_evidence(self) -> dict[str, Any]:
        """The walk as JSON facts for a cell's evidence (sockets as [dev, ino])."""
        return {
            "seen": self.seen,
            "why": self.why,
            "pid": self.pid,
            "sockets": {p: list(i) for p, i in sorted(self.sockets.items())},
            "devices": dict(sorted(self.devices.items())),
            # One reason serves every pruned directory: listed once, not once per path.
            "pruned": sorted(self.pruned),
            "pruned_why": PRUNED_WHY if self.pruned else "",
            "skipped": self.skipped,
            "not_covered": self.not_covered,
            "dirs": self.dirs,
            "entries": self.entries,
            "ms": self.ms,
        }


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, fstype) of each mount of a /proc/<pid>/mountinfo (`mountview.parse`).

    The mount point is relative to the reading process's root when it is the process itself;
    the host reading /proc/<pid>/mountinfo gets it relative to <pid>'s root.
    """
    return [(m.mount_point, m.fstype) for m in mountview.parse(text)[0]]


def _join(parts: tuple[str, ...]) -> str:
    return "/" + "/".join(parts)


def _below(path: str, candidates: Iterable[str]) -> bool:
    """Whether any candidate path lies strictly below `path`."""
    prefix = path.rstrip("/") + "/"
    return any(c.startswith(prefix) and c != path for c in candidates)


def _open_chain(root_fd: int, parts: tuple[str, ...]) -> int:
    """The directory `parts` below `root_fd`, each component opened with O_NOFOLLOW."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _errno(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def _examples(items: list[str]) -> str:
    shown = ", ".join(items[:EXAMPLES])
    return shown + (f" and {len(items) - EXAMPLES} more" if len(items) > EXAMPLES else "")


@dataclass
class _Walker:
    """One walk's state: the root descriptors, the queue, the bounds and what was found."""

    pid: int
    root_fd: int
    host_fd: int
    bounds: Bounds
    mounts: dict[str, str]
    known: tuple[str, ...]
    result: ViewWalk
    deadline: float = 0.0
    unreadable: list[str] = field(default_factory=list)
    too_deep: list[str] = field(default_factory=list)

    def skip_reason(self, path: str) -> str:
        """Why `path` is not entered because of what is mounted there, or ""."""
        fstype = self.mounts.get(path)
        if fstype in SKIP_FSTYPES:
            return SKIP_FSTYPES[fstype]
        if not self.mounts and path in FALLBACK_SKIP:
            return "the view's mount table is unreadable: skipped by its usual path"
        return ""

    def prune_reason(self, parts: tuple[str, ...], ident: Identity) -> str:
        """Why the directory `parts` is the host's own tree there (see the module), or ""."""
        path = _join(parts)
        # Without the view's mount table nothing shows what is mounted below: never prune.
        if (
            self.host_fd < 0
            or not self.mounts
            or not parts
            or _below(path, self.mounts)
            or _below(path, self.known)
        ):
            return ""
        try:
            fd = _open_chain(self.host_fd, parts)
        except OSError:
            return ""
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if (st.st_dev, st.st_ino) != ident:
            return ""
        return PRUNED_WHY

    def list_dir(
        self, parts: tuple[str, ...], ident: Identity | None
    ) -> list[tuple[str, os.stat_result]]:
        """(name, lstat) of each entry of one directory, opened without following; [] if it cannot.

        The lstat is taken while the directory's descriptor is open: a DirEntry of a
        descriptor's listing stats relative to it.
        """
        path = _join(parts)
        try:
            fd = _open_chain(self.root_fd, parts)
        except OSError as exc:
            self.unreadable.append(f"{path} ({_errno(exc)})")
            return []
        try:
            st = os.fstat(fd)
            if ident is not None and (st.st_dev, st.st_ino) != ident:
                self.unreadable.append(f"{path} (changed during the walk)")
                return []
            listed = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        listed.append((entry.name, entry.stat(follow_symlinks=False)))
        except OSError as exc:
            self.unreadable.append(f"{path} ({_errno(exc)})")
            return []
        else:
            return listed
        finally:
            os.close(fd)

    def run(self) -> None:
        """Breadth first from the root until the queue is empty or a bound is reached."""
        queue: list[tuple[tuple[str, ...], Identity | None]] = [((), None)]
        while queue:
            parts, ident = queue.pop(0)
            if self.out_of_bounds(queue, parts):
                return
            self.result.dirs += 1
            for name, st in self.list_dir(parts, ident):
                self.result.entries += 1
                self.look_at((*parts, name), st, queue)

    def out_of_bounds(
        self, queue: list[tuple[tuple[str, ...], Identity | None]], parts: tuple[str, ...]
    ) -> bool:
        """Whether a bound stops the walk here; the cut-off is noted with what was left."""
        left = [_join(parts), *(_join(p) for p, _ in queue)]
        if self.result.entries >= self.bounds.entries:
            self.result.not_covered.append(
                f"stopped at {self.bounds.entries} entries: {len(left)} directories not "
                f"listed ({_examples(left)})"
            )
            return True
        if time.monotonic() > self.deadline:
            self.result.not_covered.append(
                f"stopped at the {self.bounds.seconds} s bound: {len(left)} directories not "
                f"listed ({_examples(left)})"
            )
            return True
        return False

    def look_at(
        self,
        child: tuple[str, ...],
        st: os.stat_result,
        queue: list[tuple[tuple[str, ...], Identity | None]],
    ) -> None:
        """Record a socket or device node; queue a directory unless skipped, pruned or deep."""
        path = _join(child)
        mode = st.st_mode
        if stat.S_ISSOCK(mode):
            self.result.sockets[path] = (st.st_dev, st.st_ino)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            kind = "char" if stat.S_ISCHR(mode) else "block"
            rdev = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            self.result.devices[path] = {"kind": kind, "rdev": rdev}
        elif stat.S_ISDIR(mode):
            skip = self.skip_reason(path)
            if skip:
                self.result.skipped[path] = skip
                return
            ident = (st.st_dev, st.st_ino)
            prune = self.prune_reason(child, ident)
            if prune:
                self.result.pruned[path] = prune
            elif len(child) > self.bounds.depth:
                self.too_deep.append(path)
            else:
                queue.append((child, ident))


def walk_view(
    pid: int,
    *,
    known: Iterable[str] = (),
    bounds: Bounds | None = None,
    proc: str = "/proc",
    host_root: str = "/",
    prune: bool = True,
) -> ViewWalk:
    """Walk `pid`'s view from its root (see the module docstring); what it found and missed.

    Args:
        pid: the host pid whose root (`/proc/<pid>/root`) is walked.
        known: host paths of the sockets the caller will match against: a directory with one
            of them below it is never pruned.
        bounds: depth, entries and seconds (default `Bounds()`).
        proc: where procfs is (tests point it at a fake tree).
        host_root: the host's root, for the pruning comparison (tests point it elsewhere).
        prune: whether the host's own trees are left out (see the module docstring). Pruning
            is sound for what the caller matches by identity and lists in `known`; a caller
            after every device node in the view, the host's own included, passes False.
    """
    bounds = bounds or Bounds()
    start = time.monotonic()
    result = ViewWalk(pid)
    try:
        root_fd = os.open(f"{proc}/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        result.seen, result.why = False, f"cannot open {proc}/{pid}/root: {_errno(exc)}"
        return result
    try:
        text = ""
        with contextlib.suppress(OSError):
            text = Path(f"{proc}/{pid}/mountinfo").read_text(encoding="utf-8", errors="replace")
        mounts = dict(parse_mountinfo(text))
        if not mounts:
            result.not_covered.append(
                "the view's mount table was unreadable: pseudo file systems skipped by path "
                "only, and no directory pruned as the host's own"
            )
        # Without the host's root to compare with, nothing is pruned (`_Walker.prune_reason`).
        host_fd = -1
        with contextlib.suppress(OSError):
            if prune:
                host_fd = os.open(host_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            walker = _Walker(
                pid, root_fd, host_fd, bounds, mounts, tuple(known), result, start + bounds.seconds
            )
            walker.run()
        finally:
            if host_fd >= 0:
                os.close(host_fd)
    finally:
        os.close(root_fd)
    if walker.too_deep:
        result.not_covered.append(
            f"{len(walker.too_deep)} directories below depth {bounds.depth} not entered "
            f"({_examples(walker.too_deep)})"
        )
    if walker.unreadable:
        result.not_covered.append(
            f"{len(walker.unreadable)} directories unreadable ({_examples(walker.unreadable)})"
        )
    result.ms = round((time.monotonic() - start) * 1000, 1)
    return result


@dataclass(frozen=True)
class HostSocket:
    """One of the host's own sockets: where the host has it and what it is."""

    path: str
    kind: str  # witness / daemon / session / docker / host


def match_sockets(walk: ViewWalk, host: Mapping[Identity, HostSocket]) -> list[dict[str, Any]]:
    """Every socket in the view that is one of the host's, by (st_dev, st_ino), wherever it sits.

    Returns:
        [{"inside", "host", "kind", "dev", "ino"}], in inside-path order.
    """
    found = []
    for inside, ident in sorted(walk.sockets.items()):
        mine = host.get(ident)
        if mine is not None:
            found.append(
                {
                    "inside": inside,
                    "host": mine.path,
                    "kind": mine.kind,
                    "dev": ident[0],
                    "ino": ident[1],
                }
            )
    return found
