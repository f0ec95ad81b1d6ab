"""`net_private_address`, host side: an allowed name resolving to a non-global address.

The one target that is not a harness origin is by construction never dialed: the probe plants
link-local and private ANSWERS in the DNS fixture, and `prepare` refuses to plant an address
the proxy's own address check would let through.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Protocol, runtime_checkable

from sandbox_attest.catalog.attempts import attempts_by_role
from sandbox_attest.catalog.controls import control_record, host_check, new_control_nonce
from sandbox_attest.catalog.net.route import (
    ProxyRequest,
    RouteReading,
    RouteSpec,
    absolute_request,
    allowed_control,
    assess_route,
    connect_request,
    deny_control,
)
from sandbox_attest.catalog.net.witness import REFUSAL_STATUSES
from sandbox_attest.catalog.spec import HOST_TIMEOUT_S, CellContext, WitnessRecordsLike
from sandbox_attest.errors import FixtureError
from sandbox_attest.verdict import Assessment, Escape
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.egress.rules import Rule, address_allowed


def _own_proxy(ctx: CellContext) -> bool:
    """The backend may bring its own proxy: the runner gives such a cell no harness route.

    Callers also check that the harness proxy logged nothing for the cell: a context built
    without a route (by hand, in tests) whose requests went through the harness proxy is
    judged on that proxy's log as usual.
    """
    return ctx.route is None


@runtime_checkable
class _AnswerKnob(Protocol):
    """The part of `sandbox_attest.world.dns.DnsFixture` this probe plants answers with."""

    port: int

    def set_answers(self, name: str, addresses: list[str]) -> None:
        """Answer `name` with these addresses."""
        ...


# Each planted answer is a non-global address the proxy's check must refuse after resolution.
# Only addresses that stay on this host are ever planted: a sandbox that brings its own proxy
# (a command wrapper with egress "own") would dial whatever the fixture answers, so a private
# or link-local answer could send traffic off the machine. The other address classes are
# covered by the proxy's pure rule tests (tests/egress/test_rules.py), which send nothing.
PRIVATE_ANSWERS: tuple[tuple[str, str], ...] = (
    ("loopback", "127.0.0.1"),
    ("loopback-range", "127.0.0.2"),
    ("unspecified", "0.0.0.0"),  # "this host" on Linux; planted in DNS, never bound
)


def _check_never_dialed(address: str) -> None:
    """Refuse to plant an answer that could send traffic off this host.

    Two checks: the address must stay on the host (loopback or unspecified), because a sandbox
    that brings its own proxy dials whatever the fixture answers; and the harness proxy's own
    check must refuse it, or the probe would prove nothing.
    """
    ip = ipaddress.ip_address(address)
    if not (ip.is_loopback or ip.is_unspecified):
        raise FixtureError(
            f"net_private_address will not plant {address}: a sandbox's own proxy could dial "
            "it off this host; plant only loopback or unspecified answers"
        )
    ok, why = address_allowed(address, Rule(host=PRIVATE_NAME_SUFFIX, suffix=True))
    if ok:
        raise FixtureError(
            f"net_private_address will not plant {address}: the proxy would dial it ({why})"
        )


class NetPrivateAddress(RouteSpec):
    """An allowed name resolving to a non-global address is refused after resolution."""

    id = "net_private_address"
    area = "net"

    def _knob(self, ctx: CellContext) -> _AnswerKnob | None:
        dns = getattr(ctx.world, "dns", None)
        return dns if isinstance(dns, _AnswerKnob) else None

    def build(self, ctx: CellContext) -> list[ProxyRequest]:
        """Plant one name per address kind; CONNECT each, and GET the loopback one."""
        knob = self._knob(ctx)
        if knob is None:
            return []
        allowed = ctx.world.info.hosts["allowed"]
        n = ctx.nonce
        requests = [
            connect_request(
                "connect-allowed",
                f"{allowed.name}:{allowed.https_port}",
                n,
                allowed.name,
                role="control",
                verify=True,
            )
        ]
        for kind, address in PRIVATE_ANSWERS:
            _check_never_dialed(address)
            name = f"{n}-{kind}.{PRIVATE_NAME_SUFFIX}"
            knob.set_answers(name, [address])
            requests.append(
                connect_request(f"connect-{kind}", f"{name}:{allowed.https_port}", n, allowed.name)
            )
        loopback = f"{n}-loopback.{PRIVATE_NAME_SUFFIX}:{allowed.http_port}"
        requests.append(absolute_request("get-loopback", loopback, n, loopback))
        return requests

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The fixture answers a planted name; the proxy refuses its address; allowed works."""
        nonce = new_control_nonce()
        knob = self._knob(ctx)
        if knob is None:
            return control_record(
                nonce, [host_check("dns knob", ok=False, detail="world has no DNS")]
            )
        allowed = ctx.world.info.hosts["allowed"]
        name = f"{nonce}-loopback.{PRIVATE_NAME_SUFFIX}"
        knob.set_answers(name, ["127.0.0.1"])
        dns = ctx.world.info.dns
        try:
            answers = resolve((dns.host, dns.port), name, timeout=HOST_TIMEOUT_S)
            checks = [
                host_check(
                    "fixture answers the planted name",
                    answers == ["127.0.0.1"],
                    f"{name} -> {answers}",
                )
            ]
        except ResolveError as exc:
            checks = [host_check("fixture answers the planted name", ok=False, detail=str(exc))]
        checks += deny_control(
            ctx,
            f"{name}:{allowed.https_port}",
            nonce,
            lambda p: p.get("nonce") == nonce and _refused_after_resolution(p),
        )
        checks += allowed_control(ctx, nonce)
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Refused only if EVERY planted name was resolved, its address refused, none dialed."""
        requests = self.requests(ctx)
        planted = {
            f"{ctx.nonce}-{kind}.{PRIVATE_NAME_SUFFIX}": address
            for kind, address in PRIVATE_ANSWERS
        }

        def after_resolution(reading: RouteReading, reasons: list[str]) -> Escape | None:
            if _own_proxy(ctx) and not (reading.denies or reading.admitted):
                return _own_proxy_resolved(planted, witness, report, reasons)
            late = [
                d
                for d in reading.denies
                if _refused_after_resolution(d)
                and d.get("address") == planted.get(str(d.get("host")))
            ]
            early = [d for d in reading.denies if d not in late]
            targets = {t for r in requests if r.role == "escape" for t in r.escape_targets}
            if early or len({d.get("target") for d in late}) != len(targets):
                reasons.append(
                    f"only {len(late)} of {len(targets)} planted names were refused after "
                    "resolution with their planted address; others: "
                    + "; ".join(str(d.get("reason")) for d in early)
                )
                return "undecided"
            reasons.append(
                "the proxy resolved every planted name and refused its address before dialing: "
                + ", ".join(sorted({str(d.get("address")) for d in late}))
            )
            return None

        return assess_route(ctx, report, witness, control, requests, after_resolution)


def _own_proxy_resolved(
    planted: dict[str, str],
    witness: WitnessRecordsLike,
    report: dict[str, Any],
    reasons: list[str],
) -> Escape | None:
    """A wrapper's own proxy: it resolved every planted name and refused with a status.

    Its decisions are not in the harness proxy's log, so the DNS fixture is the witness that
    each name was resolved (the refusal came after resolution, not from a name rule), and the
    payload's 403s with a silent origin and listener say nothing was dialed.
    """
    queried = {str(q.get("name", "")).rstrip(".").lower() for q in witness.dns}
    missing = sorted(name for name in planted if name.lower() not in queried)
    statuses = {a.get("status") for a in attempts_by_role(report, "escape")}
    if missing or not statuses <= REFUSAL_STATUSES:
        reasons.append(
            "the wrapper's own proxy: the DNS fixture saw no query for "
            f"{', '.join(missing) or 'none missing'}; refusal statuses {sorted(map(str, statuses))}"
        )
        return "undecided"
    reasons.append(
        "the wrapper's own proxy resolved every planted name (the DNS fixture saw each query) "
        "and refused it with a status before dialing: nothing reached an origin or listener"
    )
    return None


def _refused_after_resolution(decision: dict[str, Any]) -> bool:
    """A 403 whose address check (which runs after resolution and before the dial) refused."""
    return (
        decision.get("decision") == "deny"
        and decision.get("status") == 403
        and bool(decision.get("address"))
        and "forbids private" in str(decision.get("reason", ""))
    )
