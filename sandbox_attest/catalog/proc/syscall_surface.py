"""proc_syscall_surface: io_uring, keyctl, bpf, TIOCSTI and odd socket families.

Self-reported (`BaselineSpec`): whether a syscall reached its kernel handler is seen by the
payload, and, where the kernel witness recorded the cell (sandbox_attest/host/kernel/), by the
kernel's own errno for each call (`KERNEL_CALLS`): a refusal it returned backs the report, a
handler it let run is an escape, a refusal it never saw is a report that does not match. A
call is judged only where the host baseline reaches it; a refusal the host's own reading rules
out (no seccomp filter on the payload) is an escape. A descriptor socket() returned counts as
the kernel's socket only where the kernel names the family asked for (`descriptor_identity`):
a sandbox may hand back a socketpair of its own instead.
"""

from __future__ import annotations

import socket
from typing import Any, Final, Literal

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.proc.baseline import (
    BaselineSpec,
    conclude_with_controls,
    judge_self_reported,
)
from sandbox_attest.catalog.proc.readings import seccomp_filter_count
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.catalog.witness.kernel import (
    SurfaceCall,
    back_refusals,
    backed_in_payload,
    first_args,
    socket_match,
    surface_escapes,
    surface_judgement,
    surface_reached,
)
from sandbox_attest.claims import claims_of, unclaimed
from sandbox_attest.verdict import Assessment, Expectation

__all__ = [
    "FAMILY_DOMAINS",
    "KERNEL_CALLS",
    "SECCOMP_ONLY",
    "ProcSyscallSurface",
    "descriptor_identity",
]

# Raw syscalls only a seccomp filter refuses where the host baseline reaches them (the probe
# calls them with arguments the kernel rejects, so no capability or namespace is involved).
# TIOCSTI and the socket families are left out: a new session or an LSM refuses those too.
SECCOMP_ONLY: Final = frozenset({"io_uring_setup", "keyctl", "bpf"})
# The address family each socket attempt asks for, by the kernel's number (copied in
# probes/proc_syscall_surface.py): a descriptor counts as the kernel's socket of that family
# only where the kernel's SO_DOMAIN for it says so.
FAMILY_DOMAINS: Final = {"socket-vsock": 40, "socket-netlink": 16, "socket-packet": 17}
Identity = Literal["kernel", "not_the_kernels", "unknown"]
# Each attempt as the kernel witness records it, matched by the arguments the payload passes
# (probes/proc_syscall_surface.py: an unknown command 0x7FFF, io_uring_setup(0, NULL), fd -1
# with TIOCSTI, and the socket family and type asked for).
UNKNOWN_COMMAND: Final = 0x7FFF
TIOCSTI: Final = 0x5412
SOCK_STREAM, SOCK_RAW = 1, 3
# How judge_self_reported says a reached call rests on the payload's report.
SELF_REPORTED: Final = "the payload reports it (no host witness exists"
KERNEL_CALLS: Final = {
    "io_uring_setup": SurfaceCall(("io_uring_setup",), first_args(0, 0)),
    "keyctl": SurfaceCall(("keyctl",), first_args(UNKNOWN_COMMAND)),
    "bpf": SurfaceCall(("bpf",), first_args(UNKNOWN_COMMAND)),
    "ioctl-tiocsti": SurfaceCall(("ioctl",), first_args(-1, TIOCSTI)),
    "socket-vsock": SurfaceCall(("socket",), socket_match(40, SOCK_STREAM)),
    "socket-netlink": SurfaceCall(("socket",), socket_match(16, SOCK_RAW)),
    "socket-packet": SurfaceCall(("socket",), socket_match(17, SOCK_RAW)),
}


def descriptor_identity(attempt: dict[str, Any]) -> Identity:
    """Whose object a reported socket() descriptor is: the kernel's socket of that family?

    "kernel" for every attempt that is not a created socket (the call's own answer is its
    evidence) and for a socket whose SO_DOMAIN is the family asked for; "not_the_kernels"
    where fstat says it is no socket, or the kernel names another family (a sandbox's
    socketpair or pipe handed back for socket(), issue 27); "unknown" where the payload could
    not ask (its `identity_error`), or an older report carries no identity.
    """
    want = FAMILY_DOMAINS.get(str(attempt.get("what")))
    if want is None or attempt.get("outcome") != "succeeded":
        return "kernel"
    domain = attempt.get("domain")
    known = isinstance(domain, int) and not isinstance(domain, bool)
    if attempt.get("is_socket") is False or (known and domain != want):
        return "not_the_kernels"
    return "kernel" if known and attempt.get("is_socket") is True else "unknown"


def _family_name(domain: object) -> str:
    """`AF_UNIX` for 1; the number where the host's socket module has no name for it."""
    try:
        return socket.AddressFamily(int(str(domain))).name
    except ValueError:
        return f"AF {domain}"


def _identity_reasons(
    judged: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The judged attempts left once socket() descriptors are identified; the unknown; why.

    A descriptor that is not the kernel's socket of the family asked for reached no kernel
    handler of that family: it is not an escape. Nor is it a refusal: the call returned a
    descriptor the sandbox made, which may lead anywhere this probe never uses it for, so
    it is taken out of the judged attempts and named; the other attempts decide the cell.
    One whose identity is unknown leaves its surface unknown (the caller: undecided).
    """
    kept: list[dict[str, Any]] = []
    unknown: list[dict[str, Any]] = []
    reasons: list[str] = []
    for a in judged:
        identity = descriptor_identity(a)
        if identity == "kernel":
            kept.append(a)
        elif identity == "unknown":
            unknown.append(a)
            reasons.append(
                f"cannot tell whose descriptor {a.get('what')} returned "
                f"({a.get('identity_error') or 'the report carries no SO_DOMAIN'}): that "
                "surface is unknown"
            )
        else:
            what = (
                "no socket (fstat)"
                if a.get("is_socket") is False
                else f"an {_family_name(a.get('domain'))} socket (SO_DOMAIN {a.get('domain')})"
            )
            reasons.append(
                f"not the kernel's: {a.get('what')} returned {what}, a descriptor the sandbox "
                "handed back, so no kernel handler of that family was reached (not judged, "
                "neither reached nor refused)"
            )
    return kept, unknown, reasons


def _refused_without_filter(ctx: CellContext, refused: list[dict[str, Any]]) -> str:
    """Why refusals of seccomp-only calls cannot be the kernel's, or "" when they can be."""
    names = sorted(str(a.get("what")) for a in refused if a.get("what") in SECCOMP_ONLY)
    bare = [p for p in host_processes(ctx) if seccomp_filter_count(p.get("status") or {}) < 1]
    if not names or not bare:
        return ""
    pids = ", ".join(
        f"{p.get('pid', '?')} (Seccomp {(p.get('status') or {}).get('Seccomp', '?')})" for p in bare
    )
    return (
        f"the report says {', '.join(names)} were refused, calls the host baseline reaches, "
        f"but the host sees no seccomp filter on the payload (host pid {pids}): nothing could "
        "have refused them, so the report is not what the kernel said"
    )


class ProcSyscallSurface(BaselineSpec):
    """io_uring, keyctl, bpf, TIOCSTI and vsock/netlink/packet sockets, with bad arguments."""

    id = "proc_syscall_surface"
    area = "proc"
    kernel_witness = True

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """None: a seccomp filter the host sees shows that one exists, not what it refuses.

        So a filter backs no PASS (a wrapper could filter nothing of these and rewrite the
        report), and no filter at all rules the refusals out (`assess`: FAIL). Across a
        command wrapper this probe's PASS is therefore INCONCLUSIVE at best.
        """
        del ctx, report
        return []

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The getpid control, four raw syscalls and three socket families.

        Where the payload has no syscall table for its machine it says so in one `syscalls`
        error instead of the four calls.
        """
        del task
        calls = attempts_of("io_uring_setup", "keyctl", "bpf", "ioctl-tiocsti")
        families = attempts_of("socket-vsock", "socket-netlink", "socket-packet")
        return AttemptTable(required=calls | families | {"getpid"}, excuses=(("syscalls", calls),))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied under a filtered-syscalls claim (the default where ipc is "isolated").

        Keyrings are per-uid across namespaces, vsock talks to the hypervisor, TIOCSTI types
        into a terminal: each is a channel to the host that isolation has to close. A kernel
        interface reached at all is also kernel attack surface the payload shares with the host.
        """
        return "denied" if claims_of(declared).syscalls == "filtered" else "allowed"

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE under an open syscall surface: this probe tests that claim alone."""
        return unclaimed(self.id, claims_of(declared))

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A call the host baseline reaches and the payload reaches too is an escape.

        So is a refusal the host's own reading rules out: a raw syscall the baseline reaches,
        reported refused while the host sees no seccomp filter on the payload.
        """
        del witness
        baseline = control.get("baseline") or {}
        host = {a.get("what"): a for a in attempts_by_role(baseline, "escape")}
        escapes = attempts_by_role(report, "escape")
        # An interface the host kernel itself lacks (EAFNOSUPPORT for vsock...) proves nothing.
        judged = [a for a in escapes if host.get(a.get("what"), {}).get("outcome") == "succeeded"]
        skipped = sorted(
            str(a.get("what")) for a in escapes if a not in judged and a.get("outcome") != "error"
        )
        judged, unidentified, identified = _identity_reasons(judged)
        observed: Literal["succeeded", "refused", "error"] = (
            observed_outcome(judged) if judged else "error"
        )
        reached = [a for a in judged if a.get("outcome") == "succeeded"]
        refused = [a for a in judged if a.get("outcome") == "refused"]
        reasons = [
            f"reached the kernel handler: {attempts_summary(reached) if reached else 'none'}",
            f"refused: {attempts_summary(refused) if refused else 'none'}",
            f"seccomp={report.get('facts', {}).get('seccomp')}",
            *identified,
        ]
        if skipped:
            reasons.append(
                f"not judged (the host baseline does not reach them): {', '.join(skipped)}"
            )
        if not judged:
            reasons.append("no call the host baseline reaches was reported")
        escape = judge_self_reported(observed, reasons)
        kernel, every = surface_judgement(ctx, refused, KERNEL_CALLS)
        # A refusal the kernel made in the payload's own process is no forgery.
        backed = backed_in_payload(ctx, kernel)
        unfiltered = _refused_without_filter(
            ctx, [a for a in refused if a.get("what") not in backed]
        )
        if unfiltered:
            escape = "escaped"
            reasons.insert(0, unfiltered)
        escaped = surface_escapes(kernel, reasons)
        seen = surface_reached(ctx, reached, KERNEL_CALLS)
        if seen:
            # The kernel's reading, not the payload's word (judge_self_reported's line).
            reasons[:] = [r for r in reasons if not r.startswith(SELF_REPORTED)]
            reasons.append("the kernel saw the handlers run: " + "; ".join(seen))
        escape = "escaped" if escaped else escape
        claims = claims_of(ctx.claims)
        if escape == "escaped" and claims.syscalls == "filtered":
            names = ", ".join([str(a.get("what")) for a in reached] + escaped)
            reasons.insert(
                0, f"{claims.phrase('syscalls')}; the payload reached {names or 'a forged refusal'}"
            )
        # A refusal counts only for a surface that was tried: a crash, or a call the host
        # reaches that the report never mentions, leaves that surface unknown.
        crashed = [a for a in escapes if a.get("outcome") == "error"]
        tried = {a.get("what") for a in escapes}
        missing = sorted(
            str(w) for w, a in host.items() if a.get("outcome") == "succeeded" and w not in tried
        )
        if escape != "escaped" and (crashed or missing or unidentified):
            escape = "undecided"
            if crashed:
                reasons.append(f"the payload failed: {attempts_summary(crashed)}")
            if missing:
                reasons.append(f"never tried, though the host reaches them: {', '.join(missing)}")
        assessment = conclude_with_controls(
            escape,
            observed,
            reasons,
            report,
            control,
            {"reached": reached, "host_baseline": list(host.values())},
        )
        # A handler reached only by the report's word is the payload's claim against the
        # sandbox: believed, and said so (issue 27). Where the host sees a judged process
        # with no seccomp filter at all, nothing could have refused it: the host backs it.
        bare = [p for p in host_processes(ctx) if seccomp_filter_count(p.get("status") or {}) < 1]
        assessment.reported_only = escape == "escaped" and not (
            unfiltered or bare or escaped or seen
        )
        back_refusals(kernel, every, assessment)
        return assessment
