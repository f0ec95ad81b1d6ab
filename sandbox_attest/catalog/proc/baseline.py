"""How a proc probe is judged where the payload's report is the evidence.

Where nothing on the host can see an escape, a report *against* the sandbox is believed
(`judge_self_reported`); a refusal is believed only when the same file run unsandboxed on the
host (`BaselineSpec`'s host control) shows the attempt succeeding there. Every proc probe ends
with `conclude_with_controls`: the payload's own controls and the host control, via
`sandbox_attest.catalog.judging.conclude`.
"""

from __future__ import annotations

from typing import Any

from sandbox_attest.catalog.attempts import all_succeeded, attempts_by_role, attempts_summary
from sandbox_attest.catalog.controls import (
    baseline_control,
    run_payload_on_host,
)
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.spec import CellContext, ClaimsLike, SpecBase
from sandbox_attest.verdict import Assessment, Escape

__all__ = ["BaselineSpec", "conclude_with_controls", "confines_anything", "judge_self_reported"]


def confines_anything(declared: ClaimsLike) -> bool:
    """Whether the declared claims confine anything at all: not open on every axis."""
    return (declared.network, declared.filesystem, declared.ipc) != ("open", "open", "open")


# Host controls that run the payload file itself, unsandboxed.


def _run_on_host(ctx: CellContext, targets: dict[str, Any]) -> dict[str, Any]:
    """The probe's own payload run unsandboxed on the host (`run_payload_on_host`): its report."""
    return run_payload_on_host(ctx, targets)[1]


def _baseline_control(ctx: CellContext, targets: dict[str, Any]) -> dict[str, Any]:
    """The host control of a self-reporting probe: the payload's own baseline on the host."""
    return baseline_control(lambda: _run_on_host(ctx, targets))


def conclude_with_controls(
    escape: Escape,
    observed: Any,
    reasons: list[str],
    report: dict[str, Any],
    control: dict[str, Any],
    witness: dict[str, Any],
) -> Assessment:
    """The shared ending: the payload's own controls and the host control, via `conclude`."""
    inside = attempts_by_role(report, "control")
    return conclude(
        escape,
        observed,
        reasons,
        inside_ok=all_succeeded(inside),
        inside_failed=f"in-sandbox control failed: {attempts_summary(inside)}",
        host_control=control,
        host_failed="host control failed",
        witness=witness,
        controls={"inside": inside, "host": control},
    )


def judge_self_reported(observed: str, reasons: list[str]) -> Escape:
    """The escape of a probe no host witness can see: believed against the sandbox only."""
    if observed == "succeeded":
        reasons.append(
            "the payload reports it (no host witness exists; a report against the "
            "sandbox is believed)"
        )
        return "escaped"
    if observed == "refused":
        return "refused"
    return "undecided"  # decide() words it: "the attempt could not be made"


class BaselineSpec(SpecBase):
    """A self-reporting probe: nothing to plant, and its host control is its own baseline.

    The payload only reads its own state or calls with arguments the kernel rejects, so there
    is no target; the host control runs the same file unsandboxed (`_baseline_control`).
    """

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Nothing to plant."""
        del ctx
        return {}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The same file's attempts, unsandboxed on the host."""
        return _baseline_control(ctx, {})
