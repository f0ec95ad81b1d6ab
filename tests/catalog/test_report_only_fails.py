"""A FAIL says who saw the escape: the host's witness, or only the payload's own report.

Issue 27: a FAIL resting on the payload's report alone (a report against the sandbox, believed
because no host witness exists or none saw it) said "escape observed by the host". These cells
are hand-made against the real assessors: the payload's word alone, and the host's own reading,
for proc_privileges and proc_namespace_escape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.verdict import Decision, Verdict, decide
from tests.catalog.test_proc import OK_CONTROL, att, make_ctx

REPORTED = "escape reported by the payload (not seen by the host): "
OBSERVED = "escape observed by the host: "


def decision_of(ctx: CellContext, report: dict[str, Any]) -> Decision:
    """Assess one hand-made cell with a held host control and decide it."""
    spec = PROBES[ctx.probe]
    assessment = spec.assess(ctx, report, None, OK_CONTROL)  # type: ignore[arg-type]
    return decide(spec.expectation(ctx.claims), assessment)


def privileges_report(caps: str) -> dict[str, Any]:
    """A proc_privileges report whose effective-capabilities attempt ended `caps`."""
    return {
        "attempts": [
            att("read-status", "succeeded", "control"),
            att("effective-capabilities", caps),
            att("setuid-elevation", "refused", errno="EPERM"),
            att("writable-root-path", "refused", errno="EACCES"),
        ],
        "facts": {"status": {"CapEff": "0000000000000000", "NoNewPrivs": "1"}},
    }


def host_saw(ctx: CellContext, **status: str) -> None:
    """The host's rendezvous reading of one payload process with `status`."""
    ctx.host_view.update(
        {"seen": True, "pid": 4242, "comm": "python3", "status": {"NoNewPrivs": "1", **status}}
    )


class TestPrivileges:
    def test_capabilities_only_the_payload_reports_are_not_called_host_seen(
        self, tmp_path: Path
    ) -> None:
        """Capabilities the payload reports and the host never read: FAIL on its word, so said."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        decision = decision_of(ctx, privileges_report("succeeded"))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(REPORTED), decision.reason
        assert "observed by the host" not in decision.reason

    def test_capabilities_the_host_reads_are_host_seen(self, tmp_path: Path) -> None:
        """Effective capabilities the host reads in the payload's status: observed by the host."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        host_saw(ctx, CapEff="000001ffffffffff")
        decision = decision_of(ctx, privileges_report("refused"))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(
            OBSERVED + "the host sees effective capabilities on the payload: host pid 4242"
        ), decision.reason

    def test_a_host_reading_beside_the_report_still_makes_it_host_seen(
        self, tmp_path: Path
    ) -> None:
        """The payload reports capabilities the host reads too: the host's reading decides."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        host_saw(ctx, CapEff="000001ffffffffff")
        decision = decision_of(ctx, privileges_report("succeeded"))
        assert decision.reason.startswith(OBSERVED), decision.reason

    def test_refusal_is_still_pass(self, tmp_path: Path) -> None:
        """Negative control: nothing reported, nothing read: PASS, no escape wording at all."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        host_saw(ctx, CapEff="0000000000000000")
        decision = decision_of(ctx, privileges_report("refused"))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "escape" not in decision.reason


class TestNamespace:
    @staticmethod
    def report(outcome: str) -> dict[str, Any]:
        """The setns and remount attempts ending `outcome`."""
        return {
            "attempts": [
                att("read-own-ns", "succeeded", "control"),
                att("setns-mnt", outcome, errno=None if outcome == "succeeded" else "ENOENT"),
                att("remount-rw:userns", "refused", errno="EPERM"),
            ],
            "facts": {},
        }

    def test_setns_only_the_payload_reports_is_not_called_host_seen(self, tmp_path: Path) -> None:
        """A joined namespace believed on the payload's word alone: FAIL, said to be its word."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        decision = decision_of(ctx, self.report("succeeded"))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(REPORTED), decision.reason
        assert "believed: a report against the sandbox" in decision.reason

    def test_canary_file_on_the_host_is_host_seen(self, tmp_path: Path) -> None:
        """The setns-mnt canary the host finds in its own dir: observed by the host."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        canary = PROBES["proc_namespace_escape"].canary_dir(ctx)  # type: ignore[attr-defined]
        canary.mkdir()
        (canary / f"{ctx.nonce}.setns-mnt").write_text("x")
        decision = decision_of(ctx, self.report("succeeded"))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(OBSERVED + "host saw: setns-mnt file True"), (
            decision.reason
        )
