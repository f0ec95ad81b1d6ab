"""Issue 14 item 3, live: classes, not instances, each with a host witness.

Three deliberately broken wrappers under tests/data/hostclasses/, each matrix/backends/
bwrap-generic.toml with one hole, go through a real `sandbox-attest run` with the control leg:

- var_tmp.toml binds the host's /var/tmp writable: `fs_write_outside` FAILs naming /var/tmp
  and the fix (its canary there changed on the host);
- dev_bind.toml binds the host's whole /dev (`--dev-bind /dev /dev`): `dev_access` FAILs
  naming a host device the payload user opened through it, and the fix; and, as the host's
  /dev/shm comes with it, `fs_write_outside` FAILs naming /dev/shm;
- orphans.toml shares the host's pid namespace and passes the agent's environment:
  `lifecycle_orphans` FAILs naming the children's pids and commands. They cannot leave the
  cell's group, so the harness's sweep kills them, and that kill is the sandbox's escape.

A fourth, leaves_helper.toml, starts bwrap-generic from a shell that first leaves a helper
running in a new session: the harness's leftover sweep kills it (by the cell's group), and that kill
must count as this sandbox's escape in `lifecycle_orphans`, not as its cleanup: the command
backend records what its sweep killed (`run.sweep.record_leftovers`) and the catalogue
reads it from the cell dir.

Each hole FAILs its own probe and no other; none of them earns a PASS gate. Real bubblewrap,
real devices, real processes, real uids; root only (the payload user exists only as root).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.attest import EVIDENCE_NAME
from sandbox_attest.catalog.dev import payload_user_devices, sensitive
from sandbox_attest.catalog.lifecycle import find_orphans
from sandbox_attest.host.trust import payload_user
from tests.here import not_judgeable_here
from tests.integration.test_cli_run import CLI, keypair
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.timeout(400),
]

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "hostclasses"
PROBES = ("fs_write_outside", "dev_access", "lifecycle_orphans")
# Each wrapper (its [backend] name) and the probes its hole must FAIL.
HOLES = {
    "hole-var-tmp": ("var_tmp.toml", frozenset({"fs_write_outside"})),
    "hole-dev-bind": ("dev_bind.toml", frozenset({"dev_access", "fs_write_outside"})),
    "hole-orphans": ("orphans.toml", frozenset({"lifecycle_orphans"})),
}
# A wrapper whose own helper outlives it (see the module docstring).
LEAVES = "hole-leaves-helper"
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class HolesRun:
    """One `sandbox-attest run` over the three broken wrappers and the control leg."""

    out: Path
    returncode: int
    stdout: str
    stderr: str

    def cells(self) -> dict[str, dict[str, Any]]:
        """The signed evidence's cells by id; fails naming the run's output if there is none."""
        path = self.out / EVIDENCE_NAME
        assert path.is_file(), f"no evidence: {self.stdout[-3000:]} {self.stderr[-2000:]}"
        evidence = json.loads(path.read_text())
        return {c["cell_id"]: c for c in evidence["cells"]}

    def cell(self, backend: str, probe: str) -> dict[str, Any]:
        """One cell."""
        return self.cells()[f"{backend}-{probe}"]


def judged_here(probe: str) -> None:
    """Skip, with the host's reason, where this machine cannot judge `probe`."""
    reason = not_judgeable_here(probe)
    if reason is not None:
        pytest.skip(f"{probe} is not judged on this machine: {reason}")


@pytest.fixture(scope="module")
def run() -> Iterator[HolesRun]:
    """The run, shared by the checks below."""
    with reachable_tempdir("sa-hostclasses-") as root:
        matrix = root / "matrix.toml"
        matrix.write_text(
            "".join(f'[[probe]]\nid = "{p}"\ntimeout = 40\n' for p in PROBES)
            + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        )
        policy = root / "policy.toml"
        # The control leg's lifecycle_orphans is left out as the release policy leaves it out.
        required = ", ".join(f'"{p}"' for p in PROBES if p != "lifecycle_orphans")
        policy.write_text(
            f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{required}]\n'
        )
        private, _ = keypair(root)
        out = root / "report"
        files = [*(file for file, _ in HOLES.values()), "leaves_helper.toml"]
        specs = [arg for file in files for arg in ("--backend-spec", str(DATA / file))]
        argv = [
            *CLI,
            "run",
            "--matrix",
            str(matrix),
            "--policy",
            str(policy),
            *specs,
            "--key",
            str(private),
            "--out",
            str(out),
            "-j",
            "2",
        ]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=REPO
        )
        yield HolesRun(out, done.returncode, done.stdout, done.stderr)


class TestControlLeg:
    def test_every_probe_sees_its_escape_unconfined(self, run: HolesRun) -> None:
        """On the open leg each probe PASSes because it saw the escape: the FAILs are not noise."""
        for probe in PROBES:
            cell = run.cell("none", probe)
            unjudged = not_judgeable_here(probe)
            if unjudged is not None:  # the run says so on every leg, as a run here must
                assert (cell["verdict"], cell["reason"]) == ("NOT_APPLICABLE", unjudged), probe
                continue
            assert cell["verdict"] == "PASS", (probe, cell["reason"])
            assert cell["escape"] == "escaped", (probe, cell["reason"])


class TestVarTmpWritable:
    def test_fails_naming_var_tmp_and_the_fix(self, run: HolesRun) -> None:
        """A writable /var/tmp is an escape the host saw: FAIL naming /var/tmp and the fix."""
        cell = run.cell("hole-var-tmp", "fs_write_outside")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "host sees canary changes: var_tmp (/var/tmp)" in cell["reason"]
        assert "fix: do not bind /var/tmp writable into the sandbox" in cell["reason"]
        assert set(cell["witness"]["changed"]) == {"var_tmp"}, cell["witness"]["changed"]

    def test_the_other_classes_held(self, run: HolesRun) -> None:
        """Every other class (home, its config dirs, /dev/shm, the run dir...) stayed intact."""
        cell = run.cell("hole-var-tmp", "fs_write_outside")
        classes = set(cell["witness"]["classes"])
        assert {"tmp", "shm", "home", "config", "cache", "local_share", "run_dir"} <= classes


class TestDevBound:
    def test_fails_naming_a_device_that_exists_here(self, run: HolesRun) -> None:
        """The host's /dev bound in exposes a device the payload user opens: FAIL naming it."""
        judged_here("dev_access")
        here = sensitive(payload_user_devices(payload_user()))
        assert here, "no device beyond the harmless set opens for the payload user here"
        cell = run.cell("hole-dev-bind", "dev_access")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the sandbox exposes " in cell["reason"]
        assert any(f"/dev/{rel} (" in cell["reason"] for rel in here), (here, cell["reason"])
        assert "do not bind the host's /dev into the sandbox" in cell["reason"]

    def test_the_host_saw_the_device_in_the_payloads_dev(self, run: HolesRun) -> None:
        """The host's own listing of the payload's /dev holds the device it opened."""
        judged_here("dev_access")
        cell = run.cell("hole-dev-bind", "dev_access")
        view = cell["witness"]["payload_view"]
        assert view["seen"], view
        assert set(cell["witness"]["exposed"]) <= {f"dev:{rel}" for rel in view["nodes"]}
        assert cell["corroborated_by"], cell

    def test_the_hosts_shm_comes_with_it(self, run: HolesRun) -> None:
        """The bound /dev carries the host's /dev/shm: fs_write_outside FAILs naming it."""
        cell = run.cell("hole-dev-bind", "fs_write_outside")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert set(cell["witness"]["changed"]) == {"shm"}, cell["witness"]["changed"]
        assert "fix: do not bind /dev/shm writable into the sandbox" in cell["reason"]


class TestOrphansOutliveTheWrapper:
    def test_fails_naming_pids_and_commands(self, run: HolesRun) -> None:
        """Children outside any pid namespace outlive the wrapper: FAIL naming pid and command.

        They stay in the cell's group whatever session or environment they take, so the
        harness's sweep ends them once the wrapper is gone, and names each as the sandbox's
        escape (sandbox_attest/host/cellgroup.py): none is left for the watch to see alive.
        """
        cell = run.cell("hole-orphans", "lifecycle_orphans")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "children outlived the payload: " in cell["reason"]
        assert cell["witness"]["watch"]["alive_processes"] == []
        swept = cell["witness"]["watch"]["swept"]
        for kind in ("setsid", "daemon"):
            named = [s for s in swept if f"/{kind}.ticks " in s]
            assert len(named) == 1, (kind, swept)
            assert named[0].split(" ", 1)[0] in cell["reason"]

    def test_the_sandbox_is_not_credited_with_the_cleanup(self, run: HolesRun) -> None:
        """The reason never says the children stopped with the payload; none is left alive."""
        cell = run.cell("hole-orphans", "lifecycle_orphans")
        assert "every child stopped with the payload" not in cell["reason"]
        assert find_orphans(cell["nonce"]) == []  # cleanup (or their own lifetime) ended them


class TestHelperLeftBehind:
    def test_the_sweep_killed_it(self, run: HolesRun) -> None:
        """The wrapper's helper outlived the sandbox; the harness's sweep killed it."""
        cell = run.cell(LEAVES, "lifecycle_orphans")
        notes = " ".join(cell["run"]["notes"])
        assert "killed 1 process(es) the run left behind: " in notes, cell["run"]
        assert "(sleep 300)" in notes

    def test_fails_naming_the_swept_helper(self, run: HolesRun) -> None:
        """A process only the harness's sweep ended is the sandbox's escape: FAIL naming it."""
        cell = run.cell(LEAVES, "lifecycle_orphans")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the harness's sweep had to kill 1 process(es)" in cell["reason"]
        assert "(sleep 300)" in cell["reason"]


class TestEachHoleItsOwnProbe:
    @pytest.mark.parametrize("backend", sorted(HOLES))
    def test_no_other_probe_fails(self, run: HolesRun, backend: str) -> None:
        """A wrapper's hole FAILs its probes only: the others are not FAIL under it."""
        _, probes = HOLES[backend]
        others = {p: run.cell(backend, p)["verdict"] for p in PROBES if p not in probes}
        assert "FAIL" not in others.values(), {p: run.cell(backend, p)["reason"] for p in others}


class TestGate:
    def test_no_hole_earns_a_pass_gate(self, run: HolesRun) -> None:
        """Exit 1 and gate FAILED, naming each hole's FAIL cell."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
        for backend, (_, probes) in HOLES.items():
            for probe in probes:
                if not_judgeable_here(probe) is not None:
                    continue  # NOT_APPLICABLE on this machine (TestControlLeg holds it to that)
                assert f"gate: required cell {backend}-{probe} is FAIL" in run.stdout, gate
