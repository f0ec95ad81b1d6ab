"""`net_private_address`, host side: an allowed name resolving to a non-global address.

The one target that is not a harness origin is by construction never dialed: the probe plants
link-local and private ANSWERS in the DNS fixture, and `prepare` refuses to plant an address
the proxy's own address check would let through.

A proxy that dials an answer anyway connects to the host's loopback at the allowed origin's
ports, so every loopback address and port the requests name has a witness: the world's own
origin where it listens there (the loopback world's 127.0.0.1), else a listener `prepare`
plants for the cell (shared by concurrent cells, each reading its own nonce), told the nonce in
the clear (`send-nonce`, or the forwarded GET's path). A connection that carries the nonce is
FAIL naming where it landed, whatever the proxy told the payload.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import threading
import time
from typing import Any, Final, Protocol, runtime_checkable

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
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX, WitnessRecords
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.egress.rules import Rule, address_allowed
from sandbox_attest.world.listeners import LOOPBACK, TCP_READ_WINDOW_S, DirectEgressListener


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


FIX: Final = (
    "fix: check the address each name resolves to (refuse loopback, unspecified, private and "
    "link-local ones) after resolution and before dialing, and dial exactly the address checked"
)


def dialed(address: str) -> str:
    """Where a dial to a planted `address` lands: Linux connects 0.0.0.0 to 127.0.0.1."""
    return LOOPBACK if ipaddress.ip_address(address).is_unspecified else address


Place = tuple[str, int]


class _SharedWitnesses:
    """Listeners at fixed loopback (address, port)s, shared by the cells that name them.

    Cells of this probe on several backends may run at once and name the same places; each
    reads only the connections that carry its own nonce.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Place, tuple[DirectEgressListener, int]] = {}

    def acquire(self, place: Place) -> DirectEgressListener | str:
        """The listener at `place`, started if none is; or why it could not be bound."""
        with self._lock:
            held = self._held.get(place)
            if held is not None:
                self._held[place] = (held[0], held[1] + 1)
                return held[0]
            listener = DirectEgressListener(place[0], tcp_port=place[1])
            try:
                listener.start()
            except FixtureError as exc:
                return str(exc)
            self._held[place] = (listener, 1)
            return listener

    def release(self, place: Place) -> None:
        """One cell done with `place`: the last one stops its listener."""
        with self._lock:
            held = self._held.pop(place, None)
            if held is None:
                return
            if held[1] > 1:
                self._held[place] = (held[0], held[1] - 1)
                return
        held[0].stop()


_WITNESSES: Final = _SharedWitnesses()


class NetPrivateAddress(RouteSpec):
    """An allowed name resolving to a non-global address is refused after resolution."""

    id = "net_private_address"
    area = "net"

    def __init__(self) -> None:
        """Per cell: the loopback places its requests name, and what witnesses each."""
        super().__init__()
        self._lock = threading.Lock()
        self._places: dict[str, dict[Place, DirectEgressListener | str]] = {}

    def _knob(self, ctx: CellContext) -> _AnswerKnob | None:
        dns = getattr(ctx.world, "dns", None)
        return dns if isinstance(dns, _AnswerKnob) else None

    @staticmethod
    def origin_listens(ctx: CellContext, place: Place) -> bool:
        """Whether the world's allowed origin listens at `place` (the loopback world)."""
        allowed = ctx.world.info.hosts["allowed"]
        return place[0] == allowed.address and place[1] in (allowed.https_port, allowed.http_port)

    @staticmethod
    def places(ctx: CellContext) -> dict[str, Place]:
        """Where each escape request lands if a proxy dials its planted answer."""
        allowed = ctx.world.info.hosts["allowed"]
        found = {f"connect-{k}": (dialed(a), allowed.https_port) for k, a in PRIVATE_ANSWERS}
        found["get-loopback"] = (dialed("127.0.0.1"), allowed.http_port)
        return found

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Build the requests (planting the answers), then a witness at every place named."""
        task = super().prepare(ctx)
        planted: dict[Place, DirectEgressListener | str] = {}
        for place in set(self.places(ctx).values()) if task["requests"] else ():
            if not self.origin_listens(ctx, place):
                planted[place] = _WITNESSES.acquire(place)
        with self._lock:
            self._places[ctx.nonce] = planted
        return task

    def cleanup(self, ctx: CellContext) -> None:
        """Let go of the cell's witnesses, then forget the cell."""
        with self._lock:
            planted = self._places.pop(ctx.nonce, {})
        for place, held in planted.items():
            if not isinstance(held, str):
                _WITNESSES.release(place)
        super().cleanup(ctx)

    def loopback_hits(
        self, ctx: CellContext, report: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The planted witnesses' connections that carry the nonce, and what each place had.

        A witness accepts and reads on its own thread, so a dial the proxy made just before
        the payload reported may not be logged yet: unless every escape was refused with a
        proxy status (nothing dialed), the witnesses get up to their read window to hear it.
        """
        with self._lock:
            planted = dict(self._places.get(ctx.nonce, {}))
        listeners = [h for h in planted.values() if not isinstance(h, str)]
        places = self.places(ctx)
        # The witnessed places of the escapes that were not refused with a proxy status.
        due = set()
        for tried in attempts_by_role(report, "escape"):
            place = places.get(str(tried.get("what")))
            if tried.get("status") in REFUSAL_STATUSES or place is None:
                continue
            if not isinstance(planted.get(place, ""), str):
                due.add(f"{place[0]}:{place[1]}")
        deadline = time.monotonic() + (TCP_READ_WINDOW_S if due else 0.0)
        while True:
            hits = [r for h in listeners for r in h.records_with(ctx.nonce)["tcp"]]
            if due <= {str(h.get("local")) for h in hits} or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        where = {}
        for place in sorted(set(places.values())):
            held = planted.get(place)
            if self.origin_listens(ctx, place):
                where[f"{place[0]}:{place[1]}"] = "the allowed origin listens there"
            elif held is None or isinstance(held, str):
                where[f"{place[0]}:{place[1]}"] = f"not witnessed: {held or 'nothing planted'}"
            else:
                where[f"{place[0]}:{place[1]}"] = "a witness planted for the cell"
        return hits, where

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
            request = connect_request(
                f"connect-{kind}", f"{name}:{allowed.https_port}", n, allowed.name
            )
            # Where no origin answers TLS, a tunnel to the witness carries the nonce in clear.
            if not self.origin_listens(ctx, (dialed(address), allowed.https_port)):
                request = dataclasses.replace(request, after="send-nonce")
            requests.append(request)
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

        hits, where = self.loopback_hits(ctx, report)
        # The world's records with the planted witnesses' connections added to direct_tcp.
        records = WitnessRecords(
            origin=witness.origin,
            dns=witness.dns,
            proxy=witness.proxy,
            direct_tcp=[*witness.direct_tcp, *hits],
            direct_udp=witness.direct_udp,
            daemon=witness.daemon,
        )
        assessment = assess_route(ctx, report, records, control, requests, after_resolution)
        if hits:
            landed = sorted({str(h.get("local")) for h in hits})
            assessment.reasons.insert(
                0,
                "the proxy dialed the host's loopback: the witness at "
                f"{', '.join(landed)} heard this cell's nonce; {FIX}",
            )
        elif assessment.escape != "refused":
            assessment.reasons.append(
                "the loopback places named: " + "; ".join(f"{k} ({v})" for k, v in where.items())
            )
        assessment.witness["loopback"] = {"places": where, "heard": hits}
        return assessment


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
