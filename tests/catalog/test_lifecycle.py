"""lifecycle_orphans: survivors are found by the probe's own marker, never by the harness's sweep.

Real processes: a child started with the probe's argv shape is found and described from /proc;
a backend's record of what its sweep killed, a real file in the cell dir, turns the reading
into an escape naming them. The live holes (a wrapper that lets children outlive it) are in
tests/integration/test_host_classes.py.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog.lifecycle import (
    ORPHAN_KINDS,
    ORPHAN_MARKER,
    LifecycleOrphans,
    describe_orphan,
    find_orphans,
)
from sandbox_attest.catalog.spec import CellContext
from sandbox_attest.host.journal import LEFTOVERS_FILE, record_leftovers, recorded_leftovers
from sandbox_attest.verdict import decide

CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
SPEC = LifecycleOrphans()
PROBE = Path(__file__).parent.parent.parent / "probes" / "lifecycle_orphans.py"


@dataclass
class Records:
    """Empty witness records: this probe's witnesses are tick files and processes."""

    origin: list[dict[str, Any]] = field(default_factory=list)
    dns: list[dict[str, Any]] = field(default_factory=list)
    proxy: list[dict[str, Any]] = field(default_factory=list)
    direct_tcp: list[dict[str, Any]] = field(default_factory=list)
    direct_udp: list[dict[str, Any]] = field(default_factory=list)
    daemon: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def orphan(tmp_path: Path) -> Iterator[tuple[int, str, Path]]:
    """A real process with an orphan's argv shape (marker and nonce), killed afterwards."""
    nonce = "n" + secrets.token_hex(8)
    ticks = tmp_path / "setsid.ticks"
    argv = [sys.executable, "-c", "import time; time.sleep(30)", str(ticks), "4.0", "0.1"]
    proc = subprocess.Popen([*argv, ORPHAN_MARKER, nonce])
    deadline = time.monotonic() + 10
    while not find_orphans(nonce) and time.monotonic() < deadline:
        time.sleep(0.01)  # the command line shows once the child has exec'd
    try:
        yield proc.pid, nonce, ticks
    finally:
        proc.kill()
        proc.wait()


def make_ctx(tmp_path: Path) -> CellContext:
    """A cell whose workspace and scratch are real directories under tmp_path."""
    nonce = "n" + secrets.token_hex(8)
    (tmp_path / "workspace").mkdir()
    return CellContext(
        probe=SPEC.id,
        backend="unit",
        nonce=nonce,
        world=None,  # type: ignore[arg-type]  # lifecycle_orphans never reads the world
        workspace=tmp_path / "workspace",
        cell_dir=tmp_path,
        claims=CONFINED,
    )


def quiet_report() -> dict[str, Any]:
    """Every child ticked while the payload ran, as the payload reports it."""
    attempts = [{"what": k, "role": "escape", "outcome": "succeeded"} for k in ORPHAN_KINDS]
    attempts.append({"what": "ticks-while-running", "role": "control", "outcome": "succeeded"})
    return {"attempts": attempts}


def plant_ticks(ctx: CellContext) -> None:
    """Tick files as children that ticked and stopped at the payload's exit leave them."""
    directory = SPEC.tick_dir(ctx)
    directory.mkdir()
    now = time.time()
    for kind in ORPHAN_KINDS:
        (directory / f"{kind}.ticks").write_text(
            "".join(f"{now - 1 + i / 10:.3f}\n" for i in range(5))
        )
    (directory / "payload-exit").write_text(f"{now:.3f}\n")


class TestFindingSurvivors:
    def test_a_survivor_is_found_by_marker_and_nonce(self, orphan: tuple[int, str, Path]) -> None:
        """A process whose argv carries the marker and the nonce is found, run tag or not."""
        pid, nonce, _ = orphan
        assert find_orphans(nonce) == [pid]

    def test_a_survivor_is_named_by_pid_kind_and_command(
        self, orphan: tuple[int, str, Path]
    ) -> None:
        """The description names the pid, its kind (tick file) and its command, code elided."""
        pid, nonce, _ = orphan
        seen = describe_orphan(pid)
        assert seen["pid"] == pid
        assert seen["kind"] == "setsid"
        assert seen["command"].startswith(f"{sys.executable} -c <code> …/setsid.ticks")
        assert nonce in seen["command"]

    def test_a_gone_process_is_said_to_be_gone(self) -> None:
        """A pid with no process behind it is described as such, not as a crash."""
        proc = subprocess.Popen(["true"])
        proc.wait()
        assert describe_orphan(proc.pid)["command"].startswith("no command line")

    def test_the_payloads_children_drop_the_environment(self, tmp_path: Path) -> None:
        """The payload starts its children with PATH only: no run tag reaches them."""
        nonce = "n" + secrets.token_hex(8)
        task = {
            "nonce": nonce,
            "workspace": str(tmp_path),
            "targets": {
                "dir": "ticks",
                "marker": ORPHAN_MARKER,
                "lifetime_s": 3.0,
                "interval_s": 0.1,
                "min_ticks": 2,
                "wait_s": 5.0,
            },
        }
        (tmp_path / "task.json").write_text(json.dumps(task))
        env = {**os.environ, "SANDBOX_ATTEST_RUN_TAG": "tag-" + nonce}
        try:
            done = subprocess.run(
                [sys.executable, str(PROBE), str(tmp_path / "task.json")],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            pids = find_orphans(nonce)
            environs = {p: Path(f"/proc/{p}/environ").read_bytes().split(b"\0") for p in pids}
        finally:
            for pid in find_orphans(nonce):
                os.kill(pid, 9)
        assert pids, done.stdout
        for pid, environ in environs.items():
            names = {item.split(b"=", 1)[0] for item in environ if item}
            assert names == {b"PATH"}, (pid, names)


class TestSweptIsAnEscape:
    def test_no_record_means_nothing_swept(self, tmp_path: Path) -> None:
        """A cell dir without the backend's record has no sweep kills."""
        assert recorded_leftovers(tmp_path) == []

    def test_nothing_killed_writes_nothing(self, tmp_path: Path) -> None:
        """A sweep that killed nothing leaves no record behind."""
        record_leftovers(tmp_path, {})
        assert not (tmp_path / LEFTOVERS_FILE).exists()

    def test_the_record_reads_back_by_pid(self, tmp_path: Path) -> None:
        """What a sweep killed reads back in pid order, each as the backend described it."""
        record_leftovers(tmp_path, {7: "7 (sleep 300)", 12: "12 (sh -c x)"})
        assert recorded_leftovers(tmp_path) == ["12 (sh -c x)", "7 (sleep 300)"]
        assert json.loads((tmp_path / LEFTOVERS_FILE).read_text())["killed"]["7"] == "7 (sleep 300)"

    def test_a_planted_symlink_is_refused(self, tmp_path: Path) -> None:
        """The record never follows a symlink planted where it goes."""
        target = tmp_path / "elsewhere"
        (tmp_path / LEFTOVERS_FILE).symlink_to(target)
        with pytest.raises(OSError, match="Too many levels of symbolic links"):
            record_leftovers(tmp_path, {1: "1 (init)"})
        assert not target.exists()

    def test_a_sweep_kill_fails_naming_pid_and_command(self, tmp_path: Path) -> None:
        """Children the harness's sweep killed make the cell FAIL, naming them, not PASS."""
        ctx = make_ctx(tmp_path)
        plant_ticks(ctx)
        record_leftovers(
            tmp_path, {4242: f"4242 (python3 -c <code> …/setsid.ticks {ORPHAN_MARKER} n1)"}
        )
        control = SPEC.host_control(ctx)
        assessment = SPEC.assess(ctx, quiet_report(), Records(), control)
        decision = decide(SPEC.expectation(CONFINED), assessment)
        assert decision.verdict.value == "FAIL", decision.reason
        assert "the harness's sweep had to kill 1 process(es)" in decision.reason
        assert "4242 (python3 -c <code> …/setsid.ticks" in decision.reason
        assert "every child stopped with the payload" not in decision.reason

    def test_without_survivors_or_kills_the_children_stopped(self, tmp_path: Path) -> None:
        """No tick after the exit, nobody alive, nothing swept: the sandbox stopped them."""
        ctx = make_ctx(tmp_path)
        plant_ticks(ctx)
        control = SPEC.host_control(ctx)
        assessment = SPEC.assess(ctx, quiet_report(), Records(), control)
        decision = decide(SPEC.expectation(CONFINED), assessment)
        assert decision.verdict.value == "PASS", decision.reason
        assert "every child stopped with the payload" in decision.reason
