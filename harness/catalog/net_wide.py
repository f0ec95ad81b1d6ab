"""Wider-catalogue network probes (issue 8), host side.

Three probes go THROUGH the harness proxy and try to confuse it (`net_host_canonical`,
`net_proxy_confusion`, `net_private_address`): the host builds every request head, the payload
sends them byte for byte, and the proxy's decision log plus the origin logs are the witnesses.
A refusal counts only when it came as the proxy's own status; an "allow" decision for a target
that must never be admitted, or any origin request tagged with an escape attempt, is an escape.

Three probes go AROUND the proxy (`net_proxy_env_override`, `net_loopback_services`,
`net_ipv6_udp_icmp`): the host starts per-cell loopback listeners in `prepare` (a service with
a banner, a rogue proxy, IPv6/UDP listeners) whose logs are the witnesses, and stops them in
`cleanup`. A success that reached only the sandbox's own loopback is containment, not escape.

Every target is harness-owned and on loopback. The one exception is by construction never
dialed: `net_private_address` plants link-local and private ANSWERS in the DNS fixture, and
`prepare` refuses to plant an address the proxy's own address check would let through.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import ipaddress
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit

from harness.catalog.base import (
    HOST_TIMEOUT_S,
    CellContext,
    ProbeSpec,
    WitnessRecordsLike,
    _attempts,
    _check,
    _conclude,
    _confined_network,
    _control,
    _control_nonce,
    _guarded,
    _https_via_proxy,
    _judge,
    _namespace,
    _observed,
    _poll,
    _private_namespace,
    _Spec,
    _split,
    _summary,
    _tunnel,
    _wait_for,
    _with_nonce,
)
from harness.egress.rules import Rule, address_allowed
from harness.errors import FixtureError
from harness.trust import PayloadUser
from harness.verdict import Assessment, Escape, Expectation
from harness.world.core import PRIVATE_NAME_SUFFIX
from harness.world.dns import ResolveError, resolve

if TYPE_CHECKING:
    from collections.abc import Callable

    from harness.backends.base import DeclaredPolicy

__all__ = [
    "SPECS",
    "LoopbackWitness",
    "NetHostCanonical",
    "NetIpv6UdpIcmp",
    "NetLoopbackServices",
    "NetPrivateAddress",
    "NetProxyConfusion",
    "NetProxyEnvOverride",
]

# Statuses by which the proxy refuses before anything is dialed: a bad host or request (400),
# no rule or a forbidden address (403), a Host header naming another host (421).
REFUSAL_STATUSES = frozenset({400, 403, 421})
_POLL_S = 0.2
_READ_WINDOW_S = 2.0
_PREFIX_LIMIT = 512
SERVICE_BANNER = b"SA-LOOPBACK-SERVICE ok\n"
ROGUE_REPLY = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n"
    b"Connection: close\r\n\r\nrogue-ok\n"
)


# ---------------------------------------------------------------------------------------------
# A per-cell loopback listener: the witness of the probes that go around the proxy.


class LoopbackWitness:
    """TCP and/or UDP on one loopback address, logging the first bytes of everything.

    A TCP peer is read until its first newline (or `_PREFIX_LIMIT` bytes, or `_READ_WINDOW_S`),
    logged, and then answered with `banner` if one is set: the log line is written before the
    answer, so a client that got the banner can already be found in the log.

    Args:
        address: a loopback literal (`127.0.0.1`, `::1`); anything else is refused.
        tcp: listen on TCP.
        udp: listen on UDP.
        banner: bytes to answer each TCP peer with, or None to stay silent.
    """

    def __init__(
        self, address: str, *, tcp: bool = True, udp: bool = False, banner: bytes | None = None
    ) -> None:
        """Check the address; nothing is bound until `start`."""
        ip = ipaddress.ip_address(address)
        if not ip.is_loopback:
            raise FixtureError(f"LoopbackWitness must bind a loopback address, not {address!r}")
        self.address = str(ip)
        self.family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        self.tcp_port = 0
        self.udp_port = 0
        self._want = (tcp, udp)
        self._banner = banner
        self._log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Bind on ephemeral ports and serve from daemon threads.

        Raises:
            FixtureError: a socket could not be bound (the message names the address).
        """
        try:
            if self._want[0]:
                tcp = socket.socket(self.family, socket.SOCK_STREAM)
                self._socks.append(tcp)
                tcp.bind((self.address, 0))
                tcp.listen(16)
                tcp.settimeout(_POLL_S)
                self.tcp_port = tcp.getsockname()[1]
                self._spawn(self._accept_loop, tcp)
            if self._want[1]:
                udp = socket.socket(self.family, socket.SOCK_DGRAM)
                self._socks.append(udp)
                udp.bind((self.address, 0))
                udp.settimeout(_POLL_S)
                self.udp_port = udp.getsockname()[1]
                self._spawn(self._udp_loop, udp)
        except OSError as exc:
            self.stop()
            raise FixtureError(
                f"loopback witness could not bind {self.address}: {exc}; "
                "check that the loopback interface is up for this address family"
            ) from exc

    def hostport(self, port: int) -> str:
        """`127.0.0.1:PORT` or `[::1]:PORT`."""
        return f"[{self.address}]:{port}" if ":" in self.address else f"{self.address}:{port}"

    def record(self, entry: dict[str, Any]) -> None:
        """Append one log entry (`proto`, `peer`, `data`); the serving threads call this."""
        with self._lock:
            self._log.append({"time": time.time(), **entry})

    def records_with(self, nonce: str) -> list[dict[str, Any]]:
        """Entries whose bytes carry `nonce`."""
        with self._lock:
            return [dict(e) for e in self._log if nonce in str(e.get("data", ""))]

    def stop(self) -> None:
        """Close every socket and join the threads; safe to call twice."""
        self._stop.set()
        for sock in self._socks:
            sock.close()
        for thread in self._threads:
            thread.join(_READ_WINDOW_S + 1.0)
        self._socks, self._threads = [], []

    def _spawn(self, target: Callable[[socket.socket], None], sock: socket.socket) -> None:
        thread = threading.Thread(target=target, args=(sock,), daemon=True, name="net-wide")
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        with conn:
            conn.settimeout(_READ_WINDOW_S)
            data = b""
            with contextlib.suppress(OSError):
                while b"\n" not in data and len(data) < _PREFIX_LIMIT:
                    chunk = conn.recv(_PREFIX_LIMIT)
                    if not chunk:
                        break
                    data += chunk
            self.record({"proto": "tcp", "peer": _peer(peer), "data": data.decode("latin-1")})
            if self._banner is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(self._banner)

    def _udp_loop(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data, peer = sock.recvfrom(_PREFIX_LIMIT)
            except TimeoutError:
                continue
            except OSError:
                return
            self.record({"proto": "udp", "peer": _peer(peer), "data": data.decode("latin-1")})


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def has_ipv6_loopback() -> bool:
    """Whether this host can bind ::1 (no IPv6 loopback means the v6 attempts are moot)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


class _Cells:
    """Per-cell state of one spec instance (the catalogue holds one instance per probe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_nonce: dict[str, dict[str, Any]] = {}

    def put(self, nonce: str, state: dict[str, Any]) -> None:
        with self._lock:
            self._by_nonce[nonce] = state

    def get(self, nonce: str) -> dict[str, Any]:
        with self._lock:
            return self._by_nonce.get(nonce, {})

    def pop(self, nonce: str) -> dict[str, Any]:
        with self._lock:
            return self._by_nonce.pop(nonce, {})


def _stop_listeners(state: dict[str, Any]) -> None:
    for value in state.values():
        if isinstance(value, LoopbackWitness):
            value.stop()


class _PerCellSpec(_Spec):
    """A spec that keeps per-cell state from `prepare` (its own listeners) until `cleanup`.

    The catalogue holds one instance per probe and cells may run in parallel, so the state is
    keyed by the cell's nonce; `cleanup` stops every listener the cell started.
    """

    def __init__(self) -> None:
        """No cell prepared yet."""
        self._cells = _Cells()

    def _listener(self, ctx: CellContext, key: str) -> LoopbackWitness | None:
        """The cell's listener kept under `key`, or None when `prepare` did not start it."""
        value = self._cells.get(ctx.nonce).get(key)
        return value if isinstance(value, LoopbackWitness) else None

    def cleanup(self, ctx: CellContext) -> None:
        """Stop the cell's listeners and forget the cell."""
        _stop_listeners(self._cells.pop(ctx.nonce))


def _unprepared_control(what: str) -> dict[str, Any]:
    """The host control of a cell whose `prepare` never ran: failed, saying so."""
    return _control(_control_nonce(), [_check(what, ok=False, detail="prepare() did not run")])


def _unprepared(what: str, observed: Any) -> Assessment:
    """The assessment of a cell whose `prepare` never ran: nothing could witness it."""
    reasons = [f"prepare() did not run for this cell: no {what} to witness"]
    return Assessment("undecided", controls_ok=False, reasons=reasons, observed=observed)


# ---------------------------------------------------------------------------------------------
# Requests through the proxy, built on the host and sent verbatim by the payload.


@dataclass(frozen=True)
class ProxyRequest:
    """One connection's worth of request heads for the payload to send through the proxy.

    Attributes:
        what: the attempt's name in the report; also its `a=` tag in every request path.
        role: "escape" or "control".
        heads: request heads without Proxy-Authorization and without the final blank line;
            sent one after the other on ONE connection (or all at once when `pipelined`).
        escape_targets: request-targets (as in the decision log) that must never be admitted.
        refusal: how the escape must end: "status" (a proxy refusal status) or "closed" (the
            connection ends before the answer to the last head).
        after: on a 200 CONNECT: "tls-get" (TLS to `sni`, GET `path`) or "send-nonce".
    """

    what: str
    role: str
    heads: tuple[str, ...]
    escape_targets: tuple[str, ...] = ()
    refusal: str = "status"
    pipelined: bool = False
    after: str = "tls-get"
    sni: str = ""
    path: str = ""
    verify: bool = False

    def to_task(self) -> dict[str, Any]:
        """The JSON the payload reads."""
        return {
            "what": self.what,
            "role": self.role,
            "heads": list(self.heads),
            "pipelined": self.pipelined,
            "after": self.after,
            "sni": self.sni,
            "path": self.path,
            "verify": self.verify,
            "tag": self.what,
        }


def _head(method: str, target: str, nonce: str, host: str | None, *extra: str) -> str:
    """A request head: request line, Host (unless None), the nonce header, then `extra`."""
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"X-Attest-Nonce: {nonce}", *extra]
    return "\r\n".join(lines)


def _wire(text: str) -> str:
    """How the proxy logs a target the payload sent as UTF-8 (it decodes heads as latin-1)."""
    return text.encode("utf-8").decode("latin-1")


def _connect(
    what: str, authority: str, nonce: str, sni: str, *, role: str = "escape", verify: bool = False
) -> ProxyRequest:
    return ProxyRequest(
        what=what,
        role=role,
        heads=(_head("CONNECT", authority, nonce, authority),),
        escape_targets=(authority,) if role == "escape" else (),
        sni=sni,
        path=f"/ok?nonce={nonce}&a={what}",
        verify=verify,
    )


def _absolute(
    what: str, authority: str, nonce: str, host: str | None, *extra: str, role: str = "escape"
) -> ProxyRequest:
    target = f"http://{authority}/ok?nonce={nonce}&a={what}"
    return ProxyRequest(
        what=what,
        role=role,
        heads=(_head("GET", target, nonce, host, "Connection: close", *extra),),
        escape_targets=(target,) if role == "escape" else (),
    )


def _tag(entry: dict[str, Any]) -> str | None:
    """The `a=` tag of an origin log entry's path (also inside an absolute-form path)."""
    path = str(entry.get("path", ""))
    values = parse_qs(urlsplit(path).query).get("a")
    return values[0] if values else None


@dataclass
class _RouteReading:
    """What the witnesses say about a set of proxy requests with one nonce."""

    admitted: list[dict[str, Any]] = field(default_factory=list)
    denies: list[dict[str, Any]] = field(default_factory=list)
    origin_hits: list[dict[str, Any]] = field(default_factory=list)
    listener_hits: list[dict[str, Any]] = field(default_factory=list)


# The proxy's statuses for a request its rules admitted whose dial then failed (no answer from
# the DNS fixture, a dead or slow upstream): the allowlist said yes, so it counts as admitted.
PAST_RULES_STATUSES = frozenset({502, 504})


def _admitted(entry: dict[str, Any]) -> bool:
    """Whether a decision line shows the request got past the allowlist.

    Only "allow", or a dial failure that only follows admission. Any other refusal (407 bad
    credentials, 431 oversize head, no status at all) stopped before the rules: counting it as
    admitted would turn a broken client into a false FAIL.
    """
    return entry.get("decision") == "allow" or entry.get("status") in PAST_RULES_STATUSES


def _read_route(
    nonce: str, requests: list[ProxyRequest], witness: WitnessRecordsLike
) -> _RouteReading:
    escape_targets = {_wire(t) for r in requests if r.role == "escape" for t in r.escape_targets}
    escape_tags = {r.what for r in requests if r.role == "escape"}
    reading = _RouteReading()
    for entry in _with_nonce(witness.proxy, nonce):
        if entry.get("target") not in escape_targets:
            continue
        if _admitted(entry):
            reading.admitted.append(entry)
        elif entry.get("status") in REFUSAL_STATUSES:
            reading.denies.append(entry)
    # The tag names which request got through; the denied host seeing the nonce at all is an
    # escape whatever its path says (a proxy may rewrite or drop the query that carries a=).
    reading.origin_hits = [
        o
        for o in _with_nonce(witness.origin, nonce)
        if _tag(o) in escape_tags or o.get("host") == "denied"
    ]
    reading.listener_hits = _with_nonce(witness.direct_tcp, nonce)
    return reading


def _assess_route(
    ctx: CellContext,
    report: dict[str, Any],
    witness: WitnessRecordsLike,
    control: dict[str, Any],
    requests: list[ProxyRequest],
    extra: Callable[[_RouteReading, list[str]], Escape | None] | None = None,
) -> Assessment:
    """The shared reading of the probes that try to confuse the proxy."""
    escapes = _attempts(report, "escape")
    controls = _attempts(report, "control")
    observed = _observed(escapes)
    if not requests:
        missing = ["prepare() did not run for this cell: no requests to judge"]
        return Assessment("undecided", controls_ok=False, reasons=missing, observed=observed)
    reading = _read_route(ctx.nonce, requests, witness)
    reasons: list[str] = []
    seen = bool(reading.admitted or reading.origin_hits or reading.listener_hits)
    if seen:
        admitted = sorted({f"{e.get('target')} ({e.get('status')})" for e in reading.admitted})
        reasons.append(
            f"the proxy let {len(reading.admitted)} escape requests past its checks "
            f"{admitted[:4]}; origins saw {len(reading.origin_hits)} tagged escape requests; "
            f"the direct listener saw {len(reading.listener_hits)} connections"
        )
    by_what = {r.what: r for r in requests}
    misshapen = [
        a
        for a in escapes
        if a.get("outcome") == "refused"
        and by_what.get(str(a.get("what"))) is not None
        and by_what[str(a.get("what"))].refusal == "status"
        and a.get("status") not in REFUSAL_STATUSES
    ]
    reasons.append(f"payload: {_summary(escapes)}")
    reasons.append(f"proxy logged {len(reading.denies)} refusals of escape targets")
    escape = _judge(observed, seen, None, reasons)
    if escape == "refused" and misshapen:
        reasons.append(
            "a refusal did not come as the proxy's 400/403/421: "
            + ", ".join(str(a.get("what")) for a in misshapen)
        )
        escape = "disagree"
    unexercised = [
        f"{a.get('what')} ({_progress(a)})" for a in escapes if not _exercised(a, by_what)
    ]
    if escape == "refused" and unexercised:
        # A refusal counts only for the request that carried the escape; if that head was
        # never written, the proxy was never asked, and nothing was refused.
        reasons.append("the escaping request was never put to the proxy: " + ", ".join(unexercised))
        escape = "undecided"
    if escape == "refused" and extra is not None:
        escape = extra(reading, reasons) or escape
    inside_ok = bool(controls) and all(
        a.get("outcome") == "succeeded"
        and a.get("status") == 200
        and "nonce echoed" in str(a.get("detail", ""))
        for a in controls
    )
    return _conclude(
        escape,
        observed,
        reasons,
        inside=controls,
        inside_ok=inside_ok,
        host_control=control,
        witness={
            "admitted": reading.admitted,
            "denied": reading.denies,
            "origin": reading.origin_hits,
            "direct_tcp": reading.listener_hits,
        },
    )


def _progress(attempt: dict[str, Any]) -> str:
    sent, heads, answered = attempt.get("sent"), attempt.get("heads"), attempt.get("answered")
    return f"{sent} of {heads} heads written, {answered} answered"


def _exercised(attempt: dict[str, Any], by_what: dict[str, ProxyRequest]) -> bool:
    """Whether a refused multi-request attempt wrote its last (escaping) head to the proxy.

    The payload reports `sent` (heads fully written) and `answered` (responses read). A
    refusal of the last head needs that head written and every earlier one answered: a
    connection that ended before response 1 never carried the request under test.
    """
    request = by_what.get(str(attempt.get("what")))
    if attempt.get("outcome") != "refused" or request is None or len(request.heads) < 2:
        return True
    sent, answered = attempt.get("sent"), attempt.get("answered")
    if not isinstance(sent, int) or not isinstance(answered, int):
        return False
    return sent == len(request.heads) and answered >= len(request.heads) - 1


def _deny_control(
    ctx: CellContext, authority: str, nonce: str, want: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The host CONNECTs `authority`; the proxy must refuse it and log a line `want` accepts."""
    info = ctx.world.info
    host, port = _split(authority)

    def connect() -> dict[str, Any]:
        sock, status, reason = _tunnel(info.proxy.url, host, port, nonce)
        sock.close()
        ok = status in REFUSAL_STATUSES
        return _check(f"host connect {authority} refused", ok, f"{status} {reason}".strip())

    checks = [_guarded(f"host connect {authority} refused", connect)]
    records = _wait_for(ctx.world, nonce, lambda r: any(want(p) for p in r.proxy))
    logged = [p for p in _with_nonce(records.proxy, nonce) if want(p)]
    checks.append(
        _check(
            "proxy logged the host's refusal",
            bool(logged),
            "; ".join(str(p.get("reason")) for p in logged) or "no matching decision line",
        )
    )
    return checks


def _allowed_control(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
    """The host GETs the allowed origin through the proxy (200, nonce echoed)."""
    info = ctx.world.info
    allowed = info.hosts["allowed"]

    def get() -> dict[str, Any]:
        url = f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}"
        status, body, _ = _https_via_proxy(info, url, nonce)
        ok = status == 200 and nonce.encode() in body
        return _check("host get allowed", ok, f"{status} {body[:60]!r}")

    return [_guarded("host get allowed", get)]


class _RouteSpec(_PerCellSpec):
    """A probe whose escapes are requests through the harness proxy."""

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied on every leg: every leg's only route is the proxy, which must refuse these."""
        del policy
        return "denied"

    def build(self, ctx: CellContext) -> list[ProxyRequest]:
        """The requests of this probe for one cell."""
        raise NotImplementedError

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Build the cell's requests (kept for `assess`) and hand them to the payload."""
        requests = self.build(ctx)
        self._cells.put(ctx.nonce, {"requests": requests})
        return {"requests": [r.to_task() for r in requests]}

    def requests(self, ctx: CellContext) -> list[ProxyRequest]:
        """The requests `prepare` built for this cell (empty if it did not run)."""
        found: list[ProxyRequest] = self._cells.get(ctx.nonce).get("requests", [])
        return found


# ---------------------------------------------------------------------------------------------
# net_host_canonical


class NetHostCanonical(_RouteSpec):
    """Spellings of the allowed host must not widen its rule; equivalent spellings still work."""

    id = "net_host_canonical"
    area = "net"

    def build(self, ctx: CellContext) -> list[ProxyRequest]:
        """Canonical and equivalent spellings (controls); widening spellings (escapes)."""
        hosts = ctx.world.info.hosts
        allowed, denied = hosts["allowed"], hosts["denied"]
        name, port, http = allowed.name, allowed.https_port, allowed.http_port
        deny_http = f"{denied.name}:{denied.http_port}"
        n = ctx.nonce
        homoglyph = "\u0430" + name[1:] if name.startswith("a") else "\u0430" + name
        return [
            _connect("connect-canonical", f"{name}:{port}", n, name, role="control", verify=True),
            # Same canonical host: admitting it shows the denials below come from matching the
            # canonical name, not from refusing everything unusual.
            _connect(
                "connect-equivalent-spelling",
                f"{name.upper()}.:{port}",
                n,
                name,
                role="control",
                verify=True,
            ),
            _connect("connect-suffix-no-boundary", f"evil{name}:{port}", n, name),
            _connect("connect-allowed-as-label", f"{name}.{denied.name}:{port}", n, name),
            _connect("connect-ipv4-literal", f"{allowed.address}:{port}", n, name),
            _connect("connect-ipv4-short", f"127.1:{port}", n, name),
            _connect("connect-ipv4-hex", f"0x7f.0.0.1:{port}", n, name),
            _connect("connect-ipv4-decimal", f"2130706433:{port}", n, name),
            _connect("connect-ipv4-octal", f"0177.0.0.1:{port}", n, name),
            _connect("connect-ipv4-mapped-ipv6", f"[::ffff:{allowed.address}]:{port}", n, name),
            _connect("connect-userinfo", f"{name}@{allowed.address}:{port}", n, name),
            _connect("connect-empty-label", f"{name}..:{port}", n, name),
            _connect("connect-homoglyph", f"{homoglyph}:{port}", n, name),
            _absolute("get-userinfo", f"{name}@{deny_http}", n, None),
            _absolute("get-backslash", f"{name}\\@{deny_http}", n, None),
            _absolute("get-fragment-authority", f"{deny_http}#@{name}:{http}", n, None),
            _absolute("get-ipv4-decimal", f"2130706433:{http}", n, f"2130706433:{http}"),
        ]

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host is refused `127.1` (and logged); the canonical name answers it."""
        nonce = _control_nonce()
        port = ctx.world.info.hosts["allowed"].https_port
        target = f"127.1:{port}"
        checks = _deny_control(
            ctx,
            target,
            nonce,
            lambda p: p.get("nonce") == nonce and p.get("target") == target,
        )
        checks += _allowed_control(ctx, nonce)
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Refused spellings + no admitted escape target + no tagged origin hit = refused."""
        requests = self.requests(ctx)
        allowed = ctx.world.info.hosts["allowed"].name

        def equivalent_admitted_as_canonical(reading: _RouteReading, reasons: list[str]) -> None:
            # The equivalent spelling must have been admitted under the canonical name.
            del reading
            spelled = [
                p
                for p in _with_nonce(witness.proxy, ctx.nonce)
                if str(p.get("target", "")).startswith(allowed.upper() + ".:")
            ]
            if spelled and all(p.get("host") == allowed for p in spelled):
                reasons.append(f"the equivalent spelling was admitted as {allowed}")
            elif spelled:
                reasons.append(f"the equivalent spelling was logged as {spelled[0].get('host')}")

        return _assess_route(
            ctx, report, witness, control, requests, equivalent_admitted_as_canonical
        )


# ---------------------------------------------------------------------------------------------
# net_proxy_confusion


class NetProxyConfusion(_RouteSpec):
    """Ports, Host headers and keep-alive reuse must not carry a request past the allowlist."""

    id = "net_proxy_confusion"
    area = "net"

    def build(self, ctx: CellContext) -> list[ProxyRequest]:
        """Two controls (CONNECT and absolute-form) and seven confusions."""
        info = ctx.world.info
        allowed, denied = info.hosts["allowed"], info.hosts["denied"]
        name, http = allowed.name, allowed.http_port
        listener_port = _split(info.direct_egress.tcp)[1]
        deny_http = f"{denied.name}:{denied.http_port}"
        n = ctx.nonce
        first = f"http://{name}:{http}/ok?nonce={n}&a=keepalive-first"
        second = f"http://{deny_http}/ok?nonce={n}&a=keepalive-second"
        piped_first = f"http://{name}:{http}/ok?nonce={n}&a=pipelined-first"
        piped_second = f"http://{deny_http}/ok?nonce={n}&a=pipelined-second"
        keep = "Connection: keep-alive"
        return [
            _connect(
                "connect-allowed",
                f"{name}:{allowed.https_port}",
                n,
                name,
                role="control",
                verify=True,
            ),
            _absolute("get-allowed", f"{name}:{http}", n, f"{name}:{http}", role="control"),
            _connect("connect-allowed-name-denied-port", f"{name}:{denied.https_port}", n, name),
            ProxyRequest(
                what="connect-allowed-name-listener-port",
                role="escape",
                heads=(_head("CONNECT", f"{name}:{listener_port}", n, f"{name}:{listener_port}"),),
                escape_targets=(f"{name}:{listener_port}",),
                after="send-nonce",
            ),
            _absolute(
                "get-allowed-name-denied-port",
                f"{name}:{denied.http_port}",
                n,
                f"{name}:{denied.http_port}",
            ),
            _absolute("get-host-header-mismatch", f"{name}:{http}", n, deny_http),
            _absolute(
                "get-duplicate-host", f"{name}:{http}", n, f"{name}:{http}", f"Host: {deny_http}"
            ),
            ProxyRequest(
                what="keepalive-second",
                role="escape",
                heads=(
                    _head("GET", first, n, f"{name}:{http}", keep),
                    _head("GET", second, n, deny_http, keep),
                ),
                escape_targets=(second,),
                refusal="closed",
            ),
            ProxyRequest(
                what="pipelined-second",
                role="escape",
                heads=(
                    _head("GET", piped_first, n, f"{name}:{http}", keep),
                    _head("GET", piped_second, n, deny_http, keep),
                ),
                escape_targets=(piped_second,),
                refusal="closed",
                pipelined=True,
            ),
        ]

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host is refused the allowed name on the denied port; the allowed port works."""
        nonce = _control_nonce()
        hosts = ctx.world.info.hosts
        target = f"{hosts['allowed'].name}:{hosts['denied'].https_port}"
        checks = _deny_control(
            ctx,
            target,
            nonce,
            lambda p: p.get("nonce") == nonce and p.get("target") == target,
        )
        checks += _allowed_control(ctx, nonce)
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Every confusion refused (or its connection closed), nothing admitted or logged."""
        return _assess_route(ctx, report, witness, control, self.requests(ctx))


# ---------------------------------------------------------------------------------------------
# net_private_address


@runtime_checkable
class _AnswerKnob(Protocol):
    """The part of `harness.world.dns.DnsFixture` this probe plants answers with."""

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


class NetPrivateAddress(_RouteSpec):
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
            _connect(
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
                _connect(f"connect-{kind}", f"{name}:{allowed.https_port}", n, allowed.name)
            )
        loopback = f"{n}-loopback.{PRIVATE_NAME_SUFFIX}:{allowed.http_port}"
        requests.append(_absolute("get-loopback", loopback, n, loopback))
        return requests

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The fixture answers a planted name; the proxy refuses its address; allowed works."""
        nonce = _control_nonce()
        knob = self._knob(ctx)
        if knob is None:
            return _control(nonce, [_check("dns knob", ok=False, detail="world has no DNS")])
        allowed = ctx.world.info.hosts["allowed"]
        name = f"{nonce}-loopback.{PRIVATE_NAME_SUFFIX}"
        knob.set_answers(name, ["127.0.0.1"])
        dns = ctx.world.info.dns
        try:
            answers = resolve((dns.host, dns.port), name, timeout=HOST_TIMEOUT_S)
            checks = [
                _check(
                    "fixture answers the planted name",
                    answers == ["127.0.0.1"],
                    f"{name} -> {answers}",
                )
            ]
        except ResolveError as exc:
            checks = [_check("fixture answers the planted name", ok=False, detail=str(exc))]
        checks += _deny_control(
            ctx,
            f"{name}:{allowed.https_port}",
            nonce,
            lambda p: p.get("nonce") == nonce and _refused_after_resolution(p),
        )
        checks += _allowed_control(ctx, nonce)
        return _control(nonce, checks)

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

        def after_resolution(reading: _RouteReading, reasons: list[str]) -> Escape | None:
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

        return _assess_route(ctx, report, witness, control, requests, after_resolution)


def _refused_after_resolution(decision: dict[str, Any]) -> bool:
    """A 403 whose address check (which runs after resolution and before the dial) refused."""
    return (
        decision.get("decision") == "deny"
        and decision.get("status") == 403
        and bool(decision.get("address"))
        and "forbids private" in str(decision.get("reason", ""))
    )


# ---------------------------------------------------------------------------------------------
# Probes around the proxy: their own listeners.


def _direct_get(address: str, port: int, host_header: str, path: str, nonce: str) -> int:
    conn = http.client.HTTPConnection(address, port, timeout=HOST_TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"Host": host_header, "X-Attest-Nonce": nonce})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _tcp_line(hostport: str, line: bytes) -> bytes:
    with socket.create_connection(_split(hostport), HOST_TIMEOUT_S) as sock:
        sock.sendall(line)
        reply = b""
        with contextlib.suppress(TimeoutError):
            while b"\n" not in reply and len(reply) < 512:
                chunk = sock.recv(512)
                if not chunk:
                    break
                reply += chunk
        return reply


def _udp_send(hostport: str, data: bytes) -> None:
    host, port = _split(hostport)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.sendto(data, (host, port))


def _denied_origin_hits(witness: WitnessRecordsLike, nonce: str) -> list[dict[str, Any]]:
    return [o for o in _with_nonce(witness.origin, nonce) if o.get("host") == "denied"]


def _origin_direct_control(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
    """The host GETs the denied origin straight on its port; the origin logs it."""
    denied = ctx.world.info.hosts["denied"]

    def get() -> dict[str, Any]:
        host = f"{denied.name}:{denied.http_port}"
        status = _direct_get(denied.address, denied.http_port, host, f"/ok?nonce={nonce}", nonce)
        return _check("host get denied origin directly", status == 200, f"{status}")

    checks = [_guarded("host get denied origin directly", get)]
    records = _wait_for(ctx.world, nonce, lambda r: bool(_denied_origin_hits(r, nonce)))
    hits = _denied_origin_hits(records, nonce)
    checks.append(_check("denied origin logged the host", bool(hits), f"{len(hits)} hits"))
    return checks


def _listener_control(
    what: str, listener: LoopbackWitness, nonce: str, action: Callable[[], dict[str, Any]]
) -> list[dict[str, Any]]:
    checks = [_guarded(what, action)]
    seen = _poll(lambda: listener.records_with(nonce), bool)
    checks.append(_check(f"{what}: listener logged it", bool(seen), f"{len(seen)} entries"))
    return checks


class NetLoopbackServices(_PerCellSpec):
    """Host services on 127.0.0.1 (a per-cell service, an origin's port) are out of reach."""

    id = "net_loopback_services"
    area = "net"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied wherever the network is confined; seen on the open control leg."""
        return _confined_network(policy)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the cell's service (answers a banner); name it and the denied origin's port."""
        service = LoopbackWitness("127.0.0.1", tcp=True, banner=SERVICE_BANNER)
        service.start()
        self._cells.put(ctx.nonce, {"service": service})
        denied = ctx.world.info.hosts["denied"]
        return {
            "service": service.hostport(service.tcp_port),
            "origin": {"address": denied.address, "port": denied.http_port, "host": denied.name},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host gets the service's banner and the denied origin's answer, both logged."""
        service = self._listener(ctx, "service")
        if service is None:
            return _unprepared_control("service")
        nonce = _control_nonce()
        hostport = service.hostport(service.tcp_port)

        def ping() -> dict[str, Any]:
            reply = _tcp_line(hostport, f"PING nonce={nonce}\n".encode())
            return _check("host reaches the service", reply == SERVICE_BANNER, repr(reply))

        checks = _listener_control("host reaches the service", service, nonce, ping)
        checks += _origin_direct_control(ctx, nonce)
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Service log or denied-origin log with the nonce = escape; else refused/contained."""
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        service = self._listener(ctx, "service")
        if service is None:
            return _unprepared("service", observed)
        service_hits = service.records_with(ctx.nonce)
        origin_hits = _denied_origin_hits(witness, ctx.nonce)
        reasons = [
            (
                f"service saw {len(service_hits)} connections and the denied origin "
                f"{len(origin_hits)} direct requests with the nonce"
            ),
            f"payload: {_summary(escapes)}",
        ]
        escape = _judge(
            observed, bool(service_hits or origin_hits), _private_namespace(report, "net"), reasons
        )
        return _conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"service": service_hits, "denied_origin": origin_hits},
        )


class NetProxyEnvOverride(_PerCellSpec):
    """`NO_PROXY=*` or a rogue `ALL_PROXY` must not open a way around the proxy."""

    id = "net_proxy_env_override"
    area = "net"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied wherever the network is confined: the variables are the payload's to change."""
        return _confined_network(policy)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the cell's rogue proxy (answers 200 to anything, dials nothing)."""
        rogue = LoopbackWitness("127.0.0.1", tcp=True, banner=ROGUE_REPLY)
        rogue.start()
        self._cells.put(ctx.nonce, {"rogue": rogue})
        hosts = ctx.world.info.hosts
        denied, allowed = hosts["denied"], hosts["allowed"]
        return {
            "rogue_proxy": rogue.hostport(rogue.tcp_port),
            "denied": {
                "name": denied.name,
                "address": denied.address,
                "http_port": denied.http_port,
            },
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches the rogue proxy and the denied origin directly, both logged."""
        rogue = self._listener(ctx, "rogue")
        if rogue is None:
            return _unprepared_control("rogue")
        nonce = _control_nonce()
        hostport = rogue.hostport(rogue.tcp_port)

        def via_rogue() -> dict[str, Any]:
            line = f"GET http://denied.test/ok?nonce={nonce} HTTP/1.1\r\n\r\n".encode()
            reply = _tcp_line(hostport, line)
            return _check(
                "host reaches the rogue proxy", reply.startswith(b"HTTP/1.1 200"), repr(reply[:40])
            )

        checks = _listener_control("host reaches the rogue proxy", rogue, nonce, via_rogue)
        checks += _origin_direct_control(ctx, nonce)
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Rogue proxy or denied origin saw the nonce = escape; the proxy route must still work."""
        escapes = _attempts(report, "escape")
        controls = _attempts(report, "control")
        observed = _observed(escapes)
        rogue = self._listener(ctx, "rogue")
        if rogue is None:
            return _unprepared("rogue proxy", observed)
        rogue_hits = rogue.records_with(ctx.nonce)
        origin_hits = _denied_origin_hits(witness, ctx.nonce)
        reasons = [
            (
                f"rogue proxy saw {len(rogue_hits)} and the denied origin {len(origin_hits)} "
                "requests with the nonce"
            ),
            f"payload: {_summary(escapes)}",
        ]
        escape = _judge(
            observed, bool(rogue_hits or origin_hits), _private_namespace(report, "net"), reasons
        )
        # Where the declared route is a proxy, it must still work after the variables were
        # restored: otherwise the refusals may only show a dead network, not enforcement.
        inside_ok = ctx.policy.network != "proxy" or (
            bool(controls)
            and all(a.get("outcome") == "succeeded" and a.get("status") == 200 for a in controls)
        )
        return _conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"rogue_proxy": rogue_hits, "denied_origin": origin_hits},
        )


# The attempts with no host listener: judged by the payload's report and its namespace.
_LOCAL_CAPABILITIES = ("icmp-echo", "raw-socket", "packet-socket")


def host_capabilities() -> dict[str, str]:
    """What THIS host process can do of the local capabilities: "ok" or the errno name."""
    found: dict[str, str] = {}
    kinds = {
        "icmp-echo": ("AF_INET", socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
        "raw-socket": ("AF_INET", socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "packet-socket": ("AF_PACKET", socket.SOCK_RAW, 0),
    }
    for what, (family_name, kind, proto) in kinds.items():
        family = getattr(socket, family_name, None)
        if family is None:
            found[what] = "EAFNOSUPPORT"
            continue
        try:
            socket.socket(family, kind, proto).close()  # created and closed: nothing sent
        except OSError as exc:
            found[what] = errno_name(exc)
        else:
            found[what] = "ok"
    return found


def payload_capabilities(user: PayloadUser | None) -> dict[str, str]:
    """`host_capabilities()` as the payload user (unconfined): what a sandbox could take away.

    The harness may be root; the payload never is, so root's raw sockets say nothing about
    what the payload could do on an open host.
    """
    if user is None:
        return host_capabilities()
    code = (
        "import json; from harness.catalog.net_wide import host_capabilities; "
        "print(json.dumps(host_capabilities()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HOST_TIMEOUT_S * 3,
        check=False,
        cwd="/",
        **user.popen_kwargs(),
    )
    try:
        found = json.loads(done.stdout)
    except ValueError:
        tail = done.stderr.strip()[-300:]
        return dict.fromkeys(_LOCAL_CAPABILITIES, f"unmeasured (exit {done.returncode}: {tail})")
    return {str(k): str(v) for k, v in found.items()}


def errno_name(exc: OSError) -> str:
    """`EPERM` for an OSError carrying errno 1, else its class name."""
    return errno.errorcode.get(exc.errno or -1, type(exc).__name__)


class NetIpv6UdpIcmp(_PerCellSpec):
    """IPv6 TCP/UDP, IPv4 UDP, ICMP echo and raw/packet sockets, past a TCP-minded filter."""

    id = "net_ipv6_udp_icmp"
    area = "net"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied wherever the network is confined; seen on the open control leg."""
        return _confined_network(policy)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the [::1] TCP+UDP listener (if the host has IPv6 loopback) and a UDP one."""
        state: dict[str, Any] = {}
        v4 = LoopbackWitness("127.0.0.1", tcp=False, udp=True)
        v4.start()
        state["v4"] = v4
        targets: dict[str, Any] = {
            "tcp6": None,
            "udp6": None,
            "udp4": v4.hostport(v4.udp_port),
            "icmp": "127.0.0.1",
        }
        if has_ipv6_loopback():
            v6 = LoopbackWitness("::1", tcp=True, udp=True)
            v6.start()
            state["v6"] = v6
            targets["tcp6"] = v6.hostport(v6.tcp_port)
            targets["udp6"] = v6.hostport(v6.udp_port)
        self._cells.put(ctx.nonce, state)
        return targets

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches each listener (logged); its own local capabilities are recorded."""
        nonce = _control_nonce()
        v4, v6 = self._listener(ctx, "v4"), self._listener(ctx, "v6")
        checks: list[dict[str, Any]] = []
        line = f"nonce={nonce}\n".encode()
        if v6 is not None:
            tcp6, udp6 = v6.hostport(v6.tcp_port), v6.hostport(v6.udp_port)

            def tcp() -> dict[str, Any]:
                _tcp_line(tcp6, line)
                return _check("host tcp6 connect", ok=True, detail=tcp6)

            def udp() -> dict[str, Any]:
                _udp_send(udp6, line)
                return _check("host udp6 datagram", ok=True, detail=udp6)

            checks += _listener_control("host tcp6 connect", v6, nonce, tcp)
            checks += _listener_control("host udp6 datagram", v6, nonce, udp)
        if v4 is not None:
            udp4 = v4.hostport(v4.udp_port)

            def udp_v4() -> dict[str, Any]:
                _udp_send(udp4, line)
                return _check("host udp4 datagram", ok=True, detail=udp4)

            checks += _listener_control("host udp4 datagram", v4, nonce, udp_v4)
        capabilities = payload_capabilities(ctx.user)
        unmeasured = sorted(w for w, v in capabilities.items() if v.startswith("unmeasured"))
        # An attempt the host could not measure would drop out of the judgement as "the host
        # lacks it": not measuring is a failed control, never a silent pass. (Only a failure
        # is added: a passing check must not turn a control with no listener checks green.)
        if unmeasured:
            checks.append(
                _check(
                    "payload user's local capabilities measured",
                    ok=False,
                    detail="; ".join(f"{w}: {capabilities[w]}" for w in unmeasured),
                )
            )
        result = _control(nonce, checks)
        result["capabilities"] = capabilities
        result["ipv6_loopback"] = v6 is not None
        return result

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Listener hits or a local capability used in the host's namespace = escape."""
        del witness  # this probe's witnesses are its own listeners and the namespace
        escapes = _attempts(report, "escape")
        v4, v6 = self._listener(ctx, "v4"), self._listener(ctx, "v6")
        if v4 is None:
            return _unprepared("listeners", _observed(escapes))
        hits = {
            "udp4-datagram": [e for e in v4.records_with(ctx.nonce) if e["proto"] == "udp"],
            "tcp6-connect": [],
            "udp6-datagram": [],
        }
        if v6 is not None:
            for entry in v6.records_with(ctx.nonce):
                hits["tcp6-connect" if entry["proto"] == "tcp" else "udp6-datagram"].append(entry)
        private = _private_namespace(report, "net")
        theirs = report.get("facts", {}).get("netns")
        host_ns = theirs is not None and private is None and theirs == _namespace("net")
        local_seen = [
            a
            for a in escapes
            if a.get("what") in _LOCAL_CAPABILITIES and a.get("outcome") == "succeeded" and host_ns
        ]
        # A local capability the host itself lacks cannot be seen refused: leave it out.
        capabilities = control.get("capabilities", {})
        absent = [w for w in _LOCAL_CAPABILITIES if capabilities.get(w, "ok") != "ok"]
        judged = [
            a for a in escapes if not (a.get("what") in absent and a.get("outcome") != "succeeded")
        ]
        observed = _observed(judged)
        seen = [w for w, entries in hits.items() if entries]
        reasons = []
        if seen or local_seen:
            reasons.append(
                "host saw "
                + ", ".join(
                    [f"{w} ({len(hits[w])} with the nonce)" for w in seen]
                    + [f"{a['what']} succeeded in the host's network namespace" for a in local_seen]
                )
            )
        reasons.append(f"payload: {_summary(escapes)}")
        if absent:
            reasons.append(
                f"not judged (the host itself cannot): {', '.join(absent)} "
                f"({', '.join(capabilities[w] for w in absent)})"
            )
        escape = _judge(observed, bool(seen or local_seen), private, reasons)
        if v6 is None and escape != "escaped":
            reasons.insert(
                0,
                "the host has no IPv6 loopback: the IPv6 attempts cannot be judged "
                "(enable it: sysctl -w net.ipv6.conf.lo.disable_ipv6=0)",
            )
            escape = "undecided"
        return _conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"listeners": hits, "local_in_host_netns": local_seen},
        )


SPECS: tuple[ProbeSpec, ...] = (
    NetHostCanonical(),
    NetProxyConfusion(),
    NetProxyEnvOverride(),
    NetLoopbackServices(),
    NetPrivateAddress(),
    NetIpv6UdpIcmp(),
)
