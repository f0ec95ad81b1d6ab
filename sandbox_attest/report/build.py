"""Every view of one run's judged evidence, rendered once, through the one verdict mapping.

junit.xml, report.html, summary.md, results.sarif and allure-results/ all come from
`run_outcomes` over the same cells, so a CI check, an Allure dashboard and a reviewer's page
decide as the signed gate does (sandbox_attest/report/outcomes.py). A run's session and
`attest.sign_report` (re-signing a finished directory) both call `render_views`, so "where
is junit.xml made?" has one answer. Nothing here writes the report directory except
`write_allure`; the signer writes the other files from these bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox_attest.report.allure import render_allure, write_results
from sandbox_attest.report.files import ALLURE_DIR, HTML, JUNIT, SARIF, SUMMARY
from sandbox_attest.report.junit import render_junit
from sandbox_attest.report.outcomes import run_outcomes
from sandbox_attest.report.sarif import render_sarif
from sandbox_attest.report.views import render_html, render_summary

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    from sandbox_attest.report.policy import Policy
    from sandbox_attest.report.signature import SignerFacts

__all__ = ["Views", "render_views", "write_allure"]


@dataclass(frozen=True)
class Views:
    """The rendered views of one run: report files by name, and allure-results/ files."""

    files: dict[str, bytes]
    allure: dict[str, bytes]


def render_views(
    evidence: Mapping[str, Any],
    signer: SignerFacts | None,
    policy: Policy | None,
    *,
    also_missing: Iterable[str] = (),
) -> Views:
    """Every view of the judged evidence, through the one verdict mapping.

    Args:
        evidence: the parsed evidence.json (the bytes that are signed, parsed).
        signer: who signs it (the views name the key), or None for a report not signed.
        policy: the policy the gate is derived with (None: the cells judged alone).
        also_missing: required cell ids the run never produced (see `run_outcomes`).

    Returns:
        junit.xml, report.html, summary.md and results.sarif by name, and allure-results/.
    """
    missing = tuple(also_missing)
    outcomes = run_outcomes(evidence, policy, also_missing=missing)
    files = {
        JUNIT: render_junit(evidence, outcomes),
        HTML: render_html(evidence, signer, policy, also_missing=missing).encode(),
        SUMMARY: render_summary(evidence, signer, policy, also_missing=missing).encode(),
        SARIF: render_sarif(dict(evidence)),
    }
    return Views(files, render_allure(evidence, outcomes))


def write_allure(report_dir: Path, views: Views) -> None:
    """Write the views' allure-results/ into `report_dir` (`allure.write_results`)."""
    write_results(report_dir / ALLURE_DIR, views.allure)
