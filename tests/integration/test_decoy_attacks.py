"""Issue 23, part 3, live: wrappers that steer the host's readings of their payload.

Two hostile command wrappers (tests/data/decoy/), each attested by a real `sandbox-attest run`:

- `decoy-privileges` hands the rendezvous to a tight decoy carrying the launcher's exact
  command line (NoNewPrivs, no capability) and runs the real payload another way, in a user
  namespace where it holds every capability. A host that reads only the process with the
  launcher's name corroborates a PASS of proc_privileges with the decoy's CapEff 0.
- `decoy-later` lets the decoy take the rendezvous alone and starts the real payload, with
  every capability, once the decoy is done: only a host that keeps reading the cell's group
  after the rendezvous sees it.
- `pidns-forger` leaves its payload in the host's pid namespace while claiming ipc
  "isolated", and prints a report of invisibility. The host read `shared_with_harness:
  ['pid']`, but proc_visibility judged the report and the anchor alone.

Both earned PASS before the host read every process of the cell's group
(sandbox_attest/host/cellgroup.py) and judged the worst. Here each must FAIL, its reason naming
the process or reading that decides, and the gate must not pass. Real processes, real uids,
root only (the payload user the wrappers run as exists only where the harness can switch).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.attest import EVIDENCE_NAME
from tests.integration.test_cli_run import CLI

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the wrappers run as the payload user, which needs root"
    ),
    pytest.mark.skipif(
        shutil.which("unshare") is None or shutil.which("setpriv") is None,
        reason="the decoy wrapper needs util-linux's unshare and setpriv",
    ),
    pytest.mark.timeout(300),
]

REPO = Path(__file__).parent.parent.parent
DECOY = Path(__file__).parent.parent / "data" / "decoy"
SPECS = ("decoy_privileges.toml", "decoy_later.toml", "pidns_forger.toml")
PROBES = ("proc_privileges", "proc_visibility")
RUN_TIMEOUT_S = 240


@dataclass(frozen=True)
class DecoyRun:
    """One run with both hostile wrappers named, and its evidence."""

    returncode: int
    stdout: str
    stderr: str
    cells: dict[str, dict[str, Any]]

    def cell(self, cell_id: str) -> dict[str, Any]:
        """The evidence entry of `cell_id`; fails naming the run's output when it is missing."""
        assert cell_id in self.cells, (
            f"no cell {cell_id} in the evidence (cells: {sorted(self.cells)}; "
            f"stdout tail: {self.stdout[-2000:]!r}; stderr tail: {self.stderr[-2000:]!r})"
        )
        return self.cells[cell_id]

    def gate(self) -> str:
        """The last `gate:` line the run printed."""
        lines = [ln for ln in self.stdout.splitlines() if ln.startswith("gate: ")]
        assert lines, f"the run printed no gate line: {self.stdout[-2000:]!r}"
        return lines[-1]


@pytest.fixture(scope="module")
def decoy_run(tmp_path_factory: pytest.TempPathFactory) -> DecoyRun:
    """Run both probes against the control leg and the two hostile wrappers."""
    root = tmp_path_factory.mktemp("decoy")
    matrix = root / "matrix.toml"
    matrix.write_text(
        "".join(f'[[probe]]\nid = "{p}"\ntimeout = 60\n' for p in PROBES)
        + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
    )
    policy = root / "policy.toml"
    probes = ", ".join(f'"{p}"' for p in PROBES)
    policy.write_text(f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{probes}]\n')
    out = root / "report"
    argv = [*CLI, "run", "--matrix", str(matrix), "--policy", str(policy), "--out", str(out)]
    for spec in SPECS:
        argv += ["--backend-spec", str(DECOY / spec)]
    done = subprocess.run(
        [*argv, "-j", "2"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        cwd=REPO,
    )
    evidence = out / EVIDENCE_NAME
    assert evidence.is_file(), f"no evidence written: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    cells = {c["cell_id"]: c for c in json.loads(evidence.read_text())["cells"]}
    return DecoyRun(done.returncode, done.stdout, done.stderr, cells)


def judged(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Every process the host judged in a cell (the view's top, then `others`)."""
    return [view, *(view.get("others") or [])] if view.get("seen") else []


class TestDecoyTakesTheRendezvous:
    """The decoy carries the launcher's name; the payload with every capability runs beside it."""

    CELL = "decoy-privileges-proc_privileges"

    def test_the_control_leg_still_passes(self, decoy_run: DecoyRun) -> None:
        """The unconfined leg sees the escape: the probe works on this host."""
        assert decoy_run.cell("none-proc_privileges")["verdict"] == "PASS"

    def test_the_host_read_both_the_decoy_and_the_payload(self, decoy_run: DecoyRun) -> None:
        """In the cell's group: the decoy (launcher, CapEff 0) and one holding every capability."""
        view = decoy_run.cell(self.CELL)["host_view"]
        assert view["mechanism"] == "cgroup", view.get("group_why")
        processes = view["processes"]
        decoys = [p for p in processes if p["launcher"]]
        assert [(p["cap_eff"], p["no_new_privs"]) for p in decoys] == [("0000000000000000", "1")]
        holders = [p for p in processes if p["role"] == "payload" and int(p["cap_eff"], 16)]
        assert holders, processes
        assert all(not p["launcher"] for p in holders)

    def test_proc_privileges_fails_naming_the_worse_process(self, decoy_run: DecoyRun) -> None:
        """FAIL, and the reason names the host pid that holds the capabilities."""
        cell = decoy_run.cell(self.CELL)
        assert cell["verdict"] == "FAIL", cell["reason"]
        holders = [p for p in judged(cell["host_view"]) if int(p["status"]["CapEff"], 16)]
        assert holders
        for process in holders:
            assert f"host pid {process['pid']}" in cell["reason"], cell["reason"]
        assert "effective capabilities" in cell["reason"]


class TestPayloadAfterTheRendezvous:
    """The decoy is alone at the rendezvous; the payload with every capability comes after."""

    CELL = "decoy-later-proc_privileges"

    def test_the_payload_was_read_when_it_joined(self, decoy_run: DecoyRun) -> None:
        """Read after the rendezvous (`when` later), holding capabilities, and judged."""
        view = decoy_run.cell(self.CELL)["host_view"]
        later = [p for p in view["processes"] if p["when"] == "later" and p["role"] == "payload"]
        assert any(int(p["cap_eff"], 16) for p in later if "cap_eff" in p), view["processes"]

    def test_proc_privileges_fails_naming_it(self, decoy_run: DecoyRun) -> None:
        """FAIL, the reason naming the late process's host pid and its capabilities."""
        cell = decoy_run.cell(self.CELL)
        assert cell["verdict"] == "FAIL", cell["reason"]
        late = [p for p in cell["host_view"]["processes"] if p["when"] == "later"]
        holders = [p for p in late if "cap_eff" in p and int(p["cap_eff"], 16)]
        assert any(f"host pid {p['pid']}" in cell["reason"] for p in holders), cell["reason"]


class TestPayloadInTheHostsPidNamespace:
    """The forger's payload shares the host's pid namespace and reports it sees nothing."""

    CELL = "pidns-forger-proc_visibility"

    def test_the_report_claims_invisibility(self, decoy_run: DecoyRun) -> None:
        """The report is the forgery's: every escape refused (what the host must overrule)."""
        attempts = decoy_run.cell(self.CELL)["attempts"]
        escapes = [a["outcome"] for a in attempts if a["role"] == "escape"]
        assert escapes
        assert set(escapes) == {"refused"}

    def test_proc_visibility_fails_on_the_hosts_reading(self, decoy_run: DecoyRun) -> None:
        """FAIL whatever the report says: the host saw the payload in its own pid namespace."""
        cell = decoy_run.cell(self.CELL)
        assert "pid" in cell["host_view"]["shared_with_harness"]
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "shared_with_harness: ['pid']" in cell["reason"]
        assert f"host pid {cell['host_view']['pid']}" in cell["reason"]


def test_the_gate_does_not_pass(decoy_run: DecoyRun) -> None:
    """The named wrappers' cells are required, so their FAILs fail the run: exit 1, FAILED."""
    assert decoy_run.gate() == "gate: FAILED", decoy_run.stdout[-3000:]
    assert decoy_run.returncode == 1
    for cell in (
        TestDecoyTakesTheRendezvous.CELL,
        TestPayloadAfterTheRendezvous.CELL,
        TestPayloadInTheHostsPidNamespace.CELL,
    ):
        assert f"gate: required cell {cell} is FAIL" in decoy_run.stdout
