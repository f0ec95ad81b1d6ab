"""A proxy's lookups, witnessed (issue 26 item 3): the decision tables, hand-fed.

Under a wrapper's own proxy (egress "own", no harness route) the DNS fixture's log is read for
the names the cell used, by one reading (sandbox_attest/catalog/net/lookups.py) shared by
net_denied_host, net_host_canonical and net_proxy_dns_exfil. These tests feed the assessors
hand-made reports and DNS entries; tests/integration/test_identity_proxy.py runs the real
holes.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.net import lookups
from sandbox_attest.catalog.net.allowlist import denied_request_name
from sandbox_attest.catalog.net.confusion import NetHostCanonical
from sandbox_attest.catalog.records import dns_hits, in_lab_world
from sandbox_attest.run.runner import inside_route
from sandbox_attest.verdict import Verdict, decide
from sandbox_attest.world.info import PROBE_NAME_SUFFIX
from tests.catalog.test_assess import CONFINED, OK_CONTROL, FakeWorld, Records

if TYPE_CHECKING:
    from pathlib import Path

LAB = {"world": {"kind": "lab"}}


@dataclasses.dataclass
class KnobWorld(FakeWorld):
    """A fake world with a DNS fixture's answer knob: what a probe planted, by name."""

    planted: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def dns(self) -> KnobWorld:
        """The knob is the world itself here."""
        return self

    def set_answers(self, name: str, addresses: list[str]) -> None:
        """Record the planted answer."""
        self.planted[name] = addresses


def ctx_for(probe: str, base: Path, *, own: bool, lab: bool) -> CellContext:
    """A cell under a wrapper's own proxy (`own`: no harness route), in the lab or not."""
    world = KnobWorld()
    if lab:
        world.info = dataclasses.replace(world.info, extra=dict(LAB))
    (base / "cell" / "workspace").mkdir(parents=True)
    return CellContext(
        probe=probe,
        backend="test",
        nonce="n" + secrets.token_hex(8),
        world=world,
        workspace=base / "cell" / "workspace",
        cell_dir=base / "cell",
        claims=CONFINED,
        route=None if own else inside_route(),
    )


def attempt(what: str, role: str, outcome: str, status: int | None) -> dict[str, Any]:
    """One payload attempt."""
    return {"what": what, "role": role, "outcome": outcome, "errno": None, "status": status}


def judge(ctx: CellContext, report: dict[str, Any], witness: Records) -> tuple[Verdict, str]:
    """Prepare, assess and decide one cell."""
    spec = PROBES[ctx.probe]
    spec.prepare(ctx)
    assessment = spec.assess(ctx, report, witness, OK_CONTROL)
    decision = decide(spec.expectation(ctx.claims), assessment)
    return decision.verdict, decision.reason


def denied_report() -> dict[str, Any]:
    """net_denied_host: both denied forms 403, the allowed control 200."""
    return {
        "attempts": [
            attempt("get-denied-absolute", "escape", "refused", 403),
            attempt("connect-denied", "escape", "refused", 403),
            attempt("get-allowed", "control", "succeeded", 200),
        ]
    }


def query(name: str) -> dict[str, Any]:
    """A DNS fixture log entry (names are logged lower case, no trailing dot)."""
    return {"name": name, "qtype": "A", "transport": "udp", "rcode": "NXDOMAIN"}


class TestSharedReading:
    def test_dns_hits_fold_case(self) -> None:
        """A nonce in any case is the cell's; another nonce is not."""
        entries = [query("NABC.denied.test"), query("nother.denied.test")]
        assert dns_hits(entries, "nabc") == [entries[0]]

    def test_in_lab_world(self) -> None:
        """Only a world that says it is the lab is the lab."""
        assert in_lab_world(LAB)
        assert not in_lab_world({"world": {"kind": "loopback"}})
        assert not in_lab_world({})

    def test_allowlisted_names_are_not_lookups_outside(self, tmp_path: Path) -> None:
        """A lookup of an allowed or private-zone name is the allowlist's, not a leak."""
        ctx = ctx_for("net_denied_host", tmp_path, own=True, lab=True)
        n = ctx.nonce
        entries = [query(f"{n}-x.private.test"), query(f"{n}.denied.test")]
        assert lookups.lookups_outside(ctx, entries) == [entries[1]]
        assert lookups.allowlisted(ctx, "ALLOWED.test.")

    def test_never_plants_an_address_off_this_host(self, tmp_path: Path) -> None:
        """Only loopback or lab addresses are planted; any other (TEST-NET-3 here) is refused."""
        ctx = ctx_for("net_denied_host", tmp_path, own=True, lab=True)
        assert not lookups.plant_answer(ctx, "x.denied.test", "203.0.113.7")
        assert lookups.plant_answer(ctx, "x.denied.test", "198.18.0.7")
        assert ctx.world.planted == {"x.denied.test": ["198.18.0.7"]}  # type: ignore[attr-defined]

    @pytest.mark.parametrize(("own", "lab"), [(False, True), (False, False), (True, False)])
    def test_no_fixture_check_where_silence_decides_nothing(
        self, tmp_path: Path, own: bool, lab: bool
    ) -> None:
        """The fixture's hearing is checked only under an own proxy in the lab (live-tested)."""
        ctx = ctx_for("net_denied_host", tmp_path, own=own, lab=lab)
        assert lookups.own_proxy_witness_checks(ctx, "hcontrol") == []


class TestDeniedHostUnderOwnProxy:
    def test_nonce_name_is_planted_in_the_lab(self, tmp_path: Path) -> None:
        """In the lab the denied host is asked for under the nonce, answered by its origin."""
        ctx = ctx_for("net_denied_host", tmp_path, own=True, lab=True)
        name = denied_request_name(ctx)
        assert name == f"{ctx.nonce}.denied.test"
        assert ctx.world.planted == {name: ["127.0.0.1"]}  # type: ignore[attr-defined]

    @pytest.mark.parametrize(("own", "lab"), [(False, True), (False, False), (True, False)])
    def test_plain_name_elsewhere(self, tmp_path: Path, own: bool, lab: bool) -> None:
        """On a harness route, or outside the lab, the denied host's own name; nothing planted."""
        ctx = ctx_for("net_denied_host", tmp_path, own=own, lab=lab)
        assert denied_request_name(ctx) == "denied.test"
        assert ctx.world.planted == {}  # type: ignore[attr-defined]

    def test_lookup_of_the_denied_name_fails(self, tmp_path: Path) -> None:
        """403s for both forms, but the fixture logged the nonce name: FAIL naming it, the fix."""
        ctx = ctx_for("net_denied_host", tmp_path, own=True, lab=True)
        name = f"{ctx.nonce}.denied.test"
        verdict, reason = judge(ctx, denied_report(), Records(dns=[query(name)]))
        assert verdict is Verdict.FAIL, reason
        assert "DNS exfiltration through the proxy's resolver" in reason
        assert name in reason
        assert "fix: check the allowlist before resolving" in reason

    def test_silent_fixture_passes_in_the_lab(self, tmp_path: Path) -> None:
        """403s and no lookup carrying the nonce: PASS."""
        ctx = ctx_for("net_denied_host", tmp_path, own=True, lab=True)
        other = query("nsomeoneelse.denied.test")
        assert judge(ctx, denied_report(), Records(dns=[other]))[0] is Verdict.PASS

    def test_unwitnessed_outside_the_lab_is_inconclusive(self, tmp_path: Path) -> None:
        """Outside the lab the proxy's lookups cannot be seen: never PASS, say why."""
        ctx = ctx_for("net_denied_host", tmp_path, own=True, lab=False)
        verdict, reason = judge(ctx, denied_report(), Records())
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert "the proxy's lookups were not witnessed" in reason
        assert "run with --world lab" in reason

    def test_harness_route_unchanged(self, tmp_path: Path) -> None:
        """On the harness's route (it checks before it resolves) 403s still PASS anywhere."""
        ctx = ctx_for("net_denied_host", tmp_path, own=False, lab=False)
        assert judge(ctx, denied_report(), Records())[0] is Verdict.PASS


def canonical_report(spec: Any, ctx: CellContext) -> dict[str, Any]:
    """net_host_canonical: every escape 403 (written in full), both controls 200 echoed."""
    attempts = []
    for r in spec.requests(ctx):
        if r.role == "control":
            attempts.append(
                attempt(r.what, "control", "succeeded", 200) | {"detail": "nonce echoed"}
            )
        else:
            heads = len(r.heads)
            progress = {"sent": heads, "answered": heads, "heads": heads}
            attempts.append(attempt(r.what, "escape", "refused", 403) | progress)
    return {"attempts": attempts, "facts": {}}


class TestHostCanonicalUnderOwnProxy:
    def judge(self, ctx: CellContext, dns: list[dict[str, Any]]) -> tuple[Verdict, str]:
        """Prepare the cell's requests, answer each 403, assess and decide."""
        spec = PROBES["net_host_canonical"]
        spec.prepare(ctx)
        try:
            report = canonical_report(spec, ctx)
            assessment = spec.assess(ctx, report, Records(dns=dns), OK_CONTROL)
        finally:
            spec.cleanup(ctx)
        decision = decide(spec.expectation(ctx.claims), assessment)
        return decision.verdict, decision.reason

    def test_names_carry_the_nonce_where_only_the_fixture_resolves(self, tmp_path: Path) -> None:
        """The no-boundary and allowed-as-label spellings carry the cell's nonce in the lab."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=True, lab=True)
        built = NetHostCanonical().build(ctx)
        targets = {r.what: r.escape_targets[0] for r in built if r.role == "escape"}
        assert targets["connect-suffix-no-boundary"].startswith(f"{ctx.nonce}evilallowed.test:")
        assert targets["connect-allowed-as-label"].startswith(
            f"allowed.test.{ctx.nonce}.denied.test:"
        )

    def test_refusal_after_a_lookup_fails(self, tmp_path: Path) -> None:
        """A 403 after the proxy looked up `<nonce>evilallowed.test` is FAIL naming it."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=True, lab=True)
        name = f"{ctx.nonce}evilallowed.test"
        verdict, reason = self.judge(ctx, [query(name)])
        assert verdict is Verdict.FAIL, reason
        assert f"a refusal after a lookup is not a refusal: the proxy tried {name}" in reason
        assert "fix: match allowlist hosts on whole labels" in reason

    def test_refusal_without_lookup_passes(self, tmp_path: Path) -> None:
        """Every spelling refused and the fixture silent: PASS."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=True, lab=True)
        assert self.judge(ctx, [])[0] is Verdict.PASS

    def test_unwitnessed_outside_the_lab_is_inconclusive(self, tmp_path: Path) -> None:
        """Outside the lab, plain names, no witness: never PASS, saying why."""
        ctx = ctx_for("net_host_canonical", tmp_path, own=True, lab=False)
        verdict, reason = self.judge(ctx, [])
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert "the proxy's lookups were not witnessed" in reason


class TestDnsResolutionScope:
    @staticmethod
    def report() -> dict[str, Any]:
        """Both raw queries time out."""
        return {
            "attempts": [
                attempt("udp-query", "escape", "refused", None) | {"errno": "ETIMEDOUT"},
                attempt("tcp-query", "escape", "refused", None) | {"errno": "ECONNREFUSED"},
            ]
        }

    def test_own_proxy_pass_says_its_scope(self, tmp_path: Path) -> None:
        """Under an own proxy dns_resolution PASSes on its reading and says what it covers.

        The proxy's lookups are judged by the probes whose requests cause them.
        """
        ctx = ctx_for("dns_resolution", tmp_path, own=True, lab=True)
        other = query(f"{'n' + secrets.token_hex(8)}.denied.test")
        verdict, reason = judge(ctx, self.report(), Records(dns=[other]))
        assert verdict is Verdict.PASS, reason
        assert "the payload's own resolvers only" in reason
        assert "net_denied_host, net_host_canonical and net_proxy_dns_exfil" in reason

    def test_payload_query_still_fails(self, tmp_path: Path) -> None:
        """A query carrying this cell's nonce is the payload's own: FAIL, as before."""
        ctx = ctx_for("dns_resolution", tmp_path, own=True, lab=True)
        mine = query(f"{ctx.nonce}.{PROBE_NAME_SUFFIX}")
        assert judge(ctx, self.report(), Records(dns=[mine]))[0] is Verdict.FAIL
