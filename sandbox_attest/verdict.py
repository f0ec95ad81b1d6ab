"""Verdicts: the expectation x the payload's report x the host witness x the control.

The judging is split in two on purpose. A probe's own assessor (in `sandbox_attest.catalog`) knows
what its attempts and witnesses mean and reduces them to an `Assessment`; `decide` then applies
the same fail-closed rules to every probe, so no probe can invent a lenient path to PASS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal


class Verdict(StrEnum):
    """The six outcomes of a matrix cell (see ARCHITECTURE.md, "Verdicts")."""

    PASS = "PASS"  # noqa: S105  (a verdict, not a password)
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    ERROR = "ERROR"
    UNAVAILABLE = "UNAVAILABLE"
    NOT_APPLICABLE = "NOT_APPLICABLE"


# What the declared claims say must happen to the probe's attempt.
#   "denied":  a confining sandbox must stop the escape attempt.
#   "allowed": the attempt must succeed and be seen by the host (the control leg for a
#              negative probe, or any leg for a capability such as the 18 MiB transfer).
Expectation = Literal["denied", "allowed"]

# What happened to the escape/capability, once payload and witness are compared:
#   "escaped":    a host witness saw it (authoritative whatever the payload says), or, marked
#                 `Assessment.reported_only`, the payload reports it and nothing on the host
#                 could see it (a report against the sandbox is believed).
#   "refused":    the payload was refused and no host witness saw anything.
#   "contained":  the payload "succeeded" but only inside the sandbox (its private tmpfs, its
#                 own empty loopback); nothing reached the host. Not an escape.
#   "disagree":   payload and witness tell different stories that containment can't explain.
#   "undecided":  the attempt could not be made (tool missing, error before the attempt).
Escape = Literal["escaped", "refused", "contained", "disagree", "undecided"]


@dataclass
class Assessment:
    """A probe's reading of one run: the escape, the controls, and why.

    Attributes:
        escape: the combined payload/witness reading of the attempt (see `Escape`).
        controls_ok: every positive control succeeded (inside and on the host), so a refusal
            or a silent witness means something.
        reasons: short lowercase phrases, most important first ("proxy answered 403").
        observed: the payload's side in one word: "succeeded" | "refused" | "error".
        witness: the host-side records this assessment relied on, for the evidence file.
        control: the controls and their results, for the evidence file.
        corroborated_by: the host readings that back the reading whatever the payload says
            (a listener's log, a canary's state, the host's /proc view of the payload), by
            name; empty when it rests on the payload's report alone (see `believe`).
        reported_only: an "escaped" reading that rests on the payload's report alone: no
            host witness saw the escape, and the report is believed only because it speaks
            against the sandbox. The assessor that believes such a report sets it; `decide`
            then words the FAIL as the payload's report, never as the host's observation.
    """

    escape: Escape
    controls_ok: bool
    reasons: list[str]
    observed: Literal["succeeded", "refused", "error"]
    witness: dict[str, object] = field(default_factory=dict)
    control: dict[str, object] = field(default_factory=dict)
    corroborated_by: list[str] = field(default_factory=list)
    reported_only: bool = False


@dataclass(frozen=True)
class Decision:
    """A verdict and the one-line reason a reviewer reads first."""

    verdict: Verdict
    reason: str


# How a FAIL's reason begins: who saw the escape. A report is believed against the sandbox
# (a wrapper that forges an escape only fails itself), but it is not the host's observation,
# and a reviewer weighs the two differently.
OBSERVED_ESCAPE = "escape observed by the host"
REPORTED_ESCAPE = "escape reported by the payload (not seen by the host)"


def decide(expected: Expectation, assessment: Assessment) -> Decision:  # noqa: PLR0911
    # (one return per rule keeps the rule table above readable line by line)
    """Apply the fail-closed rules to one assessed cell.

    Rules, in order:
      1. An escape where denial was expected is FAIL, always. Its reason says who saw it:
         `OBSERVED_ESCAPE` (a host witness) or, for an `Assessment.reported_only` escape,
         `REPORTED_ESCAPE` (the payload's own report, believed against the sandbox).
      2. Controls that failed make any non-FAIL outcome INCONCLUSIVE: a denial nobody could
         have seen succeed proves nothing.
      3. Payload and witness disagreeing, or an attempt never made, is INCONCLUSIVE.
      4. Expected denial + refused/contained is PASS; expected allowed + escaped is PASS.
      5. Expected allowed but refused/contained is INCONCLUSIVE: the capability was not
         seen, so nothing is proven. On the control leg it means the probe is blind (and
         every PASS of that probe is downgraded); in a sandbox that promised the capability
         it fails any required cell, since only PASS satisfies the gate.
    """
    why = "; ".join(assessment.reasons) or "no reason recorded"
    escape = assessment.escape
    if expected == "denied" and escape == "escaped":
        said = REPORTED_ESCAPE if assessment.reported_only else OBSERVED_ESCAPE
        return Decision(Verdict.FAIL, f"{said}: {why}")
    if not assessment.controls_ok:
        return Decision(Verdict.INCONCLUSIVE, f"positive control failed: {why}")
    if escape == "disagree":
        return Decision(Verdict.INCONCLUSIVE, f"payload and host witness disagree: {why}")
    if escape == "undecided":
        return Decision(Verdict.INCONCLUSIVE, f"the attempt could not be made: {why}")
    if expected == "denied":
        return Decision(Verdict.PASS, why)
    if escape == "escaped":
        return Decision(Verdict.PASS, why)
    return Decision(Verdict.INCONCLUSIVE, f"expected to succeed and be seen, but: {why}")


UNCORROBORATED = (
    "PASS rests on the payload's report alone, which crossed the wrapper; no host reading "
    "corroborates it"
)


def believe(decision: Decision, assessment: Assessment, *, crossed_wrapper: bool) -> Decision:
    """Downgrade a PASS that nothing but a rewritable report stands behind.

    On a command wrapper the payload's JSON line travels through the wrapper's stdout, which
    the wrapper can rewrite ("succeeded" into "refused"). There a PASS counts only where a host
    reading corroborates it (`Assessment.corroborated_by`); otherwise it is INCONCLUSIVE. Where
    the harness runs the payload itself (the built-in backends) the decision stands. Nothing
    else is changed: a FAIL is a FAIL whoever reported it.
    """
    if decision.verdict is not Verdict.PASS or not crossed_wrapper:
        return decision
    if assessment.corroborated_by:
        return decision
    return Decision(Verdict.INCONCLUSIVE, f"{UNCORROBORATED}; was: {decision.reason}")
