"""The journal: what a run is about to make, written before it makes it, for the next run's sweep.

A run plants files on the host (the world's scratch directory under /tmp, nonce-named
canaries in the payload user's home and in /tmp) and starts processes, cgroups and containers.
When it ends normally it removes them itself; SIGKILL leaves them. So, before it makes any of
them, a run writes a journal entry saying what it is about to make and who it is (pid, the
pid's start time, the boot), and removes the entry when the thing is gone. The next run's
sweep (`sandbox_attest.run.sweep`) acts on every entry whose owner is no longer that live
process. This is the record half, below everything that makes things (backends, the
catalogue, the cell groups); the sweep sits with the run that calls it.

Where the journal lives: `/var/lib/sandbox-attest/journal/` as root, else
`$XDG_STATE_HOME/sandbox-attest/journal/` (default `~/.local/state`), 0700 and the harness's
own, or `$SANDBOX_ATTEST_STATE_DIR/journal/`. It is the harness's, never the payload user's:
a payload that could write an entry could make the next run (as root) remove a path of its
choosing.

Also here: the cell dir's record of what a backend's own sweep killed after one cell's run
(`record_leftovers`), which the catalogue reads back.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from sandbox_attest.errors import ConfigError

STATE_ENV: Final = "SANDBOX_ATTEST_STATE_DIR"
ROOT_STATE_DIR: Final = Path("/var/lib/sandbox-attest")
JOURNAL: Final = "journal"


def state_dir() -> Path:
    """The harness's state directory (see the module docstring for which one)."""
    override = os.environ.get(STATE_ENV)
    if override:
        return Path(override)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return ROOT_STATE_DIR
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sandbox-attest"


def journal_dir() -> Path:
    """The journal directory, created 0700 and checked to be this user's alone.

    Raises:
        ConfigError: it exists but is a symlink, someone else's, or writable by others
            (the message names the path and the fix).
    """
    path = state_dir() / JOURNAL
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise ConfigError(
            f"the harness journal {path} is not a directory that only uid {os.geteuid()} "
            f"can write (mode {stat.filemode(info.st_mode)}, owner {info.st_uid}); remove it "
            f"or point ${STATE_ENV} elsewhere"
        )
    return path


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time since boot), or None if there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has finished; only its parent's wait is missing
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Owner:
    """A process, identified so that a reused pid is not mistaken for it.

    Get the current one from `Owner.current()`.
    """

    pid: int
    start: int | None
    boot: str

    @classmethod
    def current(cls) -> Owner:
        """This process."""
        return cls(os.getpid(), _start_ticks(os.getpid()), _boot_id())

    def alive(self) -> bool:
        """Whether this very process still runs (same boot, same pid, same start time)."""
        if self.boot != _boot_id():
            return False
        ticks = _start_ticks(self.pid)
        return ticks is not None and ticks == self.start


def record(key: str, paths: list[Path], *, dirs: tuple[Path, ...] = (), **facts: Any) -> Path:
    """Journal that this process is about to make `paths`; call before making them.

    Call it again with the same key to change the entry (a directory created after all).
    The write is atomic (a new file renamed over the old), so a SIGKILL leaves the old
    entry or the new one, never half of one.

    Args:
        key: unique per thing made (e.g. "canary-fs_read_secrets-<nonce>"); [A-Za-z0-9_.-].
        paths: files or directories to remove if the owner dies first.
        dirs: directories this process created to hold them: removed only if empty.
        **facts: more JSON facts for the sweep (e.g. `run_id`, `docker_run_ids`).

    Returns:
        The entry's path.

    Raises:
        ConfigError: the journal directory is unsafe (see `journal_dir`).
        ValueError: `key` has characters outside [A-Za-z0-9_.-].
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
        msg = f"journal key {key!r} must be made of [A-Za-z0-9_.-] only"
        raise ValueError(msg)
    directory = journal_dir()
    entry = {
        "owner": asdict(Owner.current()),
        "paths": [str(p) for p in paths],
        "dirs": [str(d) for d in dirs],
        "recorded_at": time.time(),
        **facts,
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(entry, handle)
        handle.flush()
        os.fsync(handle.fileno())
    target = directory / f"{key}.json"
    Path(tmp).replace(target)
    return target


def forget(key: str) -> None:
    """Remove the journal entry `key` (what it listed is gone); missing is fine."""
    with contextlib.suppress(FileNotFoundError):
        (journal_dir() / f"{key}.json").unlink()


def read_entry(entry: Path) -> dict[str, Any] | None:
    """A journal entry, parsed; None when it is unreadable or not a JSON object."""
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def entry_owner(data: dict[str, Any]) -> Owner | None:
    """Who wrote a parsed journal entry; None when its `owner` is missing or malformed."""
    raw = data.get("owner")
    if not isinstance(raw, dict):
        return None
    try:
        return Owner(int(raw["pid"]), raw.get("start"), str(raw.get("boot", "")))
    except (KeyError, TypeError, ValueError):
        return None


def live_entries() -> list[dict[str, Any]]:
    """Journal entries whose owner still runs (a concurrent run's), parsed."""
    out = []
    for entry in sorted(journal_dir().glob("*.json")):
        data = read_entry(entry)
        owner = entry_owner(data) if data is not None else None
        if data is not None and owner is not None and owner.alive():
            out.append(data)
    return out


def dead_entries() -> list[Path]:
    """Journal entries whose owner is gone (or unreadable): what the next sweep acts on.

    A soak (bench/soak.py) counts these as left behind; entries of live runs are not.
    """
    found = []
    for entry in sorted(journal_dir().glob("*.json")):
        data = read_entry(entry)
        owner = entry_owner(data) if data is not None else None
        if owner is None or not owner.alive():
            found.append(entry)
    return found


# What a backend's own sweep killed after one cell's run (sandbox_attest/backends/command/'s
# LeftoverWatcher), kept in the cell dir for the assessors: `lifecycle_orphans` counts each as
# an escape, since the sandbox let it outlive the payload and only the harness ended it. The
# cell dir is the harness's, never the payload user's, so the payload cannot write or hide it.
LEFTOVERS_FILE: Final = "leftovers.json"


def record_leftovers(cell_dir: Path, killed: dict[int, str]) -> None:
    """Record in `cell_dir` the processes a run's sweep killed (`pid -> "pid (command)"`).

    Nothing is written when nothing was killed. A symlink planted in its place is refused
    (O_NOFOLLOW), not followed.
    """
    if not killed:
        return
    body = json.dumps({"killed": {str(pid): what for pid, what in sorted(killed.items())}})
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(cell_dir / LEFTOVERS_FILE, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(body)


def recorded_leftovers(cell_dir: Path) -> list[str]:
    """What `record_leftovers` wrote for this cell, by pid; [] when nothing was killed."""
    try:
        data = json.loads((cell_dir / LEFTOVERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    killed = data.get("killed") if isinstance(data, dict) else None
    if not isinstance(killed, dict):
        return []
    return [str(v) for _, v in sorted(killed.items(), key=lambda kv: str(kv[0]))]
