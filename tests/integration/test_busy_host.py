"""A busy host never changes a verdict (issue 24, part 3), live.

Every cell here runs while `tests.noise.busy_host()` keeps /tmp and /run busy: a root-only
0700 directory with a listening socket (a browser's), and `tmp.*` directories with sockets and
writable subdirectories made and removed every few milliseconds, some removed and made again
under the same name. Before the fix the control leg's witnesses went silent in the private
directory (INCONCLUSIVE) and a canary planted in a directory its owner then removed read as a
write that got through (a false FAIL). Now:

- the strong bubblewrap leg PASSes every probe that plants under /tmp or /run, five rounds in a
  row, and so does the open control leg (each site it could not reach is dropped and listed);
- every true hole of those probes still FAILs under the same noise: the host's /tmp bound in,
  the host's /run bound in, a daemon socket bound in, the host network shared, /var/tmp bound,
  the host's whole / bound writable.

All cells are real: real bubblewrap, the real running world, the payload user as root makes it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends import create_backend
from sandbox_attest.backends.base import Backend
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog.fs import writable as fs
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world
from tests.noise import Noise, busy_host
from tests.reachable import reachable_tempdir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install)"),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the payload runs as a uid of its own only under root"
    ),
    pytest.mark.timeout(900),
]

DATA = Path(__file__).parent.parent / "data"
# Every probe that plants a witness or canary under /tmp or /run, and fs_read_secrets, which
# the reports named beside them.
PROBES = ("ipc_unix_socket_escape", "fs_write_outside", "fs_read_secrets", "fs_link_escape")
ROUNDS = 5
# Each true hole (backend name -> how to make it) and the probes of PROBES it must FAIL.
HOLES: dict[str, tuple[Path | frozenset[str], frozenset[str]]] = {
    "hole-host-tmp": (
        DATA / "busy" / "hole_host_tmp.toml",
        frozenset({"fs_write_outside", "fs_link_escape", "ipc_unix_socket_escape"}),
    ),
    "hole-host-run": (
        DATA / "sockets" / "hole_host_run.toml",
        frozenset({"ipc_unix_socket_escape"}),
    ),
    "generic-docker-socket": (
        DATA / "specs" / "hole_generic_docker_socket.toml",
        frozenset({"ipc_unix_socket_escape"}),
    ),
    "hole-var-tmp": (
        DATA / "hostclasses" / "var_tmp.toml",
        frozenset({"fs_write_outside"}),
    ),
    "bwrap-share-net": (frozenset({"share-net"}), frozenset({"ipc_unix_socket_escape"})),
    # The host's / writable: the payload user's canaries, its home's secrets and the host's
    # /run witnesses are all in view.
    "bwrap-host-root-rw": (
        frozenset({"host-root-rw"}),
        frozenset({"fs_write_outside", "fs_read_secrets", "ipc_unix_socket_escape"}),
    ),
}


def make_hole(name: str) -> Backend:
    """The hole `name` of HOLES: a command wrapper from its spec, or a weakened bubblewrap."""
    how = HOLES[name][0]
    if isinstance(how, Path):
        return CommandBackend.from_path(how)
    return BubblewrapBackend(weaken=how)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One real running world for the module, under a short /tmp path (unix socket limits)."""
    with reachable_tempdir("sa-busy-") as base, start_world(base / "w") as running:
        yield running


@pytest.fixture(scope="module")
def still(runner: CellRunner) -> dict[str, str]:
    """The command wrapper's verdicts before the noise starts: what a busy host must not change."""
    for probe in PROBES:
        run(runner, "none", probe)
    return {probe: run(runner, "bwrap-generic", probe)["verdict"] for probe in PROBES}


@pytest.fixture(scope="module")
def noise(still: dict[str, str]) -> Iterator[Noise]:
    """The busy host, running for every later cell of the module (control leg included)."""
    del still  # taken first, on the still host
    with busy_host() as running:
        yield running


@pytest.fixture(scope="module")
def runner(world: World, tmp_path_factory: pytest.TempPathFactory) -> CellRunner:
    """A runner over the control leg, the strong bubblewrap leg and every hole."""
    backends: dict[str, Backend] = {
        "none": NoneBackend(),
        "bubblewrap": BubblewrapBackend(),
        # The third-party shape: the same sandbox through a spec file and the command backend.
        "bwrap-generic": create_backend("bwrap-generic"),
    }
    for name in HOLES:
        backends[name] = make_hole(name)
    availability = {name: b.availability() for name, b in backends.items()}
    down = {n: a.reason for n, a in availability.items() if not a.ok}
    assert not down, f"UNAVAILABLE here: {down}"
    scratch = tmp_path_factory.mktemp("cells")
    scratch.chmod(0o755)
    return CellRunner(
        world=world, scratch=scratch, backends=backends, availability=availability, platform="linux"
    )


def run(runner: CellRunner, backend: str, probe: str) -> CellEntry:
    """One cell's evidence entry; fs_write_outside's writable-place scan is redone first.

    The scan is kept once per process (places do not change on a still host); redone here,
    it meets this busy host's transient writable directories, so canaries go into them.
    """
    if probe == "fs_write_outside":
        # The scan's cache is the seam: without this it keeps what an earlier test's scan saw.
        fs._scan_as.cache_clear()
    return runner.run_cell(Cell(backend, ProbeRow(probe, 180), None))


@pytest.fixture(scope="module")
def control(runner: CellRunner, noise: Noise) -> dict[str, CellEntry]:
    """Every probe on the open control leg under noise (later legs are judged against them)."""
    del noise
    return {probe: run(runner, "none", probe) for probe in PROBES}


def verdicts(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each probe's verdict, with its reason where it is not PASS."""
    return {
        p: e["verdict"] if e["verdict"] == "PASS" else f"{e['verdict']}: {e['reason']}"
        for p, e in entries.items()
    }


def test_control_leg_passes_under_noise(control: dict[str, dict[str, Any]], noise: Noise) -> None:
    """The open control leg PASSes every planting probe while the host is busy."""
    assert all(e["verdict"] == "PASS" for e in control.values()), (
        verdicts(control),
        noise.summary(),
    )


@pytest.mark.usefixtures("control")
@pytest.mark.parametrize("round_", range(1, ROUNDS + 1))
def test_strong_bubblewrap_passes_under_noise(
    runner: CellRunner, noise: Noise, round_: int
) -> None:
    """The strong bubblewrap leg PASSes every planting probe under noise, round after round."""
    entries = {probe: run(runner, "bubblewrap", probe) for probe in PROBES}
    assert all(e["verdict"] == "PASS" for e in entries.values()), (
        round_,
        verdicts(entries),
        noise.summary(),
    )
    # The noise reached the cell: witnesses went into its transient directories too.
    sites = entries["ipc_unix_socket_escape"]["witness"]["witness_sockets"]["planted"]
    assert {Path(s).parent for s in sites} & noise.paths, (sites, noise.summary())


@pytest.mark.usefixtures("control")
def test_command_wrapper_keeps_its_verdicts_under_noise(
    runner: CellRunner, noise: Noise, still: dict[str, str]
) -> None:
    """The sandbox through a spec file (a third-party wrapper's shape) gives its still verdicts.

    Its witness and canary probes PASS on a still host; fs_read_secrets is what the host's look
    through a wrapper makes it there, and the noise must not change that either.
    """
    entries = {probe: run(runner, "bwrap-generic", probe) for probe in PROBES}
    got = {p: e["verdict"] for p, e in entries.items()}
    assert got == still, (verdicts(entries), noise.summary())
    assert {got["ipc_unix_socket_escape"], got["fs_write_outside"]} == {"PASS"}


@pytest.mark.usefixtures("control")
@pytest.mark.parametrize(
    ("backend", "probe"),
    [(name, probe) for name, (_, must) in HOLES.items() for probe in sorted(must)],
)
def test_true_hole_still_fails_under_noise(
    runner: CellRunner, noise: Noise, backend: str, probe: str
) -> None:
    """A hole that exposes what the probe plants FAILs under noise, as on a still host."""
    entry = run(runner, backend, probe)
    assert entry["verdict"] == "FAIL", (entry["reason"], noise.summary())
