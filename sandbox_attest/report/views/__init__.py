"""Human views of a report: report.html for a security reviewer, summary.md for CI.

Both are rendered in memory from the evidence the session judged, and from what is known
about the signer before it signs (`SignerFacts`): the views are signed subjects themselves, so
the signer writes exactly these bytes and signs their digests. Neither verifies a signature,
because neither has a trusted key; they say who signs and point at `sandbox-attest verify`
for the trust decision. Neither reads the report directory: a file planted there cannot
change what they say. What both show is `views.model.ReportView`; `report.build` renders
every view of a run once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox_attest.report.views.html import render_page
from sandbox_attest.report.views.model import view_of
from sandbox_attest.report.views.summary import summary_text

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sandbox_attest.report.policy import Policy
    from sandbox_attest.report.signature import SignerFacts

__all__ = ["render_html", "render_summary"]


def render_html(
    evidence: Mapping[str, Any],
    signer: SignerFacts | None,
    policy: Policy | None,
    *,
    also_missing: Iterable[str] = (),
) -> str:
    """report.html as text (one self-contained page); see `view_of` for the arguments."""
    return render_page(view_of(evidence, signer, policy, also_missing=also_missing))


def render_summary(
    evidence: Mapping[str, Any],
    signer: SignerFacts | None,
    policy: Policy | None,
    *,
    also_missing: Iterable[str] = (),
) -> str:
    """summary.md as text, cut to fit GitHub's step-summary limit; see `view_of`."""
    return summary_text(view_of(evidence, signer, policy, also_missing=also_missing))
