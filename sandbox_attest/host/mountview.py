"""Which host directories a process's mounts expose, and where it sees them (issue 26).

A sandbox may mount a host directory anywhere in the payload's view: the payload user's home
at `/home/agent`, the host's `/var/tmp` at `/host/var-tmp`. Looking for a host object at its
host path finds none of these. So the host reads the payload's `/proc/<pid>/mountinfo`
(every mount's point inside, the device its filesystem lives on, the root of that filesystem
it shows, its options and type) and maps each mount to a host directory by identity:

1. the host's own mounts (its `/proc/self/mountinfo`) of the same device, whose root holds
   the inside mount's root, name the candidate host directory: host mount point + the inside
   root relative to the host mount's root;
2. the candidate is believed only when its (st_dev, st_ino) equals that of the inside mount
   point, stat'ed through `/proc/<pid>/root/<mount point>` (the payload's root as the host
   sees it). Path names alone never map a mount.

A mount of a device the host mounts nowhere is the sandbox's own where that device is an
anonymous one (a fresh tmpfs, proc, mqueue: major 0) and not a FUSE filesystem; any other
(a block device the host does not mount, a FUSE mount that may serve host files, a candidate
whose identity does not match) is *unmapped*: the host cannot say what it exposes, and a
verdict must not rest on the payload's word about it.

Only reads: `/proc` files and `lstat`. Nothing here creates, changes or follows anything into
a place the payload user can change beyond a stat, whose answer is compared by identity.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

# The fields before the optional ones: mount id, parent id, major:minor, root, mount point,
# options (proc(5)).
_FIXED: Final = 6
# Filesystems whose anonymous device may still serve host files (bindfs, sshfs...).
_PASSING_THROUGH: Final = ("fuse",)
_OCTAL: Final = re.compile(r"\\([0-7]{3})")
# At most this many mounts are mapped (a view with more is cut, and the cut is said).
MAX_MOUNTS: Final = 400


def unescape(text: str) -> str:
    r"""A mountinfo path field as the path: `\040` is a space, `\011` a tab, `\134` a backslash."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


@dataclass(frozen=True)
class Mount:
    """One line of a mountinfo file (proc(5)), paths unescaped.

    Attributes:
        mount_id: the mount's id.
        parent_id: its parent mount's id.
        device: (major, minor) of the filesystem's device (st_dev of its files).
        root: the directory of that filesystem the mount shows, as a path within it.
        mount_point: where the mount sits, relative to the reading process's root.
        options: the per-mount options (`rw` or `ro` first).
        optional: the optional fields (`shared:N`, `master:N`...).
        fstype: the filesystem type (`ext4`, `tmpfs`, `fuse.bindfs`).
        source: the mount source (`/dev/sda1`, `tmpfs`).
        super_options: the superblock's options.
    """

    mount_id: int
    parent_id: int
    device: tuple[int, int]
    root: str
    mount_point: str
    options: tuple[str, ...]
    optional: tuple[str, ...]
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def writable(self) -> bool:
        """Whether writes through this mount reach its filesystem (rw mount and superblock)."""
        return "rw" in self.options and "ro" not in self.super_options

    @property
    def device_text(self) -> str:
        """`major:minor`."""
        return f"{self.device[0]}:{self.device[1]}"


def parse_line(line: str) -> Mount:
    """One mountinfo line as a Mount.

    Raises:
        ValueError: the line has not the shape proc(5) gives (no `-` separator, a short
            line, a device that is not `major:minor`).
    """
    fields = line.split()
    if len(fields) < _FIXED + 3 or "-" not in fields[_FIXED:]:
        msg = f"not a mountinfo line: {line!r}"
        raise ValueError(msg)
    sep = fields.index("-", _FIXED)
    after = fields[sep + 1 :]
    if len(after) < 2:  # fstype and source; super options may be empty
        msg = f"no filesystem type and source after the separator: {line!r}"
        raise ValueError(msg)
    major, _, minor = fields[2].partition(":")
    return Mount(
        mount_id=int(fields[0]),
        parent_id=int(fields[1]),
        device=(int(major), int(minor)),
        root=unescape(fields[3]),
        mount_point=unescape(fields[4]),
        options=tuple(fields[5].split(",")),
        optional=tuple(fields[_FIXED:sep]),
        fstype=unescape(after[0]),
        source=unescape(after[1]),
        super_options=tuple(after[2].split(",")) if len(after) > 2 else (),
    )


def parse(text: str) -> tuple[list[Mount], list[str]]:
    """Every mount in a mountinfo text, and the lines that are not mounts (named, not dropped)."""
    mounts: list[Mount] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            mounts.append(parse_line(line))
        except ValueError as exc:
            bad.append(str(exc))
    return mounts, bad


def _under(path: str, root: str) -> str | None:
    """`path` relative to `root` ("" when equal), or None when it is not at or under it."""
    if root == "/":
        return path.lstrip("/")
    if path == root:
        return ""
    if path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1 :]
    return None


def _join(base: str, rel: str) -> str:
    return str(PurePosixPath(base) / rel) if rel else base


def host_candidates(mount: Mount, host: list[Mount]) -> list[str]:
    """Host paths that may be `mount`'s directory: same device, a host root holding its root."""
    found: list[str] = []
    for own in host:
        if own.device != mount.device:
            continue
        rel = _under(mount.root, own.root)
        if rel is not None:
            path = _join(own.mount_point, rel)
            if path not in found:
                found.append(path)
    return found


Identity = tuple[int, int]


def identity(path: str) -> Identity | None:
    """(st_dev, st_ino) of `path` itself (a symlink at the name is not followed), or None."""
    try:
        # A str, not a Path: pathlib drops the trailing slash of `/proc/<pid>/root/`, and the
        # payload's root itself would then be the magic link's own inode.
        st = os.stat(path, follow_symlinks=False)  # noqa: PTH116
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def through_root(pid: int | str, inside: str) -> str:
    """The host's path to `inside` as process `pid` sees it (`/proc/<pid>/root/...`)."""
    return f"/proc/{pid}/root/{inside.lstrip('/')}"


@dataclass
class Mapped:
    """One inside mount and what the host found it to be.

    Attributes:
        mount: the inside mount.
        host_path: the host directory (or file) it shows, confirmed by identity; None if not.
        kind: "host" (mapped), "own" (the sandbox's own filesystem), "covered" (hidden under
            a later mount at the same point or above it), or "unmapped" (the host cannot say).
        why: how the host knows, or why it cannot.
    """

    mount: Mount
    host_path: str | None
    kind: str
    why: str

    def record(self) -> dict[str, Any]:
        """As evidence."""
        return {
            "inside": self.mount.mount_point,
            "device": self.mount.device_text,
            "root": self.mount.root,
            "fstype": self.mount.fstype,
            "rw": self.mount.writable,
            "host": self.host_path,
            "kind": self.kind,
            "why": self.why,
        }


@dataclass
class MountMap:
    """A process's mounts mapped to the host's (see the module docstring)."""

    pid: int | str
    mapped: list[Mapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Mapped]:
        """The mounts of one kind ("host", "own", "covered", "unmapped")."""
        return [m for m in self.mapped if m.kind == kind]

    def covering(self, inside: str) -> Mapped | None:
        """The mount that shows `inside` in the view: the deepest mount point, the last one."""
        best: Mapped | None = None
        depth = -1
        for entry in self.mapped:
            rel = _under(inside, entry.mount.mount_point)
            if rel is None:
                continue
            here = len(PurePosixPath(entry.mount.mount_point).parts)
            if here >= depth:
                best, depth = entry, here
        return best

    def inside_paths(self, host_path: str, want: Identity | None = None) -> list[str]:
        """Where `host_path` is in this view, other than at `host_path` itself, by identity.

        Each mapped mount whose host directory holds `host_path` gives an inside path
        (its mount point + the rest); it counts only when the mount showing that inside path
        is that mount, and when the object there, stat'ed through the process's root, is
        `want` (or the host's object at `host_path` when `want` is None).
        """
        want = want if want is not None else identity(host_path)
        if want is None:
            return []
        found: list[str] = []
        for entry in self.of_kind("host"):
            rel = _under(host_path, str(entry.host_path))
            if rel is None:
                continue
            inside = _join(entry.mount.mount_point, rel)
            if inside == host_path or inside in found or self.covering(inside) is not entry:
                continue
            if identity(through_root(self.pid, inside)) == want:
                found.append(inside)
        return found

    def record(self) -> dict[str, Any]:
        """As evidence: every mount with what it is, and the notes."""
        return {
            "pid": self.pid,
            "mounts": [m.record() for m in self.mapped],
            "notes": self.notes,
        }


def read_text(path: str) -> str | None:
    """A /proc file's text, or None when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None


def _classify(mount: Mount, host: list[Mount], above: set[str], pid: int | str) -> Mapped:
    candidates = host_candidates(mount, host)
    seen = identity(through_root(pid, mount.mount_point))
    for path in candidates:
        if seen is not None and identity(path) == seen:
            return Mapped(mount, path, "host", f"same (device, inode) as the host's {path}")
    if above:
        return Mapped(
            mount, None, "covered", f"hidden under a later mount at {', '.join(sorted(above))}"
        )
    if candidates:
        shown = ", ".join(candidates)
        return Mapped(
            mount,
            None,
            "unmapped",
            f"the host mounts device {mount.device_text} ({shown}), but no candidate has the "
            "inside mount point's (device, inode)",
        )
    if mount.device[0] == 0 and not mount.fstype.startswith(_PASSING_THROUGH):
        return Mapped(
            mount,
            None,
            "own",
            f"the sandbox's own {mount.fstype}: the host mounts no filesystem of its "
            f"anonymous device {mount.device_text}",
        )
    return Mapped(
        mount,
        None,
        "unmapped",
        f"the host cannot see device {mount.device_text} ({mount.fstype} {mount.source}): "
        "it mounts no filesystem of it",
    )


def map_mounts(pid: int | str, host_text: str | None = None) -> MountMap:
    """`pid`'s mounts mapped to the host's (its own `/proc/self/mountinfo` unless given)."""
    result = MountMap(pid)
    text = read_text(f"/proc/{pid}/mountinfo")
    if text is None:
        result.notes.append(f"/proc/{pid}/mountinfo could not be read")
        return result
    host_text = host_text if host_text is not None else read_text("/proc/self/mountinfo")
    mounts, bad = parse(text)
    host, host_bad = parse(host_text or "")
    result.notes += [f"payload mountinfo: {b}" for b in bad]
    result.notes += [f"host mountinfo: {b}" for b in host_bad]
    if len(mounts) > MAX_MOUNTS:
        result.notes.append(f"{len(mounts)} mounts, only the first {MAX_MOUNTS} mapped")
    mounts = mounts[:MAX_MOUNTS]
    for index, mount in enumerate(mounts):
        # A later mount at the same point or above it (bwrap's --dev /dev over a /dev/shm that
        # came with a recursive bind of /) hides this one from the view.
        later = {
            m.mount_point
            for m in mounts[index + 1 :]
            if _under(mount.mount_point, m.mount_point) is not None
        }
        mapped = _classify(mount, host, later, pid)
        if host_bad and mapped.kind == "own":
            # A host mount of that device may be on a line that could not be read.
            mapped.kind = "unmapped"
            mapped.why += ", but some lines of the host's mountinfo could not be read"
        result.mapped.append(mapped)
    return result
