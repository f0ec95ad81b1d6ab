"""The command backend's leftover watcher credits a sandbox with what it ends itself."""

from __future__ import annotations

import subprocess
import time

from sandbox_attest.backends.command.leftovers import LeftoverWatcher
from sandbox_attest.host import cellgroup


def test_a_child_ending_on_its_own_is_not_the_harness_kill() -> None:
    """One child exits 0.1 s after the wrapper (not killed); one outlives it (killed, named)."""
    argv = ["/bin/sh", "-c", "sleep 0.1 & sleep 30 & echo $! ; exit 0"]
    with cellgroup.open_cell() as group:
        watcher = LeftoverWatcher(group)
        watcher.start()
        # The wrapper exits at once; its children stay in the cell's group, as a sandbox's do.
        wrapper = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, **cellgroup.spawn_kwargs(argv)
        )
        cellgroup.started(wrapper.pid)
        out, _ = wrapper.communicate(timeout=10)
        outliving = int(out.split()[0])
        time.sleep(LeftoverWatcher.GRACE_S + 0.5)
        watcher.finish()
    assert list(watcher.killed) == [outliving]
    assert "sleep 30" in watcher.killed[outliving]
    assert watcher.surviving == []


def test_a_child_that_leaves_session_and_environment_is_still_found() -> None:
    """A setsid child with a fresh environment (no tag could follow it) is killed and named."""
    argv = ["/bin/sh", "-c", "setsid env -i /bin/sleep 30 & echo $! ; exit 0"]
    with cellgroup.open_cell() as group:
        watcher = LeftoverWatcher(group)
        watcher.start()
        wrapper = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, **cellgroup.spawn_kwargs(argv)
        )
        cellgroup.started(wrapper.pid)
        wrapper.communicate(timeout=10)
        watcher.finish()
        left = group.pids()
    assert len(watcher.killed) == 1, watcher.killed
    assert "sleep 30" in next(iter(watcher.killed.values()))
    assert watcher.surviving == []
    assert left == []
