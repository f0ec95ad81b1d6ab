"""The sweep after every command-wrapper run: whatever the run started that is still alive.

That includes children that left the process group with setsid() or double-forked away with a
fresh environment: the wrapper starts inside the cell's group (sandbox_attest/host/cellgroup.py:
a cgroup the payload user cannot leave, or where none can be made the harness's process
subtree), and whatever is still in the group once the wrapper has exited is killed and named in
the run's notes. Nothing in any environment marks the run (a wrapper that could see a run tag
could confine only when tested). In the subtree fallback the sweep is weaker: a process whose
parent exits before the harness first sees it is nobody's member and survives.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Final

from sandbox_attest.host import cellgroup

# The variable that once carried a per-run tag into every wrapper's environment, so that the
# sweep found leftovers by it. No environment carries it any more (a wrapper that sees it can
# confine only when tested); leftovers are found through the cell's group. Kept by name so a
# test can show it is absent.
RUN_TAG_VAR: Final = "SANDBOX_ATTEST_RUN_TAG"
# How long the final sweep keeps killing the group's members (a forking daemon may respawn).
SWEEP_SECONDS: Final = 3.0
# How much of a leftover's command line names it in the notes (its head and its tail).
DESCRIBE_CHARS: Final = 160


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries `RUN_TAG_VAR=tag` (unreadable ones are skipped).

    Nothing the harness starts carries one any more; kept to show that (tests).
    """
    needle = f"{RUN_TAG_VAR}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone already, or not ours to read
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _describe(pid: int) -> str:
    try:
        cmd = (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode("utf-8", "replace")
        )
    except OSError:
        cmd = "?"
    cmd = " ".join(cmd.split())
    if len(cmd) > DESCRIBE_CHARS:
        # Head and tail: a long `python -c CODE ARGS` names what it is by its last arguments.
        cmd = cmd[: DESCRIBE_CHARS // 2] + " … " + cmd[-DESCRIBE_CHARS // 2 :]
    return f"{pid} ({cmd})"


class LeftoverWatcher(threading.Thread):
    """Kills what a run leaves behind as soon as the wrapper itself has exited.

    Members of the cell's group (sandbox_attest/host/cellgroup.py) are the wrapper and everything
    it started, wherever they moved: another session or process group, a fresh environment,
    a double fork. Once no wrapper the group started is still running, every member left is
    a leftover: killed once it has outlived the wrapper by GRACE_S, and named.
    """

    POLL_S: Final = 0.05
    # How long a process may take to end on its own once the wrapper is gone. A sandbox's own
    # cleanup is asynchronous (bwrap --die-with-parent SIGKILLs its namespace as it exits, and
    # a killed process still shows, cmdline already empty, while it exits): one the harness
    # killed within that time would be the sandbox's work credited to the harness, and a
    # lifecycle_orphans FAIL that a slower machine makes and a faster one does not.
    GRACE_S: Final = 0.5

    def __init__(self, group: cellgroup.CellGroup, name: str = "") -> None:
        """Watch the members of `group` (`name` only names the thread)."""
        super().__init__(name=f"leftovers-{name[:6]}", daemon=True)
        self.group = group
        self.killed: dict[int, str] = {}
        self.surviving: list[str] = []
        self._done = threading.Event()
        self._enabled = Path("/proc/self/stat").exists()  # no procfs (macOS): group kill only
        self._first_seen: dict[int, float] = {}

    def _wrapper_running(self) -> bool:
        # Before the wrapper started there is nothing to call left behind.
        roots = list(self.group.roots)
        return not roots or any(_running(p) for p in roots)

    def run(self) -> None:
        """Poll until `finish`; kill leftovers whenever the wrapper is no longer running."""
        while self._enabled and not self._done.wait(self.POLL_S):
            # Read every poll, the wrapper running or not: in the subtree fallback a member is
            # remembered only once seen, so a child must be seen before its parent exits.
            members = self.group.pids()
            if not self._wrapper_running():
                pids = [p for p in members if p not in self.group.roots]
                if pids:
                    self._kill_outliving(pids)

    def finish(self) -> None:
        """Stop watching, then sweep until the group is empty (or give up and say so)."""
        self._done.set()
        self.join()
        if not self._enabled:
            return
        deadline = time.monotonic() + SWEEP_SECONDS
        while pids := [p for p in self.group.pids() if p not in self.group.roots or _running(p)]:
            if time.monotonic() > deadline:
                self.surviving = [_describe(p) for p in pids]
                return
            self._kill_outliving(pids)
            time.sleep(self.POLL_S)
        # Wait until each killed one is gone or a zombie, so "killed" means dead on return.
        while dying := [p for p in self.killed if _running(p)]:
            if time.monotonic() > deadline:
                self.surviving = [_describe(p) for p in dying]
                return
            time.sleep(self.POLL_S)

    def _kill_outliving(self, pids: list[int]) -> None:
        """Kill (and record) the leftovers that have outlived the wrapper by GRACE_S."""
        now = time.monotonic()
        ripe = []
        for pid in pids:
            seen = self._first_seen.setdefault(pid, now)
            if now - seen < self.GRACE_S and pid not in self.killed:
                continue
            self.killed.setdefault(pid, _describe(pid))
            ripe.append(pid)
        if ripe:
            self.group.kill(ripe)


def _running(pid: int) -> bool:
    """Whether `pid` still exists and is not a zombie (it may still be exiting)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
