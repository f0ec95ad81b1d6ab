"""What a sandbox's own kernel leaves out of /proc is named, and never read as an escape.

Issue 27: a sandbox with a kernel of its own (a user-space kernel, a microVM) may give the
payload a /proc/self/status without a NoNewPrivs line, or no /proc/self/ns/mnt. Then
proc_privileges and proc_namespace_escape cannot judge: their cells are INCONCLUSIVE (never
ERROR, never FAIL), and the reason names what the sandbox did not provide. Reports
here are shaped as the payloads write them in that case (probes/proc_privileges.py stops at
`read-status`; probes/proc_namespace_escape.py records None for a namespace it cannot read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.verdict import Decision, Verdict, decide
from tests.catalog.test_proc import OK_CONTROL, att, make_ctx


def judged(ctx: CellContext, report: dict[str, Any]) -> Decision:
    """The report is the probe's (the runner's first check), then assessed and decided."""
    spec = PROBES[ctx.probe]
    assert spec.attempt_table({}).mismatch(report["attempts"]) is None
    assessment = spec.assess(ctx, report, None, OK_CONTROL)  # type: ignore[arg-type]
    return decide(spec.expectation(ctx.claims), assessment)


class TestPrivilegesWithoutNoNewPrivs:
    @staticmethod
    def report(missing: str) -> dict[str, Any]:
        """The payload's report where its status lacks `missing` (it stops at read-status)."""
        return {
            "attempts": [att("read-status", "error", "control", detail=f"missing: {missing}")],
            "facts": {},
        }

    def test_missing_no_new_privs_is_inconclusive_naming_it(self, tmp_path: Path) -> None:
        """No NoNewPrivs line: INCONCLUSIVE, the reason names the missing line."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        decision = judged(ctx, self.report("NoNewPrivs"))
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert (
            "the sandbox gives the payload a /proc/self/status without NoNewPrivs (a kernel "
            "of its own may not provide them)" in decision.reason
        ), decision.reason

    def test_every_missing_field_is_named(self, tmp_path: Path) -> None:
        """Several missing lines are all named, in the payload's order."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        decision = judged(ctx, self.report("CapBnd,NoNewPrivs"))
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert "/proc/self/status without CapBnd, NoNewPrivs" in decision.reason

    def test_a_full_status_names_no_gap(self, tmp_path: Path) -> None:
        """Negative control: a status with every line read says nothing of a missing one."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        report = {
            "attempts": [
                att("read-status", "succeeded", "control", detail="all fields read"),
                att("effective-capabilities", "refused", errno="EPERM"),
                att("setuid-elevation", "refused", errno="EPERM"),
                att("writable-root-path", "refused"),
            ],
            "facts": {"status": {"CapEff": "0000000000000000", "NoNewPrivs": "1"}},
        }
        decision = judged(ctx, report)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "a kernel of its own" not in decision.reason


class TestNamespaceWithoutNsMnt:
    @staticmethod
    def report(**ns: str | None) -> dict[str, Any]:
        """The payload's report where its own namespace ids are `ns` (None: not readable)."""
        read = all(ns.get(k) for k in ("mnt", "net", "user"))
        return {
            "attempts": [
                att(
                    "read-own-ns",
                    "succeeded" if read else "error",
                    "control",
                    detail=f"mnt/net/user ids read: {read}",
                ),
                att("fork-child", "succeeded", "control"),
                att("setns-mnt", "refused", errno="ENOENT"),
                att("setns-net", "refused", errno="ENOENT"),
                att("inner:unshare-mnt", "succeeded"),
                att("inner:abort:mnt", "refused"),
                att("inner:unshare-userns", "succeeded"),
                att("inner:abort:userns", "refused"),
            ],
            "facts": {f"{kind}ns": value for kind, value in ns.items()},
        }

    def test_missing_ns_mnt_is_inconclusive_naming_it(self, tmp_path: Path) -> None:
        """No /proc/self/ns/mnt inside: INCONCLUSIVE, the reason names the missing file."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        report = self.report(mnt=None, net="net:[1]", user="user:[2]", pid="pid:[3]")
        decision = judged(ctx, report)
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert (
            "the sandbox gives the payload no /proc/self/ns/mnt (a kernel of its own may not "
            "provide them)" in decision.reason
        ), decision.reason

    def test_every_missing_namespace_file_is_named(self, tmp_path: Path) -> None:
        """Each of the three the control reads is named when missing (pid is not read)."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        decision = judged(ctx, self.report(mnt=None, net=None, user="user:[2]", pid=None))
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert "no /proc/self/ns/mnt, /proc/self/ns/net" in decision.reason
        assert "/proc/self/ns/pid" not in decision.reason

    def test_namespaces_read_name_no_gap(self, tmp_path: Path) -> None:
        """Negative control: every namespace read, the refusals PASS with no gap named."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        report = self.report(mnt="mnt:[0]", net="net:[1]", user="user:[2]", pid="pid:[3]")
        decision = judged(ctx, report)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "a kernel of its own" not in decision.reason
