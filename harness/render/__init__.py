"""Human views of a report: report.html for a security reviewer, summary.md for CI.

Both are rendered in memory from the evidence the session judged, and from what is known
about the signer before it signs (`SignerFacts`): the views are signed subjects themselves, so
the signer writes exactly these bytes and signs their digests. Neither verifies a signature,
because neither has a trusted key; they say who signs and point at `sandbox-attest verify`
for the trust decision. Neither reads the report directory: a file planted there cannot
change what they say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.attest import UNTRUSTED_LOCAL_NOTE, SignerFacts, gate_for
from harness.attest.sigstore import ED25519_ONLY

if TYPE_CHECKING:
    from collections.abc import Mapping

    from harness.attest.policy import Gate, Policy

__all__ = [
    "NOT_SIGNED",
    "ReportView",
    "render_html",
    "render_summary",
    "signature_sentence",
    "view_of",
]

NOT_SIGNED = "NOT SIGNED: the run wrote no attestation; nothing here can be verified"


@dataclass(frozen=True)
class ReportView:
    """What both renderers show; get one from `view_of`."""

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


def signature_sentence(signer: SignerFacts | None) -> str:
    """One sentence about the signature: who signs, keyless or not, and how to verify it."""
    if signer is None:
        return NOT_SIGNED
    untrusted = signer.trust == "untrusted-local"
    who = UNTRUSTED_LOCAL_NOTE if untrusted else "signed with a provided Ed25519 key"
    reason = signer.sigstore_reason
    return (
        f"{who} (keyid {signer.keyid}); {signer.sigstore_status}"
        + (f" ({reason})" if reason and signer.sigstore_status == ED25519_ONLY else "")
        + "; not verified here: run `sandbox-attest verify --trusted-key PUB`"
    )


def view_of(
    evidence: Mapping[str, Any], signer: SignerFacts | None, policy: Policy | None
) -> ReportView:
    """The view of one run's evidence, with the gate the signer signs (`gate_for`).

    Args:
        evidence: the parsed evidence.json (the bytes that are signed, parsed).
        signer: who signs it, or None for a report that is not signed.
        policy: the policy the gate is derived with (None: the cells judged alone); pass the
            one the signer gets, so the page shows the signed gate.
    """
    cells: list[dict[str, Any]] = list(evidence["cells"])
    backends: list[str] = []
    probes: list[str] = []
    for c in cells:
        if str(c.get("backend")) not in backends:
            backends.append(str(c.get("backend")))
        if str(c.get("probe")) not in probes:
            probes.append(str(c.get("probe")))
    backends.sort(key=lambda b: (b != "none", b))
    return ReportView(
        evidence=dict(evidence),
        cells=cells,
        backends=backends,
        probes=probes,
        gate=gate_for(evidence, policy),
        signature=signature_sentence(signer),
        signed=signer is not None,
        untrusted=signer is not None and signer.trust == "untrusted-local",
    )


def render_html(
    evidence: Mapping[str, Any], signer: SignerFacts | None, policy: Policy | None
) -> str:
    """report.html as text (one self-contained page); see `view_of` for the arguments."""
    from harness.render.html import render_page  # noqa: PLC0415  (avoids an import cycle)

    return render_page(view_of(evidence, signer, policy))


def render_summary(
    evidence: Mapping[str, Any], signer: SignerFacts | None, policy: Policy | None
) -> str:
    """summary.md as text, cut to fit GitHub's step-summary limit; see `view_of`."""
    from harness.render.summary import summary_text  # noqa: PLC0415  (avoids an import cycle)

    return summary_text(view_of(evidence, signer, policy))
