"""The views are rendered in memory from the judged evidence and show the gate that is signed."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from sandbox_attest.attest import policy_from_evidence
from sandbox_attest.attest.subjects import EVIDENCE, HTML, SUMMARY
from sandbox_attest.report.policy import gate_for
from sandbox_attest.report.signature import ED25519_ONLY, SignerFacts
from sandbox_attest.report.views import render_html, render_summary
from sandbox_attest.report.views.model import NOT_SIGNED, view_of

if TYPE_CHECKING:
    from pathlib import Path


def _signed_facts(report: Path) -> SignerFacts:
    signing = json.loads((report / "signing.json").read_text())
    return SignerFacts(
        signing["keyid"],
        signing["trust"],
        signing["sigstore"]["status"],
        signing["sigstore"]["reason"],
    )


def test_view_gate_is_the_signed_gate(report: Path) -> None:
    """report.html/summary.md show exactly the gate signed into the test-result statement."""
    evidence = json.loads((report / EVIDENCE).read_bytes())
    policy = policy_from_evidence(evidence)
    view = view_of(evidence, _signed_facts(report), policy)
    assert view.gate == gate_for(evidence, policy)
    lines = (report / "attestation.intoto.jsonl").read_text().splitlines()
    stmts = [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in lines]
    # The run's gate is in the evidence statement; each backend's statement lists its own
    # cells. An optional backend is judged there as if named with --backend, so its warned
    # cell may be failed, and its UNAVAILABLE cell (listed nowhere in the run's gate) failed.
    assert stmts[-1]["predicate"]["gate"]["result"] == view.gate.result
    keys = ("passedTests", "warnedTests", "failedTests")
    signed = {t for s in stmts[:-1] for k in keys for t in s["predicate"][k]}
    assert {*view.gate.passed, *view.gate.warned, *view.gate.failed} <= signed
    assert {t for s in stmts[:-1] for t in s["predicate"]["passedTests"]} == set(view.gate.passed)
    failed = {t for s in stmts[:-1] for t in s["predicate"]["failedTests"]}
    assert set(view.gate.failed) <= failed


def test_signed_views_are_the_in_memory_rendering(report: Path) -> None:
    """The report.html and summary.md on disk are byte for byte the rendering of evidence.json."""
    evidence = json.loads((report / EVIDENCE).read_bytes())
    policy = policy_from_evidence(evidence)
    facts = _signed_facts(report)
    assert (report / HTML).read_text() == render_html(evidence, facts, policy)
    assert (report / SUMMARY).read_text() == render_summary(evidence, facts, policy)


def test_rendering_reads_nothing_from_the_directory(report: Path) -> None:
    """A forged signing.json and a deleted attestation change nothing the renderers say."""
    evidence = json.loads((report / EVIDENCE).read_bytes())
    policy = policy_from_evidence(evidence)
    facts = _signed_facts(report)
    before = (render_html(evidence, facts, policy), render_summary(evidence, facts, policy))
    (report / "signing.json").write_text(json.dumps({"trust": "provided", "keyid": "forged"}))
    (report / "attestation.intoto.jsonl").unlink()
    after = (render_html(evidence, facts, policy), render_summary(evidence, facts, policy))
    assert after == before
    assert "forged" not in after[0]


def test_untrusted_signer_is_said(report: Path) -> None:
    """Facts naming the per-machine key make both views say it is an untrusted local key."""
    evidence = json.loads((report / EVIDENCE).read_bytes())
    facts = SignerFacts("0" * 64, "untrusted-local", ED25519_ONLY, "")
    for text in (render_html(evidence, facts, None), render_summary(evidence, facts, None)):
        assert "signed by an untrusted local key (keyid " + "0" * 64 in text


def test_unsigned_view_says_not_signed(report: Path) -> None:
    """Without signer facts both views say the report is NOT SIGNED."""
    evidence = json.loads((report / EVIDENCE).read_bytes())
    assert NOT_SIGNED in render_summary(evidence, None, None)
    page = render_html(evidence, None, None)
    assert "This report is not signed" in page
