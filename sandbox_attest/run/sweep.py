"""What a killed run left behind: the next run's sweep of it.

A run plants files on the host (the world's scratch directory under /tmp, nonce-named
canaries in the payload user's home and in /tmp) and starts processes and containers. When it
ends normally it removes them itself; SIGKILL leaves them. So, before it makes any of them, a
run writes a journal entry saying what it is about to make and who it is
(`sandbox_attest.host.journal`: the record half, below the backends and the catalogue that
write it). The next run starts with `sweep()`: every entry whose owner is no longer that live
process is acted on (its paths removed, its empty created directories removed) and the entry
deleted.

Never a live run's: an entry is swept only when its owner is provably gone (no such pid, or
a pid reused since, or another boot), so two concurrent runs never sweep each other. Things
no entry claims (left by a harness that predates the journal) are swept only when they are
the harness's by name and owner and have not changed for `STALE_AGE_S`: longer than any run.

Why canaries still go into a home (issue 18, item 4): `fs_read_secrets` asks whether a sandbox
shows untrusted code the home it runs in, so the canaries must be where that home is. As root
it is the payload user's own home (`host.trust`), not a person's; without root it is the
harness user's real home, and the journal is what guarantees a killed run's fake secrets go.

What it does not do: it never kills a process that is not an orphaned anchor or proxy of the
harness (payloads that daemonize on purpose are a live cell's evidence), and it never removes
a docker container itself (`sandbox_attest.backends.docker.stale.sweep_stale_containers` does,
asked here).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sandbox_attest.host import cgroupfs, disguise
from sandbox_attest.host.journal import entry_owner, journal_dir, live_entries, read_entry
from sandbox_attest.host.safefs import UnsafePathError, open_dir

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
# A run's cgroup (sandbox_attest/host/cellgroup.py RUN_PREFIX): the only kind of directory the sweep
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


def sweep_journal() -> tuple[list[Swept], set[str]]:
    """Act on every entry whose owner is gone, then delete the entry.

    Returns:
        What was removed, and the docker run ids that the dead runs had recorded.
    """
    swept: list[Swept] = []
    dead_docker: set[str] = set()
    for entry in sorted(journal_dir().glob("*.json")):
        data = read_entry(entry)
        owner = entry_owner(data) if data is not None else None
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
    """Kill what a dead run left in its cgroup (host/cellgroup.py), remove the groups.

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
        from sandbox_attest.backends.docker.stale import (  # noqa: PLC0415
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
