"""Syscall-surface probes beyond proc_syscall_surface (issue 28), host side; Linux only.

`proc_syscall_surface_extended` tries the keyrings' add_key/request_key, userfaultfd,
perf_event_open, ioctl TIOCLINUX and the 32-bit socketcall through int 0x80 (and records,
unjudged, a fileless exec through memfd_create + execveat); `proc_new_mount_api` tries clone3
with namespace flags and the new mount API (open_tree, move_mount, mount_setattr, fsopen)
from a user namespace of the payload's own. Both payloads call with arguments the kernel
rejects, so "succeeded" means the call reached its handler.

Without the kernel witness no host reading sees whether a syscall reached its handler, so the
payload's report is the evidence, believed in one direction only (as in `catalog/proc.py`): a
call reported reached is believed, because no payload gains by forging one; a refusal counts
only where the same file, run unsandboxed on the host as the payload user (the host control),
reached it. Where the witness recorded the cell (sandbox_attest/host/kernel/), the kernel's
errno for each refused call backs it; for proc_syscall_surface_extended, whose arguments name
its own calls, a call the kernel let reach its handler is an escape, and its int 0x80
socketcall killed by seccomp is backed by the SIGSYS the kernel raised for it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    baseline_control,
    run_payload_on_host,
)
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.catalog.witness.kernel import (
    SIGSYS_KILL,
    KernelJudgement,
    ReportedAttempt,
    SurfaceCall,
    back_refusals,
    backed_in_payload,
    corroborate,
    first_args,
    seccomp_kill,
    surface_escapes,
    surface_judgement,
    surface_reached,
)
from sandbox_attest.claims import claims_of, unclaimed
from sandbox_attest.verdict import Assessment, Escape, Expectation

__all__ = ["SPECS", "ProcNewMountApi", "ProcSyscallSurfaceExtended"]


def host_baseline(ctx: CellContext) -> dict[str, Any]:
    """The payload file itself, unsandboxed, as the payload user (`run_payload_on_host`)."""
    return run_payload_on_host(ctx, {})[1]


def seccomp_filters(status: dict[str, Any]) -> int:
    """How many seccomp filters the host sees on a process (mode 2 only); 0 without any."""
    if str(status.get("Seccomp")) != "2":
        return 0
    try:
        return int(str(status.get("Seccomp_filters", "1")))
    except ValueError:
        return 1


def unknown_surface(escapes: list[dict[str, Any]], host: dict[Any, dict[str, Any]]) -> list[str]:
    """Why the surface stays unknown, or [] when every door the baseline reaches was tried.

    A crashed attempt, or one the baseline reaches that the report never made, leaves that
    door unknown: a refusal counts only for a surface that was tried.
    """
    reasons = []
    crashed = [a for a in escapes if a.get("outcome") == "error"]
    if crashed:
        reasons.append(f"the payload failed: {attempts_summary(crashed)}")
    tried = {a.get("what") for a in escapes}
    missing = sorted(
        str(w) for w, a in host.items() if a.get("outcome") == "succeeded" and w not in tried
    )
    if missing:
        reasons.append(f"never tried, though the host reaches them: {', '.join(missing)}")
    return reasons


def _any_event(event: dict[str, Any]) -> bool:
    """Every event of the call: its arguments are not what tells the attempt (its errno is)."""
    del event
    return True


def _no_event(event: dict[str, Any]) -> bool:
    """No event of the call is an escape by itself."""
    del event
    return False


class _SurfaceSpec(SpecBase):
    """A syscall-surface probe judged against its own unsandboxed baseline.

    Subclasses name their attempts, the calls only a seccomp filter can refuse where the
    baseline reaches them (`seccomp_only`), and what reaching them means (`reached_words`).
    """

    area = "syscalls"
    kernel_witness = True
    calls: tuple[str, ...] = ()
    seccomp_only: frozenset[str] = frozenset()
    reached_words: str = "reached"
    # Each attempt's syscalls as the kernel witness records them (sandbox_attest/host/kernel/);
    # an attempt not named here is not judged by the kernel's answer. `kernel_calls`: matched
    # by syscall and errno alone (arguments that do not tell the payload's call from others);
    # `surface_calls`: matched by the payload's own arguments too, so a handler the kernel
    # let run for a call reported refused is an escape (`surface_judgement`).
    kernel_calls: ClassVar[dict[str, tuple[str, ...]]] = {}
    surface_calls: ClassVar[dict[str, SurfaceCall]] = {}

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """None: a seccomp filter the host sees shows that one exists, not what it refuses.

        So across a command wrapper this probe's PASS is INCONCLUSIVE at best; a FAIL (a call
        reported reached) needs no corroboration.
        """
        del ctx, report
        return []

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The getpid control and this probe's calls; `syscalls` excuses all of them.

        Where the payload has no syscall table for its machine it says so in one `syscalls`
        error, before even its control.
        """
        del task
        names = attempts_of("getpid", *self.calls)
        return AttemptTable(required=names, excuses=(("syscalls", names),))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied under a filtered-syscalls claim (the default where ipc is "isolated")."""
        return "denied" if claims_of(declared).syscalls == "filtered" else "allowed"

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE under an open syscall surface: this probe tests that claim alone."""
        return unclaimed(self.id, claims_of(declared))

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Nothing to plant: the payload calls with arguments the kernel rejects."""
        del ctx
        return {}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The same file's attempts, unsandboxed on the host as the payload user."""
        return baseline_control(lambda: host_baseline(ctx))

    def _refused_without_filter(self, ctx: CellContext, refused: list[dict[str, Any]]) -> str:
        """Why refusals of seccomp-only calls cannot be the kernel's, or "" when they can be."""
        names = sorted(str(a.get("what")) for a in refused if a.get("what") in self.seccomp_only)
        bare = [p for p in host_processes(ctx) if seccomp_filters(p.get("status") or {}) < 1]
        if not names or not bare:
            return ""
        pids = ", ".join(
            f"{p.get('pid', '?')} (Seccomp {(p.get('status') or {}).get('Seccomp', '?')})"
            for p in bare
        )
        return (
            f"the report says {', '.join(names)} were refused, calls the host baseline "
            f"reaches, but the host sees no seccomp filter on the payload (host pid {pids}): "
            "nothing could have refused them, so the report is not what the kernel said"
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A call the host baseline reaches and the payload reaches too is an escape.

        So is a refusal the host's own reading rules out (a seccomp-only call reported refused
        while the host sees no filter on the payload). A crash, or a call the baseline reaches
        that the report never made, leaves the surface unknown: never a PASS.
        """
        del witness
        baseline = control.get("baseline") or {}
        host = {a.get("what"): a for a in attempts_by_role(baseline, "escape")}
        escapes = attempts_by_role(report, "escape")
        # A door the host kernel itself lacks (no IA32 emulation, perf off) proves nothing.
        judged = [a for a in escapes if host.get(a.get("what"), {}).get("outcome") == "succeeded"]
        skipped = sorted(
            str(a.get("what")) for a in escapes if a not in judged and a.get("outcome") != "error"
        )
        observed: Literal["succeeded", "refused", "error"] = (
            observed_outcome(judged) if judged else "error"
        )
        reached = [a for a in judged if a.get("outcome") == "succeeded"]
        refused = [a for a in judged if a.get("outcome") == "refused"]
        facts = report.get("facts", {})
        reasons = [
            f"{self.reached_words}: {attempts_summary(reached) if reached else 'none'}",
            f"refused: {attempts_summary(refused) if refused else 'none'}",
            f"seccomp={facts.get('seccomp')}",
        ]
        if "unshare" in facts:
            reasons.append(
                f"the payload's own unshare(CLONE_NEWUSER|CLONE_NEWNS): {facts['unshare']}"
            )
        if skipped:
            reasons.append(
                f"not judged (the host baseline does not reach them): {', '.join(skipped)}"
            )
        if not judged:
            reasons.append("no call the host baseline reaches was reported")
        seen = surface_reached(ctx, reached, self.surface_calls)
        escape: Escape = "undecided"
        if observed == "succeeded":
            escape = "escaped"
            reasons.append(
                "the kernel saw the handlers run: " + "; ".join(seen)
                if seen
                else "the payload reports it (no host witness exists; a report against the "
                "sandbox is believed)"
            )
        elif observed == "refused":
            escape = "refused"
        kernel, every = self._kernel_judgement(ctx, refused)
        # A refusal the kernel made in the payload's own process is no forgery.
        backed = backed_in_payload(ctx, kernel)
        unfiltered = self._refused_without_filter(
            ctx, [a for a in refused if a.get("what") not in backed]
        )
        if unfiltered:
            escape = "escaped"
            reasons.insert(0, unfiltered)
        escaped = surface_escapes(kernel, reasons)
        escape = "escaped" if escaped else escape
        claims = claims_of(ctx.claims)
        if escape == "escaped" and claims.syscalls == "filtered":
            names = ", ".join([str(a.get("what")) for a in reached] + escaped)
            reasons.insert(
                0, f"{claims.phrase('syscalls')}; the payload reached {names or 'a forged refusal'}"
            )
        unknown = unknown_surface(escapes, host)
        if escape != "escaped" and unknown:
            escape = "undecided"
            reasons.extend(unknown)
        inside = attempts_by_role(report, "control")
        assessment = conclude(
            escape,
            observed,
            reasons,
            inside_ok=all_succeeded(inside),
            inside_failed=f"in-sandbox control failed: {attempts_summary(inside)}",
            host_control=control,
            host_failed="host control failed",
            witness={
                "reached": reached,
                "host_baseline": list(host.values()),
                "observations": attempts_by_role(report, "observation"),
            },
            controls={"inside": inside, "host": control},
        )
        # A call reached only by the report's word is said as such; a judged process the
        # host sees with no seccomp filter at all backs it (nothing could have refused it).
        bare = [p for p in host_processes(ctx) if seccomp_filters(p.get("status") or {}) < 1]
        assessment.reported_only = escape == "escaped" and not (
            unfiltered or bare or escaped or seen
        )
        back_refusals(kernel, every, assessment)
        return assessment

    def _kernel_judgement(
        self, ctx: CellContext, refused: list[dict[str, Any]]
    ) -> tuple[KernelJudgement | None, bool]:
        """The kernel's answer behind each refused call; whether every refusal was asked.

        The kernel's answer to these calls is the sandbox's whatever namespaces the payload
        has, so the rule applies wherever the witness recorded the payload's own processes.
        A refusal with the reported errno answers the attempt (one event each); a refused
        call the kernel never saw is a report that does not match (the runner's ERROR).
        """
        if self.surface_calls:
            return surface_judgement(ctx, refused, self.surface_calls)
        attempts = [
            ReportedAttempt(
                label=str(a.get("what")),
                outcome="refused",
                syscalls=self.kernel_calls[str(a.get("what"))],
                match=_any_event,
                # A success of the call is no escape here: clone3 also makes every thread,
                # and a reached call is judged by the report (believed against the sandbox).
                counts=_no_event,
                errno=str(a.get("errno") or ""),
            )
            for a in refused
            if str(a.get("what")) in self.kernel_calls and a.get("errno")
        ]
        if not attempts:
            return None, False
        return corroborate(ctx, attempts, None), len(attempts) == len(refused)


class ProcSyscallSurfaceExtended(_SurfaceSpec):
    """add_key, request_key, userfaultfd, perf_event_open, TIOCLINUX and i386 socketcall."""

    id = "proc_syscall_surface_extended"
    calls = (
        "add_key",
        "request_key",
        "userfaultfd",
        "perf_event_open",
        "ioctl-tioclinux",
        "socketcall-i386",
        "memfd-execveat",
    )
    # No capability or namespace decides these with the payload's arguments: only a filter
    # (or an LSM hook this host does not run) can refuse them where the baseline reaches them.
    seccomp_only = frozenset({"add_key", "request_key", "userfaultfd"})
    reached_words = "reached the kernel handler"
    # The payload's arguments (probes/proc_syscall_surface_extended.py) pick its own calls;
    # its i386 socketcall is a 32-bit call the witness leaves out: a seccomp kill of it is
    # seen as the SIGSYS the kernel raised (SYS_SECCOMP), any other answer is not judged.
    surface_calls: ClassVar[dict[str, SurfaceCall]] = {
        "add_key": SurfaceCall(("add_key",), first_args(0)),
        "request_key": SurfaceCall(("request_key",), first_args(0)),
        "userfaultfd": SurfaceCall(("userfaultfd",), first_args(3)),
        "perf_event_open": SurfaceCall(("perf_event_open",), first_args(0, 0, -1, -1)),
        "ioctl-tioclinux": SurfaceCall(("ioctl",), first_args(-1, 0x541C)),
        "socketcall-i386": SurfaceCall(SIGSYS_KILL, seccomp_kill, frozenset({"SIGSYS"})),
    }


class ProcNewMountApi(_SurfaceSpec):
    """clone3 with namespace flags, then open_tree/move_mount/mount_setattr/fsopen in them."""

    id = "proc_new_mount_api"
    calls = ("clone3-newns", "open_tree", "move_mount", "mount_setattr", "fsopen")
    # All of these need CAP_SYS_ADMIN over a mount namespace or a free user-namespace slot:
    # a sandbox may refuse them without a filter (bwrap --disable-userns), so none is here.
    seccomp_only = frozenset()
    reached_words = "reached (clone3 made namespaces, or the mount API passed its permission check)"
    kernel_calls: ClassVar[dict[str, tuple[str, ...]]] = {
        "clone3-newns": ("clone3",),
        "open_tree": ("open_tree",),
        "move_mount": ("move_mount",),
        "mount_setattr": ("mount_setattr",),
        "fsopen": ("fsopen",),
    }


SPECS: Final = (ProcSyscallSurfaceExtended(), ProcNewMountApi())
