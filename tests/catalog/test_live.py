"""Every release-core probe, run unsandboxed (the control leg) against one real world.

On the control leg nothing confines the payload, so every negative's escape must be SEEN by
its host witness and the capabilities must work: each cell must PASS. A probe failing here is a
broken probe, and would turn every PASS it gives elsewhere into INCONCLUSIVE.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.backends.base import START_MARKER, DeclaredClaims
from sandbox_attest.catalog import PROBES, CellContext, FsWriteOutside, WorldLike, probe_path
from sandbox_attest.run.runner import inside_route
from sandbox_attest.verdict import Assessment, Decision, Verdict, decide
from sandbox_attest.world.core import World, start_world
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

OPEN = DeclaredClaims(network="open", filesystem="open", ipc="open")


@dataclass
class CellResult:
    """Everything one control-leg cell produced."""

    ctx: CellContext
    report: dict[str, Any]
    control: dict[str, Any]
    assessment: Assessment
    decision: Decision
    stderr: str


def run_cell(
    world: WorldLike, probe: str, base: Path, declared: DeclaredClaims = OPEN
) -> CellResult:
    """Prepare, run the payload as a plain child process, control, assess and decide."""
    spec = PROBES[probe]
    nonce = "n" + secrets.token_hex(8)
    cell_dir = base / f"{probe}-{nonce}"
    workspace = cell_dir / "workspace"
    workspace.mkdir(parents=True)
    ctx = CellContext(
        probe=probe,
        backend="none",
        nonce=nonce,
        world=world,
        workspace=workspace,
        cell_dir=cell_dir,
        claims=declared,
        route=inside_route(),
    )
    try:
        targets = spec.prepare(ctx)
        info = world.info
        task = {
            "probe": probe,
            "nonce": nonce,
            "cell_id": f"none-{probe}",
            "workspace": str(workspace),
            "proxy_url": info.proxy.url,
            "ca_bundle": info.ca_bundle,
            "world": info.for_probe(),
            "targets": targets,
            "deadline_s": 100,
        }
        task_path = cell_dir / "task.json"
        task_path.write_text(json.dumps(task))
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "HTTPS_PROXY": info.proxy.url,
            "HTTP_PROXY": info.proxy.url,
        }
        proc = subprocess.run(
            [sys.executable, str(probe_path(probe)), str(task_path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        lines = proc.stdout.splitlines()
        assert lines[0] == f"{START_MARKER} {nonce}", proc.stdout + proc.stderr
        assert proc.returncode == 0, proc.stderr
        report = json.loads(lines[1])
        control = spec.host_control(ctx)
        witness = world.records(nonce)
        assessment = spec.assess(ctx, report, witness, control)
        decision = decide(spec.expectation(declared), assessment)
        return CellResult(ctx, report, control, assessment, decision, proc.stderr)
    finally:
        spec.cleanup(ctx)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One world for the module, under a short /tmp path (unix socket limits)."""
    with (
        reachable_tempdir("sa-cat-") as base,
        start_world(base / "w") as running,
    ):
        yield running


@pytest.fixture(scope="module")
def cells(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CellResult]:
    """Each of the seven probes run once on the control leg."""
    base = tmp_path_factory.mktemp("cells")
    return {probe: run_cell(world, probe, base) for probe in sorted(PROBES)}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_control_leg_passes(cells: dict[str, CellResult], probe: str) -> None:
    """Unconfined, each probe's escape or capability is seen by the host: PASS."""
    # A probe the runner marks NOT_APPLICABLE in this (loopback) world never runs in a real
    # run either (net_dns_rebinding needs the lab): skip it with the spec's own reason.
    inapplicable = getattr(PROBES[probe], "not_applicable", None)
    why = inapplicable("") if callable(inapplicable) else None
    if why:
        pytest.skip(f"{probe} is NOT_APPLICABLE here, as a run would mark it: {why}")
    cell = cells[probe]
    assert cell.decision.verdict is Verdict.PASS, (cell.decision, cell.report, cell.control)
    # Probes through the proxy (net_denied_host and its kin) are denied on every leg, the proxy
    # being every leg's route: refused here too. Every other escape is seen on the open leg.
    expected = PROBES[probe].expectation(OPEN)
    assert cell.assessment.escape == ("refused" if expected == "denied" else "escaped")
    assert cell.assessment.controls_ok
    assert cell.control["ok"], cell.control


class TestWitnessesSawIt:
    """The host-side records behind each control-leg PASS are the real ones."""

    def test_denied_host_got_two_403s_and_allowed_200(self, cells: dict[str, CellResult]) -> None:
        """Both forms got the proxy's 403 with its reason; the allowed host echoed the nonce."""
        cell = cells["net_denied_host"]
        by_what = {a["what"]: a for a in cell.report["attempts"]}
        assert by_what["get-denied-absolute"]["status"] == 403
        assert by_what["connect-denied"]["status"] == 403
        assert by_what["connect-denied"]["detail"], "the deny reason header is reported"
        assert by_what["get-allowed"]["status"] == 200
        assert cell.ctx.nonce in by_what["get-allowed"]["detail"]
        decisions = cell.assessment.witness["proxy"]
        assert isinstance(decisions, list)
        assert {d["decision"] for d in decisions} >= {"deny"}
        assert cell.assessment.witness["denied_origin"] == []

    def test_direct_egress_logged_tcp_and_udp(self, cells: dict[str, CellResult]) -> None:
        """The listener logged the payload's TCP connection and UDP datagram by nonce."""
        witness = cells["net_direct_egress"].assessment.witness
        assert witness["direct_tcp"]
        assert witness["direct_udp"]

    def test_dns_fixture_logged_udp_and_tcp(self, cells: dict[str, CellResult]) -> None:
        """The DNS fixture logged the nonce name over both transports."""
        queries = cells["dns_resolution"].assessment.witness["dns"]
        assert isinstance(queries, list)
        assert {q["transport"] for q in queries} == {"udp", "tcp"}

    def test_daemon_logged_both_sockets(self, cells: dict[str, CellResult]) -> None:
        """The fake daemon logged the nonce on its path and abstract sockets."""
        requests = cells["ipc_unix_socket_escape"].assessment.witness["daemon"]
        assert isinstance(requests, list)
        assert {r["socket"] for r in requests} == {"unix", "abstract"}

    def test_fs_canaries_changed_and_cleaned(self, cells: dict[str, CellResult]) -> None:
        """Every planted canary changed on the host, and cleanup removed /tmp and home dirs."""
        cell = cells["fs_write_outside"]
        changed = cell.assessment.witness["changed"]
        classes = cell.assessment.witness["classes"]
        assert isinstance(changed, dict)
        assert isinstance(classes, (dict, list))
        # Every class planted, named and scan-found alike, changed on the unconfined leg.
        assert set(changed) == set(classes) >= {"sibling", "tmp", "home"}
        dirs = FsWriteOutside.canary_dirs(cell.ctx)
        assert not dirs["tmp"].exists()
        assert not dirs["home"].exists()

    def test_transfer_hash_and_rate(self, cells: dict[str, CellResult]) -> None:
        """The payload hashed the full blob and reported a rate."""
        cell = cells["net_transfer_18mib"]
        facts = cell.report["facts"]
        assert facts["bytes"] == 18_874_368
        assert facts["sha256"] == cell.ctx.world.info.blob.sha256
        assert facts["mb_per_s"] > 0

    def test_pip_printed_the_wheel_nonce(self, cells: dict[str, CellResult]) -> None:
        """The installed module printed the wheel's nonce; the denied index gave 403."""
        cell = cells["pkg_pip_install"]
        assert cell.report["facts"]["import_printed"] == cell.ctx.world.info.index.wheel_nonce
        denied = [a for a in cell.report["attempts"] if a["what"] == "pip-install-denied"]
        assert denied[0]["status"] == 403
        assert "Tunnel connection failed: 403" in denied[0]["detail"]


def test_forged_refusal_is_caught_live(world: World, tmp_path: Path) -> None:
    """A real escape rewritten as 'refused' by the payload is still FAIL under a confining claim."""
    confined = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
    cell = run_cell(world, "net_direct_egress", tmp_path, confined)
    forged = dict(cell.report)
    forged["attempts"] = [
        dict(a, outcome="refused", errno="ECONNREFUSED") for a in cell.report["attempts"]
    ]
    spec = PROBES["net_direct_egress"]
    assessment = spec.assess(cell.ctx, forged, world.records(cell.ctx.nonce), cell.control)
    assert decide("denied", assessment).verdict is Verdict.FAIL
