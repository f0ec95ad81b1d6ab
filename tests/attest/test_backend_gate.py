"""Each backend's statement carries its own gate (issue 30): `backend_gate`.

A sandbox build is judged by its cells and the control leg's, never by another sandbox's; a
backend nothing required (an optional wrapper of the default set) is judged as if named with
`--backend`, so its statement says whether its applicable cells passed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import backend_gate, policy_from_evidence
from sandbox_attest.report.policy import gate_for
from tests.attest.builder import build_report, make_cells

if TYPE_CHECKING:
    from pathlib import Path

BACKENDS = ("none", "bubblewrap", "firejail")


def evidence_for(tmp_path: Path, policy_file: Path, verdicts: dict[str, str]) -> dict[str, Any]:
    """Evidence of none, bubblewrap (required by the policy) and firejail (required by nothing)."""
    report = build_report(tmp_path / "r", policy_file, make_cells(BACKENDS, verdicts=verdicts))
    evidence: dict[str, Any] = json.loads((report / "evidence.json").read_text())
    return evidence


def results(evidence: dict[str, Any]) -> dict[str, str]:
    """Backend -> the result its statement signs."""
    policy = policy_from_evidence(evidence)
    return {b: backend_gate(evidence, policy, b).result for b in BACKENDS}


class TestBackendGate:
    def test_all_pass(self, tmp_path: Path, policy_file: Path) -> None:
        """Every cell PASS: every backend's statement is PASSED, optional firejail too."""
        assert results(evidence_for(tmp_path, policy_file, {})) == dict.fromkeys(BACKENDS, "PASSED")

    def test_an_optional_backends_fail_is_its_own(self, tmp_path: Path, policy_file: Path) -> None:
        """A firejail FAIL fails firejail's statement; the run is WARNED, bubblewrap PASSED."""
        evidence = evidence_for(tmp_path, policy_file, {"firejail-net_denied_host": "FAIL"})
        assert gate_for(evidence, policy_from_evidence(evidence)).result == "WARNED"
        assert results(evidence) == {"none": "WARNED", "bubblewrap": "PASSED", "firejail": "FAILED"}
        gate = backend_gate(evidence, policy_from_evidence(evidence), "firejail")
        assert gate.failed == ("firejail-net_denied_host",)
        assert "bubblewrap-net_denied_host" not in gate.passed

    def test_a_required_backends_fail_is_not_anothers(
        self, tmp_path: Path, policy_file: Path
    ) -> None:
        """A bubblewrap FAIL fails the run and bubblewrap's statement, not firejail's."""
        evidence = evidence_for(tmp_path, policy_file, {"bubblewrap-net_denied_host": "FAIL"})
        assert results(evidence) == {"none": "FAILED", "bubblewrap": "FAILED", "firejail": "PASSED"}

    def test_a_broken_control_fails_every_sandbox(self, tmp_path: Path, policy_file: Path) -> None:
        """The control leg's required cell not PASS: no sandbox's PASS means anything."""
        evidence = evidence_for(tmp_path, policy_file, {"none-net_denied_host": "INCONCLUSIVE"})
        assert results(evidence) == dict.fromkeys(BACKENDS, "FAILED")

    def test_not_applicable_cells_are_not_required_of_an_optional_backend(
        self, tmp_path: Path, policy_file: Path
    ) -> None:
        """A matrix-excluded firejail cell does not fail firejail's statement."""
        evidence = evidence_for(
            tmp_path, policy_file, {"firejail-net_denied_host": "NOT_APPLICABLE"}
        )
        assert results(evidence)["firejail"] == "PASSED"
