"""proc_privileges: capabilities held, setuid elevation, and the `runs_as` claim.

Self-reported (`BaselineSpec`): the host cannot see what a capability would let the payload
do, but it reads the payload's status itself (CapEff, NoNewPrivs, uids), and that reading
wins over the report.
"""

from __future__ import annotations

import os
from typing import Any

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import control_record, host_check
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.proc.baseline import (
    BaselineSpec,
    conclude_with_controls,
    confines_anything,
    judge_self_reported,
)
from sandbox_attest.catalog.proc.readings import with_capabilities, without_no_new_privs
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    WitnessRecordsLike,
    host_processes,
    own_kernel_ran,
)
from sandbox_attest.claims import Claims, claims_of
from sandbox_attest.verdict import Assessment, Expectation

__all__ = ["ProcPrivileges"]


class ProcPrivileges(BaselineSpec):
    """Capabilities held, and setuid elevation possible, inside the sandbox."""

    id = "proc_privileges"
    area = "proc"

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host's read of the payload's status: no effective capability, NoNewPrivs set.

        Under `kernel = "own"` (no payload process on the host) the host's reading is the
        owner of the payload's ready file in the workspace: the host user its writes land as.
        """
        del report
        processes = host_processes(ctx)
        if not processes:
            uid = _own_kernel_uid(ctx)
            return [] if uid is None else [f"host view: the payload's workspace file, uid {uid}"]
        statuses = [p.get("status") or {} for p in processes]
        if not statuses or with_capabilities(processes):
            return []
        if any(s.get("NoNewPrivs") != "1" for s in statuses):
            return []
        return ["host view: CapEff 0", "host view: NoNewPrivs 1"]

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Reading its status (the control), then three attempts; none without the status."""
        del task
        later = attempts_of("effective-capabilities", "setuid-elevation", "writable-root-path")
        return AttemptTable(required=later | {"read-status"}, excuses=(("read-status", later),))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever anything is confined: privilege can undo any confinement."""
        return "denied" if confines_anything(declared) else "allowed"

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The same read, by the same file, unsandboxed on the host, must find CapEff there.

        The host need not hold a capability itself (it usually runs unprivileged): the
        baseline shows the payload's reading works, so "no capability" inside is a reading,
        not a status file the payload failed to parse.
        """
        control = super().host_control(ctx)
        status = ((control.get("baseline") or {}).get("facts") or {}).get("status") or {}
        read = host_check(
            "host baseline read its credentials",
            "CapEff" in status,
            f"CapEff={status.get('CapEff')} CapBnd={status.get('CapBnd')}",
        )
        return control_record(control["nonce"], [*control["checks"], read]) | {
            "baseline": control.get("baseline")
        }

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any effective capability or a usable setuid route is an escape (self-reported).

        The host's own read of the payload's status wins over the report: effective
        capabilities the host sees while the report says none are an escape. Under `kernel
        = "own"` the host sees no payload process, and the privilege judged is the one its
        effects carry on the host (`_assess_own_kernel`).
        """
        del witness
        if not host_processes(ctx) and own_kernel_ran(ctx):
            return _assess_own_kernel(ctx, report, control)
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        facts = report.get("facts", {})
        status = facts.get("status", {})
        reasons = [
            f"payload: {attempts_summary(escapes)}",
            (
                f"CapEff={status.get('CapEff')} CapBnd={status.get('CapBnd')} "
                f"NoNewPrivs={status.get('NoNewPrivs')} Seccomp={status.get('Seccomp')} "
                f"uid_map={facts.get('uid_map')}"
            ),
        ]
        gap = _status_gap(report)
        if gap:
            reasons.insert(0, gap)
        escape = judge_self_reported(observed, reasons)
        # Which host readings saw an escape themselves; none: it is the report's alone.
        host_seen = False
        # Every judged process of the cell (sandbox_attest/run/hostview.py), not only the one
        # carrying the launcher's name: the worst one decides.
        held = with_capabilities(host_processes(ctx))
        if held:
            escape, host_seen = "escaped", True
            reasons.insert(0, f"the host sees effective capabilities on the payload: {held}")
        unset = without_no_new_privs(host_processes(ctx))
        if unset and str(status.get("NoNewPrivs")) == "1":
            # The report speaks for one process; the kernel shows another of the cell free to
            # gain privileges through a setuid program: the report is not the cell's state.
            escape, host_seen = "escaped", True
            reasons.insert(
                0,
                f"the report says NoNewPrivs 1, but the host sees a process of the cell "
                f"without it: {unset}",
            )
        claims = claims_of(ctx.claims)
        if claims.runs_as:
            broke, seen = _runs_as_reading(ctx, claims)
            if broke:
                escape, host_seen = "escaped", True
                reasons.insert(0, broke)
            elif seen:
                reasons.append(f"{claims.phrase('runs_as')}: the host sees {seen}")
        baseline = control.get("baseline") or {}
        host_status = baseline.get("facts", {}).get("status", {})
        assessment = conclude_with_controls(
            escape,
            observed,
            reasons,
            report,
            control,
            {"payload_status": status, "host_status": host_status},
        )
        # An escape only `judge_self_reported` found is the payload's word: its FAIL says so.
        assessment.reported_only = escape == "escaped" and not host_seen
        return assessment


def _status_gap(report: dict[str, Any]) -> str:
    """The status lines the payload found missing, in words; "" when it read them all.

    probes/proc_privileges.py stops at `read-status` (an error, "missing: A,B") where its
    /proc/self/status lacks a line it needs: a kernel of the sandbox's own (a user-space
    kernel, a microVM) may not provide NoNewPrivs. The cell is then INCONCLUSIVE (its
    control failed), and this names why, never an escape.
    """
    for status in attempts_by_role(report, "control"):
        detail = str(status.get("detail") or "")
        if status.get("what") == "read-status" and status.get("outcome") == "error":
            missing = detail.removeprefix("missing: ") if detail.startswith("missing: ") else ""
            if missing:
                return (
                    "the sandbox gives the payload a /proc/self/status without "
                    f"{', '.join(missing.split(','))} (a kernel of its own may not provide "
                    "them): nothing is judged without them"
                )
    return ""


def _wanted_uid(ctx: CellContext, claim: str) -> int | None:
    """The one uid a `runs_as` claim names (None: "non-root", or a name unknown here)."""
    if claim == "payload-user":
        return ctx.user.uid if ctx.user is not None else os.geteuid()
    if claim.isdigit():
        return int(claim)
    if claim == "non-root":
        return None
    import pwd  # noqa: PLC0415  (POSIX only, and only a named user needs it)

    try:
        return pwd.getpwnam(claim).pw_uid
    except KeyError:
        return None


def _runs_as_reading(ctx: CellContext, claims: Claims) -> tuple[str, str]:
    """(how the host's uid reading breaks the `runs_as` claim, or ""; what it saw, or "").

    The uids come from /proc/<pid>/status on the host (real, effective, saved, fs), read at
    the rendezvous for every payload process: the report's own uid_map is not believed.
    """
    claim = claims.runs_as
    wanted = _wanted_uid(ctx, claim)
    if wanted is None and claim != "non-root":
        return f"{claims.phrase('runs_as')}, a user this host does not know", ""
    seen = []
    for process in host_processes(ctx):
        pid = process.get("pid", "?")
        text = str((process.get("status") or {}).get("Uid", ""))
        uids = {int(u) for u in text.split() if u.isdigit()}
        if not uids:
            continue
        seen.append(f"host pid {pid} with uids {text}")
        wrong = 0 in uids if wanted is None else uids != {wanted}
        if wrong:
            return (
                f"{claims.phrase('runs_as')}; the host sees the payload (host pid {pid}) "
                f"run with uids {text} (real, effective, saved, fs)"
            ), ""
    return "", "; ".join(seen)


def _own_kernel_uid(ctx: CellContext) -> int | None:
    """The host owner of the payload's ready file under `kernel = "own"`; None: no such reading."""
    if not own_kernel_ran(ctx):
        return None
    uid = (ctx.host_view.get("workspace_rendezvous") or {}).get("uid")
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else None


def _assess_own_kernel(
    ctx: CellContext, report: dict[str, Any], control: dict[str, Any]
) -> Assessment:
    """proc_privileges for a payload on a kernel of its own: judged by its effect on the host.

    Inside, the payload may be root with every capability: of its own kernel, over that
    kernel's objects (gVisor's Sentry runs it as root in a user namespace of the Sentry's).
    What reaches the host is what that kernel does there, and the host reads it without the
    payload's word: the owner of the ready file the payload wrote into the workspace is the
    host user its writes land as. Root there is an escape (its kernel acts with root's power
    on the host); so is a uid `runs_as` does not allow. The payload's own status (it may lack
    NoNewPrivs: such a kernel need not provide it) is recorded, not judged, and its
    in-sandbox control with it; the host control still has to hold.
    """
    claims = claims_of(ctx.claims)
    uid = _own_kernel_uid(ctx)
    facts = report.get("facts", {})
    status = facts.get("status", {})
    reasons = [
        (
            f"{claims.phrase('kernel')}: the host sees no payload process, so the privilege "
            "judged is the one its writes carry on the host"
        ),
        (
            "inside its own kernel, not judged (that kernel's privileges act on its own "
            f"objects): CapEff={status.get('CapEff')} NoNewPrivs={status.get('NoNewPrivs')} "
            f"uid_map={facts.get('uid_map')}; payload: "
            f"{attempts_summary(attempts_by_role(report, 'escape'))}"
        ),
    ]
    escape: Any
    if uid is None:
        escape = "undecided"
        reasons.insert(0, "the host could not read the owner of the payload's workspace file")
    else:
        wanted = _wanted_uid(ctx, claims.runs_as) if claims.runs_as else None
        if uid == 0:
            escape = "escaped"
            reasons.insert(
                0,
                "the payload's workspace file lands on the host as root (uid 0): its kernel "
                "acts on the host with root's power",
            )
        elif claims.runs_as and claims.runs_as != "non-root" and uid != wanted:
            escape = "escaped"
            reasons.insert(
                0,
                f"{claims.phrase('runs_as')}; the payload's workspace file lands on the "
                f"host as uid {uid}",
            )
        else:
            escape = "refused"
            reasons.append(f"the payload's workspace file lands on the host as uid {uid}")
    return conclude(
        escape,
        "succeeded" if escape == "escaped" else "refused" if escape == "refused" else "error",
        reasons,
        host_control=control,
        witness={"host_uid_of_payload_writes": uid, "payload_status": status},
    )
