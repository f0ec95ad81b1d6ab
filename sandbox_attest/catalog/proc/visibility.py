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
from sandbox_attest.catalog.witness.kernel import (
    OPENS,
    KernelJudgement,
    ReportedAttempt,
    corroborate,
    path_match,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.verdict import Assessment, Escape, Expectation

__all__ = ["ProcVisibility"]

# What backs a refusal in the harness's pid namespace when the kernel witness recorded it.
KERNEL_BACKED = (
    "the kernel's answers to kill(anchor, 0) and the /proc/<anchor>/environ read (kernel witness)"
)


def kernel_judgement(
    ctx: CellContext, report: dict[str, Any], anchor_pid: int | None
) -> KernelJudgement | None:
    """The kernel's answers to the two attempts it can witness, on a shared pid namespace.

    kill(anchor, 0) (matched by its pid and signal 0) and the open of
    /proc/<anchor>/environ; None where the witness did not record the payload in the
    harness's pid namespace (`corroborate`), or the anchor is unknown. The /proc scan and
    ptrace are not among them: the scan's "not listed" is no refusal of a call, and ptrace
    is never tried on an unverified pid.
    """
    if anchor_pid is None:
        return None
    outcomes = {
        str(a.get("what")): str(a.get("outcome")) for a in attempts_by_role(report, "escape")
    }

    def signal_zero(event: dict[str, Any]) -> bool:
        args = event.get("args") or [0, 0]
        return bool(args[0] == anchor_pid and args[1] == 0)

    attempts = [
        ReportedAttempt(
            f"kill({anchor_pid}, 0)", outcomes.get("kill-0", "refused"), ("kill",), signal_zero
        ),
        ReportedAttempt(
            f"/proc/{anchor_pid}/environ",
            outcomes.get("read-environ", "refused"),
            OPENS,
            path_match(f"/proc/{anchor_pid}/environ"),
        ),
    ]
    return corroborate(ctx, attempts, "pid")


def _judge_shared(
    escape: Escape,
    escapes: list[dict[str, Any]],
    anchor_pid: int | None,
    where: str,
    reasons: list[str],
    kernel: KernelJudgement | None,
) -> Escape:
    """A payload in the harness's pid namespace: what it reached decides, not the namespace.

    Sharing the namespace makes the anchor addressable; whether the payload could see, read
    or signal it is the sandbox's to refuse (sandlock hides other pids in its /proc and scopes
    signals with Landlock). So: anything reached (the anchor's log, its secret, its pid, or a
    success the report names, plausible there) is an escape; a "no such process" for the
    anchor's live pid is no kernel's answer in that namespace, so the report is not believed
    (a forgery, or a filter faking errnos) and it fails; refusals shaped like the kernel's
    (EPERM, EACCES) leave nothing the anchor can log (a read, signal 0): a refusal, backed
    by the kernel witness's answers where it recorded them (`kernel_judgement`), else by the
    report alone (`ProcVisibility.corroboration`: a report that crossed a wrapper is then
    INCONCLUSIVE). The kernel's word wins both ways: a success it returned to the payload is
    an escape; an ESRCH it returned (a filter's) is a refusal, not a forgery.
    """
    absent = [
        str(a.get("what"))
        for a in escapes
        if a.get("what") == "kill-0" and a.get("errno") == "ESRCH"
    ]
    if escape == "escaped" or any(a.get("outcome") == "succeeded" for a in escapes):
        reasons.insert(0, where)
        return "escaped"
    if kernel is not None and kernel.escapes:
        reasons.insert(
            0, f"{where}; the kernel let the payload through: {'; '.join(kernel.escapes)}"
        )
        return "escaped"
    if kernel is not None and kernel.all_corroborated:
        reasons.append(
            f"{where}: nothing reached the anchor, and the kernel answered each refusal: "
            + "; ".join(kernel.corroborated)
        )
        return "refused"
    if absent:
        reasons.insert(
            0,
            f"{where}, where the anchor pid {anchor_pid or '?'} is alive (the "
            "host control signals it), yet "
            f"the payload reports no such process for {', '.join(absent)}: not what the "
            "kernel answers there, so its report of seeing nothing is not believed",
        )
        return "escaped"
    reasons.append(
        f"{where}: nothing reached the anchor, and the refusals the payload reports leave "
        "nothing the anchor can log (a /proc read, signal 0), so nothing corroborates them "
        "but the report (`corroboration`)"
    )
    return "refused"


class ProcVisibility(AnchoredSpec):
    """Find, read, signal (0) and ptrace a harness-planted host process."""

    id = "proc_visibility"
    area = "proc"
    kernel_witness = True
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

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The anchor's log, except where a judged process shares the harness's pid namespace.

        There the anchor is addressable, and its silent log does not back a refused /proc
        read or signal 0 (neither leaves a trace in it): the refusal is the report's word.
        """
        if sharing_with_harness(host_processes(ctx), "pid"):
            anchor = self._anchor(ctx)
            kernel = kernel_judgement(ctx, report, anchor.pid if anchor else None)
            return [KERNEL_BACKED] if kernel is not None and kernel.all_corroborated else []
        return super().corroboration(ctx, report)

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
        kernel = kernel_judgement(ctx, report, anchor.pid if anchor else None) if shared else None
        if shared and self.expectation(ctx.claims) == "denied":
            escape = _judge_shared(
                escape,
                escapes,
                anchor.pid if anchor else None,
                f"{claims_of(ctx.claims).phrase('ipc')}; the host sees {shared} in the "
                "harness's pid namespace (shared_with_harness: ['pid'])",
                reasons,
                kernel,
            )
        assessment = conclude_with_controls(
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
                **({"kernel": kernel.as_witness()} if kernel is not None else {}),
            },
        )
        if kernel is not None and kernel.all_corroborated and escape == "refused":
            assessment.corroborated_by = [KERNEL_BACKED]
        return assessment
