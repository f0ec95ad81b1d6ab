"""net_host_canonical: a proxy that refuses `ALLOWED.TEST.` fails closed (issue 27).

The positive control is the plain allowlisted name. The equivalent spelling (upper case, a
trailing dot) names the same host: a proxy may admit it under the canonical name or refuse
it, and both keep the allowlist whole. Before, it was a second control, so a proxy that
refused it (the strict choice) made the cell INCONCLUSIVE. The report below is the shape the
payload wrote on such a proxy: every widening spelling 403, the canonical name 200 with the
nonce echoed, the equivalent spelling 403, under the harness's route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from sandbox_attest.catalog import PROBES
from sandbox_attest.catalog.net.confusion import EQUIVALENT, NetHostCanonical
from sandbox_attest.verdict import Verdict, decide
from tests.catalog.test_assess import OK_CONTROL, Records
from tests.catalog.test_proxy_lookups import attempt, ctx_for

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.catalog import CellContext

SPEC = cast("NetHostCanonical", PROBES["net_host_canonical"])


def recorded(ctx: CellContext, equivalent: str, status: int) -> tuple[dict[str, Any], Records]:
    """The payload's report and the proxy's decision log with the equivalent spelling so."""
    attempts, decisions = [], []
    for r in SPEC.requests(ctx):
        heads = len(r.heads)
        progress = {"sent": heads, "answered": heads, "heads": heads}
        if r.what == "connect-canonical":
            attempts.append(attempt(r.what, r.role, "succeeded", 200) | {"detail": "nonce echoed"})
        elif r.what == EQUIVALENT:
            detail = "nonce echoed" if equivalent == "succeeded" else "403 Forbidden"
            attempts.append(attempt(r.what, r.role, equivalent, status) | {"detail": detail})
        else:
            attempts.append(attempt(r.what, r.role, "refused", 403) | progress)
        for target in r.escape_targets or (r.heads[0].split()[1],):
            refused = r.role == "escape" or equivalent == "refused"
            decisions.append(
                {
                    "nonce": ctx.nonce,
                    "target": target,
                    "host": target.rsplit(":", 1)[0].rstrip(".").lower(),
                    "decision": "deny" if refused else "allow",
                    "status": 403 if refused else 200,
                }
            )
    return {"attempts": attempts, "facts": {}}, Records(proxy=decisions)


def judge(ctx: CellContext, equivalent: str, status: int) -> tuple[Verdict, str]:
    """Prepare, assess and decide one cell with this outcome for the equivalent spelling."""
    SPEC.prepare(ctx)
    try:
        report, witness = recorded(ctx, equivalent, status)
        assessment = SPEC.assess(ctx, report, witness, OK_CONTROL)
    finally:
        SPEC.cleanup(ctx)
    decision = decide(SPEC.expectation(ctx.claims), assessment)
    return decision.verdict, decision.reason


class TestEquivalentSpelling:
    def test_refused_is_fail_closed(self, tmp_path: Path) -> None:
        """A proxy refusing `ALLOWED.TEST.` (403) keeps the allowlist whole: PASS, saying so."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=False, lab=False)
        verdict, reason = judge(ctx, "refused", 403)
        assert verdict is Verdict.PASS, reason
        assert "refused the equivalent spelling ALLOWED.TEST. (403)" in reason
        assert "fails closed" in reason

    def test_admitted_as_canonical_still_passes(self, tmp_path: Path) -> None:
        """A proxy admitting it as the canonical name: PASS, as before."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=False, lab=False)
        verdict, reason = judge(ctx, "succeeded", 200)
        assert verdict is Verdict.PASS, reason
        assert "the equivalent spelling was admitted as allowed.test" in reason

    def test_the_plain_name_is_the_only_positive_control(self, tmp_path: Path) -> None:
        """Only `connect-canonical` is a control; the equivalent spelling is no escape either."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=False, lab=False)
        SPEC.prepare(ctx)
        try:
            built = {r.what: r for r in SPEC.requests(ctx)}
        finally:
            SPEC.cleanup(ctx)
        assert [w for w, r in built.items() if r.role == "control"] == ["connect-canonical"]
        assert built[EQUIVALENT].role not in ("control", "escape")
        assert built[EQUIVALENT].escape_targets == ()

    def test_a_refused_plain_name_is_still_inconclusive(self, tmp_path: Path) -> None:
        """The canonical name refused: the refusals below prove nothing, never PASS."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=False, lab=False)
        SPEC.prepare(ctx)
        try:
            report, witness = recorded(ctx, "refused", 403)
            for a in report["attempts"]:
                if a["what"] == "connect-canonical":
                    a.update(outcome="refused", status=403, detail="403 Forbidden")
            assessment = SPEC.assess(ctx, report, witness, OK_CONTROL)
        finally:
            SPEC.cleanup(ctx)
        verdict = decide(SPEC.expectation(ctx.claims), assessment).verdict
        assert verdict is Verdict.INCONCLUSIVE
