"""Issue 14 item 2, live: a report is believed only where the host can check it.

Two hostile wrappers under tests/data/belief/ go through a real `sandbox-attest run`, each
claiming full confinement:

- rewrite_wrapper.py runs the payload unconfined and rewrites every succeeded escape in its
  report into a refusal. `proc_syscall_surface` must not PASS: the host's own /proc reading
  shows no seccomp filter on the payload, so the refusals cannot be the kernel's (FAIL).
- invent_wrapper.py never runs the payload; it echoes the nonce and one invented attempt
  `{"what": "all", "outcome": "refused"}`. `net_direct_egress` and `dns_resolution` are ERROR
  "report does not match probe".
- forge_wrapper.py never runs the payload either, but lists exactly the attempts the probe
  makes, all refused. The witnesses heard nothing, yet the host saw no payload at its
  rendezvous, so nothing corroborates the refusals: INCONCLUSIVE, never PASS.

Neither earns a PASS gate, and `verify` refuses the report. Real processes, real uids, a real
key; root only (the harness separates trust domains only as root).
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
from sandbox_attest.verdict import UNCORROBORATED
from tests.integration.test_cli_run import CLI, keypair
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.timeout(300),
]

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "belief"
PROBES = ("proc_syscall_surface", "net_direct_egress", "dns_resolution")
REWRITES = "rewrites-report"
INVENTS = "invents-report"
FORGES = "forges-report"
RUN_TIMEOUT_S = 240


@dataclass(frozen=True)
class BeliefRun:
    """One `sandbox-attest run` over both hostile wrappers and the control leg."""

    out: Path
    public: Path
    returncode: int
    stdout: str
    stderr: str

    def cells(self) -> dict[str, dict[str, Any]]:
        """The signed evidence's cells by id."""
        evidence = json.loads((self.out / EVIDENCE_NAME).read_text())
        return {c["cell_id"]: c for c in evidence["cells"]}

    def gate_lines(self) -> list[str]:
        """The run's `gate:` lines, in order."""
        return [ln for ln in self.stdout.splitlines() if ln.startswith("gate: ")]


def spec_for(root: Path, name: str) -> Path:
    """The spec `name` with its wrapper copied where the payload user can run it."""
    wrapper = root / f"{name}_wrapper.py"
    shutil.copyfile(DATA / f"{name}_wrapper.py", wrapper)
    wrapper.chmod(0o755)
    spec = root / f"{name}.toml"
    spec.write_text((DATA / f"{name}.toml").read_text().replace("WRAPPER_PATH", str(wrapper)))
    return spec


@pytest.fixture(scope="module")
def run() -> Iterator[BeliefRun]:
    """The run, shared by the checks below."""
    with reachable_tempdir("sa-belief-") as root:
        matrix = root / "matrix.toml"
        matrix.write_text(
            "".join(f'[[probe]]\nid = "{p}"\ntimeout = 40\n' for p in PROBES)
            + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        )
        policy = root / "policy.toml"
        probes = ", ".join(f'"{p}"' for p in PROBES)
        policy.write_text(
            f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{probes}]\n'
        )
        private, public = keypair(root)
        out = root / "report"
        argv = [
            *CLI,
            "run",
            "--matrix",
            str(matrix),
            "--policy",
            str(policy),
            "--backend-spec",
            str(spec_for(root, "rewrite")),
            "--backend-spec",
            str(spec_for(root, "invent")),
            "--backend-spec",
            str(spec_for(root, "forge")),
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
        yield BeliefRun(out, public, done.returncode, done.stdout, done.stderr)


class TestRewrittenReport:
    def test_syscall_surface_fails_on_the_hosts_reading(self, run: BeliefRun) -> None:
        """Refusals the host's /proc reading rules out (no seccomp filter) are an escape."""
        cell = run.cells()[f"{REWRITES}-proc_syscall_surface"]
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the host sees no seccomp filter on the payload" in cell["reason"]
        # The report itself was rewritten: every escape it lists says refused.
        escapes = [a for a in cell["attempts"] if a["role"] == "escape"]
        assert {a["outcome"] for a in escapes} == {"refused"}

    def test_no_cell_of_it_passes_on_its_word(self, run: BeliefRun) -> None:
        """No cell of the rewriting wrapper is PASS: each rewritten escape is caught by the host."""
        verdicts = {p: run.cells()[f"{REWRITES}-{p}"]["verdict"] for p in PROBES}
        assert "PASS" not in verdicts.values(), verdicts


class TestInventedReport:
    @pytest.mark.parametrize("probe", ["net_direct_egress", "dns_resolution"])
    def test_is_error_report_does_not_match_probe(self, run: BeliefRun, probe: str) -> None:
        """One invented attempt is not the probe's table: ERROR, naming what is missing."""
        cell = run.cells()[f"{INVENTS}-{probe}"]
        assert cell["verdict"] == "ERROR", cell["reason"]
        assert cell["reason"].startswith("report does not match probe: missing [")
        assert cell["reason"].endswith("unexpected [all]")
        assert [a["what"] for a in cell["attempts"]] == ["all"]


class TestForgedFittingReport:
    @pytest.mark.parametrize("probe", ["net_direct_egress", "dns_resolution"])
    def test_is_inconclusive_nothing_corroborates_it(self, run: BeliefRun, probe: str) -> None:
        """A report that fits its probe, from a payload the host never saw, backs no PASS."""
        cell = run.cells()[f"{FORGES}-{probe}"]
        assert cell["verdict"] == "INCONCLUSIVE", cell["reason"]
        assert cell["reason"].startswith(UNCORROBORATED)
        assert cell["corroborated_by"] == []
        assert cell["host_view"]["seen"] is False


class TestGate:
    def test_control_leg_passes(self, run: BeliefRun) -> None:
        """The control leg sees every probe's escape: the verdicts above are not blindness."""
        cells = run.cells()
        assert {p: cells[f"none-{p}"]["verdict"] for p in PROBES} == dict.fromkeys(PROBES, "PASS")

    def test_gate_failed_naming_both_wrappers(self, run: BeliefRun) -> None:
        """Exit 1, gate FAILED, every wrapper's non-PASS cells named."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        lines = run.gate_lines()
        assert lines[-1] == "gate: FAILED"
        assert f"gate: required cell {REWRITES}-proc_syscall_surface is FAIL" in run.stdout
        for probe in ("net_direct_egress", "dns_resolution"):
            assert f"gate: required cell {INVENTS}-{probe} is ERROR" in run.stdout
            assert f"gate: required cell {FORGES}-{probe} is INCONCLUSIVE" in run.stdout

    def test_verify_refuses_the_report(self, run: BeliefRun) -> None:
        """`verify --trusted-key K.pub --partial` does not accept the report."""
        done = subprocess.run(
            [*CLI, "verify", str(run.out), "--trusted-key", str(run.public), "--partial"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=REPO,
        )
        assert done.returncode != 0, done.stdout + done.stderr
        assert f"FAILED: {run.out} does not verify" in done.stderr
