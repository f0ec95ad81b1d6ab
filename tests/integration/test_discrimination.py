"""The harness tells a good sandbox from a broken one (issue 8, "Discrimination").

A corpus of deliberately weakened sandbox configurations: for each, the probes that match the
hole must FAIL, and every probe unrelated to the hole must still PASS (no collateral noise).
All cells run for real: real bubblewrap, a real Docker engine, the real fixture world. The
strong configurations must give zero FAIL and zero INCONCLUSIVE (the slow tier repeats them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.backends.base import Backend
from harness.backends.bubblewrap import BubblewrapBackend
from harness.backends.none import NoneBackend
from harness.catalog import PROBES
from harness.matrix import Cell, ProbeRow, load_matrix
from harness.paths import matrix_dir
from harness.runner import CellRunner
from harness.world import World, start_world

pytestmark = pytest.mark.slow

CORE = (
    "net_denied_host",
    "net_direct_egress",
    "dns_resolution",
    "ipc_unix_socket_escape",
    "fs_write_outside",
    "net_transfer_18mib",
    "pkg_pip_install",
)


def docker(weaken: frozenset[str] = frozenset()) -> Backend:
    """A docker backend (imported lazily: the SDK is an extra)."""
    from harness.backends.docker import DockerBackend  # noqa: PLC0415

    return DockerBackend(weaken=weaken)


@dataclass(frozen=True)
class Broken:
    """One weakened configuration and the probes its hole must FAIL."""

    id: str
    make: Callable[[], Backend]
    must_fail: frozenset[str]
    why: str


CORPUS = [
    Broken(
        "bubblewrap-share-net",
        lambda: BubblewrapBackend(weaken=frozenset({"share-net"})),
        frozenset({"net_direct_egress", "dns_resolution", "ipc_unix_socket_escape"}),
        "the host network: its listener, its DNS port and its abstract sockets",
    ),
    Broken(
        "bubblewrap-host-root-rw",
        lambda: BubblewrapBackend(weaken=frozenset({"host-root-rw"})),
        frozenset({"fs_write_outside", "ipc_unix_socket_escape"}),
        "the host's / writable: canaries change, and /var/run/docker.sock is visible",
    ),
    Broken(
        "docker-socket-mounted",
        lambda: docker(frozenset({"docker-socket"})),
        frozenset({"ipc_unix_socket_escape"}),
        "the Docker socket mounted in answers /_ping",
    ),
    Broken(
        "docker-host-network",
        lambda: docker(frozenset({"host-network"})),
        frozenset({"net_direct_egress", "dns_resolution", "ipc_unix_socket_escape"}),
        "the host network namespace",
    ),
]
STRONG: dict[str, Callable[[], Backend]] = {
    "bubblewrap": BubblewrapBackend,
    "docker": docker,
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real fixture world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def control(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The control leg's results for every probe (every later leg is judged against them)."""
    runner = make_runner(world, tmp_path_factory.mktemp("control"), {})
    results = {p: runner.run_cell(Cell("none", ProbeRow(p, 180), None)) for p in probes()}
    for probe, entry in results.items():
        assert entry["verdict"] == "PASS", f"control leg {probe}: {entry['reason']}"
    return results


def probes() -> list[str]:
    """Every probe of the shipped matrix that applies on Linux."""
    rows = load_matrix(matrix_dir() / "matrix.toml").probes
    return [row.id for row in rows if "linux" in row.platforms and row.id in PROBES]


def make_runner(
    world: World, scratch: Path, backends: dict[str, Backend], control: dict[str, Any] | None = None
) -> CellRunner:
    """A runner over `backends` with the control leg's results preloaded."""
    every: dict[str, Backend] = {"none": NoneBackend(), **backends}
    runner = CellRunner(
        world=world,
        scratch=scratch,
        backends=every,
        availability={n: b.availability() for n, b in every.items()},
        platform="linux",
    )
    runner.control_results.update(control or {})
    return runner


def run_all(runner: CellRunner, backend: str) -> dict[str, dict[str, Any]]:
    """Every probe under `backend`."""
    return {p: runner.run_cell(Cell(backend, ProbeRow(p, 180), None)) for p in probes()}


@pytest.mark.parametrize("broken", CORPUS, ids=[b.id for b in CORPUS])
def test_hole_fails_its_probes_and_nothing_else(
    broken: Broken, world: World, tmp_path: Path, control: dict[str, Any]
) -> None:
    """The matching probes FAIL; every unrelated probe still PASSes."""
    backend = broken.make()
    try:
        runner = make_runner(world, tmp_path, {broken.id: backend}, control)
        results = run_all(runner, broken.id)
    finally:
        getattr(backend, "close", lambda: None)()
    got = {p: e["verdict"] for p, e in results.items()}
    want = {p: ("FAIL" if p in broken.must_fail else "PASS") for p in results}
    reasons = {p: e["reason"] for p, e in results.items() if got[p] != want[p]}
    assert got == want, f"{broken.why}: {reasons}"


@pytest.mark.parametrize("name", list(STRONG))
def test_strong_configuration_is_clean_three_times(
    name: str, world: World, tmp_path: Path, control: dict[str, Any]
) -> None:
    """A good configuration gives all PASS, identically, in three repeated runs."""
    backend = STRONG[name]()
    try:
        runner = make_runner(world, tmp_path, {name: backend}, control)
        rounds = [{p: e["verdict"] for p, e in run_all(runner, name).items()} for _ in range(3)]
    finally:
        getattr(backend, "close", lambda: None)()
    assert rounds[0] == dict.fromkeys(probes(), "PASS")
    assert rounds[0] == rounds[1] == rounds[2]
