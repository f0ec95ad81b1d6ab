"""The verdict logic cannot be fooled: forged, broken and blind payloads against a real world.

Each test runs the real runner with a real backend and the real running world; only the
payload script is swapped (the narrow seam `sandbox_attest.run.runner.probe_path`) for one in
tests/data/forged/ that lies, crashes, stays silent or cannot see.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import Availability, Backend, EgressMode, ProbeRequest, ProbeRun
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.backends.process import run_process
from sandbox_attest.catalog import probe_path
from sandbox_attest.run import runner as runner_module
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world

FORGED = Path(__file__).parent.parent / "data" / "forged"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


class ExitsBeforeStart:
    """A sandbox that fails before the payload runs (its wrapper says why on stderr)."""

    name = "broken"
    egress_mode: EgressMode = "direct-tcp"

    def __init__(self) -> None:
        """Borrow the control leg's identity; only `run` differs."""
        self._avail = NoneBackend().availability()

    def availability(self) -> Availability:
        """Available, so the failure happens at run time."""
        return self._avail

    def run(self, request: ProbeRequest) -> ProbeRun:
        """A wrapper that cannot set up its sandbox and exits 1."""
        argv = ["sh", "-c", "echo 'wrapper: cannot create namespace' >&2; exit 1"]
        return run_process(request.cell_id, argv, dict(request.env), request.workspace, 10)


def make_runner(world: World, tmp_path: Path, backends: dict[str, Backend]) -> CellRunner:
    """A runner over `backends` (the control leg always included)."""
    all_backends: dict[str, Backend] = {"none": NoneBackend(), **backends}
    return CellRunner(
        world=world,
        scratch=tmp_path,
        backends=all_backends,
        availability={n: b.availability() for n, b in all_backends.items()},
        platform="linux",
    )


def cell(backend: str, probe: str, timeout: float = 60) -> Cell:
    """A matrix cell."""
    return Cell(backend, ProbeRow(probe, timeout), None)


def forge(monkeypatch: pytest.MonkeyPatch, probe: str, script: str) -> None:
    """Swap the payload of `probe` (only) for a forged script."""
    real = probe_path

    def patched(probe_id: str) -> Path:
        return FORGED / script if probe_id == probe else real(probe_id)

    monkeypatch.setattr(runner_module, "probe_path", patched)


def verdict(entry: Mapping[str, Any]) -> str:
    """The verdict, with the reason shown when an assertion fails."""
    return f"{entry['verdict']}: {entry['reason']}"


class TestForgedAndBroken:
    def test_forged_refusal_seen_by_witness_is_fail(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A payload that reaches the listener but prints 'refused' is FAIL: the host saw it."""
        forge(monkeypatch, "net_direct_egress", "lying_direct_egress.py")
        runner = make_runner(
            world, tmp_path, {"bubblewrap": BubblewrapBackend(weaken=frozenset({"share-net"}))}
        )
        runner.run_cell(cell("none", "net_direct_egress"))
        entry = runner.run_cell(cell("bubblewrap", "net_direct_egress"))
        assert verdict(entry).startswith("FAIL: escape observed by the host")
        assert entry["observed"] == "refused"  # the payload's lie is kept as evidence

    def test_failed_control_is_inconclusive(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A correct-looking denial whose allowed-host control failed proves nothing."""
        forge(monkeypatch, "net_denied_host", "denied_host_control_fails.py")
        runner = make_runner(world, tmp_path, {"bubblewrap": BubblewrapBackend()})
        entry = runner.run_cell(cell("bubblewrap", "net_denied_host"))
        assert verdict(entry).startswith("INCONCLUSIVE: positive control failed")

    @pytest.mark.parametrize(
        ("script", "needle"),
        [
            ("crash_after_marker.py", "broke its output contract: expected exactly one JSON"),
            ("silent.py", "did not start the payload: no start marker"),
            ("two_reports.py", "found 2"),
        ],
    )
    def test_broken_payload_is_error(
        self,
        world: World,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        script: str,
        needle: str,
    ) -> None:
        """A payload that crashes, stays silent or prints two reports is ERROR, never PASS."""
        forge(monkeypatch, "net_direct_egress", script)
        runner = make_runner(world, tmp_path, {"bubblewrap": BubblewrapBackend()})
        entry = runner.run_cell(cell("bubblewrap", "net_direct_egress"))
        assert entry["verdict"] == "ERROR", verdict(entry)
        assert needle in entry["reason"]

    def test_crash_keeps_the_traceback_as_evidence(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The payload's stderr (its traceback) is in the evidence of an ERROR cell."""
        forge(monkeypatch, "net_direct_egress", "crash_after_marker.py")
        runner = make_runner(world, tmp_path, {"bubblewrap": BubblewrapBackend()})
        entry = runner.run_cell(cell("bubblewrap", "net_direct_egress"))
        assert "payload crashed on purpose" in entry["run"]["stderr"]

    def test_backend_exiting_before_start_is_error(self, world: World, tmp_path: Path) -> None:
        """A sandbox that never starts the payload is ERROR, with the wrapper's stderr."""
        runner = make_runner(world, tmp_path, {"broken": ExitsBeforeStart()})
        entry = runner.run_cell(cell("broken", "net_direct_egress"))
        assert entry["verdict"] == "ERROR", verdict(entry)
        assert "cannot create namespace" in entry["reason"]

    def test_timeout_is_error_with_partial_output(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A payload that hangs is killed at the deadline: ERROR, with what it printed."""
        hang = tmp_path / "forged" / "hang.py"
        hang.parent.mkdir()
        hang.write_text(
            "import time\nprint('SANDBOX-ATTEST-START x', flush=True)\ntime.sleep(120)\n"
        )
        monkeypatch.setattr(runner_module, "probe_path", lambda _probe: hang)
        runner = make_runner(world, tmp_path, {"bubblewrap": BubblewrapBackend()})
        entry = runner.run_cell(cell("bubblewrap", "net_direct_egress", timeout=3))
        assert verdict(entry).startswith("ERROR: timed out after")
        assert "SANDBOX-ATTEST-START" in entry["run"]["stdout"]


class TestControlLeg:
    def test_blind_probe_on_control_leg_downgrades_other_passes(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A probe that cannot see its escape on the open host turns later PASSes INCONCLUSIVE."""
        runner = make_runner(world, tmp_path, {"bubblewrap": BubblewrapBackend()})
        forge(monkeypatch, "net_direct_egress", "blind_direct_egress.py")
        control = runner.run_cell(cell("none", "net_direct_egress"))
        assert control["verdict"] == "INCONCLUSIVE", verdict(control)
        monkeypatch.undo()  # the real probe under bubblewrap would PASS on its own
        entry = runner.run_cell(cell("bubblewrap", "net_direct_egress"))
        assert verdict(entry).startswith("INCONCLUSIVE: the control leg gave INCONCLUSIVE")
        assert "was: " in entry["reason"]

    def test_missing_control_leg_makes_pass_inconclusive(
        self, world: World, tmp_path: Path
    ) -> None:
        """A PASS with no control-leg run for the same probe is not accepted."""
        runner = make_runner(world, tmp_path, {"bubblewrap": BubblewrapBackend()})
        entry = runner.run_cell(cell("bubblewrap", "dns_resolution"))
        assert verdict(entry).startswith("INCONCLUSIVE: the control leg did not run")


class TestWeakenedBubblewrap:
    """Real probes against deliberately broken bubblewrap configurations."""

    @pytest.mark.parametrize(
        ("weakening", "probe"),
        [
            ("share-net", "net_direct_egress"),
            ("share-net", "dns_resolution"),
            ("share-net", "ipc_unix_socket_escape"),  # the abstract socket lives in the netns
            ("host-root-rw", "fs_write_outside"),
        ],
    )
    def test_hole_makes_matching_probe_fail(
        self, world: World, tmp_path: Path, weakening: str, probe: str
    ) -> None:
        """The probe that matches the hole FAILs, and the strong sandbox PASSes it."""
        runner = make_runner(
            world,
            tmp_path,
            {
                "bubblewrap": BubblewrapBackend(),
                "weak": BubblewrapBackend(weaken=frozenset({weakening})),
            },
        )
        control = runner.run_cell(cell("none", probe))
        assert control["verdict"] == "PASS", verdict(control)
        strong = runner.run_cell(cell("bubblewrap", probe))
        assert strong["verdict"] == "PASS", verdict(strong)
        weak = runner.run_cell(cell("weak", probe))
        assert weak["verdict"] == "FAIL", verdict(weak)


class TestReplayedReport:
    def test_report_for_another_nonce_is_error(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A report that is not this cell's (stale nonce) is ERROR, never judged."""
        stale = tmp_path / "forged" / "stale.py"
        stale.parent.mkdir()
        stale.write_text(
            "import json, sys\n"
            "task = json.load(open(sys.argv[1]))\n"
            "print('SANDBOX-ATTEST-START ' + task['nonce'], flush=True)\n"
            "print(json.dumps({'probe': task['probe'], 'nonce': 'n-old-run', 'facts': {},\n"
            "  'attempts': [{'what': 'tcp-direct', 'role': 'escape', 'outcome': 'refused'}]}))\n"
        )
        monkeypatch.setattr(runner_module, "probe_path", lambda _probe: stale)
        runner = make_runner(world, tmp_path, {"bubblewrap": BubblewrapBackend()})
        entry = runner.run_cell(cell("bubblewrap", "net_direct_egress"))
        assert entry["verdict"] == "ERROR", verdict(entry)
        assert "the report is not this cell's" in entry["reason"]
