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

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.attest import EVIDENCE_NAME
from tests.integration.test_cli_run import CLI, keypair
from tests.reachable import reachable_tempdir

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


@dataclass(frozen=True)
class Run:
    """One `sandbox-attest run` over the holes, the strong backends and the control leg."""

    out: Path
    returncode: int
    stdout: str
    stderr: str

    def cell(self, backend: str, probe: str) -> dict[str, Any]:
        """One cell of the signed evidence; fails naming the run's output if there is none."""
        path = self.out / EVIDENCE_NAME
        assert path.is_file(), f"no evidence: {self.stdout[-3000:]} {self.stderr[-2000:]}"
        cells: dict[str, dict[str, Any]] = {
            c["cell_id"]: c for c in json.loads(path.read_text())["cells"]
        }
        return cells[f"{backend}-{probe}"]


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    """The run, shared by the checks below."""
    with reachable_tempdir("sa-races-") as root:
        matrix = root / "matrix.toml"
        matrix.write_text(
            "".join(f'[[probe]]\nid = "{p}"\ntimeout = 30\n' for p in PROBES)
            + "".join(
                f'[[backend]]\nname = "{b}"\nplatforms = ["linux"]\n' for b in ("none", *STRONG)
            )
        )
        policy = root / "policy.toml"
        probes = ", ".join(f'"{p}"' for p in PROBES)
        policy.write_text(
            "".join(
                f'[[require]]\nplatform = "linux"\nbackend = "{b}"\nprobes = [{probes}]\n'
                for b in ("none", *STRONG)
            )
        )
        private, _ = keypair(root)
        out = root / "report"
        specs = [arg for file, _ in HOLES.values() for arg in ("--backend-spec", str(DATA / file))]
        argv = [*CLI, "run", "--matrix", str(matrix), "--policy", str(policy), *specs]
        argv += ["--key", str(private), "--out", str(out), "-j", "2"]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=REPO
        )
        yield Run(out, done.returncode, done.stdout, done.stderr)


class TestControlLeg:
    def test_sees_both_escapes_unconfined(self, run: Run) -> None:
        """Unconfined, the swap reaches the canary and the socket lands: the FAILs are not noise."""
        cell = run.cell("none", PROBE)
        assert (cell["verdict"], cell["escape"]) == ("PASS", "escaped"), cell["reason"]
        assert cell["witness"]["read"], cell["witness"]
        assert len(cell["witness"]["sockets"]) == 1, cell["witness"]


class TestStrongBackends:
    @pytest.mark.parametrize("backend", STRONG)
    def test_pass(self, run: Run, backend: str) -> None:
        """The native bwrap and docker legs bind no swappable source and no outside dir: PASS."""
        cell = run.cell(backend, PROBE)
        if cell["verdict"] == "UNAVAILABLE":
            pytest.skip(f"{backend} cannot run here: {cell['reason']}")
        assert (cell["verdict"], cell["escape"]) == ("PASS", "refused"), cell["reason"]
        assert cell["witness"]["bound"] is False, cell["witness"]
        assert cell["witness"]["sockets"] == [], cell["witness"]


class TestSwappedBindSource:
    def test_fails_naming_the_canary_behind_the_swap_and_the_fix(self, run: Run) -> None:
        """The setup followed the helper's symlink: FAIL, the host saw the canary in the view."""
        cell = run.cell("hole-setup-race", PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the canary swapped in before setup is in the payload's view" in cell["reason"]
        assert "fix: never bind a source the payload user can change" in cell["reason"]
        assert cell["witness"]["bound"] is True, cell["witness"]
        assert cell["witness"]["sockets"] == [], cell["witness"]


class TestSocketOutside:
    def test_fails_naming_the_socket_and_the_fix(self, run: Run) -> None:
        """A socket bound outside the workspace at start-up stays on the host: FAIL naming it."""
        cell = run.cell("hole-socket-dir", PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        (socket,) = cell["witness"]["sockets"]
        assert f"a unix socket of the payload's is left on the host: {socket}" in cell["reason"]
        assert "fix: bind nothing outside the workspace writable" in cell["reason"]
        assert cell["witness"]["bound"] is False, cell["witness"]


class TestGate:
    def test_no_hole_earns_a_pass_gate(self, run: Run) -> None:
        """Exit 1 and gate FAILED: the holes' FAIL cells are not hidden by the PASSing legs."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
