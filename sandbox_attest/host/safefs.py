"""Safe host filesystem: what the harness does as root under a path the payload user can change.

The harness runs as root beside hostile code, and the payload user (sandbox_attest/host/trust.py)
can rename, replace and re-point anything in the directories it may write: its home, the
workspace, the canary and witness directories it must reach unconfined, `/tmp`. A path-based
call (`Path.write_text`, `chmod`, `os.chown`, `mkdir`, `unlink`, `bind`) resolves the path
again at every call, so an entry swapped for a symlink between the harness's check and its use
turns a root write into a write wherever the link points (issue 23: `~/.ssh` re-pointed at
`/etc/cron.hourly`, a canary created there and chowned to the payload user).

So every such operation goes through directory descriptors here:
  1. a directory is opened once, from `/`, with no symlink on the way that anyone but root
     could change (`openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` where the kernel has it;
     a path through a link such as /var/run -> /run is walked again one
     `openat(O_NOFOLLOW | O_DIRECTORY)` per component, following only root's links in
     directories nobody else may write, or sticky ones: `_trusted_link`), and its
     (device, inode) kept;
  2. everything below it is one path component relative to that descriptor, never followed:
     `mkdirat`, `openat(O_CREAT | O_EXCL | O_NOFOLLOW)`, `unlinkat`, and `fchown`/`fchmod`
     on the descriptor the harness itself opened (an `O_PATH` descriptor's
     `/proc/self/fd/N` for a socket, whose inode no ordinary open reaches);
  3. what the harness made is remembered by identity, and removed only while the name still
     holds that identity: anything else found there is named, never followed, never removed
     unless the caller asks for it (and then without following it either).

What this module does not do: decide which paths are payload-reachable. The callers do. Paths
that only root can write need none of this, and are left path-based on purpose:
  - the report directory (sandbox_attest/report/files.py already writes it with
    `O_EXCL | O_NOFOLLOW` and an atomic rename; root-owned, 0755, made by the harness);
  - the harness's own scratch root and its `cells/` (root-owned, made fresh per run by the
    session, 0755: the payload user can traverse but not write them), hence each cell dir and
    its `input/` task files, which the harness writes before the payload starts and which the
    payload user can never rename (the payload's workspace, in the same cell dir, is handed
    over only after the harness has written into it: sandbox_attest/run/runner.py);
  - the world's run dir (sandbox_attest/world/core.py: root-owned 0711) and the sweep journal
    (root-owned 0700).
tests/unit/test_safefs_only.py lists every path-based call left in the package, each with the
reason only root can write there. The payload home's parent (/var/lib/agent) must be root's
and writable by nobody else; `trust._ensure_home` checks it, because a home whose parent the
user could write could itself be swapped.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Final, Self

from sandbox_attest.errors import FixtureError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = [
    "Identity",
    "SafeDir",
    "UnsafePathError",
    "chown_tree",
    "describe",
    "open_dir",
    "openat2_supported",
]

# openat2(2): the same number on x86_64 and aarch64 (it is one of the syscalls numbered
# alike on every architecture since 5.x); elsewhere the per-component fallback is used.
_SYS_OPENAT2: Final = 437
_OPENAT2_MACHINES: Final = frozenset({"x86_64", "aarch64", "arm64"})
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04
RESOLVE_BENEATH: Final = 0x08
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_PATH: an open that does not need read permission nor opens a FIFO or a device, so the
# harness can look at (and chmod through /proc) whatever the payload left at a name.
_O_PATH: Final = getattr(os, "O_PATH", 0)
# How `_at` looks at an entry: O_PATH where there is one (Linux); elsewhere a non-blocking
# read-only open, so a FIFO cannot hang the harness (a socket then cannot be opened at all).
_LOOK_FLAGS: Final = (_O_PATH or os.O_RDONLY | os.O_NONBLOCK) | os.O_NOFOLLOW | os.O_CLOEXEC
# Symlinks followed on the way to a directory (only trusted ones: `_trusted_link`), as the
# kernel's own limit for one path (MAXSYMLINKS).
_MAX_HOPS: Final = 40


def _fchmod(fd: int, mode: int) -> None:
    """Chmod the inode `fd` holds, never a path.

    Through /proc/self/fd for an O_PATH descriptor (Linux: fchmod refuses those): the kernel
    resolves that magic link to the descriptor's inode.
    """
    if _O_PATH:
        os.chmod(f"/proc/self/fd/{fd}", mode)  # noqa: PTH101  (an fd's magic link, not a path)
    else:
        os.fchmod(fd, mode)


def _fchown(fd: int, owner: tuple[int, int]) -> None:
    """Chown the inode `fd` holds, never a path (see `_fchmod`)."""
    if _O_PATH:
        os.chown(f"/proc/self/fd/{fd}", *owner)
    else:
        os.fchown(fd, *owner)


class UnsafePathError(FixtureError):
    """A payload-reachable path was not what the harness made (a symlink, a swapped entry).

    The harness refuses to follow or touch it; the message names the path, what was found
    there and, for a symlink, where it points.
    """


Identity = tuple[int, int]  # (st_dev, st_ino)


def _identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino)


def _kind(mode: int) -> str:
    for test, word in (
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISREG, "file"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return word
    return "unknown object"


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


_openat2_state: dict[str, bool] = {}


def openat2_supported() -> bool:
    """Whether this kernel and machine give `openat2` (probed once; ENOSYS means no)."""
    if "ok" not in _openat2_state:
        ok = False
        if os.name == "posix" and platform.machine() in _OPENAT2_MACHINES:
            try:
                fd = _openat2(-100, "/", _DIR_FLAGS, RESOLVE_NO_SYMLINKS)  # -100: AT_FDCWD
            except OSError as exc:
                ok = exc.errno not in (errno.ENOSYS, errno.EPERM)  # EPERM: a seccomp filter
            else:
                os.close(fd)
                ok = True
        _openat2_state["ok"] = ok
    return _openat2_state["ok"]


def _openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags=flags, mode=0, resolve=resolve)
    fd = int(
        libc.syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def describe(dir_fd: int, name: str, shown: str) -> str:
    """What is at `name` under `dir_fd`, in words, for an error: "a symlink (to /etc)"."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return f"{shown} cannot be looked at ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return f"{shown} is a symlink (to {target})"
    return f"{shown} is a {_kind(st.st_mode)} owned by uid {st.st_uid}"


def _refusal(dir_fd: int, name: str, shown: str, wanted: str) -> UnsafePathError:
    return UnsafePathError(
        f"{describe(dir_fd, name, shown)}, not {wanted}; refusing to follow it (whoever "
        "can write the directory above it, the payload user included, can plant such a link "
        "to turn the harness's root writes elsewhere: remove it, and find out who made it)"
    )


def _components(path: Path) -> list[str]:
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        msg = f"safefs needs an absolute path, got {path}"
        raise ValueError(msg)
    parts = list(pure.parts[1:])
    if ".." in parts:
        msg = f"safefs refuses '..' in {path}: name the directory itself"
        raise ValueError(msg)
    return parts


def _trusted_link(dir_fd: int, link: os.stat_result) -> bool:
    """Whether a symlink is one no other user can change, so following it is safe.

    The link must be root's (or the harness's own) and sit in a directory of the same owners
    that nobody else may write, or a sticky one (/tmp: only an entry's owner may replace it).
    This is what lets `/var/run -> /run` or macOS's `/tmp -> private/tmp` be followed while a
    link the payload user planted in its home or in /tmp never is.
    """
    mine = {0, os.geteuid()}
    here = os.fstat(dir_fd)
    if link.st_uid not in mine or here.st_uid not in mine:
        return False
    return not here.st_mode & 0o022 or bool(here.st_mode & stat.S_ISVTX)


class _Walk:
    """One walk's descriptors: the directory reached so far and those above it (for "..")."""

    def __init__(self) -> None:
        self.fd = os.open("/", _DIR_FLAGS)
        self.above: list[int] = []

    def close(self) -> None:
        for fd in (*self.above, self.fd):
            if fd >= 0:
                os.close(fd)
        self.above, self.fd = [], -1

    def restart(self) -> None:
        """Back to `/`, for an absolute link target."""
        self.close()
        self.fd = os.open("/", _DIR_FLAGS)

    def up(self) -> None:
        """A link target's "..": the directory above, never above `/`."""
        if self.above:
            os.close(self.fd)
            self.fd = self.above.pop()

    def step(self, part: str, shown: Path, hops: int) -> str | None:
        """Enter `part`: None when entered, or the target of the trusted link it is.

        Raises:
            UnsafePathError: `part` is a link someone else could change, or not a directory.
        """
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = os.stat(part, dir_fd=self.fd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode) or not _trusted_link(self.fd, st) or hops >= _MAX_HOPS:
                raise _refusal(self.fd, part, str(shown / part), "a directory") from exc
            return os.readlink(part, dir_fd=self.fd)
        self.above.append(self.fd)
        self.fd = child
        return None

    def take(self) -> int:
        """The descriptor reached; everything else is closed."""
        fd, self.fd = self.fd, -1
        self.close()
        return fd


def _walk(parts: list[str]) -> int:
    """One `openat(O_NOFOLLOW | O_DIRECTORY)` per component from `/`; trusted links followed."""
    walk = _Walk()
    pending, hops, shown = list(parts), 0, Path("/")
    try:
        while pending:
            part = pending.pop(0)
            if part == "..":
                walk.up()
                continue
            if part in ("", "."):
                continue
            target = walk.step(part, shown, hops)
            if target is None:
                shown /= part
                continue
            hops += 1
            if target.startswith("/"):
                walk.restart()
            pending = [p for p in target.split("/") if p] + pending
    except BaseException:
        walk.close()
        raise
    return walk.take()


def _open_dir_fd(path: Path) -> int:
    """A descriptor of the directory `path`, reached from `/` through no untrusted symlink.

    `openat2(RESOLVE_NO_SYMLINKS)` first, where the kernel has it: one call, no link at all.
    A path that holds a link (`/var/run/...`) is walked again one component at a time, and a
    link is followed only when no other user can change it (`_trusted_link`).
    """
    parts = _components(path)
    if parts and openat2_supported():
        root = os.open("/", _DIR_FLAGS)
        try:
            return _openat2(
                root,
                "/".join(parts),
                _DIR_FLAGS,
                RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
            )
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
                raise
        finally:
            os.close(root)
    return _walk(parts)


def open_dir(path: Path, *, shown: str | None = None) -> SafeDir:
    """Open the directory `path` with no symlink anywhere on the way, as a `SafeDir`.

    Args:
        path: an absolute path without `..`.
        shown: how messages name it ("~/.ssh under the payload home"); default the path.

    Raises:
        UnsafePathError: a component is a symlink or not a directory (named, with its target).
        OSError: it does not exist, or cannot be opened.
    """
    fd = _open_dir_fd(path)
    return SafeDir(fd, Path(path), _identity(os.fstat(fd)), shown or str(path))


@dataclass
class SafeDir:
    """An open directory descriptor, the identity it had when opened, and its path for messages.

    No public constructor: get one from `open_dir`, or from `SafeDir.mkdir`/`open_subdir` for
    a child. Every method takes one path component (no `/`) and never follows a symlink
    there. What it made is remembered (`made`: name -> identity) so that `unlink` and
    `rmtree` remove only that. Close it (it is a context manager) when done.

    What it does not do: keep the payload user out. It only makes sure that whatever the
    user did to these names, the harness acts on the objects it opened or made, or refuses.
    """

    fd: int
    path: Path
    ident: Identity
    shown: str
    made: dict[str, Identity] = field(default_factory=dict)
    children: dict[str, SafeDir] = field(default_factory=dict)

    def __enter__(self) -> Self:
        """The directory itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the descriptors (the children's too)."""
        self.close()

    def close(self) -> None:
        """Close this descriptor and every child's; idempotent."""
        for child in self.children.values():
            child.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _name(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            msg = f"safefs takes one path component, got {name!r} under {self.path}"
            raise ValueError(msg)
        return name

    def _shown(self, name: str) -> str:
        return f"{self.shown.rstrip('/')}/{name}"

    def identity(self) -> Identity:
        """The (device, inode) this directory had when the harness opened or made it."""
        return self.ident

    def entry(self, name: str) -> os.stat_result | None:
        """The lstat of `name` here (never followed), or None when nothing is there."""
        try:
            return os.stat(self._name(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def still_same(self) -> str:
        """Whether `self.path`, resolved afresh with no symlink, is still this directory.

        Returns:
            "" or a phrase naming what the path is now ("... is a symlink (to /etc)").
        """
        try:
            fd = _open_dir_fd(self.path)
        except UnsafePathError as exc:
            return str(exc)
        except OSError as exc:
            return f"{self.shown} cannot be opened again: {exc.strerror}"
        try:
            now = _identity(os.fstat(fd))
        finally:
            os.close(fd)
        if now != self.ident:
            return (
                f"{self.shown} is another directory now (inode {now[1]}, the harness made or "
                f"opened inode {self.ident[1]})"
            )
        return ""

    def open_subdir(self, name: str, *, shown: str | None = None) -> SafeDir:
        """The directory `name` here, opened without following a symlink.

        Raises:
            UnsafePathError: `name` is a symlink or not a directory.
        """
        try:
            fd = os.open(self._name(name), _DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refusal(self.fd, name, shown or self._shown(name), "a directory") from exc
            raise
        child = SafeDir(fd, self.path / name, _identity(os.fstat(fd)), shown or self._shown(name))
        old = self.children.pop(name, None)
        if old is not None:
            old.close()
        self.children[name] = child
        return child

    def mkdir(
        self,
        name: str,
        mode: int = 0o755,
        owner: tuple[int, int] | None = None,
        *,
        shown: str | None = None,
    ) -> SafeDir:
        """Make the directory `name` here (it must not exist) and open it.

        The mode is set with `fchmod` on the new descriptor (never left to the umask) and the
        owner with `fchown`, so both land on the directory the harness made.

        Raises:
            FileExistsError: something is already at `name` (a symlink included).
            UnsafePathError: `name` was swapped between the mkdir and the open.
        """
        os.mkdir(self._name(name), 0o700, dir_fd=self.fd)
        child = self.open_subdir(name, shown=shown)
        st = os.fstat(child.fd)
        if st.st_uid != os.geteuid():
            raise UnsafePathError(
                f"{child.shown} was swapped right after the harness made it (now owned by uid "
                f"{st.st_uid}); refusing to use it"
            )
        os.fchmod(child.fd, mode)
        if owner is not None:
            os.fchown(child.fd, *owner)
        self.made[name] = child.ident
        return child

    def create_file(
        self,
        name: str,
        data: bytes | str,
        mode: int = 0o644,
        owner: tuple[int, int] | None = None,
    ) -> Identity:
        """Create the file `name` here (`O_EXCL | O_NOFOLLOW`), write `data`, set mode/owner.

        Returns:
            The new file's identity (also kept in `made`).

        Raises:
            FileExistsError: something (a symlink included) is at `name` already.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self._name(name), flags, 0o600, dir_fd=self.fd)
        try:
            os.fchmod(fd, mode)
            payload = data.encode() if isinstance(data, str) else data
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if owner is not None:
                os.fchown(fd, *owner)
            ident = _identity(os.fstat(fd))
        finally:
            os.close(fd)
        self.made[name] = ident
        return ident

    def open_file(self, name: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of the regular file `name` here, never through a symlink.

        Opened non-blocking first, so a FIFO the payload left cannot hang the harness, and
        refused unless it is a regular file. The caller closes it.

        Raises:
            UnsafePathError: `name` is a symlink, a FIFO, a device or a directory.
        """
        base = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(self._name(name), base, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refusal(self.fd, name, self._shown(name), "a file") from exc
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            err = _refusal(self.fd, name, self._shown(name), "a regular file")
            os.close(fd)
            raise err
        os.set_blocking(fd, True)
        return fd

    def read_bytes(self, name: str, limit: int = 1 << 20) -> bytes:
        """The bytes of the regular file `name` here (at most `limit`), never through a link."""
        fd = self.open_file(name)
        try:
            chunks, size = [], 0
            while size < limit:
                chunk = os.read(fd, min(65536, limit - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _at(self, name: str, expect: Identity | None) -> Iterator[tuple[int, os.stat_result]]:
        """An O_PATH descriptor of the non-symlink `name` here (of identity `expect`)."""
        try:
            fd = os.open(self._name(name), _LOOK_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refusal(self.fd, name, self._shown(name), "what the harness made") from exc
            raise
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                raise _refusal(self.fd, name, self._shown(name), "what the harness made")
            if expect is not None and _identity(st) != expect:
                raise UnsafePathError(
                    f"{self._shown(name)} is another {_kind(st.st_mode)} now (inode "
                    f"{st.st_ino}, uid {st.st_uid}), not the one the harness made; refusing "
                    "to touch it"
                )
            yield fd, st
        finally:
            os.close(fd)

    def chmod(self, name: str, mode: int, *, expect: Identity | None = None) -> None:
        """Set the mode of `name` here (a file, dir or socket), never through a symlink.

        Through `/proc/self/fd/N` of an O_PATH descriptor: the kernel resolves that magic
        link to the inode the descriptor holds, which a later swap of `name` cannot change.
        """
        with self._at(name, expect) as (fd, _):
            _fchmod(fd, mode)

    def chown(self, name: str, owner: tuple[int, int], *, expect: Identity | None = None) -> None:
        """Set the owner of `name` here, never through a symlink (see `chmod`)."""
        with self._at(name, expect) as (fd, _):
            _fchown(fd, owner)

    def unlink(self, name: str, *, expect: Identity | None = None) -> bool:
        """Remove the non-directory `name` here if it is (still) what the harness made.

        Args:
            name: one path component here.
            expect: the identity it must have; default the one kept in `made`, else any.

        Returns:
            True when removed, False when nothing was there.

        Raises:
            UnsafePathError: something else is there now (named; left in place).
        """
        want = expect if expect is not None else self.made.get(name)
        st = self.entry(name)
        if st is None:
            self.made.pop(name, None)
            return False
        if stat.S_ISDIR(st.st_mode) or (want is not None and _identity(st) != want):
            raise UnsafePathError(
                f"{describe(self.fd, name, self._shown(name))}, not the file the harness made "
                f"there; leaving it in place"
            )
        os.unlink(name, dir_fd=self.fd)
        self.made.pop(name, None)
        return True

    def rmdir(self, name: str, *, expect: Identity | None = None) -> bool:
        """Remove the empty directory `name` if it is (still) the one the harness made.

        Returns:
            True when removed; False when it was gone or is not empty (then kept).
        """
        want = expect if expect is not None else self.made.get(name)
        st = self.entry(name)
        if st is None:
            return False
        if not stat.S_ISDIR(st.st_mode) or (want is not None and _identity(st) != want):
            raise UnsafePathError(
                f"{describe(self.fd, name, self._shown(name))}, not the directory the harness "
                "made there; leaving it in place"
            )
        try:
            os.rmdir(name, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        self.made.pop(name, None)
        child = self.children.pop(name, None)
        if child is not None:
            child.close()
        return True

    def rmtree(
        self,
        name: str,
        made: Mapping[str, Identity] | None = None,
        *,
        also_foreign: bool = False,
    ) -> list[str]:
        """Remove the directory `name` and what the harness made in it, by identity.

        Args:
            name: a directory here that the harness made.
            made: relative path (from this directory, "name/sub/file") -> identity of every
                object the harness made; default what this SafeDir and its children kept.
            also_foreign: remove entries the harness did not make too (a nonce file a payload
                wrote in a canary dir); still through descriptors, never following a link.

        Returns:
            What was found that the harness did not make, one phrase each; with
            `also_foreign` False those are left in place, and so are the directories
            holding them. A `name` that is itself not what the harness made is named and
            left whole.
        """
        known = dict(made) if made is not None else self._made_tree()
        st = self.entry(name)
        if st is None:
            return []
        want = known.get(name)
        if not stat.S_ISDIR(st.st_mode) or want is None or _identity(st) != want:
            return [f"{describe(self.fd, name, self._shown(name))}, not what the harness made"]
        foreign: list[str] = []
        child = self.open_subdir(name)
        try:
            if child.ident != want:
                return [f"{child.shown} was swapped while opened; left in place"]
            child._rm_contents(name, known, foreign, also_foreign=also_foreign)  # noqa: SLF001  (SafeDir's own module)
        finally:
            self.children.pop(name, None)
            child.close()
        with contextlib.suppress(UnsafePathError):
            self.rmdir(name, expect=want)
        return foreign

    def _made_tree(self, prefix: str = "") -> dict[str, Identity]:
        out = {f"{prefix}{k}": v for k, v in self.made.items()}
        for name, child in self.children.items():
            out |= child._made_tree(f"{prefix}{name}/")  # noqa: SLF001  (SafeDir's own module)
        return out

    def _rm_contents(
        self, rel: str, known: Mapping[str, Identity], foreign: list[str], *, also_foreign: bool
    ) -> None:
        for name in sorted(os.listdir(self.fd)):  # noqa: PTH208  (a descriptor, not a path)
            st = self.entry(name)
            if st is None:
                continue
            path = f"{rel}/{name}"
            ours = known.get(path) == _identity(st)
            if not ours:
                foreign.append(describe(self.fd, name, self._shown(name)))
                if not also_foreign:
                    continue
            if stat.S_ISDIR(st.st_mode):
                child = self.open_subdir(name)
                try:
                    child._rm_contents(path, known, foreign, also_foreign=also_foreign)  # noqa: SLF001  (SafeDir's own module)
                finally:
                    self.children.pop(name, None)
                    child.close()
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=self.fd)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=self.fd)


def chown_tree(directory: SafeDir, owner: tuple[int, int], *, only_uid: int | None = None) -> int:
    """Give `directory` and everything under it to `owner`, through descriptors only.

    Entries are looked at with O_PATH and no-follow, and changed through `/proc/self/fd/N`,
    so an entry swapped for a symlink (or its parent for one) during the walk is never
    followed out of the tree. A non-directory with more than one link is skipped: it may be
    a hard link the payload user made to a file it does not own (fs.protected_hardlinks=0).

    Args:
        directory: the top, already opened safely (its own owner changes too).
        owner: (uid, gid).
        only_uid: change only entries owned by this uid (the harness's): what the payload
            user or anyone else owns is not the harness's to give.

    Returns:
        How many objects changed owner.
    """
    count = 0
    st = os.fstat(directory.fd)
    if only_uid is None or st.st_uid == only_uid:
        os.fchown(directory.fd, *owner)
        count += 1
    for name in os.listdir(directory.fd):  # noqa: PTH208  (a descriptor, not a path)
        try:
            with directory._at(name, None) as (fd, entry):  # noqa: SLF001  (SafeDir's own module)
                if stat.S_ISDIR(entry.st_mode):
                    pass  # walked below, through its own descriptor
                elif entry.st_nlink > 1 or (only_uid is not None and entry.st_uid != only_uid):
                    continue
                else:
                    _fchown(fd, owner)
                    count += 1
                    continue
        except (UnsafePathError, FileNotFoundError):
            # A symlink is left as it is: its own owner matters to nobody, and following it
            # is the attack. An entry gone meanwhile needs nothing.
            continue
        try:
            child = directory.open_subdir(name)
        except (UnsafePathError, FileNotFoundError):
            continue
        try:
            count += chown_tree(child, owner, only_uid=only_uid)
        finally:
            directory.children.pop(name, None)
            child.close()
    return count


def walk_made(directory: SafeDir) -> Iterator[tuple[str, Identity]]:
    """Every (relative path, identity) `directory` and its open children made."""
    yield from directory._made_tree().items()  # noqa: SLF001  (SafeDir's own module)
