"""proc_visibility: find, read, signal (0) and ptrace the harness-planted anchor."""

from __future__ import annotations

from typing import Any

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import control_record, new_control_nonce
from sandbox_attest.catalog.judging import judge_escape
from sandbox_attest.catalog.proc.anchor import AnchoredSpec
from sandbox_attest.catalog.proc.baseline import conclude_with_controls
from sandbox_attest.catalog.proc.readings import sharing_with_harness
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.verdict import Assessment, Expectation

__all__ = ["ProcVisibility"]


class ProcVisibility(AnchoredSpec):
    """Find, read, signal (0) and ptrace a harness-planted host process."""

    id = "proc_visibility"
    area = "proc"
    host_readings = ("anchor process log",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Two controls on its own process, four attempts at the anchor."""
        del task
        return AttemptTable(
            required=attempts_of(
                "scan-own", "kill-0-self", "scan-proc", "read-environ", "kill-0", "ptrace-seize"
            )
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied when ipc is "isolated": that claim includes no view of host processes."""
        return "denied" if declared.ipc == "isolated" else "allowed"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the anchor; the payload gets its marker and pid, never its secret."""
        anchor = self._start_anchor(ctx)
        return {"marker": anchor.marker, "anchor_pid": anchor.pid}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host sees the anchor by its marker, reads its secret and signals it (0)."""
        return control_record(new_control_nonce(), self._anchor_checks(ctx))

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The anchor's tracer log, its secret echoed, or its host pid found is an escape."""
        del witness  # the anchor is this probe's witness
        anchor = self._anchor(ctx)
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        facts = report.get("facts", {})
        tracers = anchor.tracers() if anchor else []
        secret_read = anchor is not None and facts.get("environ_secret") == anchor.secret
        found = [p for p in facts.get("found_pids", []) if isinstance(p, int)]
        pid_found = anchor is not None and anchor.pid in found
        reasons = [
            (
                f"anchor pid {anchor.pid if anchor else '?'}: "
                f"traced by {', '.join(tracers) or 'nobody'}, "
                f"secret echoed: {secret_read}, host pid found: {pid_found}"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(observed, bool(tracers or secret_read or pid_found), None, reasons)
        shared = sharing_with_harness(host_processes(ctx), "pid")
        if shared and self.expectation(ctx.claims) == "denied":
            # The host's own reading: a process of the cell in the harness's pid namespace
            # sees every host process, whatever its report says it found.
            escape = "escaped"
            reasons.insert(
                0,
                f"{claims_of(ctx.claims).phrase('ipc')}; the host sees {shared} in the "
                "harness's pid namespace (shared_with_harness: ['pid'])",
            )
        return conclude_with_controls(
            escape,
            observed,
            reasons,
            report,
            control,
            {
                "tracers": tracers,
                "secret_echoed": secret_read,
                "pid_found": pid_found,
                "pid_namespace_shared": shared,
            },
        )
