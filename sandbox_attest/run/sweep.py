"""What a killed run left behind: a journal written before it is made, and the next run's sweep.

A run plants files on the host (the world's scratch directory under /tmp, nonce-named
canaries in the payload user's home and in /tmp) and starts processes and containers. When it
ends normally it removes them itself; SIGKILL leaves them. So, before it makes any of them, a
run writes a journal entry saying what it is about to make and who it is (pid, the pid's start
time, the boot), and removes the entry when the thing is gone. The next run starts with
`sweep()`: every entry whose owner is no longer that live process is acted on (its paths
removed, its empty created directories removed) and the entry deleted.

Never a live run's: an entry is swept only when its owner is provably gone (no such pid, or
a pid reused since, or another boot), so two concurrent runs never sweep each other. Things
no entry claims (left by a harness that predates the journal) are swept only when they are
the harness's by name and owner and have not changed for `STALE_AGE_S`: longer than any run.

Where the journal lives: `/var/lib/sandbox-attest/journal/` as root, else
`$XDG_STATE_HOME/sandbox-attest/journal/` (default `~/.local/state`), 0700 and the harness's
own, or `$SANDBOX_ATTEST_STATE_DIR/journal/`. It is the harness's, never the payload user's:
a payload that could write an entry could make the next run (as root) remove a path of its
choosing.

Why canaries still go into a home (issue 18, item 4): `fs_read_secrets` asks whether a sandbox
shows untrusted code the home it runs in, so the canaries must be where that home is. As root
it is the payload user's own home (`host.trust`), not a person's; without root it is the
harness user's real home, and the journal is what guarantees a killed run's fake secrets go.

What it does not do: it never kills a process that is not an orphaned anchor or proxy of the
harness (payloads that daemonize on purpose are a live cell's evidence), and it never removes
a docker container itself (`sandbox_attest.backends.docker.sweep_stale_containers` does, asked
here).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from sandbox_attest.errors import ConfigError
from sandbox_attest.host import cgroupfs, disguise
from sandbox_attest.host.safefs import UnsafePathError, open_dir

STATE_ENV: Final = "SANDBOX_ATTEST_STATE_DIR"
ROOT_STATE_DIR: Final = Path("/var/lib/sandbox-attest")
JOURNAL: Final = "journal"
# Longer than any run (the full matrix takes minutes): an unjournalled leftover older than this
# belongs to no live run, even one of a harness that predates the journal.
STALE_AGE_S: Final = 6 * 3600.0
# Names the harness gives what it plants in /tmp and homes (sandbox_attest.run.session,
# catalog.fs/host).
# A command wrapper's availability check works in `agent-check-*` (a neutral name: the wrapper
# sees it, issue 23), never journalled; a run's scratch (`agent-*`) is journalled instead.
# Each pattern takes the current names (sandbox_attest/host/disguise.py) and, for one release, the
# names before it (`sandbox-attest-*`), so a run interrupted before the upgrade is swept too.
_CANARY: Final = f"(?:{re.escape(disguise.CANARY_PREFIX)}|sandbox-attest-canary-)"
_LINK: Final = f"(?:{re.escape(disguise.LINK_PREFIX)}|sandbox-attest-link-)"
TMP_NAMES: Final = re.compile(rf"^({_CANARY}|{_LINK}|sandbox-attest-|agent-check-)[A-Za-z0-9_]+$")
HOME_NAMES: Final = re.compile(
    rf"^(?:{re.escape(disguise.HOME_CANARY_PREFIX)}|\.sandbox-attest-canary-)[A-Za-z0-9_-]+$"
)
SECRET_NAMES: Final = re.compile(rf"^{_CANARY}[A-Za-z0-9_-]+(\.json)?$")
# What a cell's payload leaves beside the egress route when a sandbox shows the host's run dir
# (probes/ipc_proxy_socket_tamper.py), and the socket witnesses
# (sandbox_attest.catalog.socket_witness): nonce-named, in the host's copy of the namespaced
# backends' run dir (sandbox_attest.backends.base.SANDBOX_RUN_DIR) and in /run and /tmp themselves.
_WITNESS: Final = f"(?:{re.escape(disguise.WITNESS_PREFIX)}|\\.sandbox-attest-witness-)"
RUN_DIR_NAMES: Final = re.compile(
    rf"^(rogue-n[0-9a-f]{{16}}\.sock|shim-n[0-9a-f]{{16}}\.py|{_WITNESS}n[0-9a-f]{{16}}\.sock)$"
)
RUN_DIRS: Final = (
    Path(disguise.SANDBOX_RUN_DIR),
    Path(disguise.LEGACY_RUN_DIR),
    Path("/run"),
)
# Processes the harness starts that must never outlive it, matched on their exact argv shape
# (not a substring: a shell or an editor whose command line mentions the marker is not one):
# an anchor is `python -c CODE kiln-idle:<nonce> ...` (sandbox_attest.catalog.proc, disguise), the
# proxy `python -m world.egress.proxy CONFIG` (sandbox_attest.world.egress.proxy.start_proxy).
ANCHOR_MARKER: Final = disguise.ANCHOR_MARKER.encode()
# An anchor a run before the rename left (for one release).
LEGACY_ANCHOR_MARKER: Final = disguise.LEGACY_ANCHOR_MARKER.encode()
# The package was called `harness` before it was `sandbox_attest`: a proxy orphaned by a run of
# that version is still the harness's, and the first run after an upgrade sweeps it too.
PROXY_MODULES: Final = (b"sandbox_attest.world.egress.proxy", b"harness.egress.proxy")
# A run's cgroup (sandbox_attest/run/cellgroup.py RUN_PREFIX): the only kind of directory the sweep
# kills in and removes from a journal entry's `cgroup`.
RUN_CGROUP_PREFIX: Final = disguise.RUN_CGROUP_PREFIX
# A run's cgroup named before the rename (for one release): the sweep still removes it.
RUN_CGROUP_PREFIXES: Final = (RUN_CGROUP_PREFIX, disguise.LEGACY_RUN_CGROUP_PREFIX)
# Once up, the proxy shows `python -m relay <tmp>/proxy-config-*.json` instead (a neutral
# title: sandbox_attest/host/proctitle.py, issue 23); the config's name tells it from another relay.
PROXY_TITLE_MODULE: Final = b"relay"
PROXY_CONFIG_PREFIX: Final = b"proxy-config-"


def is_harness_child(argv: list[bytes]) -> bool:
    """Whether a process's argv (from /proc/<pid>/cmdline) is an anchor's or the proxy's."""
    if len(argv) < 4 or b"python" not in Path(os.fsdecode(argv[0])).name.encode():
        return False
    anchor = argv[1] == b"-c" and argv[3].startswith((ANCHOR_MARKER, LEGACY_ANCHOR_MARKER))
    config = Path(os.fsdecode(argv[3])).name.encode()
    titled = argv[2] == PROXY_TITLE_MODULE and config.startswith(PROXY_CONFIG_PREFIX)
    proxy = argv[1] == b"-m" and (argv[2] in PROXY_MODULES or titled)
    return anchor or proxy


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


# What a backend's own sweep killed after one cell's run (sandbox_attest/backends/command.py's
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


@dataclass(frozen=True)
class Swept:
    """One thing a sweep removed (or could not), as the evidence lists it under `swept`."""

    what: str  # "path", "process", "cgroup", "container", "image", "journal"
    target: str
    why: str
    removed: bool = True

    def line(self) -> str:
        """The thing as one line for the run's output."""
        verb = "removed" if self.removed else "could NOT remove"
        return f"swept: {verb} {self.what} {self.target} ({self.why})"


def _remove_path(path: Path, why: str) -> Swept | None:
    """Remove a file or a directory tree without following symlinks; None if it is gone."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Swept("path", str(path), f"{why}; {exc}", removed=False)
    # Through the parent's descriptor, opened with no symlink on the way (sandbox_attest/
    # safefs.py): a journalled canary may sit in the payload user's home, and a parent swapped
    # for a symlink since then (even between a check and the removal) is refused, never
    # followed.
    try:
        with open_dir(path.parent) as parent:
            now = parent.entry(path.name)
            if now is None:
                return None
            ident = (now.st_dev, now.st_ino)
            if stat.S_ISDIR(now.st_mode):
                left = parent.rmtree(path.name, {path.name: ident}, also_foreign=True)
                if parent.entry(path.name) is not None:
                    kept = "; ".join(left) or "still there"
                    return Swept("path", str(path), f"{why}; not removed: {kept}", removed=False)
            else:
                parent.unlink(path.name, expect=ident)
    except (OSError, UnsafePathError) as exc:
        return Swept("path", str(path), f"{why}; {exc}", removed=False)
    del info  # looked at first only to tell "gone" from "unreadable"
    return Swept("path", str(path), why)


def _load(entry: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _owner_of(data: dict[str, Any]) -> Owner | None:
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
        data = _load(entry)
        owner = _owner_of(data) if data is not None else None
        if data is not None and owner is not None and owner.alive():
            out.append(data)
    return out


def dead_entries() -> list[Path]:
    """Journal entries whose owner is gone (or unreadable): what the next sweep acts on.

    A soak (bench/soak.py) counts these as left behind; entries of live runs are not.
    """
    found = []
    for entry in sorted(journal_dir().glob("*.json")):
        data = _load(entry)
        owner = _owner_of(data) if data is not None else None
        if owner is None or not owner.alive():
            found.append(entry)
    return found


def sweep_journal() -> tuple[list[Swept], set[str]]:
    """Act on every entry whose owner is gone, then delete the entry.

    Returns:
        What was removed, and the docker run ids that the dead runs had recorded.
    """
    swept: list[Swept] = []
    dead_docker: set[str] = set()
    for entry in sorted(journal_dir().glob("*.json")):
        data = _load(entry)
        owner = _owner_of(data) if data is not None else None
        if data is not None and owner is not None and owner.alive():
            continue
        why = (
            f"left by run {data.get('run_id', '?')}, pid {owner.pid}, which is gone"
            if data is not None and owner is not None
            else "an unreadable journal entry"
        )
        removed = (_remove_path(Path(str(raw)), why) for raw in (data or {}).get("paths", []))
        swept.extend(done for done in removed if done is not None)
        for raw in (data or {}).get("dirs", []):
            made = Path(str(raw))
            # Not empty (something else uses it) or not a plain dir under a safe path: kept.
            # Through the parent's descriptor: these dirs may sit in the payload user's home.
            with contextlib.suppress(OSError, UnsafePathError), open_dir(made.parent) as parent:
                if parent.rmdir(made.name):
                    swept.append(Swept("path", str(raw), f"{why}; an empty directory it made"))
        dead_docker.update(str(r) for r in (data or {}).get("docker_run_ids", []))
        if cgroup := (data or {}).get("cgroup"):
            done = _remove_run_cgroup(Path(str(cgroup)), why)
            swept.append(done)
            if not done.removed:
                continue  # keep the entry: the next sweep tries again
        entry.unlink(missing_ok=True)
    return swept, dead_docker


def _remove_run_cgroup(path: Path, why: str) -> Swept:
    """Kill what a dead run left in its cgroup (sandbox_attest/run/cellgroup.py), remove the groups.

    Only a directory that is a run's cgroup by name, on a cgroup2 mount, is touched: the
    journal is the harness's alone, but a path that is anything else is refused, not acted on.
    """
    if not path.name.startswith(RUN_CGROUP_PREFIXES) or not cgroupfs.on_cgroup2(path):
        return Swept("cgroup", str(path), f"{why}; not a run's cgroup on cgroup2", removed=False)
    members = cgroupfs.cgroup_members(path)
    notes = cgroupfs.remove_cgroup_tree(path)
    if notes:
        return Swept("cgroup", str(path), f"{why}; {'; '.join(notes)}", removed=False)
    killed = f"; killed {len(members)} process(es) left in it: {members}" if members else ""
    return Swept("cgroup", str(path), f"{why}{killed}")


def _claimed(live: list[dict[str, Any]]) -> set[str]:
    return {str(p) for data in live for p in [*data.get("paths", []), *data.get("dirs", [])]}


def _old(path: Path, now: float) -> bool:
    try:
        return now - path.lstat().st_mtime > STALE_AGE_S
    except OSError:
        return False


def unjournalled_candidates(
    tmp: Path, homes: list[Path], run_dirs: tuple[Path, ...] = RUN_DIRS
) -> list[Path]:
    """Harness-named things in `tmp`, `homes` and `run_dirs` (see the *_NAMES patterns)."""
    found: list[Path] = []
    with contextlib.suppress(OSError):
        found += [
            p for p in tmp.iterdir() if TMP_NAMES.match(p.name) or RUN_DIR_NAMES.match(p.name)
        ]
    for directory in run_dirs:
        with contextlib.suppress(OSError):
            found += [p for p in directory.iterdir() if RUN_DIR_NAMES.match(p.name)]
    for home in homes:
        with contextlib.suppress(OSError):
            found += [p for p in home.iterdir() if HOME_NAMES.match(p.name)]
        for sub in (".ssh", ".aws", ".docker"):
            with contextlib.suppress(OSError):
                found += [p for p in (home / sub).iterdir() if SECRET_NAMES.match(p.name)]
    return found


def sweep_unjournalled(
    tmp: Path,
    homes: list[Path],
    owners: set[int],
    *,
    now: float | None = None,
    run_dirs: tuple[Path, ...] = RUN_DIRS,
) -> list[Swept]:
    """Remove harness-named leftovers no live entry claims, owned by `owners`, untouched for long.

    Args:
        tmp: the host temp directory (/tmp).
        homes: homes where canaries are planted (the payload user's, or the harness user's).
        owners: uids whose files these may be (the harness's and the payload user's).
        now: the time to measure age from (tests pass one).
        run_dirs: where a leaky cell leaves nonce-named sockets and shims (RUN_DIR_NAMES).
    """
    now = time.time() if now is None else now
    claimed = _claimed(live_entries())
    swept = []
    for path in unjournalled_candidates(tmp, homes, run_dirs):
        try:
            uid = path.lstat().st_uid
        except OSError:
            continue
        if str(path) in claimed or uid not in owners or not _old(path, now):
            continue
        age = "no journal entry claims it and it is untouched for over 6 h"
        if (done := _remove_path(path, age)) is not None:
            swept.append(done)
    return swept


def _parent_is_python(pid: int) -> bool:
    """Whether the parent of `pid` is a Python interpreter (a live harness)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        ppid = int(raw.rsplit(")", 1)[1].split()[1])
        parent = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")[0]
    except (OSError, ValueError, IndexError):
        return False
    return ppid != 1 and b"python" in Path(os.fsdecode(parent)).name.encode()


def sweep_orphans() -> list[Swept]:
    """SIGKILL anchors and proxies of the harness that no live harness parents any more.

    A live run's anchor or proxy is the child of its harness (a Python process); once the
    harness is gone they are re-parented to init or a subreaper. `PR_SET_PDEATHSIG` makes
    this all but impossible (sandbox_attest/host/lifetime.py); this is the net under it.
    """
    swept = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            raw = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        pid = int(proc.name)
        if not is_harness_child(raw.split(b"\0")) or _parent_is_python(pid):
            continue
        shown = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as exc:
            swept.append(Swept("process", f"{pid} ({shown})", f"orphaned; {exc}", removed=False))
        else:
            swept.append(Swept("process", f"{pid} ({shown})", "orphaned by a run that is gone"))
    return swept


def sweep(*, homes: list[Path], owners: set[int], docker: bool = False) -> list[Swept]:
    """The next run's sweep of what killed runs left: journal, unjournalled files, processes.

    Args:
        homes: homes where canaries are planted.
        owners: uids whose unjournalled leftovers may be removed.
        docker: also remove containers labelled by a run that is gone (needs the engine).

    Returns:
        Everything removed or found and not removable, in the order done.
    """
    swept, dead_docker = sweep_journal()
    tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())  # noqa: S108
    swept += sweep_unjournalled(tmp, homes, owners)
    if sys.platform.startswith("linux"):
        swept += sweep_orphans()
    if docker:
        from sandbox_attest.backends.docker import (  # noqa: PLC0415
            sweep_stale_containers,
            sweep_stale_images,
        )

        live_ids = {str(r) for data in live_entries() for r in data.get("docker_run_ids", [])}
        swept += [
            Swept("container", name, why, removed=ok)
            for name, why, ok in sweep_stale_containers(dead_docker, live_ids, STALE_AGE_S)
        ]
        # Containers first: a tag a dead run's container still used could not go before.
        swept += [
            Swept("image", ref, why, removed=ok)
            for ref, why, ok in sweep_stale_images(dead_docker, live_ids, STALE_AGE_S)
        ]
    return swept
