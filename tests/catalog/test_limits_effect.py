"""resource_limits judged by the effect the host counted, on recorded readings.

Issue 27: a forks limit the host counted holding (19 forked children against a declared 20)
was FAIL because the host read no RLIMIT_NPROC or pids.max at or below 20 on the payload: a
sandbox that caps processes by its own means (its own kernel, a supervisor) was failed for
the mechanism, not the effect. The host's count is its own witness (files in the workspace
it lists itself), so an effect it counted holding is a PASS corroborated by that count; a
limit it counted broken, and a limit only the payload's word says held while the host reads
it unset, stay FAIL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.proc import BOUNDS
from sandbox_attest.verdict import Verdict, believe, decide
from tests.catalog.test_proc import OK_CONTROL, Records, limits_report, make_ctx

MIB = 1024 * 1024
FORKS_20 = DeclaredClaims(
    network="proxy", filesystem="workspace", ipc="isolated", limits=(("forks", 20),)
)
FORKS_20_NOFILE_64 = DeclaredClaims(
    network="proxy",
    filesystem="workspace",
    ipc="isolated",
    limits=(("forks", 20), ("nofile", 64)),
)
FSIZE_8 = DeclaredClaims(
    network="proxy", filesystem="workspace", ipc="isolated", limits=(("fsize_mib", 8),)
)
# The host's rendezvous reading of a payload process on which no rlimit or cgroup cap
# applies any declared limit (recorded shape of run/hostview.py's read_process).
UNCAPPED: dict[str, Any] = {
    "seen": True,
    "pid": 4242,
    "limits": {
        "Max processes": {"soft": None, "hard": None},
        "Max address space": {"soft": None, "hard": None},
        "Max file size": {"soft": None, "hard": None},
        "Max open files": {"soft": 1024, "hard": 1024},
    },
    "cgroup_limits": {"cgroup": "/user.slice", "pids.max": None, "memory.max": None},
}


def report(**reached: int) -> dict[str, Any]:
    """Loops that reached `reached` (the rest their bound), stopped by their limit's errno."""
    return limits_report(reached)


def cell(tmp_path: Path, claims: DeclaredClaims, forks: int, fsize_mib: int) -> CellContext:
    """A cell whose workspace holds what the loops left, read with no cap on the payload."""
    ctx = make_ctx(tmp_path, "resource_limits", claims)
    spec = PROBES[ctx.probe]
    fork_dir = ctx.workspace / spec.fork_dir(ctx)  # type: ignore[attr-defined]
    fork_dir.mkdir()
    for i in range(forks):
        (fork_dir / f"fork-{i}").write_text("1")
    with (ctx.workspace / spec.fsize_file(ctx)).open("wb") as fh:  # type: ignore[attr-defined]
        fh.truncate(fsize_mib * MIB)
    ctx.host_view.update(UNCAPPED)
    return ctx


def judged(ctx: CellContext, payload: dict[str, Any]) -> tuple[Any, Any]:
    """The decision as a wrapper's cell gets it (the report crossed the wrapper), and why."""
    spec = PROBES[ctx.probe]
    assessment = spec.assess(ctx, payload, Records(), OK_CONTROL)
    decision = decide(spec.expectation(ctx.claims), assessment)
    return believe(decision, assessment, crossed_wrapper=True), assessment


class TestCountedEffect:
    def test_forks_counted_holding_pass(self, tmp_path: Path) -> None:
        """19 forked children counted by the host against a declared 20, no cap read: PASS."""
        ctx = cell(tmp_path, FORKS_20, forks=19, fsize_mib=BOUNDS["fsize_mib"])
        decision, assessment = judged(ctx, report(forks=19))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert any("forks=19 against the declared 20" in c for c in assessment.corroborated_by), (
            assessment.corroborated_by
        )

    def test_the_mechanism_is_said_missing_not_failed(self, tmp_path: Path) -> None:
        """The reasons say the host read no cap for the counted limit, and that the count held."""
        ctx = cell(tmp_path, FORKS_20, forks=19, fsize_mib=BOUNDS["fsize_mib"])
        decision, _ = judged(ctx, report(forks=19))
        assert "forks=20 (Max processes unlimited, pids.max max)" in decision.reason
        assert "held by the host's count" in decision.reason

    def test_fsize_counted_holding_pass(self, tmp_path: Path) -> None:
        """An 8 MiB file the host measured against a declared 8 MiB, no RLIMIT_FSIZE: PASS."""
        ctx = cell(tmp_path, FSIZE_8, forks=BOUNDS["forks"], fsize_mib=8)
        decision, assessment = judged(ctx, report(fsize_mib=8))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert any("fsize_mib=8 against the declared 8" in c for c in assessment.corroborated_by)


class TestLimitsThatDidNotHold:
    def test_forks_counted_past_the_limit_fail(self, tmp_path: Path) -> None:
        """25 children counted against a declared 20: FAIL, whatever the payload says."""
        ctx = cell(tmp_path, FORKS_20, forks=25, fsize_mib=BOUNDS["fsize_mib"])
        decision, _ = judged(ctx, report(forks=19))
        assert decision.verdict is Verdict.FAIL, decision.reason

    def test_an_uncounted_limit_read_unset_still_fails(self, tmp_path: Path) -> None:
        """A nofile limit held in the payload's word only, its rlimit read at 1024: FAIL."""
        ctx = cell(tmp_path, FORKS_20_NOFILE_64, forks=19, fsize_mib=BOUNDS["fsize_mib"])
        decision, _ = judged(ctx, report(forks=19, nofile=60))
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "nofile=64 (Max open files 1024)" in decision.reason
        not_applied = decision.reason.split("is not applied")[1].split("apply them")[0]
        assert "forks=20" not in not_applied

    def test_counted_but_stopped_by_another_wall_keeps_the_reading(self, tmp_path: Path) -> None:
        """19 children but the loop stopped on ENOMEM: the limit untested, no cap read: FAIL."""
        ctx = cell(tmp_path, FORKS_20, forks=19, fsize_mib=BOUNDS["fsize_mib"])
        payload = report(forks=19)
        payload["attempts"][1]["errno"] = "ENOMEM"
        decision, _ = judged(ctx, payload)
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "the resource limits claim (forks=20) is not applied" in decision.reason

    def test_a_payload_count_unlike_the_hosts_keeps_the_reading(self, tmp_path: Path) -> None:
        """The payload says 18 forks, the host counts 19: no exemption from the reading."""
        ctx = cell(tmp_path, FORKS_20, forks=19, fsize_mib=BOUNDS["fsize_mib"])
        decision, _ = judged(ctx, report(forks=18))
        assert decision.verdict is Verdict.FAIL, decision.reason
