"""Issue 28, races, live: a swapped bind source and a start-up socket each FAIL, strong legs PASS.

Two deliberately broken wrappers under tests/data/newclasses/, each matrix/backends/
bwrap-generic.toml with one hole, go through one real `sandbox-attest run` beside the control
leg and the native bubblewrap and docker backends:

- fs_setup_race_hole.toml binds a directory the payload user owns (race/shared) read-only;
  fs_setup_race's helper, running as the payload user outside the sandbox, swapped it for a
  symlink to a host canary dir before the cell, and bwrap follows it: FAIL naming the canary
  the host saw in the payload's view behind the swapped path, and the fix;
- fs_setup_race_socket_hole.toml binds a directory outside the workspace writable: the unix
  socket the payload binds there at start-up is left on the host: FAIL naming the socket.

Real bubblewrap, real docker, real uids; root only (the payload user exists only as root).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.hole_runs import HoleRun, hole_run

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install)"),
    pytest.mark.timeout(400),
]

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "newclasses"
PROBES = ("fs_setup_race",)
PROBE = "fs_setup_race"
# Each wrapper (its [backend] name), its spec, and the one probe its hole must FAIL.
HOLES = {
    "hole-setup-race": ("fs_setup_race_hole.toml", PROBE),
    "hole-socket-dir": ("fs_setup_race_socket_hole.toml", PROBE),
}
STRONG = ("bubblewrap", "docker")
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """The run, shared by the checks below."""
    legs = ("none", *STRONG)
    specs = [DATA / file for file, _ in HOLES.values()]
    with hole_run(
        "sa-races-", probes=PROBES, legs=legs, required=legs, specs=specs, run_timeout=RUN_TIMEOUT_S
    ) as done:
        yield done


class TestControlLeg:
    def test_sees_both_escapes_unconfined(self, run: HoleRun) -> None:
        """Unconfined, the swap reaches the canary and the socket lands: the FAILs are not noise."""
        cell = run.cell("none", PROBE)
        assert (cell["verdict"], cell["escape"]) == ("PASS", "escaped"), cell["reason"]
        assert cell["witness"]["read"], cell["witness"]
        assert len(cell["witness"]["sockets"]) == 1, cell["witness"]


class TestStrongBackends:
    @pytest.mark.parametrize("backend", STRONG)
    def test_pass(self, run: HoleRun, backend: str) -> None:
        """The native bwrap and docker legs bind no swappable source and no outside dir: PASS."""
        cell = run.cell(backend, PROBE)
        if cell["verdict"] == "UNAVAILABLE":
            pytest.skip(f"{backend} cannot run here: {cell['reason']}")
        assert (cell["verdict"], cell["escape"]) == ("PASS", "refused"), cell["reason"]
        assert cell["witness"]["bound"] is False, cell["witness"]
        assert cell["witness"]["sockets"] == [], cell["witness"]


class TestSwappedBindSource:
    def test_fails_naming_the_canary_behind_the_swap_and_the_fix(self, run: HoleRun) -> None:
        """The setup followed the helper's symlink: FAIL, the host saw the canary in the view."""
        cell = run.cell("hole-setup-race", PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the canary swapped in before setup is in the payload's view" in cell["reason"]
        assert "fix: never bind a source the payload user can change" in cell["reason"]
        assert cell["witness"]["bound"] is True, cell["witness"]
        assert cell["witness"]["sockets"] == [], cell["witness"]


class TestSocketOutside:
    def test_fails_naming_the_socket_and_the_fix(self, run: HoleRun) -> None:
        """A socket bound outside the workspace at start-up stays on the host: FAIL naming it."""
        cell = run.cell("hole-socket-dir", PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        (socket,) = cell["witness"]["sockets"]
        assert f"a unix socket of the payload's is left on the host: {socket}" in cell["reason"]
        assert "fix: bind nothing outside the workspace writable" in cell["reason"]
        assert cell["witness"]["bound"] is False, cell["witness"]


class TestGate:
    def test_no_hole_earns_a_pass_gate(self, run: HoleRun) -> None:
        """Exit 1 and gate FAILED: the holes' FAIL cells are not hidden by the PASSing legs."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
