"""The renderer shows the gate the signer signed: both come from `gate_for`."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from harness.attest import gate_for, policy_from_evidence
from harness.render import load_view

if TYPE_CHECKING:
    from pathlib import Path


def test_view_gate_is_the_signed_gate(report: Path) -> None:
    """report.html/summary.md show exactly the gate signed into the test-result statement."""
    view = load_view(report)
    assert view.gate == gate_for(view.evidence, policy_from_evidence(view.evidence))
    first = (report / "attestation.intoto.jsonl").read_text().splitlines()[0]
    signed = json.loads(base64.b64decode(json.loads(first)["payload"]))["predicate"]
    assert signed["result"] == view.gate.result
    assert signed["failedTests"] == list(view.gate.failed)
