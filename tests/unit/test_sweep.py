"""host.journal and run.sweep: real journal files, dead and live owners, orphaned processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox_attest.errors import ConfigError
from sandbox_attest.host import disguise, journal
from sandbox_attest.run import sweep

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of the test's own, so no real run's journal is read or swept."""
    directory = tmp_path / "state"
    monkeypatch.setenv(journal.STATE_ENV, str(directory))
    return directory


def record_from_a_process_that_exits(key: str, paths: list[Path], **facts: str) -> None:
    """Journal `paths` from a child process that then exits (a run killed after planting)."""
    code = (
        f"import sys; sys.path.insert(0, {ROOT!r}); from pathlib import Path; "
        "from sandbox_attest.host import journal; "
        f"journal.record({key!r}, [Path(p) for p in {list(map(str, paths))!r}], **{facts!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class TestJournal:
    def test_dead_owners_paths_are_removed_with_the_entry(self, tmp_path: Path) -> None:
        """A canary journalled by a process that is gone is removed, and so is the entry."""
        canary = tmp_path / "home" / f"{disguise.HOME_CANARY_PREFIX}abc"
        canary.mkdir(parents=True)
        (canary / disguise.CANARY_FILE).write_text("x")
        record_from_a_process_that_exits("canary-x-abc", [canary], run_id="r1")
        swept, _ = sweep.sweep_journal()
        assert not canary.exists()
        assert [s.target for s in swept] == [str(canary)]
        assert "left by run r1" in swept[0].why
        assert list(journal.journal_dir().glob("*.json")) == []

    def test_live_owners_entry_and_paths_are_kept(self, tmp_path: Path) -> None:
        """An entry of this (live) process is not swept: a concurrent run is never touched."""
        canary = tmp_path / f"{disguise.CANARY_PREFIX}live"
        canary.write_text("x")
        journal.record("canary-live", [canary])
        swept, _ = sweep.sweep_journal()
        assert swept == []
        assert canary.exists()
        journal.forget("canary-live")
        assert list(journal.journal_dir().glob("*.json")) == []

    def test_a_reused_pid_is_not_the_owner(self) -> None:
        """The same pid with another start time is another process: not alive as the owner."""
        me = journal.Owner.current()
        assert me.alive()
        assert not journal.Owner(me.pid, (me.start or 0) + 1, me.boot).alive()
        assert not journal.Owner(me.pid, me.start, "another-boot").alive()

    def test_docker_run_ids_of_dead_runs_are_returned(self, tmp_path: Path) -> None:
        """The docker run ids a dead run journalled come back for the container sweep."""
        code = (
            f"import sys; sys.path.insert(0, {ROOT!r}); from pathlib import Path; "
            "from sandbox_attest.host import journal; "
            f"journal.record('run-x', [Path({str(tmp_path / 'gone')!r})], docker_run_ids=['d1'])"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
        _, dead = sweep.sweep_journal()
        assert dead == {"d1"}

    def test_created_dir_is_removed_only_when_empty(self, tmp_path: Path) -> None:
        """A directory the dead run made goes if empty; one holding other files stays."""
        empty, full = tmp_path / "a" / ".ssh", tmp_path / "b" / ".aws"
        empty.mkdir(parents=True)
        full.mkdir(parents=True)
        (full / "credentials").write_text("real")
        code = (
            f"import sys; sys.path.insert(0, {ROOT!r}); from pathlib import Path; "
            "from sandbox_attest.host import journal; "
            f"journal.record('k', [], dirs=(Path({str(empty)!r}), Path({str(full)!r})))"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
        sweep.sweep_journal()
        assert not empty.exists()
        assert (full / "credentials").read_text() == "real"

    def test_unsafe_journal_dir_is_refused(self, state: Path) -> None:
        """A journal directory others can write is refused, naming the fix."""
        (state / "journal").mkdir(parents=True)
        (state / "journal").chmod(0o777)
        with pytest.raises(ConfigError, match=journal.STATE_ENV):
            journal.journal_dir()

    def test_key_with_a_slash_is_refused(self) -> None:
        """A key cannot name a file outside the journal."""
        with pytest.raises(ValueError, match="A-Za-z0-9"):
            journal.record("../escape", [])


class TestUnjournalled:
    def test_old_harness_named_leftovers_go_fresh_ones_stay(self, tmp_path: Path) -> None:
        """Unclaimed harness-named leftovers (new and pre-rename names) older than 6 h go."""
        tmp, home = tmp_path / "tmp", tmp_path / "home"
        (home / ".ssh").mkdir(parents=True)
        tmp.mkdir()
        old = [
            tmp / f"{disguise.CANARY_PREFIX}n1",
            tmp / f"{disguise.LINK_PREFIX}n5",
            tmp / f"{disguise.WITNESS_PREFIX}n0123456789abcdef.sock",
            home / f"{disguise.HOME_CANARY_PREFIX}n2",
            home / ".ssh" / f"{disguise.CANARY_PREFIX}n3",
            # What a run before sandbox_attest/host/disguise.py left: swept for one more release.
            tmp / "sandbox-attest-abc123",
            tmp / "sandbox-attest-canary-n6",
            tmp / ".sandbox-attest-witness-nfedcba9876543210.sock",
            home / ".sandbox-attest-canary-n7",
            home / ".ssh" / "sandbox-attest-canary-n8",
        ]
        fresh = tmp / f"{disguise.CANARY_PREFIX}n4"
        unrelated = tmp / "someone-elses-file"
        for path in [*old, fresh, unrelated]:
            path.write_text("x")
        long_ago = time.time() - sweep.STALE_AGE_S - 60
        for path in [*old, unrelated]:
            os.utime(path, (long_ago, long_ago))
        swept = sweep.sweep_unjournalled(tmp, [home], {os.geteuid()})
        assert sorted(s.target for s in swept) == sorted(map(str, old))
        assert fresh.exists()
        assert unrelated.exists()

    def test_old_leftover_claimed_by_a_live_entry_stays(self, tmp_path: Path) -> None:
        """An old file that a live run journalled is that run's: it is not swept."""
        canary = tmp_path / f"{disguise.CANARY_PREFIX}claimed"
        canary.write_text("x")
        long_ago = time.time() - sweep.STALE_AGE_S - 60
        os.utime(canary, (long_ago, long_ago))
        journal.record("claimed", [canary])
        try:
            assert sweep.sweep_unjournalled(tmp_path, [], {os.geteuid()}) == []
            assert canary.exists()
        finally:
            journal.forget("claimed")

    def test_leftover_of_another_uid_stays(self, tmp_path: Path) -> None:
        """An old harness-named file of a uid not given as an owner is not swept."""
        canary = tmp_path / f"{disguise.CANARY_PREFIX}other"
        canary.write_text("x")
        long_ago = time.time() - sweep.STALE_AGE_S - 60
        os.utime(canary, (long_ago, long_ago))
        assert sweep.sweep_unjournalled(tmp_path, [], {os.geteuid() + 12345}) == []
        assert canary.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
class TestOrphans:
    def test_only_the_exact_argv_shapes_are_harness_children(self) -> None:
        """An anchor's and the proxy's argv match; a shell line mentioning the marker does not."""
        anchor = disguise.ANCHOR_MARKER.encode()
        assert sweep.is_harness_child([b"/usr/bin/python3", b"-c", b"code", anchor + b"n"])
        # An anchor a run from before the rename left is the harness's for one more release.
        assert sweep.is_harness_child(
            [b"/usr/bin/python3", b"-c", b"code", b"sandbox-attest-anchor:n"]
        )
        assert sweep.is_harness_child(
            [b"/v/bin/python", b"-m", b"sandbox_attest.world.egress.proxy", b"/tmp/c"]
        )
        # The proxy of a version from before the package rename is the harness's too.
        assert sweep.is_harness_child([b"/v/bin/python", b"-m", b"harness.egress.proxy", b"/c"])
        assert not sweep.is_harness_child([b"/v/bin/python", b"-m", b"http.server", b"8000"])
        assert not sweep.is_harness_child([b"/bin/bash", b"-c", b"x " + anchor + b"n", b"y"])
        assert not sweep.is_harness_child([b"python", b"-c", b"print('" + anchor + b"')"])

    def test_orphaned_anchor_is_killed_a_parented_one_is_not(self) -> None:
        """An anchor re-parented to init is killed; one this harness parents lives on."""
        sleeper = "import time, sys; time.sleep(120)"
        driver = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
                    f"{sleeper!r}, '{disguise.ANCHOR_MARKER}orphan-test'], start_new_session=True, "
                    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                    "print(p.pid)"
                ),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        orphan = int(driver.stdout)
        parented = subprocess.Popen(
            [sys.executable, "-c", sleeper, f"{disguise.ANCHOR_MARKER}parented-test"]
        )
        try:
            swept = sweep.sweep_orphans()
            targets = " ".join(s.target for s in swept)
            assert f"{orphan} (" in targets
            assert str(parented.pid) not in targets
            deadline = time.monotonic() + 5
            while alive(orphan) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not alive(orphan)
            assert parented.poll() is None
        finally:
            if alive(orphan):
                os.kill(orphan, 9)
            parented.kill()
            parented.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of another uid needs root to plant")
class TestSweepFollowsNoPayloadLink:
    def test_a_reparented_canary_and_dir_are_not_followed(self, tmp_path: Path) -> None:
        """A home dir re-pointed at a root dir after journalling: nothing there is removed."""
        home, decoy = tmp_path / "home", tmp_path / "decoy"
        (decoy / "share").mkdir(parents=True)  # empty, as a journalled dir would be
        (decoy / "canary").write_text("root's, named like the canary")
        home.mkdir()
        # The payload user's link (its own, in its home): never trusted by safefs.
        (home / ".ssh").symlink_to(decoy)
        os.lchown(home / ".ssh", 65534, 65534)
        code = (
            f"import sys; sys.path.insert(0, {ROOT!r}); from pathlib import Path; "
            "from sandbox_attest.host import journal; "
            f"journal.record('k', [Path({str(home / '.ssh' / 'canary')!r})], "
            f"dirs=(Path({str(home / '.ssh' / 'share')!r}),))"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
        swept, _ = sweep.sweep_journal()
        assert (decoy / "canary").read_text() == "root's, named like the canary"
        assert (decoy / "share").is_dir()
        assert [(s.removed, "symlink" in s.why) for s in swept] == [(False, True)]
