"""Unix sockets as a class, live (issue 14, items 3 and 5): real wrappers, real witnesses.

Before each `ipc_unix_socket_escape` cell the harness plants witness sockets beside the host's
real ones (/run, /var/run, /tmp, the abstract namespace). On the open control leg they must
hear the payload; under the release legs (bubblewrap, docker) nothing may reach them. The
wrappers under tests/data/sockets/ are bwrap-generic with one change each: the host's /run
bound in (a hole: FAIL naming a /run socket), the world's whole run dir bound in (a hole: FAIL
naming the fake daemon), and only the egress socket's own directory bound in (no hole: the
fake daemon lives elsewhere, so it PASSes). `ipc_proxy_socket_tamper` attacks the route where
each wrapper really shows it. After every cell nothing carrying its nonce is left on the host,
and a real `sandbox-attest run` of the /run hole earns no PASS gate.

All cells are real: real bubblewrap, a real Docker engine, the real running world, the payload
user as root makes it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import Backend
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog.ipc.proxy_socket import TAMPER_OPS
from sandbox_attest.host import disguise
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world
from tests.integration.test_cli_run import run_cli
from tests.reachable import reachable_tempdir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install)"),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the payload runs as a uid of its own only under root"
    ),
]

SOCKETS = Path(__file__).parent.parent / "data" / "sockets"
ESCAPE = "ipc_unix_socket_escape"
TAMPER = "ipc_proxy_socket_tamper"
WRAPPERS = ("hole_host_run", "world_dir_bound", "egress_dir_only")


def wrapper(name: str) -> CommandBackend:
    """A command-wrapper backend from tests/data/sockets/."""
    return CommandBackend.from_path(SOCKETS / f"{name}.toml")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One real running world for the module, under a short /tmp path (unix socket limits)."""
    with reachable_tempdir("sa-sock-") as base, start_world(base / "w") as running:
        yield running


@pytest.fixture(scope="module")
def runner(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CellRunner]:
    """A runner over the control leg, both release legs and the three socket wrappers."""
    from sandbox_attest.backends.docker.backend import DockerBackend  # noqa: PLC0415  (the SDK is an extra)

    docker = DockerBackend()
    backends: dict[str, Backend] = {
        "none": NoneBackend(),
        "bubblewrap": BubblewrapBackend(),
        "docker": docker,
    }
    for name in WRAPPERS:
        backend = wrapper(name)
        backends[backend.name] = backend
    availability = {name: b.availability() for name, b in backends.items()}
    down = {n: a.reason for n, a in availability.items() if not a.ok}
    assert not down, f"UNAVAILABLE here: {down}"
    scratch = tmp_path_factory.mktemp("cells")
    scratch.chmod(0o755)
    made = CellRunner(
        world=world, scratch=scratch, backends=backends, availability=availability, platform="linux"
    )
    try:
        yield made
    finally:
        docker.close()


@pytest.fixture(scope="module")
def control(runner: CellRunner) -> dict[str, CellEntry]:
    """Both probes on the open control leg (every later leg is judged against them)."""
    return {
        probe: runner.run_cell(Cell("none", ProbeRow(probe, 120), None))
        for probe in (ESCAPE, TAMPER)
    }


def run(runner: CellRunner, backend: str, probe: str) -> CellEntry:
    """One cell's evidence entry."""
    return runner.run_cell(Cell(backend, ProbeRow(probe, 120), None))


def sockets_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The witness sockets' evidence of an ipc_unix_socket_escape cell."""
    found: dict[str, Any] = entry["witness"]["witness_sockets"]
    return found


def assert_nothing_left(entry: Mapping[str, Any]) -> None:
    """No host directory a witness sat in still holds anything named with the cell's nonce."""
    nonce = entry["nonce"]
    dirs = {Path(p).parent for p in sockets_of(entry)["planted"] if not p.startswith("@")}
    left = [str(p) for d in dirs for p in entries_if_present(d) if nonce in p.name]
    assert left == []


def entries_if_present(directory: Path) -> list[Path]:
    """The directory's entries; none when its owner removed it (a busy host's temp dirs)."""
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []


class TestControlLeg:
    def test_witnesses_hear_the_unconfined_payload(self, control: dict[str, Any]) -> None:
        """On the open leg the witnesses in /tmp and the abstract namespace hear the nonce."""
        entry = control[ESCAPE]
        assert entry["verdict"] == "PASS", entry["reason"]
        heard = {h["witness"] for h in sockets_of(entry)["heard"]}
        nonce = entry["nonce"]
        assert f"/tmp/{disguise.WITNESS_PREFIX}{nonce}.sock" in heard
        assert f"@{disguise.ABSTRACT_WITNESS_PREFIX}{nonce}" in heard
        assert all(nonce in h["line"] for h in sockets_of(entry)["heard"])

    def test_socketpair_works_inside(self, control: dict[str, Any]) -> None:
        """The in-sandbox control, a socketpair round trip, succeeds on the open leg."""
        pair = [a for a in control[ESCAPE]["attempts"] if a["what"] == "socketpair"]
        assert [a["outcome"] for a in pair] == ["succeeded"]

    def test_witnesses_are_removed_after_the_cell(self, control: dict[str, Any]) -> None:
        """Every path witness planted for the cell is gone from the host afterwards."""
        entry = control[ESCAPE]
        planted = [p for p in sockets_of(entry)["planted"] if not p.startswith("@")]
        assert planted
        removed = set(sockets_of(entry)["removed"])
        assert removed <= set(planted)
        # The rest went with their directory: its owner removed it during the cell (a busy
        # host's temp dirs), so the harness had nothing left to remove there.
        assert [p for p in planted if p not in removed and os.path.lexists(p)] == []
        assert_nothing_left(entry)

    def test_tamper_passes_on_the_decoy(self, control: dict[str, Any]) -> None:
        """The tamper probe's control-leg cell sees its decoy change, so it can see an escape."""
        assert control[TAMPER]["verdict"] == "PASS", control[TAMPER]["reason"]


@pytest.mark.usefixtures("control")
class TestReleaseLegs:
    @pytest.mark.parametrize("backend", ["bubblewrap", "docker"])
    def test_no_witness_hears_a_release_leg(self, runner: CellRunner, backend: str) -> None:
        """Bubblewrap and docker PASS the class: witnesses planted, none heard the payload."""
        entry = run(runner, backend, ESCAPE)
        assert entry["verdict"] == "PASS", entry["reason"]
        assert sockets_of(entry)["planted"]
        assert sockets_of(entry)["heard"] == []
        assert_nothing_left(entry)

    @pytest.mark.parametrize("backend", ["bubblewrap", "docker"])
    def test_tamper_passes_on_the_real_route(self, runner: CellRunner, backend: str) -> None:
        """Bubblewrap and docker PASS the tamper probe with their route found and attacked."""
        entry = run(runner, backend, TAMPER)
        assert entry["verdict"] == "PASS", entry["reason"]
        assert entry["probe_facts"]["visible:sandbox"] is True
        assert entry["witness"]["removed"] == []


@pytest.mark.usefixtures("control")
class TestWrappers:
    def test_host_run_bound_fails_naming_run(self, runner: CellRunner) -> None:
        """A wrapper binding the host's /run FAILs the class, naming a /run witness and the fix."""
        entry = run(runner, "hole-host-run", ESCAPE)
        assert entry["verdict"] == "FAIL", entry["reason"]
        nonce = entry["nonce"]
        assert (
            f"witness socket /run/{disguise.WITNESS_PREFIX}{nonce}.sock heard the payload"
            in (entry["reason"])
        )
        assert "do not bind /run" in entry["reason"]
        assert_nothing_left(entry)

    def test_tamper_attacks_where_the_wrapper_puts_the_route(self, runner: CellRunner) -> None:
        """The tamper probe attacks /sandbox-route/, this wrapper's route, and finds it."""
        entry = run(runner, "hole-host-run", TAMPER)
        assert entry["verdict"] == "PASS", entry["reason"]
        assert entry["probe_facts"]["visible:sandbox"] is True
        attacked = {a["what"] for a in entry["attempts"] if a["what"].startswith("sandbox:")}
        assert attacked == {f"sandbox:{op}" for op in TAMPER_OPS}

    def test_world_dir_bound_fails_naming_the_daemon(
        self, runner: CellRunner, world: World
    ) -> None:
        """A wrapper that binds the world's whole run dir FAILs naming the fake daemon's path."""
        entry = run(runner, "world-dir-bound", ESCAPE)
        assert entry["verdict"] == "FAIL", entry["reason"]
        assert (
            f"the fake daemon at {world.info.daemon.unix} answered the payload" in (entry["reason"])
        )

    def test_egress_dir_only_exposes_no_daemon(self, runner: CellRunner) -> None:
        """Binding only the egress socket's directory PASSes both ipc probes: no daemon there."""
        escape = run(runner, "egress-dir-only", ESCAPE)
        tamper = run(runner, "egress-dir-only", TAMPER)
        assert (escape["verdict"], tamper["verdict"]) == ("PASS", "PASS"), (
            escape["reason"],
            tamper["reason"],
        )
        daemon = [a for a in escape["attempts"] if a["what"] == "daemon-unix"]
        assert [(a["outcome"], a["errno"]) for a in daemon] == [("refused", "ENOENT")]


def test_host_run_hole_earns_no_pass_gate(tmp_path: Path) -> None:
    """A real `sandbox-attest run` of the /run-binding wrapper FAILs its gate on this probe."""
    out = tmp_path / "report"
    proc = run_cli(
        "run",
        "--backend",
        "none",
        "--backend-spec",
        str(SOCKETS / "hole_host_run.toml"),
        "--out",
        str(out),
        "-j",
        "2",
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "gate: required cell hole-host-run-ipc_unix_socket_escape is FAIL" in proc.stdout
    assert "heard the payload: the sandbox exposes the host's /run" in proc.stdout
