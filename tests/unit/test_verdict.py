"""The fail-closed verdict rules, case by case."""

from __future__ import annotations

import re

import pytest

from sandbox_attest import verdict
from sandbox_attest.verdict import Assessment, Escape, Expectation, Verdict, decide


def assessment(escape: Escape, *, controls_ok: bool = True) -> Assessment:
    """An assessment with one reason, for the decision table."""
    return Assessment(
        escape=escape, controls_ok=controls_ok, reasons=["because"], observed="refused"
    )


CASES = [
    # expected, escape, controls_ok, verdict
    ("denied", "escaped", True, Verdict.FAIL),
    ("denied", "escaped", False, Verdict.FAIL),  # a witness-seen escape is FAIL regardless
    ("denied", "refused", True, Verdict.PASS),
    ("denied", "contained", True, Verdict.PASS),
    ("denied", "refused", False, Verdict.INCONCLUSIVE),
    ("denied", "disagree", True, Verdict.INCONCLUSIVE),
    ("denied", "undecided", True, Verdict.INCONCLUSIVE),
    ("allowed", "escaped", True, Verdict.PASS),
    ("allowed", "escaped", False, Verdict.INCONCLUSIVE),
    ("allowed", "refused", True, Verdict.INCONCLUSIVE),
    ("allowed", "contained", True, Verdict.INCONCLUSIVE),
    ("allowed", "disagree", True, Verdict.INCONCLUSIVE),
]


class TestDecide:
    @pytest.mark.parametrize(
        ("expected", "escape", "controls_ok", "verdict"),
        CASES,
        ids=[f"{c[0]}-{c[1]}-controls_{c[2]}" for c in CASES],
    )
    def test_decision_table(
        self, expected: Expectation, escape: Escape, controls_ok: bool, verdict: Verdict
    ) -> None:
        """Each (expectation, escape, control) combination gives exactly one verdict."""
        assert decide(expected, assessment(escape, controls_ok=controls_ok)).verdict == verdict

    def test_reason_carries_the_assessment(self) -> None:
        """The decision's reason repeats the assessor's facts, so a reviewer sees why."""
        decision = decide("denied", assessment("escaped"))
        assert "escape observed by the host" in decision.reason
        assert "because" in decision.reason

    def test_reported_only_fail_says_the_host_did_not_see_it(self) -> None:
        """A FAIL on the payload's word alone says so, never that the host observed it."""
        reported = assessment("escaped")
        reported.reported_only = True
        decision = decide("denied", reported)
        assert decision.verdict is Verdict.FAIL
        assert decision.reason == "escape reported by the payload (not seen by the host): because"
        assert "observed by the host" not in decision.reason

    @pytest.mark.parametrize(
        ("expected", "escape", "controls_ok", "verdict"),
        CASES,
        ids=[f"{c[0]}-{c[1]}-controls_{c[2]}" for c in CASES],
    )
    def test_reported_only_changes_no_verdict(
        self, expected: Expectation, escape: Escape, controls_ok: bool, verdict: Verdict
    ) -> None:
        """Who saw the escape changes the FAIL's words only, in every row of the table."""
        reported = assessment(escape, controls_ok=controls_ok)
        reported.reported_only = True
        assert decide(expected, reported).verdict == verdict

    def test_only_two_paths_lead_to_pass(self) -> None:
        """PASS needs working controls and either a seen escape (allowed) or none (denied)."""
        passing = {
            (e, esc, ok)
            for e in ("denied", "allowed")
            for esc in ("escaped", "refused", "contained", "disagree", "undecided")
            for ok in (True, False)
            if decide(e, assessment(esc, controls_ok=ok)).verdict is Verdict.PASS
        }
        assert passing == {
            ("denied", "refused", True),
            ("denied", "contained", True),
            ("allowed", "escaped", True),
        }


def test_decide_docstring_names_only_real_functions() -> None:
    """The rule table cites no helper that does not exist (it once cited one)."""
    cited = re.findall(r"`(\w+)`", verdict.decide.__doc__ or "")
    assert all(hasattr(verdict, name) for name in cited), cited
