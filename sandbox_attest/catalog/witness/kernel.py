"""What the kernel answered a cell's attempts: the kernel witness's reading, for the judges.

sandbox_attest/host/kernel/ records, per cell, each syscall probes care about with
its argument and the kernel's answer; the runner puts them in `ctx.host_view["kernel"]`.
This module is how a probe's judge asks about one attempt:

- `kernel_answers(ctx, syscalls, match)`: every event of those syscalls whose argument the
  match accepts, as `KernelAnswer`s ("the kernel saw openat(/path) -> EACCES");
- `corroborate(ctx, attempts)`: the rule of issue 27 for a filter sandbox, for a list of
  reported attempts: a refusal the kernel returned an error for is corroborated; an attempt
  the kernel never saw is a report that does not match the probe; a success the kernel saw
  in the payload's own process is an escape the payload's report did not own up to.

It decides nothing where the witness did not record the cell (not root, no bpftrace, a
subtree cell group): `recorded(ctx)` is False and the judges keep today's readings.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sandbox_attest.catalog.spec import CellContext, host_processes
from sandbox_attest.verdict import Assessment

# The open flags that read nothing (O_PATH): such an open reaches no byte of the file.
O_PATH: Final = 0o10000000
OPENS: Final = ("open", "openat", "openat2")
# The witness cuts a path at 199 bytes (its BPFTRACE_STRLEN): a cut one matches by prefix.
CUT: Final = 199


@dataclass(frozen=True)
class KernelAnswer:
    """One syscall of the cell and the kernel's answer; from `kernel_answers` only."""

    syscall: str
    argument: str
    error: str  # "EACCES", or "" for a success
    ret: int
    pid: int
    entered: bool
    event: dict[str, Any] = field(compare=False, hash=False, repr=False)

    def reading(self) -> str:
        """`the kernel saw openat(/home/u/.ssh/id) -> EACCES`."""
        if self.syscall == "signal":
            return (
                f"the kernel killed pid {self.pid} by seccomp, SIGSYS (si_code SYS_SECCOMP, "
                "before the syscall began)"
            )
        if not self.entered:
            return (
                f"the kernel refused {self.syscall} before it began -> {self.error} "
                "(seccomp; its argument is not seen there)"
            )
        return f"the kernel saw {self.syscall}({self.argument}) -> {self.error or self.ret}"


def witness_reading(ctx: CellContext) -> dict[str, Any]:
    """The kernel witness's reading of this cell (`status`, `why`, `events`), or {}."""
    kernel = ctx.host_view.get("kernel")
    return kernel if isinstance(kernel, dict) else {}


def recorded(ctx: CellContext) -> bool:
    """Whether the witness was attached and recorded this cell from before its payload ran."""
    kernel = witness_reading(ctx)
    return bool(kernel.get("recorded")) and isinstance(kernel.get("events"), list)


def why_not_recorded(ctx: CellContext) -> str:
    """Why the kernel witness has nothing on this cell, in a phrase."""
    kernel = witness_reading(ctx)
    return str(kernel.get("why") or "no kernel witness ran")


def _answer(event: dict[str, Any]) -> KernelAnswer:
    address = event.get("address") or {}
    argument = str(event.get("text") or address.get("address") or "")
    return KernelAnswer(
        syscall=str(event.get("syscall")),
        argument=argument,
        error=str(event.get("error") or ""),
        ret=int(event.get("ret") or 0),
        pid=int(event.get("pid") or 0),
        entered=bool(event.get("entered")),
        event=event,
    )


def kernel_answers(
    ctx: CellContext, syscalls: Sequence[str], match: Callable[[dict[str, Any]], bool]
) -> list[KernelAnswer]:
    """Every recorded event of `syscalls` whose event `match` accepts, in order."""
    if not recorded(ctx):
        return []
    events = witness_reading(ctx).get("events") or []
    return [
        _answer(e)
        for e in events
        if isinstance(e, dict) and e.get("syscall") in syscalls and e.get("entered") and match(e)
    ]


def kernel_answer(
    ctx: CellContext, syscall: str, match: Callable[[dict[str, Any]], bool]
) -> KernelAnswer | None:
    """The kernel's answer to one attempt: its first refusal, else its first success; or None."""
    found = kernel_answers(ctx, (syscall,), match)
    refused = [a for a in found if a.error]
    return next(iter(refused or found), None)


def refused_unseen(ctx: CellContext, syscalls: Sequence[str]) -> list[KernelAnswer]:
    """Events of `syscalls` refused before they began (seccomp): their arguments are unknown."""
    if not recorded(ctx):
        return []
    events = witness_reading(ctx).get("events") or []
    return [
        _answer(e)
        for e in events
        if isinstance(e, dict)
        and e.get("syscall") in syscalls
        and not e.get("entered")
        and e.get("error")
    ]


def payload_pids(ctx: CellContext) -> set[int]:
    """The pids of the payload's own processes, as the host read them at the rendezvous."""
    return {int(p["pid"]) for p in host_processes(ctx) if isinstance(p.get("pid"), int)}


def path_match(path: str) -> Callable[[dict[str, Any]], bool]:
    """A match for an event whose path argument is `path` (or its cut prefix, 199 bytes)."""
    want = os.path.normpath(path)

    def match(event: dict[str, Any]) -> bool:
        text = str(event.get("text") or "")
        if not text:
            return False
        got = os.path.normpath(text)
        return got == want or (len(text) >= CUT and want.startswith(text))

    return match


def address_match(ip: str, port: int) -> Callable[[dict[str, Any]], bool]:
    """A match for a connect/bind/sendto event whose socket address is `ip`:`port`."""
    want = ipaddress.ip_address(ip.strip("[]"))

    def match(event: dict[str, Any]) -> bool:
        address = event.get("address") or {}
        try:
            got = ipaddress.ip_address(str(address.get("ip", "")))
        except ValueError:
            return False
        return got == want and address.get("port") == port

    return match


def socket_match(
    family: int, kind: int, protos: Collection[int] | None = None
) -> Callable[[dict[str, Any]], bool]:
    """A match for socket(family, kind, proto) with proto in `protos` (None: any).

    SOCK_NONBLOCK and SOCK_CLOEXEC in the type are ignored.
    """

    def match(event: dict[str, Any]) -> bool:
        args = event.get("args") or [0, 0, 0, 0]
        if event.get("syscall") != "socket" or args[0] != family or args[1] & 0xF != kind:
            return False
        return protos is None or args[2] in protos

    return match


def either(*matches: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """A match that any of `matches` accepts."""
    return lambda event: any(m(event) for m in matches)


def reads_bytes(event: dict[str, Any]) -> bool:
    """Whether an open event could read the file's bytes (not O_PATH; openat2's are unseen)."""
    args = event.get("args") or [0, 0, 0, 0]
    syscall = event.get("syscall")
    flags = args[1] if syscall == "open" else args[2] if syscall == "openat" else None
    return flags is not None and not flags & O_PATH and flags & 3 != 1  # not O_WRONLY


@dataclass
class KernelJudgement:
    """What the kernel's answers say about a list of reported attempts (`corroborate`)."""

    corroborated: list[str] = field(default_factory=list)  # readings behind refusals
    unseen: list[str] = field(default_factory=list)  # reported attempts the kernel never saw
    uncertain: list[str] = field(default_factory=list)  # unseen, but the cell's events overflowed
    escapes: list[str] = field(default_factory=list)  # successes in the payload's processes
    cited: list[dict[str, Any]] = field(default_factory=list)  # the events that judged
    backed: dict[str, int] = field(default_factory=dict)  # refused label -> its event's pid

    @property
    def all_corroborated(self) -> bool:
        """Every refusal had the kernel's error behind it, and nothing else was found."""
        return bool(self.corroborated) and not (self.unseen or self.uncertain or self.escapes)

    def as_witness(self) -> dict[str, Any]:
        """The judgement for the assessment's witness (`witness["kernel"]`)."""
        return {
            "corroborated": self.corroborated,
            "unseen": self.unseen,
            "uncertain": self.uncertain,
            "escapes": self.escapes,
            "events": self.cited,
        }


@dataclass(frozen=True)
class ReportedAttempt:
    """One attempt as the payload reported it, and how to find it among the kernel's events.

    `counts` says whether an event is this attempt's real effect (an open that reads bytes,
    not an O_PATH look): a success the kernel saw counts as an escape only when it does.
    """

    label: str
    outcome: str  # "succeeded" | "refused" | "error"
    syscalls: tuple[str, ...]
    match: Callable[[dict[str, Any]], bool]
    counts: Callable[[dict[str, Any]], bool] = lambda _event: True
    # The errno the payload reports: when given, only a refusal with it answers the attempt.
    errno: str = ""
    # The answers that are refusals, where the attempt's arguments are ones the kernel rejects
    # (a syscall-surface probe): an event with another errno reached the call's handler and
    # counts as a success. None: every error is a refusal.
    refusals: frozenset[str] | None = None

    def refused_by(self, answer: KernelAnswer) -> bool:
        """Whether `answer` is a refusal of this attempt (not a success, not a handler's no)."""
        return bool(answer.error) and (self.refusals is None or answer.error in self.refusals)


def filter_sandbox(ctx: CellContext, namespace: str | None) -> str:
    """Why the rule does not apply to this cell, or "" where it does.

    It applies where the payload runs in the harness's own `namespace` (a filter sandbox:
    the path or address it names is the host's; None for a syscall whose answer does not
    depend on any namespace's view) and the witness saw the payload's own processes in the
    cell's cgroup (a container engine moves them to a cgroup of its own).
    """
    if not recorded(ctx):
        return why_not_recorded(ctx)
    processes = host_processes(ctx)
    if not processes:
        return "the host did not see the payload's processes"
    if namespace and any(namespace not in (p.get("shared_with_harness") or []) for p in processes):
        return f"the payload has a {namespace} namespace of its own"
    events = witness_reading(ctx).get("events") or []
    mine = payload_pids(ctx)
    if not any(isinstance(e, dict) and e.get("pid") in mine for e in events):
        return "the kernel witness saw no syscall of the payload's processes in the cell's cgroup"
    return ""


def corroborate(
    ctx: CellContext, attempts: Sequence[ReportedAttempt], namespace: str | None
) -> KernelJudgement | None:
    """Issue 27's rule for each reported attempt; None where it does not apply (`filter_sandbox`).

    1. A refusal is corroborated by a refusal the kernel returned for that syscall and
       argument; or, where seccomp refused the syscall before it began (no argument seen), by
       such a refusal of the same syscall, said as such.
    2. A refusal (or an error) the kernel never saw in any form is a report that does not
       match the probe.
    3. A success the kernel returned in one of the payload's own processes (the host's pids;
       a wrapper's supervisor opening a path for its own checks is not the payload) for an
       attempt the payload reports refused is an escape the report hides.
    """
    if filter_sandbox(ctx, namespace):
        return None
    judged = KernelJudgement()
    mine = payload_pids(ctx)
    dropped = int(witness_reading(ctx).get("dropped") or 0)
    # Each event answers one attempt: two attempts refused the same way before the syscall
    # began (no argument to tell them apart) need two such refusals.
    used: set[int] = set()
    for attempt in attempts:
        found = [
            a
            for a in kernel_answers(ctx, attempt.syscalls, attempt.match)
            if id(a.event) not in used
        ]
        refused = [a for a in found if attempt.refused_by(a) and attempt.errno in {"", a.error}]
        won = [
            a
            for a in found
            if not attempt.refused_by(a) and a.pid in mine and attempt.counts(a.event)
        ]
        if won and attempt.outcome != "succeeded":
            judged.escapes.append(f"{attempt.label}: {won[0].reading()}")
            judged.cited.append(won[0].event)
            used.add(id(won[0].event))
            continue
        if attempt.outcome == "succeeded":
            continue
        before = [
            a
            for a in refused_unseen(ctx, attempt.syscalls)
            if id(a.event) not in used and attempt.errno in {"", a.error}
        ]
        for answer in (refused or before)[:1]:
            judged.corroborated.append(f"{attempt.label}: {answer.reading()}")
            judged.cited.append(answer.event)
            judged.backed[attempt.label] = answer.pid
            used.add(id(answer.event))
        if refused or before:
            continue
        said = (
            f"{attempt.label}: the payload reports {attempt.outcome}, but the kernel saw no "
            f"{'/'.join(attempt.syscalls)} of it"
        )
        if dropped:
            # Past the cell's cap the kernel saw more than it kept: not seen is not never.
            judged.uncertain.append(f"{said} (the witness dropped {dropped} of the cell's events)")
        else:
            judged.unseen.append(said)
    return judged


# ---------------------------------------------------------------------------------------------
# Syscall-surface probes (proc_syscall_surface, proc_syscall_surface_extended): each call is
# made with arguments the kernel rejects, so the kernel's own errno tells a refusal (a filter,
# an LSM, a missing capability) from a handler that ran and rejected the arguments.

# The answers the payloads count as refused (their REFUSED); SIGSYS is a seccomp kill.
SURFACE_REFUSALS: Final = frozenset(
    {"EPERM", "EACCES", "ENOSYS", "EAFNOSUPPORT", "EPROTONOSUPPORT", "SIGSYS"}
)
# What backs a syscall-surface cell whose every refusal the kernel answered.
KERNEL_BACKED_CALLS: Final = "the kernel's errno for each refused call (kernel witness)"
# The SIGSYS seccomp raised (the witness's `signal` events; sandbox_attest/host/kernel/).
SIGSYS_KILL: Final = ("signal",)
U32: Final = 0xFFFFFFFF


@dataclass(frozen=True)
class SurfaceCall:
    """How the kernel witness sees one attempt of a syscall-surface probe.

    `match` picks the payload's own call among the cell's entered events by its arguments
    (a refusal before the syscall began has none and is matched by syscall and errno alone).
    `errnos`: the reported errnos this mapping judges (empty: any); another is not judged.
    """

    syscalls: tuple[str, ...]
    match: Callable[[dict[str, Any]], bool]
    errnos: frozenset[str] = frozenset()


def first_args(*want: int) -> Callable[[dict[str, Any]], bool]:
    """A match for an event whose first arguments are `want` (each compared as 32 bits)."""

    def match(event: dict[str, Any]) -> bool:
        args = list(event.get("args") or [])[: len(want)]
        return len(args) == len(want) and all(
            int(a) & U32 == w & U32 for a, w in zip(args, want, strict=True)
        )

    return match


def seccomp_kill(event: dict[str, Any]) -> bool:
    """No entered event is a seccomp kill: the SIGSYS events are matched by `refused_unseen`."""
    del event
    return False


def surface_judgement(
    ctx: CellContext, refused: Sequence[dict[str, Any]], calls: dict[str, SurfaceCall]
) -> tuple[KernelJudgement | None, bool]:
    """The kernel's answer behind each refused call; and whether every refusal was asked.

    A refusal is corroborated by the kernel's refusal with the reported errno (one event
    each); a refused call the kernel let reach its handler in the payload's own process (a
    success, or an errno the handler gives these arguments) is an escape; a refused call the
    kernel never saw is a report that does not match (`unseen`, the runner's ERROR). The
    answer to these calls does not depend on any namespace's view (`corroborate`, None).
    """
    attempts = []
    for a in refused:
        call = calls.get(str(a.get("what")))
        err = str(a.get("errno") or "")
        if call is None or not err or (call.errnos and err not in call.errnos):
            continue
        attempts.append(
            ReportedAttempt(
                label=str(a.get("what")),
                outcome="refused",
                syscalls=call.syscalls,
                match=call.match,
                errno=err,
                refusals=SURFACE_REFUSALS,
            )
        )
    if not attempts:
        return None, False
    return corroborate(ctx, attempts, None), len(attempts) == len(refused)


def backed_in_payload(ctx: CellContext, kernel: KernelJudgement | None) -> set[str]:
    """The refused calls the kernel refused in one of the payload's own processes.

    Such a refusal is the kernel's word that a filter was on the process that made the call,
    whatever the host read on the cell's other members (a wrapper's unfiltered shell).
    """
    if kernel is None:
        return set()
    mine = payload_pids(ctx)
    return {label for label, pid in kernel.backed.items() if pid in mine}


def surface_reached(
    ctx: CellContext, reached: Sequence[dict[str, Any]], calls: dict[str, SurfaceCall]
) -> list[str]:
    """The kernel's reading of each reported reached call, or [] unless it saw every one.

    A call counts as seen where the payload's own process made it with the payload's
    arguments and the kernel gave it no refusal (`SURFACE_REFUSALS`): its handler ran.
    """
    if not reached or filter_sandbox(ctx, None):
        return []
    mine = payload_pids(ctx)
    readings = []
    for attempt in reached:
        call = calls.get(str(attempt.get("what")))
        seen = [
            a
            for a in (kernel_answers(ctx, call.syscalls, call.match) if call else [])
            if a.pid in mine and a.error not in SURFACE_REFUSALS
        ]
        if not seen:
            return []
        readings.append(f"{attempt.get('what')}: {seen[0].reading()}")
    return readings


def surface_escapes(kernel: KernelJudgement | None, reasons: list[str]) -> list[str]:
    """The refused calls the kernel let reach their handler (labels); said first in `reasons`."""
    if kernel is None or not kernel.escapes:
        return []
    reasons.insert(
        0,
        "the report says refused, but the kernel let the call reach its handler: "
        + "; ".join(kernel.escapes),
    )
    return [e.split(":")[0] for e in kernel.escapes]


def back_refusals(kernel: KernelJudgement | None, every: bool, assessment: Assessment) -> None:
    """Put the kernel's judgement in the witness; where it answered every refusal, back them."""
    if kernel is None:
        return
    assessment.witness["kernel"] = kernel.as_witness()
    if kernel.all_corroborated and every and assessment.escape == "refused":
        assessment.reasons.append("; ".join(kernel.corroborated))
        assessment.corroborated_by = [KERNEL_BACKED_CALLS]
