"""Human views of a report: report.html for a security reviewer, summary.md for CI.

Both read only files in the report directory (evidence.json, and signing.json when the run was
signed); neither verifies a signature, because neither has a trusted key. They say who signed
and point at `sandbox-attest verify` for the trust decision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.attest import (
    ATTESTATION_NAME,
    SIGNING_NAME,
    UNTRUSTED_LOCAL_NOTE,
    gate_for,
    policy_from_evidence,
)
from harness.attest.statement import read_evidence

if TYPE_CHECKING:
    from pathlib import Path

    from harness.attest.policy import Gate

__all__ = ["ReportView", "load_view", "write_html", "write_summary"]


@dataclass(frozen=True)
class ReportView:
    """What both renderers show, read once from a report directory."""

    evidence: dict[str, Any]
    cells: list[dict[str, Any]]
    backends: list[str]  # grid columns, control leg first
    probes: list[str]  # grid rows, in first-seen order
    gate: Gate
    signature: str  # one sentence: who signed, and how far to trust it
    signed: bool
    untrusted: bool

    def cell(self, backend: str, probe: str) -> dict[str, Any] | None:
        """The cell for one grid position, if the run has it."""
        for c in self.cells:
            if c.get("backend") == backend and c.get("probe") == probe:
                return c
        return None


def _signature_sentence(report_dir: Path) -> tuple[str, bool, bool]:
    if not (report_dir / ATTESTATION_NAME).is_file():
        return (
            "NOT SIGNED: the run wrote no attestation; nothing here can be verified",
            False,
            False,
        )
    try:
        signing = json.loads((report_dir / SIGNING_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return (
            (
                f"signed ({ATTESTATION_NAME}); signer details missing; check it with "
                "`sandbox-attest verify`"
            ),
            True,
            False,
        )
    untrusted = signing.get("trust") == "untrusted-local"
    who = UNTRUSTED_LOCAL_NOTE if untrusted else "signed with a provided Ed25519 key"
    sigstore = (signing.get("sigstore") or {}).get("status", "ed25519 only")
    reason = (signing.get("sigstore") or {}).get("reason", "")
    return (
        f"{who} (keyid {signing.get('keyid', '?')}); {sigstore}"
        + (f" ({reason})" if reason and sigstore == "ed25519 only" else "")
        + "; not verified here: run `sandbox-attest verify --trusted-key PUB`",
        True,
        untrusted,
    )


def load_view(report_dir: Path) -> ReportView:
    """Read a report directory into a view.

    Raises:
        ReportError: evidence.json is missing or malformed.
    """
    _, evidence = read_evidence(report_dir / "evidence.json")
    cells: list[dict[str, Any]] = evidence["cells"]
    backends: list[str] = []
    probes: list[str] = []
    for c in cells:
        if str(c.get("backend")) not in backends:
            backends.append(str(c.get("backend")))
        if str(c.get("probe")) not in probes:
            probes.append(str(c.get("probe")))
    backends.sort(key=lambda b: (b != "none", b))
    gate = gate_for(evidence, policy_from_evidence(evidence))
    signature, signed, untrusted = _signature_sentence(report_dir)
    return ReportView(evidence, cells, backends, probes, gate, signature, signed, untrusted)


def write_html(report_dir: Path) -> Path:
    """Write report.html (one self-contained file) and return its path."""
    from harness.render.html import render_html  # noqa: PLC0415  (avoids an import cycle)

    out = report_dir / "report.html"
    out.write_text(render_html(load_view(report_dir)), encoding="utf-8")
    return out


def write_summary(report_dir: Path) -> Path:
    """Write summary.md (and append it to $GITHUB_STEP_SUMMARY when set); return its path."""
    from harness.render.summary import write  # noqa: PLC0415  (avoids an import cycle)

    return write(report_dir, load_view(report_dir))
