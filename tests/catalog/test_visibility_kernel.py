"""proc_visibility in the harness's pid namespace, judged with the kernel witness's answers.

The events are the shape a live sandlock cell recorded (/tmp/sl2-r1, 2026-12-02): the payload
(python) calling kill(anchor, 0) and Landlock's signal scope answering EPERM, and its openat of
/proc/<anchor>/environ refused before the syscall began (sandlock's seccomp supervisor answers
it: EACCES, no path seen). Real anchors (prepare), hand-made host views.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.proc.visibility import KERNEL_BACKED
from sandbox_attest.verdict import Verdict, believe, decide
from tests.catalog.test_proc import OK_CONTROL, Records, att, make_ctx

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SPEC = PROBES["proc_visibility"]
PAYLOAD_PID = 10979


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[CellContext]:
    """A cell with a real anchor that cleanup removes."""
    made = make_ctx(tmp_path, SPEC.id)
    SPEC.prepare(made)
    yield made
    SPEC.cleanup(made)


def anchor_pid(ctx: CellContext) -> int:
    """The cell's anchor pid, as the task hands it to the payload."""
    anchor = SPEC._anchor(ctx)  # type: ignore[attr-defined]
    return int(anchor.pid)


def kill_event(pid: int, ret: int) -> dict[str, Any]:
    """kill(pid, 0) by the payload, entered, with the kernel's return."""
    return {
        "syscall": "kill",
        "pid": PAYLOAD_PID,
        "comm": "python",
        "ret": ret,
        "error": {-1: "EPERM", -3: "ESRCH"}.get(ret, ""),
        "entered": True,
        "args": [pid, 0, 0, 0],
    }


def environ_refused_before() -> dict[str, Any]:
    """The payload's openat refused by seccomp before it began (EACCES, no path)."""
    return {
        "syscall": "openat",
        "pid": PAYLOAD_PID,
        "comm": "python",
        "ret": -13,
        "error": "EACCES",
        "entered": False,
        "args": [0, 0, 0, 0],
    }


def shared_view(events: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The payload seen in the harness's pid namespace; the kernel's events (None: no witness)."""
    view: dict[str, Any] = {
        "seen": True,
        "pid": PAYLOAD_PID,
        "comm": "python",
        "shared_with_harness": ["ipc", "mnt", "net", "pid", "user", "uts"],
        "status": {"Uid": "994 994 994 994", "CapEff": "0", "NoNewPrivs": "1"},
    }
    if events is not None:
        view["kernel"] = {"status": "attached", "recorded": True, "dropped": 0, "events": events}
    return view


def refused_report(kill_errno: str = "EPERM") -> dict[str, Any]:
    """The report sandlock gives: not listed, environ EACCES, kill(anchor, 0) refused, no ptrace."""
    return {
        "attempts": [
            att("scan-own", "succeeded", "control"),
            att("kill-0-self", "succeeded", "control"),
            att("scan-proc", "refused", errno="ENOENT"),
            att("read-environ", "refused", errno="EACCES"),
            att("kill-0", "refused", errno=kill_errno),
            att("ptrace-seize", "refused", errno="ENOENT"),
        ],
        "facts": {"found_pids": []},
    }


def judged(ctx: CellContext, report: dict[str, Any]) -> tuple[Verdict, str, list[str]]:
    """The verdict a command wrapper's cell gets (`believe`), its reason, its corroboration."""
    assessment = SPEC.assess(ctx, report, Records(), OK_CONTROL)
    if not assessment.corroborated_by:
        assessment.corroborated_by = SPEC.corroboration(ctx, report)
    decision = believe(
        decide(SPEC.expectation(ctx.claims), assessment), assessment, crossed_wrapper=True
    )
    return decision.verdict, decision.reason, assessment.corroborated_by


class TestKernelWitness:
    def test_refusals_the_kernel_returned_pass(self, ctx: CellContext) -> None:
        """EPERM for kill and EACCES for the environ open, both the kernel's: PASS, corroborated."""
        events = [kill_event(anchor_pid(ctx), -1), environ_refused_before()]
        ctx.host_view.update(shared_view(events))
        verdict, reason, backed = judged(ctx, refused_report())
        assert verdict is Verdict.PASS, reason
        assert f"kill({anchor_pid(ctx)}, 0): the kernel saw kill() -> EPERM" in reason
        assert "environ: the kernel refused openat before it began -> EACCES" in reason
        assert backed == [KERNEL_BACKED]

    def test_without_the_witness_the_report_alone_is_inconclusive(self, ctx: CellContext) -> None:
        """The same report, no kernel reading: the refusal is the report's word alone."""
        ctx.host_view.update(shared_view(None))
        verdict, reason, backed = judged(ctx, refused_report())
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert reason.startswith("PASS rests on the payload's report alone")
        assert backed == []

    def test_a_signal_the_kernel_delivered_fails(self, ctx: CellContext) -> None:
        """The report says EPERM; the kernel let kill(anchor, 0) through: FAIL naming it."""
        ctx.host_view.update(
            shared_view([kill_event(anchor_pid(ctx), 0), environ_refused_before()])
        )
        verdict, reason, _ = judged(ctx, refused_report())
        assert verdict is Verdict.FAIL, reason
        assert f"kill({anchor_pid(ctx)}, 0): the kernel saw kill() -> 0" in reason

    def test_a_no_such_process_the_kernel_said_is_a_refusal(self, ctx: CellContext) -> None:
        """ESRCH is a lie only where the kernel did not say it: here it did (a filter's)."""
        ctx.host_view.update(
            shared_view([kill_event(anchor_pid(ctx), -3), environ_refused_before()])
        )
        verdict, reason, _ = judged(ctx, refused_report("ESRCH"))
        assert verdict is Verdict.PASS, reason

    def test_a_forged_no_such_process_still_fails(self, ctx: CellContext) -> None:
        """ESRCH the kernel never answered (no kill at all): the report is not believed."""
        ctx.host_view.update(shared_view([environ_refused_before()]))
        verdict, reason, _ = judged(ctx, refused_report("ESRCH"))
        assert verdict is Verdict.FAIL, reason
        assert "shared_with_harness: ['pid']" in reason
