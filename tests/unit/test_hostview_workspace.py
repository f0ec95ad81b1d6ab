"""The workspace half of the rendezvous: the launcher's ready file, read by the host.

Under a sandbox with its own kernel (`kernel = "own"`) the ready file is the one trace of the
payload the host has (no host process runs it), so the view records it whatever else the host
saw: its name, the pid the payload's own kernel gave it, and its owner on the host (the user
the payload's writes land as). Root reads it, so never through a link or a FIFO the payload
left there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from sandbox_attest.paths import probes_dir
from sandbox_attest.payload import LAUNCHER_SOURCE
from sandbox_attest.run.hostview import (
    LAUNCHER,
    Rendezvous,
    _ready_file,
    ready_name,
    workspace_rendezvous,
)

# Named waits, not time budgets: the launcher must be let go before its rendezvous_s (30), and
# a FIFO read that blocks never returns at all.
LET_GO_WAIT_S = 25.0
FIFO_WAIT_S = 10.0


class TestWorkspaceRendezvous:
    def test_the_ready_file_is_recorded_with_its_owner(self, tmp_path: Path) -> None:
        """At a real launcher's rendezvous the view names the ready file, its pid and its uid."""
        workspace = tmp_path / "ws"
        workspace.mkdir()
        probe = tmp_path / "probe.py"
        probe.write_text("pass\n")
        task = tmp_path / "task.json"
        task.write_text(
            json.dumps({"workspace": str(workspace), "nonce": "n2", "rendezvous_s": 30})
        )
        staged = shutil.copyfile(probes_dir() / LAUNCHER_SOURCE, tmp_path / LAUNCHER)
        watch = Rendezvous(workspace, task, "n2")
        watch.start()
        # Bounded below the task's rendezvous_s (30): a host that never let go would hold the
        # launcher for all of it, and this wait raises TimeoutExpired instead.
        done = subprocess.run(
            [sys.executable, staged, str(probe), str(task)],
            capture_output=True,
            timeout=LET_GO_WAIT_S,
            check=True,
        )
        view = watch.finish()
        assert done.returncode == 0
        found = view["workspace_rendezvous"]
        assert found["seen"] is True
        assert found["file"] == ready_name("n2")
        assert found["uid"] == os.getuid()

    def test_a_symlink_is_not_followed(self, tmp_path: Path) -> None:
        """A ready file that is a link to a host file reads as nothing, with no owner."""
        secret = tmp_path / "secret"
        secret.write_text("host secret")
        link = tmp_path / "ready"
        link.symlink_to(secret)
        assert _ready_file(link) == ("", None)

    def test_a_fifo_does_not_hang_the_host(self, tmp_path: Path) -> None:
        """A FIFO at the ready file's name is no regular file: read as nothing, at once."""
        fifo = tmp_path / "ready"
        os.mkfifo(fifo)
        read: list[tuple[str, int | None]] = []
        reader = threading.Thread(target=lambda: read.append(_ready_file(fifo)), daemon=True)
        reader.start()
        # A read that blocked on the FIFO (no writer ever comes) would still be running.
        reader.join(FIFO_WAIT_S)
        assert not reader.is_alive(), "the host blocked on a FIFO"
        assert read == [("", None)]

    def test_the_record_shape(self) -> None:
        """The record keeps at most 32 characters of the payload's own pid."""
        assert workspace_rendezvous("f", " 1\n", 994) == {
            "seen": True,
            "file": "f",
            "pid": "1",
            "uid": 994,
        }
