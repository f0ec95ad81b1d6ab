"""Claims that match real sandboxes, live: a seccomp-only network cut (issue 15 item 1).

A seccomp-only sandbox keeps the harness's network namespace by design and refuses every
connect in the kernel (tests/data/claims/seccomp_net_off.py, as Codex's seccomp-only mode
does). Judged on its true claim, network = "none" cut by "seccomp", it PASSes the network
probes: every direct attempt refused, no witness heard anything. The same wrapper without its
filter, under the same claim, FAILs them, and each FAIL names the claim it broke. Real
processes, a real seccomp filter, the real running world, the real control leg.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sandbox_attest.backends.base import Backend

pytestmark = [
    pytest.mark.skipif(
        not Path("/proc/self/status").is_file(), reason="seccomp filters are Linux only"
    ),
    pytest.mark.timeout(300),
]

CLAIMS = Path(__file__).parent.parent / "data" / "claims"
PROBES = ("net_direct_egress", "dns_resolution")
CLAIM = 'claims network = "none" cut by seccomp'


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


def run_cells(world: World, scratch: Path, name: str, backend: Backend) -> dict[str, Any]:
    """The control leg, then `backend`, on both network probes; the backend's entries."""
    every: dict[str, Backend] = {"none": NoneBackend(), name: backend}
    availability = {n: b.availability() for n, b in every.items()}
    assert availability[name].ok, f"{name} UNAVAILABLE here: {availability[name].reason}"
    runner = CellRunner(
        world=world, scratch=scratch, backends=every, availability=availability, platform="linux"
    )
    control = {p: runner.run_cell(Cell("none", ProbeRow(p, 120), None)) for p in PROBES}
    bad = {p: e["reason"] for p, e in control.items() if e["verdict"] != "PASS"}
    assert not bad, f"control leg: {bad}"
    return {p: runner.run_cell(Cell(name, ProbeRow(p, 120), None)) for p in PROBES}


class TestSeccompOnlyCut:
    def test_true_seccomp_claim_passes_the_network_probes(
        self, world: World, tmp_path: Path
    ) -> None:
        """A true seccomp cut PASSes both probes, judged by its refused connects."""
        backend = CommandBackend.from_path(CLAIMS / "seccomp_net_off.toml")
        entries = run_cells(world, tmp_path, "claims-seccomp", backend)
        verdicts = {p: (e["verdict"], e["reason"]) for p, e in entries.items()}
        assert {p: v for p, (v, _) in verdicts.items()} == dict.fromkeys(PROBES, "PASS"), verdicts
        direct = entries["net_direct_egress"]
        assert direct["reason"].startswith(
            f"{CLAIM}: it shares the harness's network namespace by design, so it is judged by "
            "the refused connects: every direct attempt was refused and no witness heard "
            "anything"
        ), direct["reason"]
        # The cut really is the filter: the host saw the payload in the harness's namespace
        # under a seccomp filter, and every attempt was refused with EPERM.
        view = direct["host_view"]
        assert "net" in view["shared_with_harness"], view
        assert view["status"]["Seccomp"] == "2", view["status"]
        attempts = [a for a in direct["attempts"] if a["role"] == "escape"]
        assert attempts, direct
        assert {(a["outcome"], a["errno"]) for a in attempts} == {("refused", "EPERM")}
        assert direct["witness"]["direct_tcp"] == []
        assert direct["witness"]["direct_udp"] == []

    def test_false_seccomp_claim_fails_them_naming_the_claim(
        self, world: World, tmp_path: Path
    ) -> None:
        """Without the filter, the same claim FAILs both probes, and each FAIL names it."""
        backend = CommandBackend.from_path(CLAIMS / "seccomp_net_off_false.toml")
        entries = run_cells(world, tmp_path, "claims-seccomp-false", backend)
        for probe, entry in entries.items():
            assert entry["verdict"] == "FAIL", (probe, entry["reason"])
            assert entry["reason"].startswith(f"escape observed by the host: {CLAIM}; the "), (
                probe,
                entry["reason"],
            )
        assert entries["net_direct_egress"]["witness"]["direct_tcp"], entries["net_direct_egress"]
        assert entries["dns_resolution"]["witness"]["dns"], entries["dns_resolution"]
