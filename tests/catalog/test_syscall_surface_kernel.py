"""The syscall-surface probes' refusals backed by the kernel's answer for each call (issue 27).

The reports and events are the ones a live sandlock cell gave (/tmp/ks2-r2, 2026-12-02):
every raw call refused by its seccomp filter before it began (`entered` False, the errno at
`sys_exit` only), socket(AF_VSOCK) EAFNOSUPPORT the same way, and the i386 socketcall's child
(pid 11449) killed by seccomp: a SIGSYS with si_code SYS_SECCOMP raised for the thread that
made the call (the witness's `signal` event). Without the witness these cells were
INCONCLUSIVE ("PASS rests on the payload's report alone"); that is reproduced first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from sandbox_attest.catalog import PROBES
from sandbox_attest.catalog.witness.kernel import KERNEL_BACKED_CALLS
from sandbox_attest.run.runner import kernel_unseen
from sandbox_attest.verdict import Assessment, Decision, Verdict, believe, decide
from tests.catalog.test_host import Records, stub_cell

PAYLOAD_PID = 11450
CHILD_PID = 11449
SURFACE = "proc_syscall_surface"
EXTENDED = "proc_syscall_surface_extended"
# The payload's arguments as the witness prints them (64-bit, -1 as 2**64 - 1).
MINUS_ONE = 2**64 - 1


def refused_before(syscall: str, error: str, ret: int, pid: int = PAYLOAD_PID) -> dict[str, Any]:
    """A call seccomp refused before it began: its errno at sys_exit, no arguments."""
    return {
        "syscall": syscall,
        "pid": pid,
        "comm": "python",
        "ret": ret,
        "error": error,
        "entered": False,
        "args": [0, 0, 0, 0],
    }


def entered(syscall: str, args: list[int], error: str, ret: int) -> dict[str, Any]:
    """A call of the payload's that began (its arguments seen) and the kernel's answer."""
    return {**refused_before(syscall, error, ret), "entered": True, "args": args}


def sigsys(*, seccomp: bool = True, queued: bool = False) -> dict[str, Any]:
    """The SIGSYS the kernel raised in the socketcall child (a `KG` line)."""
    return {
        "syscall": "signal",
        "pid": CHILD_PID,
        "comm": "python",
        "ret": 0,
        "error": "SIGSYS" if seccomp else "",
        "entered": False,
        "args": [0, 0, 0, 0],
        "signal": {
            "sig": 31,
            "code": 1,
            "target": CHILD_PID,
            "group": False,
            "result": 0,
            "queued_by_itself": queued,
            "seccomp": seccomp,
        },
    }


def att(what: str, outcome: str, errno: str | None = None, **more: Any) -> dict[str, Any]:
    """One attempt of the payload's report."""
    return {"what": what, "role": "escape", "outcome": outcome, "errno": errno, **more}


SURFACE_ATTEMPTS = [
    att("io_uring_setup", "refused", "EPERM"),
    att("keyctl", "refused", "EPERM"),
    att("bpf", "refused", "EPERM"),
    att("ioctl-tiocsti", "refused", "EPERM"),
    att("socket-vsock", "refused", "EAFNOSUPPORT"),
    # sandlock's supervisor hands back a socketpair: not judged (descriptor_identity).
    att("socket-netlink", "succeeded", None, domain=1, is_socket=True, type=5, protocol=0),
    att("socket-packet", "refused", "EAFNOSUPPORT"),
]
SURFACE_EVENTS = [
    refused_before("io_uring_setup", "EPERM", -1),
    refused_before("keyctl", "EPERM", -1),
    refused_before("bpf", "EPERM", -1),
    refused_before("ioctl", "EPERM", -1),
    refused_before("socket", "EAFNOSUPPORT", -97),
    refused_before("socket", "EAFNOSUPPORT", -97),
    # Python's own: a TCGETS on stdin, and the supervisor's socketpair ends' socket calls.
    entered("ioctl", [0, 0x5401, 0, 0], "ENOTTY", -25),
    entered("socket", [1, 0x80001, 0, 0], "", 3),
]
EXTENDED_ATTEMPTS = [
    att("add_key", "refused", "EPERM"),
    att("request_key", "refused", "EPERM"),
    att("userfaultfd", "refused", "EPERM"),
    att("perf_event_open", "refused", "EPERM"),
    att("ioctl-tioclinux", "refused", "EPERM"),
    att("socketcall-i386", "refused", "SIGSYS"),
    {**att("memfd-execveat", "succeeded"), "role": "observation"},
]
EXTENDED_EVENTS = [
    refused_before("add_key", "EPERM", -1),
    refused_before("request_key", "EPERM", -1),
    refused_before("userfaultfd", "EPERM", -1),
    refused_before("perf_event_open", "EPERM", -1),
    refused_before("ioctl", "EPERM", -1),
    sigsys(),
    entered("memfd_create", [0, 1, 0, 0], "", 3),
]


# srt's wrapper shell: a judged member of the cell with no seccomp filter (/tmp/ks2-srt-r1).
SRT_SHELL = {"pid": 22991, "comm": "bash", "status": {"Seccomp": "0"}, "shared_with_harness": []}


def cell(
    probe: str,
    attempts: list[dict[str, Any]],
    kernel: list[dict[str, Any]] | None,
    others: tuple[dict[str, Any], ...] = (),
) -> tuple[Decision, Assessment]:
    """The decision on a command wrapper (sandlock's spec) and the assessment."""
    spec = PROBES[probe]
    tmp = Path("/nonexistent-ks2")
    host_view: dict[str, Any] = {
        "seen": True,
        "pid": PAYLOAD_PID,
        "shared_with_harness": ["mnt", "net", "pid"],
        "status": {"Seccomp": "2", "Seccomp_filters": "1", "NoNewPrivs": "1"},
        "kernel": {"status": "attached", "recorded": True, "dropped": 0, "events": kernel},
        "others": list(others),
    }
    if kernel is None:
        host_view["kernel"] = {"status": "unavailable", "why": "not root"}
    ctx = stub_cell(spec.id, tmp, host_view)
    escapes = [a for a in attempts if a["role"] == "escape"]
    reached = [{**a, "outcome": "succeeded", "errno": "EFAULT"} for a in escapes]
    baseline = {"attempts": reached, "facts": {"seccomp": "0"}}
    control = {"ok": True, "nonce": "hcontrol", "checks": [], "baseline": baseline}
    control_attempt = {"what": "getpid", "role": "control", "outcome": "succeeded"}
    report = {
        "probe": spec.id,
        "nonce": ctx.nonce,
        "attempts": [control_attempt, *attempts],
        "facts": {"seccomp": "2"},
    }
    assessment = spec.assess(ctx, report, Records(), control)
    if not assessment.corroborated_by:
        assessment.corroborated_by = spec.corroboration(ctx, report)
    return believe(decide("denied", assessment), assessment, crossed_wrapper=True), assessment


def replaced(
    events: list[dict[str, Any]], syscall: str, new: dict[str, Any]
) -> list[dict[str, Any]]:
    """`events` with the first event of `syscall` replaced by `new`."""
    at = next(i for i, e in enumerate(events) if e["syscall"] == syscall)
    return [*events[:at], new, *events[at + 1 :]]


class TestSurfaceByTheKernel:
    """proc_syscall_surface on a filter sandbox: the kernel's errno behind each refusal."""

    def test_without_the_kernel_the_refusals_rest_on_the_report(self) -> None:
        """The artifact (issue 27): nothing on the host reads a seccomp refusal: INCONCLUSIVE."""
        decision, _ = cell(SURFACE, SURFACE_ATTEMPTS, None)
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert decision.reason.startswith("PASS rests on the payload's report alone")

    def test_the_kernels_errno_for_each_call_makes_it_a_pass(self) -> None:
        """Each refused call has its own refusal with the reported errno: PASS, said so."""
        decision, assessment = cell(SURFACE, SURFACE_ATTEMPTS, SURFACE_EVENTS)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert assessment.corroborated_by == [KERNEL_BACKED_CALLS]
        assert "keyctl: the kernel refused keyctl before it began -> EPERM" in decision.reason
        assert "socket-vsock: the kernel refused socket before it began -> EAFNOSUPPORT" in (
            decision.reason
        )
        assert not kernel_unseen(assessment)

    def test_a_refusal_the_kernel_never_saw_does_not_match(self) -> None:
        """No bpf event at all where the witness recorded the cell: the runner's ERROR."""
        events = [e for e in SURFACE_EVENTS if e["syscall"] != "bpf"]
        _, assessment = cell(SURFACE, SURFACE_ATTEMPTS, events)
        assert [u.split(":")[0] for u in kernel_unseen(assessment)] == ["bpf"]

    def test_a_call_the_kernel_let_reach_its_handler_is_a_fail(self) -> None:
        """The report says keyctl EPERM; the kernel ran keyctl(0x7FFF) -> EOPNOTSUPP: FAIL."""
        reached = entered("keyctl", [0x7FFF, 0, 0, 0], "EOPNOTSUPP", -95)
        decision, assessment = cell(
            SURFACE, SURFACE_ATTEMPTS, replaced(SURFACE_EVENTS, "keyctl", reached)
        )
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "the kernel let the call reach its handler: keyctl:" in decision.reason
        assert "the payload reached keyctl" in decision.reason
        assert not kernel_unseen(assessment)

    def test_a_socket_the_kernel_made_is_a_fail(self) -> None:
        """The report says vsock EAFNOSUPPORT; the kernel gave socket(AF_VSOCK) fd 5: FAIL."""
        made = entered("socket", [40, 0x80001, 0, 0], "", 5)
        decision, _ = cell(SURFACE, SURFACE_ATTEMPTS, [made, *SURFACE_EVENTS[1:]])
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "socket-vsock: the kernel saw socket() -> 5" in decision.reason

    def test_another_calls_success_is_no_escape(self) -> None:
        """Python's own TCGETS and AF_UNIX sockets answer no attempt of the probe."""
        decision, _ = cell(SURFACE, SURFACE_ATTEMPTS, SURFACE_EVENTS)
        assert "TCGETS" not in decision.reason
        assert decision.verdict is Verdict.PASS


class TestSurfaceOnSrt:
    """srt: its filter refuses io_uring_setup and vsock, not keyctl, bpf, TIOCSTI, netlink."""

    ATTEMPTS: ClassVar[list[dict[str, Any]]] = [
        att("io_uring_setup", "refused", "EPERM"),
        att("keyctl", "succeeded", "ENOTSUP"),
        att("bpf", "succeeded", "EINVAL"),
        att("ioctl-tiocsti", "succeeded", "EBADF"),
        att("socket-vsock", "refused", "EPERM"),
        att("socket-netlink", "succeeded", None, domain=16, is_socket=True, type=3, protocol=0),
        att("socket-packet", "refused", "EPERM"),
    ]
    EVENTS: ClassVar[list[dict[str, Any]]] = [
        refused_before("io_uring_setup", "EPERM", -1),
        entered("keyctl", [0x7FFF, 0, 0, 0], "ENOTSUP", -95),
        entered("bpf", [0x7FFF, 0, 0, 0], "EINVAL", -22),
        entered("ioctl", [MINUS_ONE, 0x5412, 0, 0], "EBADF", -9),
        refused_before("socket", "EPERM", -1),
        entered("socket", [16, 0x80003, 0, 0], "", 4),
    ]

    def test_a_refusal_the_kernel_backs_is_not_called_forged(self) -> None:
        """The wrapper's unfiltered shell does not make the payload's real refusal a forgery.

        The host reads Seccomp 0 on srt's bash; the kernel saw seccomp refuse the payload's
        io_uring_setup. The FAIL stands on keyctl, bpf, TIOCSTI and netlink, not on that.
        """
        decision, _ = cell(SURFACE, self.ATTEMPTS, self.EVENTS, (SRT_SHELL,))
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "nothing could have refused them" not in decision.reason
        assert "the payload reached keyctl, bpf, ioctl-tiocsti, socket-netlink" in decision.reason

    def test_without_the_kernel_the_shell_still_rules_it_out(self) -> None:
        """Where no witness ran, today's reading stands (the host's Seccomp 0)."""
        decision, _ = cell(SURFACE, self.ATTEMPTS, None, (SRT_SHELL,))
        assert "nothing could have refused them" in decision.reason

    def test_the_reached_calls_are_the_kernels_reading(self) -> None:
        """Each reached call seen by the kernel in the payload: the host saw the escape."""
        decision, assessment = cell(SURFACE, self.ATTEMPTS, self.EVENTS)
        assert decision.verdict is Verdict.FAIL
        assert not assessment.reported_only
        assert "keyctl: the kernel saw keyctl() -> ENOTSUP" in decision.reason
        assert "socket-netlink: the kernel saw socket() -> 4" in decision.reason
        assert "no host witness exists" not in decision.reason

    def test_a_reached_call_the_kernel_did_not_see_stays_the_payloads_word(self) -> None:
        """A keyctl reported reached with no keyctl event: believed against the sandbox, said so."""
        events = [e for e in self.EVENTS if e["syscall"] != "keyctl"]
        decision, assessment = cell(SURFACE, self.ATTEMPTS, events)
        assert decision.verdict is Verdict.FAIL
        assert assessment.reported_only
        assert "no host witness exists" in decision.reason


class TestExtendedByTheKernel:
    """proc_syscall_surface_extended: the same, and the i386 socketcall's seccomp kill."""

    def test_without_the_kernel_the_refusals_rest_on_the_report(self) -> None:
        """The artifact: INCONCLUSIVE, the SIGSYS of the child seen by the payload alone."""
        decision, _ = cell(EXTENDED, EXTENDED_ATTEMPTS, None)
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert decision.reason.startswith("PASS rests on the payload's report alone")

    def test_the_kernels_answers_and_its_sigsys_make_it_a_pass(self) -> None:
        """EPERM for each call and the seccomp SIGSYS for socketcall: PASS, said so."""
        decision, assessment = cell(EXTENDED, EXTENDED_ATTEMPTS, EXTENDED_EVENTS)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert assessment.corroborated_by == [KERNEL_BACKED_CALLS]
        assert f"socketcall-i386: the kernel killed pid {CHILD_PID} by seccomp, SIGSYS" in (
            decision.reason
        )

    def test_without_the_sigsys_the_kill_does_not_match(self) -> None:
        """A SIGSYS reported where the witness saw none: the report does not match (ERROR)."""
        events = [e for e in EXTENDED_EVENTS if e["syscall"] != "signal"]
        _, assessment = cell(EXTENDED, EXTENDED_ATTEMPTS, events)
        assert [u.split(":")[0] for u in kernel_unseen(assessment)] == ["socketcall-i386"]

    def test_a_sigsys_the_thread_queued_itself_answers_nothing(self) -> None:
        """rt_tgsigqueueinfo(self, SIGSYS, SYS_SECCOMP) is no seccomp kill: ERROR, not PASS."""
        events = replaced(EXTENDED_EVENTS, "signal", sigsys(seccomp=False, queued=True))
        decision, assessment = cell(EXTENDED, EXTENDED_ATTEMPTS, events)
        assert decision.verdict is not Verdict.PASS
        assert [u.split(":")[0] for u in kernel_unseen(assessment)] == ["socketcall-i386"]

    def test_a_socketcall_refused_by_errno_is_not_the_witnesss_to_judge(self) -> None:
        """A 32-bit call answered EPERM leaves no event: INCONCLUSIVE, never an ERROR.

        The witness leaves 32-bit calls out, so it has no record to hold the report against.
        """
        attempts = [
            *EXTENDED_ATTEMPTS[:5],
            att("socketcall-i386", "refused", "EPERM"),
            EXTENDED_ATTEMPTS[6],
        ]
        events = [e for e in EXTENDED_EVENTS if e["syscall"] != "signal"]
        decision, assessment = cell(EXTENDED, attempts, events)
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason
        assert not kernel_unseen(assessment)

    def test_reached_calls_the_kernel_saw_are_its_reading(self) -> None:
        """nsjail/codex/srt: each call the kernel let run in the payload backs the FAIL."""
        attempts = [
            att("add_key", "succeeded", "EFAULT"),
            att("request_key", "succeeded", "EFAULT"),
            att("userfaultfd", "succeeded", "EINVAL"),
            att("perf_event_open", "succeeded", "EFAULT"),
            att("ioctl-tioclinux", "succeeded", "EBADF"),
            att("socketcall-i386", "refused", "SIGSYS"),
        ]
        events = [
            entered("add_key", [0, 0, 0, 0], "EFAULT", -14),
            entered("request_key", [0, 0, 0, 0], "EFAULT", -14),
            entered("userfaultfd", [3, 0, 0, 0], "EINVAL", -22),
            entered("perf_event_open", [0, 0, MINUS_ONE, MINUS_ONE], "EFAULT", -14),
            entered("ioctl", [MINUS_ONE, 0x541C, 0, 0], "EBADF", -9),
            sigsys(),
        ]
        decision, assessment = cell(EXTENDED, attempts, events)
        assert decision.verdict is Verdict.FAIL
        assert not assessment.reported_only
        assert "perf_event_open: the kernel saw perf_event_open() -> EFAULT" in decision.reason
        assert "no host witness exists" not in decision.reason

    def test_an_add_key_the_kernel_ran_is_a_fail(self) -> None:
        """add_key(NULL, ...) -> EFAULT in the payload: its handler ran, the report hid it."""
        ran = entered("add_key", [0, 0, 0, 0], "EFAULT", -14)
        decision, _ = cell(EXTENDED, EXTENDED_ATTEMPTS, replaced(EXTENDED_EVENTS, "add_key", ran))
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "add_key: the kernel saw add_key() -> EFAULT" in decision.reason
