"""Safe writes into a report directory: only the harness writes there, and never through a link.

Issue 12 (b): a helper left behind by a wrapper planted `<report>/evidence.json.tmp` as a
symlink to a FIFO; the writer wrote through it, renamed the link over `evidence.json`, and the
signer re-read the helper's all-PASS copy. Every write here is therefore

  1. relative to a directory descriptor opened with `O_DIRECTORY | O_NOFOLLOW`, so a link
     swapped in for the directory after the checks is not followed;
  2. into a new file `<name>.<random>.tmp` created with `O_CREAT | O_EXCL | O_NOFOLLOW`, so
     a planted file or link of that name makes the open fail instead of being written through;
  3. fsynced, then renamed over `<name>` within that directory: rename replaces a planted link
     at the final name, it never follows it.

The directory itself is created 0700 and must belong to the harness's euid, so the payload
uid cannot plant anything in it in the first place; the steps above hold even where it could.
What this does not do: it does not protect the parents of the report directory. A directory
above it that another user can write lets that user rename the whole report away.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from sandbox_attest.errors import ConfigError, ReportError

# Windows has neither flag: a missing flag is 0, which keeps the other guarantees.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# A directory the harness owns and only it can write: nobody else may plant a file there.
DIR_MODE = 0o700
FIX_OUT = "pass a new or empty directory"

# The files of a report directory a person reads. `sandbox_attest.attest.subjects` names
# which of them a signature covers; they are named here, below it, so the renderers
# (`report/build.py`) and the signer agree on the names without the views importing `attest`.
EVIDENCE = "evidence.json"
JUNIT = "junit.xml"
HTML = "report.html"
SUMMARY = "summary.md"
# Every FAIL cell as SARIF 2.1.0 for code scanning (sandbox_attest/report/sarif.py): what it says
# is signed like the rest, so an upload cannot show escapes the signed gate does not.
SARIF = "results.sarif"
ALLURE_DIR = "allure-results"


def _euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def _check_dir_stat(path: Path, info: os.stat_result) -> None:
    """The directory is a real directory of the harness's euid that no one else can write."""
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{path} is not a directory; {FIX_OUT}")
    euid = _euid()
    if euid is not None and info.st_uid != euid:
        raise ConfigError(
            f"{path} belongs to uid {info.st_uid}, not to the harness (uid {euid}), so another "
            f"user could plant files in the report; {FIX_OUT}"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise ConfigError(
            f"{path} is writable by group or others (mode {mode:o}), so another user could "
            f"plant files in the report; {FIX_OUT}"
        )


def open_report_dir(path: Path) -> int:
    """Open an existing report directory for the safe writes below; the caller closes the fd.

    The directory is checked on the descriptor (not by name, so the check and the use see the
    same inode) and tightened to 0700.

    Args:
        path: the report directory; the last component must not be a symlink.

    Returns:
        A descriptor opened with `O_DIRECTORY | O_NOFOLLOW`.

    Raises:
        ConfigError: missing, a symlink, not a directory, someone else's, or writable by
            group or others; the message names the fix.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except OSError as exc:
        why = "is a symlink" if path.is_symlink() else f"cannot be opened ({exc.strerror})"
        raise ConfigError(f"{path} (the report directory) {why}; {FIX_OUT}") from exc
    try:
        _check_dir_stat(path, os.fstat(fd))
        if hasattr(os, "fchmod"):
            os.fchmod(fd, DIR_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create(path: Path) -> None:
    """Create the directory 0700 (parents as needed); an existing one is left to the checks."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=DIR_MODE)
    except FileExistsError:
        if not path.is_symlink() and not path.is_dir():
            raise ConfigError(
                f"{path}: cannot create the report directory there (a file of that name "
                f"exists); {FIX_OUT} path"
            ) from None
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot create the report directory there ({exc.strerror}); {FIX_OUT} path"
        ) from exc


def make_report_dir(path: Path) -> Path:
    """Create the report directory 0700, or accept an existing one only if it is empty.

    Parents are created as needed (with the usual umask); the directory itself gets 0700. An
    existing one must be empty, not a symlink, the harness euid's, and not writable by group
    or others: files already there were not written by this run, and a signature must not
    cover or sit beside them.

    Returns:
        `path`.

    Raises:
        ConfigError: the path cannot be created, or an existing one fails the checks above.
    """
    _create(path)
    fd = open_report_dir(path)
    try:
        left = sorted(os.listdir(fd))  # noqa: PTH208  (listed through the checked fd)
    finally:
        os.close(fd)
    if left:
        raise ConfigError(
            f"{path} is not empty (it holds {', '.join(left[:3])}"
            f"{', ...' if len(left) > 3 else ''}); {FIX_OUT} for each run"
        )
    return path


def ensure_report_dir(path: Path) -> int:
    """Open the report directory, creating it 0700 first if it does not exist yet.

    For a directory that other writers of this same run may have populated already
    (allure-pytest creates `allure-results/` at its start), so it need not be empty; use
    `make_report_dir` where a run begins.

    Returns:
        A descriptor from `open_report_dir`.

    Raises:
        ConfigError: as `open_report_dir`, or the directory cannot be created.
    """
    _create(path)
    return open_report_dir(path)


# Errors that mean "no room", whatever quota or size limit caused it.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_failure(directory: Path | str, name: str, exc: OSError) -> str:
    """What to tell the user when `name` could not be written into the report `directory`.

    A full filesystem (ENOSPC, or EDQUOT for a quota) gets its own message with the fix: a
    run that fills its disk must say so, not crash with a traceback, and must not pretend
    its report is whole. The files already written there are left alone.
    """
    if exc.errno in _FULL:
        code = errno.errorcode.get(exc.errno or 0, "ENOSPC")
        return (
            f"cannot write {name} in the report directory {directory}: its filesystem is full "
            f"({code}: {exc.strerror}); what was written there before is kept. Free space "
            "there, or rerun with --out on a filesystem with room"
        )
    return f"cannot write {name} in the report directory {directory}: {exc.strerror or exc}"


def _dir_name(dir_fd: int) -> str:
    """The path of the directory behind `dir_fd`, for messages (Linux); else a placeholder."""
    try:
        return str(Path(f"/proc/self/fd/{dir_fd}").readlink())
    except OSError:
        return "(the --out directory)"


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ValueError(f"{name!r} is not a plain file name inside the report directory")


def write_new(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Write `data` as `<dir>/<name>`: new temp file, fsync, rename (see the module docstring).

    Readers see the old file or the whole new one, never a partial one, and never a file
    someone else planted: a symlink or FIFO at `name` is replaced, not followed.

    Args:
        dir_fd: from `open_report_dir`.
        name: a plain file name (no slash).
        data: the exact bytes.
        mode: the file's permission bits (set exactly, whatever the umask).

    Raises:
        ReportError: the file could not be written; the message names it.
    """
    _check_name(name)
    tmp = f"{name}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise ReportError(write_failure(_dir_name(dir_fd), tmp, exc)) from exc
    try:
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, mode)  # the umask must not decide who can read a report file
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        _unlink_quietly(dir_fd, tmp)
        raise ReportError(write_failure(_dir_name(dir_fd), name, exc)) from exc
    _fsync_dir(dir_fd)


def create_append(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """Create `<dir>/<name>` (it must not exist) and return an append-only descriptor to it.

    A journal is written through this descriptor for the whole run and never re-opened by
    name, so nothing planted or renamed at that name later receives its lines.

    Raises:
        ReportError: the name exists already (another run's journal, or a planted file).
    """
    _check_name(name)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except FileExistsError as exc:
        raise ReportError(
            f"the report directory already holds {name} (another run's, or planted); {FIX_OUT}"
        ) from exc
    except OSError as exc:
        raise ReportError(write_failure(_dir_name(dir_fd), name, exc)) from exc
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    return fd


def read_regular(dir_fd: int, name: str, *, limit: int = 1 << 30) -> bytes:
    """Read `<dir>/<name>` once, only if it is a regular file (not a link, FIFO or device).

    `O_NONBLOCK` keeps a planted FIFO from blocking the open; the type is checked on the
    opened descriptor.

    Raises:
        ReportError: missing, not a regular file, or larger than `limit`.
    """
    _check_name(name)
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise ReportError(f"cannot read {name} from the report directory ({exc.strerror})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ReportError(
                f"{name} in the report directory is not a regular file; it was planted "
                f"(re-run into a new --out directory)"
            )
        if info.st_size > limit:
            raise ReportError(f"{name} is {info.st_size} bytes, over the {limit}-byte limit")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def dir_path(dir_fd: int, path: Path) -> Path:
    """A path that names the directory behind `dir_fd` itself where the OS offers one.

    On Linux `/proc/self/fd/N` resolves through the descriptor, so a directory renamed or
    replaced since it was opened is not the one read; elsewhere `path` is returned.
    """
    proc = Path(f"/proc/self/fd/{dir_fd}")
    return proc if proc.is_dir() else path


def _unlink_quietly(dir_fd: int, name: str) -> None:
    # Best effort: the temp name is random, so a leftover harms nothing.
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def _fsync_dir(dir_fd: int) -> None:
    # The rename is durable only once the directory entry is; some filesystems refuse fsync on
    # a directory descriptor, and then the file data is still safe.
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)
