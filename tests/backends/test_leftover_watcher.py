"""The command backend's leftover watcher credits a sandbox with what it ends itself."""

from __future__ import annotations

import os
import secrets
import subprocess
import time

from sandbox_attest.backends.command import RUN_TAG_VAR, LeftoverWatcher


def test_a_child_ending_on_its_own_is_not_the_harness_kill() -> None:
    """One child exits 0.1 s after the wrapper (not killed); one outlives it (killed, named)."""
    tag = secrets.token_hex(8)
    watcher = LeftoverWatcher(tag)
    watcher.start()
    # The wrapper exits at once; its children carry the run tag, as a sandbox's would.
    wrapper = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 0.1 & sleep 30 & echo $! ; exit 0"],
        env={**os.environ, RUN_TAG_VAR: tag},
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = wrapper.communicate(timeout=10)
    outliving = int(out.split()[0])
    time.sleep(LeftoverWatcher.GRACE_S + 0.5)
    watcher.finish()
    assert list(watcher.killed) == [outliving]
    assert "sleep 30" in watcher.killed[outliving]
    assert watcher.surviving == []
