"""What both human views show of one run: `ReportView`, built once by `view_of`.

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

from sandbox_attest.report.outcomes import CellOutcome, RunOutcomes, run_outcomes
from sandbox_attest.report.signature import ED25519_ONLY, UNTRUSTED_LOCAL_NOTE

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sandbox_attest.report.evidence import CellEntry
    from sandbox_attest.report.policy import Gate, Policy
    from sandbox_attest.report.signature import SignerFacts

__all__ = ["NOT_SIGNED", "ReportView", "signature_sentence", "view_of"]

NOT_SIGNED = "NOT SIGNED: the run wrote no attestation; nothing here can be verified"


@dataclass(frozen=True)
class ReportView:
    """What both renderers show; get one from `view_of`."""

    evidence: dict[str, Any]
    cells: list[CellEntry]
    backends: list[str]  # grid columns, control leg first
    probes: list[str]  # grid rows, in first-seen order
    gate: Gate
    signature: str  # one sentence: who signed, and how far to trust it
    signed: bool
    untrusted: bool
    # Every cell's outcome (report/outcomes.py), the missing required ones included: what
    # each view shows as passed, failed, error or skipped, identical to JUnit and Allure.
    outcomes: RunOutcomes

    def cell(self, backend: str, probe: str) -> CellEntry | None:
        """The cell for one grid position, if the run has it."""
        for c in self.cells:
            if c.get("backend") == backend and c.get("probe") == probe:
                return c
        return None

    def outcome(self, backend: str, probe: str) -> CellOutcome | None:
        """The outcome for one grid position (a missing required cell has one too)."""
        for o in self.outcomes.cells:
            if o.backend == backend and o.probe == probe:
                return o
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
    evidence: Mapping[str, Any],
    signer: SignerFacts | None,
    policy: Policy | None,
    *,
    also_missing: Iterable[str] = (),
) -> ReportView:
    """The view of one run's evidence, with the gate the signer signs (`gate_for`).

    Args:
        evidence: the parsed evidence.json (the bytes that are signed, parsed).
        signer: who signs it, or None for a report that is not signed.
        policy: the policy the gate is derived with (None: the cells judged alone); pass the
            one the signer gets, so the page shows the signed gate.
        also_missing: required cell ids the run never produced (see `run_outcomes`).
    """
    cells: list[CellEntry] = list(evidence["cells"])
    backends: list[str] = []
    probes: list[str] = []
    outcomes = run_outcomes(evidence, policy, also_missing=also_missing)
    for o in outcomes.cells:
        if o.backend not in backends:
            backends.append(o.backend)
        if o.probe not in probes:
            probes.append(o.probe)
    backends.sort(key=lambda b: (b != "none", b))
    return ReportView(
        evidence=dict(evidence),
        cells=cells,
        backends=backends,
        probes=probes,
        gate=outcomes.gate,
        signature=signature_sentence(signer),
        signed=signer is not None,
        untrusted=signer is not None and signer.trust == "untrusted-local",
        outcomes=outcomes,
    )
