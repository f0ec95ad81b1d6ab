"""Issue 28, live: other processes and the host's control files, each with its one hole.

One real `sandbox-attest run` over the strong backends (bubblewrap, docker), the control leg
`none` and one deliberately broken wrapper per probe (tests/data/newclasses/<probe>_hole.toml:
matrix/backends/bwrap-generic.toml with exactly that hole):

- proc_cross_process_hole.toml shares the host's pid namespace (no --unshare-pid): the payload
  delivers SIGUSR1 to the harness's target process outside the sandbox, which logs it.
- fs_open_by_handle's hole is docker's `dac-read-search` weakening (see SHOCKER): the payload
  opens the harness's canary outside its view by the file handle the host computed.
- proc_kernel_tunables_hole.toml binds the host's /sys/fs/cgroup writable: the payload makes a
  nonce-named group in the cgroup the harness delegated to the payload user, and the host
  finds it in its own cgroupfs.

Each hole FAILs its own probe, naming what happened and the fix; the strong backends PASS;
the control leg sees every escape (its job). Real bubblewrap, docker, processes and uids;
root only (the payload user exists only as root).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.backends.base import Backend
from sandbox_attest.report.evidence import CellEntry
from tests.integration.hole_runs import HoleRun, hole_run
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.timeout(400),
]

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "newclasses"
# Each probe and the [backend] name of its hole wrapper.
HOLES = {
    "proc_cross_process": "hole-cross-process",
    "proc_kernel_tunables": "hole-host-cgroupfs",
}
# fs_open_by_handle's hole is a capability in the host's user namespace, which no wrapper
# spec can grant: a wrapper runs as the payload user. It is the native docker backend run as
# root with --cap-add DAC_READ_SEARCH and the engine's own seccomp profile (which admits
# open_by_handle_at once that capability is added): the Shocker configuration.
SHOCKER = ("root-user", "default-seccomp", "dac-read-search")
PROBES = (*HOLES, "fs_open_by_handle")
STRONG = ("bubblewrap", "docker")
LEGS = ("none", *STRONG)
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """The run, shared by the checks below."""
    specs = [DATA / f"{p}_hole.toml" for p in HOLES]
    with hole_run(
        "sa-issue28-",
        probes=PROBES,
        legs=LEGS,
        required=("none",),
        specs=specs,
        named=STRONG,
        probe_timeout=40,
        run_timeout=RUN_TIMEOUT_S,
    ) as done:
        yield done


def _strong_or_skip(run: HoleRun, backend: str, probe: str) -> dict[str, Any]:
    cell = run.cell(backend, probe)
    if cell["verdict"] == "UNAVAILABLE":
        pytest.skip(f"{backend} is unavailable here: {cell['reason']}")
    return cell


@pytest.mark.parametrize("probe", PROBES)
class TestEachProbe:
    def test_the_control_leg_sees_the_escape(self, run: HoleRun, probe: str) -> None:
        """Unconfined, the payload user reaches the target: PASS because the escape was seen."""
        cell = run.cell("none", probe)
        assert (cell["verdict"], cell["escape"]) == ("PASS", "escaped"), cell["reason"]

    @pytest.mark.parametrize("backend", STRONG)
    def test_the_strong_backends_hold(self, run: HoleRun, probe: str, backend: str) -> None:
        """The strong backends (bubblewrap, docker) refuse every attempt; the control holds."""
        cell = _strong_or_skip(run, backend, probe)
        assert cell["verdict"] == "PASS", cell["reason"]
        assert cell["escape"] in {"refused", "contained"}, cell["reason"]


@pytest.mark.parametrize("probe", sorted(HOLES))
class TestEachHole:
    def test_the_hole_fails_naming_the_fix(self, run: HoleRun, probe: str) -> None:
        """The wrapper with exactly this hole FAILs, and its reason says how to close it."""
        cell = run.cell(HOLES[probe], probe)
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "fix: " in cell["reason"], cell["reason"]


class TestCrossProcess:
    def test_the_signal_reached_the_target(self, run: HoleRun) -> None:
        """Sharing the host's pid namespace lets SIGUSR1 reach the target: its log names it."""
        cell = run.cell(HOLES["proc_cross_process"], "proc_cross_process")
        assert cell["witness"]["signals"], cell["witness"]
        assert "signal-usr1" in cell["reason"], cell["reason"]
        assert "--unshare-pid" in cell["reason"], cell["reason"]


class TestKernelTunables:
    def test_the_host_found_the_group(self, run: HoleRun) -> None:
        """The host's cgroupfs held the payload's nonce-named group: FAIL naming the bind."""
        cell = run.cell(HOLES["proc_kernel_tunables"], "proc_kernel_tunables")
        assert cell["witness"]["group_made"] is True, cell["witness"]
        assert f"escape-{cell['nonce']}" in cell["reason"], cell["reason"]
        assert "do not bind the host's /sys/fs/cgroup" in cell["reason"], cell["reason"]

    def test_no_group_is_left_behind(self, run: HoleRun) -> None:
        """Cleanup removed every delegated group, the payload's included."""
        cell = run.cell(HOLES["proc_kernel_tunables"], "proc_kernel_tunables")
        made = Path(cell["witness"]["group"])
        assert made.name == f"escape-{cell['nonce']}", made
        assert not made.parent.exists(), made.parent

    @pytest.mark.parametrize("backend", STRONG)
    def test_no_control_file_opened_for_writing(self, run: HoleRun, backend: str) -> None:
        """Inside the strong backends every write-only open of a control file was refused."""
        cell = _strong_or_skip(run, backend, "proc_kernel_tunables")
        assert cell["witness"]["opened"] == [], cell["witness"]
        assert cell["witness"]["host_root"] == "", cell["witness"]


@pytest.fixture(scope="module")
def shocker() -> Iterator[dict[str, CellEntry]]:
    """fs_open_by_handle on the control leg and on docker with the Shocker configuration."""
    from sandbox_attest.backends.docker.backend import DockerBackend  # noqa: PLC0415  (an extra)
    from sandbox_attest.backends.none import NoneBackend  # noqa: PLC0415
    from sandbox_attest.run.runner import CellRunner  # noqa: PLC0415
    from sandbox_attest.world.core import start_world  # noqa: PLC0415
    from tests.here import cell_here  # noqa: PLC0415

    with reachable_tempdir("sa-shocker-") as root:
        world = start_world(root / "world")
        hole = DockerBackend(weaken=frozenset(SHOCKER))
        try:
            backends: dict[str, Backend] = {"none": NoneBackend(), "docker-shocker": hole}
            availability = {n: b.availability() for n, b in backends.items()}
            if not availability["docker-shocker"].ok:
                pytest.skip(f"docker is unavailable: {availability['docker-shocker'].reason}")
            scratch = root / "cells"
            scratch.mkdir(mode=0o755)
            runner = CellRunner(
                world=world,
                scratch=scratch,
                backends=backends,
                availability=availability,
                platform="linux",
            )
            yield {
                leg: runner.run_cell(cell_here(leg, "fs_open_by_handle", 60))
                for leg in ("none", "docker-shocker")
            }
        finally:
            hole.close()
            world.stop()


class TestOpenByHandle:
    def test_the_control_leg_reads_the_canary(self, shocker: dict[str, dict[str, Any]]) -> None:
        """Unconfined, the payload user reads the canary by path: the escape is seen."""
        cell = shocker["none"]
        assert (cell["verdict"], cell["escape"]) == ("PASS", "escaped"), cell["reason"]

    def test_the_capability_opens_the_canary_by_handle(
        self, shocker: dict[str, dict[str, Any]]
    ) -> None:
        """Root with CAP_DAC_READ_SEARCH reads the canary outside its view: FAIL with the fix."""
        cell = shocker["docker-shocker"]
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert cell["witness"]["read_via"] == ["by_handle"], cell["witness"]
        assert "by its file handle" in cell["reason"], cell["reason"]
        assert "fix: drop CAP_DAC_READ_SEARCH" in cell["reason"], cell["reason"]
