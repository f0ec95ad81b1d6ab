"""The host's view of a payload: found by its launcher command line, read from /proc.

Live: real processes, a real network namespace with a default route (made here, lo only,
so nothing can leave it), real /proc.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.hostview import LAUNCHER, find_payloads, read_process

if TYPE_CHECKING:
    from collections.abc import Iterator

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a new netns needs root")


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    """A stand-in `_launch.py` that only sleeps (named as the real one)."""
    script = tmp_path / LAUNCHER
    script.write_text("import time; time.sleep(30)\n")
    return script


@contextlib.contextmanager
def started(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """Start `argv`, yield it once its cmdline is visible, kill it afterwards."""
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes().count(b"\0") >= len(argv):
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


class TestFind:
    def test_the_launcher_is_found_and_its_wrapper_is_not(
        self, tmp_path: Path, launcher: Path
    ) -> None:
        """`python _launch.py PROBE TASK` is the payload; a wrapper naming it later is not."""
        task = tmp_path / "task.json"
        payload = [sys.executable, str(launcher), "probe.py", str(task)]
        wrapper = ["sh", "-c", "sleep 30", "--", *payload]
        with started(payload) as proc, started(wrapper) as other:
            found = find_payloads(task)
            assert proc.pid in found
            assert other.pid not in found

    def test_another_cells_task_is_not_found(self, tmp_path: Path, launcher: Path) -> None:
        """Only this cell's task file matches."""
        with started([sys.executable, str(launcher), "probe.py", str(tmp_path / "a.json")]):
            assert find_payloads(tmp_path / "b.json") == []


@needs_root
class TestRead:
    def test_a_default_route_in_its_own_namespace_is_seen(self) -> None:
        """A process in a new netns with a default route: not shared, route and lo listed."""
        argv = [
            "unshare",
            "--net",
            "sh",
            "-c",
            "ip link set lo up && ip route add default dev lo && sleep 30",
        ]
        with started(argv) as proc:
            # Until unshare has made the new namespace and sh has added the route, the
            # process is still in ours: wait for both.
            deadline = time.monotonic() + 10
            view = read_process(proc.pid)
            while time.monotonic() < deadline and (
                "net" in view["shared_with_harness"] or not view["default_routes"]
            ):
                time.sleep(0.05)
                view = read_process(proc.pid)
            assert view["default_routes"][0]["dev"] == "lo"
            assert "net" not in view["shared_with_harness"]
            assert view["interfaces"] == ["lo"]

    def test_an_unconfined_child_shares_every_namespace_and_its_creds_are_read(self) -> None:
        """A plain child shares the harness's namespaces; its status fields are read."""
        with started(["sleep", "30"]) as proc:
            view = read_process(proc.pid)
            assert "net" in view["shared_with_harness"]
            assert "mnt" in view["shared_with_harness"]
            assert view["status"]["Uid"].split()[0] == str(os.getuid())
            assert "NoNewPrivs" in view["status"]
            assert "PATH" in view["env_names"]
