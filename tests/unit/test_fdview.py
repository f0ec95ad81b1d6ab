"""The host reads each descriptor of a process by the identity of the object it holds.

Real processes hold real descriptors; where bubblewrap is here, one holds a directory opened
inside its own mount namespace, and the host's climb from it reaches the host directory bound
there (sandbox_attest/run/fdview.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.run import fdview
from sandbox_attest.run.hostview import read_process

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino]


def _wait_for_fd(pid: int, fd: int) -> None:
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{pid}/fd/{fd}").exists():
        assert time.monotonic() < deadline, f"pid {pid} never opened fd {fd}"
        time.sleep(0.01)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[int]:
    """A process holding / as fd 7, a nested dir as fd 8 and a file as fd 9."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "f").write_text("x")
    script = f"exec 7</ 8<'{tmp_path}/a/b' 9<'{tmp_path}/f'; exec sleep 30"
    child = subprocess.Popen(["sh", "-c", script])
    try:
        _wait_for_fd(child.pid, 9)
        yield child.pid
    finally:
        child.kill()
        child.wait()


class TestFdIdentities:
    def test_each_descriptor_is_read_by_its_objects_identity(
        self, holder: int, tmp_path: Path
    ) -> None:
        """Dev, inode and type of the object itself, with the link text beside them."""
        ids = read_process(holder)["fd_ids"]
        assert ids["7"]["type"] == "dir"
        assert [ids["7"]["dev"], ids["7"]["ino"]] == _identity(Path("/"))
        assert ids["9"]["type"] == "reg"
        assert [ids["9"]["dev"], ids["9"]["ino"]] == _identity(tmp_path / "f")
        assert ids["9"]["link"] == str(tmp_path / "f")

    def test_a_directory_climbs_to_its_trees_top(self, holder: int, tmp_path: Path) -> None:
        """The identities above a held directory end at the host's /, and say they did."""
        entry = read_process(holder)["fd_ids"]["8"]
        assert entry["top"] is True
        assert entry["up"][0] == _identity(tmp_path / "a")
        assert _identity(tmp_path) in entry["up"]
        assert entry["up"][-1] == _identity(Path("/"))
        root = read_process(holder)["fd_ids"]["7"]
        assert (root["up"], root["top"]) == ([], True)

    def test_a_file_is_placed_by_the_directory_holding_it(
        self, holder: int, tmp_path: Path
    ) -> None:
        """A regular file climbs from the directory where its link's path finds it."""
        entry = read_process(holder)["fd_ids"]["9"]
        assert entry["up"][0] == _identity(tmp_path)
        assert entry["top"] is True

    def test_a_file_replaced_at_its_path_is_not_placed(self, holder: int, tmp_path: Path) -> None:
        """Another file at the link's path is not the descriptor's: nothing above is claimed."""
        (tmp_path / "g").write_text("y")
        (tmp_path / "g").replace(tmp_path / "f")
        entry = read_process(holder)["fd_ids"]["9"]
        assert (entry["up"], entry["top"]) == ([], False)
        assert entry["link"].endswith(" (deleted)")

    def test_the_reading_is_bounded(self, holder: int, monkeypatch: pytest.MonkeyPatch) -> None:
        """Past FD_IDS_MAX descriptors the rest are named unread, not identified."""
        monkeypatch.setattr(fdview, "FD_IDS_MAX", 2)
        ids = read_process(holder)["fd_ids"]
        assert ids["9"]["unread"] == "more than 2 descriptors"

    def test_a_climb_deeper_than_the_bound_says_so(
        self, holder: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A climb cut at FD_CLIMB_MAX is not a top: the judge cannot place it."""
        monkeypatch.setattr(fdview, "FD_CLIMB_MAX", 1)
        entry = read_process(holder)["fd_ids"]["8"]
        assert entry["top"] is False
        assert "deeper than 1" in entry["why"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install)")
def test_the_climb_follows_the_payloads_own_mount_tree(tmp_path: Path) -> None:
    """A dir or file opened inside bwrap under a bound host dir climbs into that dir."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "lock").write_text("x")
    argv = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr"]
    argv += ["--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"]
    argv += ["--symlink", "usr/bin", "/bin", "--bind", str(tmp_path), "/ws"]
    argv += ["--", "sh", "-c", "exec 7</ws/sub 8</ws/lock; exec sleep 30"]
    child = subprocess.Popen(argv)
    try:
        pids = [child.pid]
        deadline = time.monotonic() + 10
        entry, pid = None, child.pid
        while entry is None and time.monotonic() < deadline:
            for parent in list(pids):
                kids = Path(f"/proc/{parent}/task/{parent}/children")
                if kids.exists():
                    pids += [int(k) for k in kids.read_text().split() if int(k) not in pids]
            for candidate in pids:
                found = read_process(candidate)["fd_ids"].get("7")
                if found and found.get("link") == "/ws/sub":
                    entry, pid = found, candidate
            time.sleep(0.02)
        if entry is None:
            pytest.skip("bwrap could not start a sandbox here (user namespaces refused?)")
        assert [entry["dev"], entry["ino"]] == _identity(tmp_path / "sub")
        assert entry["up"][0] == _identity(tmp_path)
        assert _identity(Path("/")) not in entry["up"], "the climb left the sandbox's tree"
        assert entry["top"] is True
        held = read_process(pid)["fd_ids"]["8"]
        assert (held["link"], held["up"][0], held["top"]) == ("/ws/lock", _identity(tmp_path), True)
    finally:
        child.kill()
        child.wait()
