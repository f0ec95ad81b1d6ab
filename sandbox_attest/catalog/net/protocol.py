"""The proxy's protocol surface, host side: smuggling, upgrades, HTTP/2 and DNS rebinding.

Three probes (issue 28, "Through the proxy") share one payload, `probes/net_proxy_wire.py`,
which writes host-built bytes to the proxy and reports the statuses it got back:

- `net_proxy_smuggling`: a request to the allowed origin whose body carries a second request
  to the denied host, framed so that a proxy and an origin may disagree where the body ends
  (a GET body the origin ignores, Content-Length with Transfer-Encoding either way round, two
  Content-Lengths, an obfuscated coding, an obs-fold, the bytes after the last chunk);
- `net_proxy_upgrade`: `Upgrade: websocket` to the denied host, `Upgrade: websocket` and
  `Upgrade: h2c` to the allowed origin followed on the same connection by a request to the
  denied host (an upgrade must not turn an allowed connection into a tunnel), and the HTTP/2
  prior-knowledge preface with a GET for the denied host in its HEADERS frame;
- `net_dns_rebinding`: an allowlisted name below `private.test` whose first DNS answer is the
  origins' lab address and every later one a per-cell loopback address where the host
  listens: a proxy that checks one answer and dials another reaches that listener.

The witnesses are the host's: the origins' access logs (a request tagged with an escape's
`a=` that an origin served as anything but the allowed host itself, or anything the denied
origin served with the nonce), the harness proxy's decision log (an admission for the denied
host), and for rebinding the per-cell listener. What the payload says only counts as a
refusal when the escaping bytes were actually put to the proxy.

Every target is harness-owned: the origins, the DNS fixture and a loopback listener. The
rebinding name's answers are the origins' own address and a loopback address, never anything
else (`_check_rebinding_answers`).
"""

from __future__ import annotations

import base64
import ipaddress
import secrets
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    new_control_nonce,
)
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.net.route import (
    PAST_RULES_STATUSES,
    allowed_control,
    claims_no_network,
    deny_control,
    no_network_reason,
    refused_by_no_network,
    route_tag,
)
from sandbox_attest.catalog.net.witness import LoopbackWitness, PerCellSpec
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    WitnessRecordsLike,
)
from sandbox_attest.errors import FixtureError
from sandbox_attest.verdict import Assessment, Escape, Expectation
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.lab import current_lab

if TYPE_CHECKING:
    from sandbox_attest.catalog.spec import PolicyLike

# The payload replaces this with the Proxy-Authorization line (or nothing) in every part.
AUTH: Final = "{auth}"
NOT_IN_LAB: Final = (
    "needs the lab world: the rebinding name's first answer must be an address the proxy "
    "admits for a planted name, and only the lab's origins have one; run as root on Linux "
    "(--world lab)"
)


@dataclass(frozen=True)
class WireRequest:
    """One connection's bytes for the payload to write to the proxy.

    Attributes:
        what: the attempt's name; also the `a=` tag of the escaping request inside it.
        role: "escape" or "control".
        parts: text written in order (latin-1); one response is read after each but the last.
        carriers: how many answers the allowed requests in front of the escape may get; an
            answer beyond them is the escaping request's.
        denied_target: the request-target of the escaping request, as the proxy would log it.
    """

    what: str
    role: str
    parts: tuple[str, ...]
    carriers: int = 0
    denied_target: str = ""

    def to_task(self) -> dict[str, Any]:
        """The JSON the payload reads."""
        return {
            "what": self.what,
            "role": self.role,
            "parts": list(self.parts),
            "carriers": self.carriers,
        }


def _head(*lines: str) -> str:
    """A request head with the auth placeholder after the last header and the blank line."""
    return "\r\n".join(lines) + AUTH + "\r\n\r\n"


@dataclass(frozen=True)
class _Hosts:
    """The allowed and denied origins' plain-HTTP authorities for one cell."""

    allowed: str
    denied: str
    nonce: str

    def url(self, authority: str, tag: str) -> str:
        return f"http://{authority}/ok?nonce={self.nonce}&a={tag}"

    def smuggled(self, tag: str) -> str:
        """The request to the denied host that rides inside an allowed one (no auth line)."""
        return (
            f"GET {self.url(self.denied, tag)} HTTP/1.1\r\nHost: {self.denied}\r\n"
            f"X-Attest-Nonce: {self.nonce}\r\n\r\n"
        )

    def carrier(self, tag: str, *extra: str) -> str:
        """A GET to the allowed origin with `extra` headers, without its final blank line."""
        return "\r\n".join(
            [
                f"GET {self.url(self.allowed, 'carrier-' + tag)} HTTP/1.1",
                f"Host: {self.allowed}",
                f"X-Attest-Nonce: {self.nonce}",
                *extra,
            ]
        )


def _hosts(ctx: CellContext) -> _Hosts:
    hosts = ctx.world.info.hosts
    allowed, denied = hosts["allowed"], hosts["denied"]
    return _Hosts(
        allowed=f"{allowed.name}:{allowed.http_port}",
        denied=f"{denied.name}:{denied.http_port}",
        nonce=ctx.nonce,
    )


def _control_get(h: _Hosts) -> WireRequest:
    return WireRequest(
        what="get-allowed",
        role="control",
        parts=(
            _head(
                f"GET {h.url(h.allowed, 'get-allowed')} HTTP/1.1",
                f"Host: {h.allowed}",
                f"X-Attest-Nonce: {h.nonce}",
                "Connection: close",
            ),
        ),
    )


def _smuggle(h: _Hosts, what: str, headers: tuple[str, ...], body: str) -> WireRequest:
    """An allowed GET carrying `body` (which holds the denied request) under `headers`."""
    return WireRequest(
        what=what,
        role="escape",
        parts=(h.carrier(what, *headers) + AUTH + "\r\n\r\n" + body,),
        carriers=1,
        denied_target=h.url(h.denied, what),
    )


def smuggling_requests(h: _Hosts) -> list[WireRequest]:
    """The control GET and seven framings that hide a request to the denied host."""
    inner = {what: h.smuggled(what) for what in _SMUGGLING}
    last = "0\r\n\r\n"

    def chunk(text: str) -> str:
        return f"{len(text.encode('latin-1')):x}\r\n{text}\r\n{last}"

    def size(text: str) -> str:
        return f"Content-Length: {len(text.encode('latin-1'))}"

    bodies = {
        "cl0-get-body": inner["cl0-get-body"],
        "cl-te": last + inner["cl-te"],
        "te-cl": chunk(inner["te-cl"]),
        "duplicate-cl": inner["duplicate-cl"],
        "te-obfuscated": inner["te-obfuscated"],
        "obs-fold": last + inner["obs-fold"],
        "te-chunked-tail": last + inner["te-chunked-tail"],
    }
    headers: dict[str, tuple[str, ...]] = {
        # The origin ignores a GET's body, so a proxy that keeps the upstream connection open
        # delivers the body as a second request (a CL.0 desync).
        "cl0-get-body": (size(bodies["cl0-get-body"]),),
        "cl-te": (size(bodies["cl-te"]), "Transfer-Encoding: chunked"),
        "te-cl": ("Transfer-Encoding: chunked", "Content-Length: 3"),
        "duplicate-cl": ("Content-Length: 0", size(bodies["duplicate-cl"])),
        "te-obfuscated": ("Transfer-Encoding: xchunked", size(bodies["te-obfuscated"])),
        "obs-fold": (size(bodies["obs-fold"]), "Transfer-Encoding:", " chunked"),
        # Chunked alone is legal: the proxy must end the request at the last chunk and never
        # pass the bytes after it on as a request of their own.
        "te-chunked-tail": ("Transfer-Encoding: chunked",),
    }
    return [_control_get(h)] + [_smuggle(h, w, headers[w], bodies[w]) for w in _SMUGGLING]


_SMUGGLING: Final = (
    "cl0-get-body",
    "cl-te",
    "te-cl",
    "duplicate-cl",
    "te-obfuscated",
    "obs-fold",
    "te-chunked-tail",
)

_WS_KEY: Final = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
# An empty SETTINGS payload, base64url as RFC 7540 3.2.1 asks.
_H2_SETTINGS: Final = "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA"


def _hpack_literal(name: str, value: str) -> bytes:
    """One header as an HPACK literal without indexing, new name, no Huffman (RFC 7541 6.2.2)."""

    def string(text: str) -> bytes:
        raw = text.encode("latin-1")
        if len(raw) >= 127:
            # A 7-bit prefix integer with continuation (RFC 7541 5.1).
            out, rest = bytearray([127]), len(raw) - 127
            while rest >= 128:
                out.append((rest & 0x7F) | 0x80)
                rest >>= 7
            out.append(rest)
            return bytes(out) + raw
        return bytes([len(raw)]) + raw

    return b"\x00" + string(name) + string(value)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, stream id, payload (RFC 7540 4.1)."""
    head = struct.pack("!I", len(payload))[1:] + bytes([kind, flags]) + struct.pack("!I", stream)
    return head + payload


def h2_prior_knowledge(h: _Hosts, what: str) -> str:
    """The HTTP/2 preface, SETTINGS and a HEADERS frame for a GET to the denied host."""
    block = b"".join(
        _hpack_literal(n, v)
        for n, v in (
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", h.denied),
            (":path", f"/ok?nonce={h.nonce}&a={what}"),
            ("x-attest-nonce", h.nonce),
        )
    )
    settings = _frame(0x4, 0, 0, b"")
    headers = _frame(0x1, 0x5, 1, block)  # END_STREAM | END_HEADERS on stream 1
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    return (preface + settings + headers).decode("latin-1")


def upgrade_requests(h: _Hosts) -> list[WireRequest]:
    """The control GET and four upgrades: one to the denied host, two of an allowed connection.

    The two upgrades of an allowed connection are followed on it by a request to the denied
    host; the fourth is HTTP/2 with prior knowledge, its GET for the denied host.
    """
    then = "Connection: Upgrade"

    def tunnel(what: str, *headers: str) -> WireRequest:
        second = _head(
            f"GET {h.url(h.denied, what)} HTTP/1.1",
            f"Host: {h.denied}",
            f"X-Attest-Nonce: {h.nonce}",
        )
        return WireRequest(
            what=what,
            role="escape",
            parts=(h.carrier(what, *headers) + AUTH + "\r\n\r\n", second),
            carriers=1,
            denied_target=h.url(h.denied, what),
        )

    denied = "upgrade-websocket-denied"
    return [
        _control_get(h),
        WireRequest(
            what=denied,
            role="escape",
            parts=(
                _head(
                    f"GET {h.url(h.denied, denied)} HTTP/1.1",
                    f"Host: {h.denied}",
                    f"X-Attest-Nonce: {h.nonce}",
                    "Upgrade: websocket",
                    then,
                    _WS_KEY,
                    "Sec-WebSocket-Version: 13",
                ),
            ),
            denied_target=h.url(h.denied, denied),
        ),
        tunnel(
            "upgrade-websocket-allowed",
            "Upgrade: websocket",
            then,
            _WS_KEY,
            "Sec-WebSocket-Version: 13",
        ),
        tunnel(
            "upgrade-h2c-allowed",
            "Upgrade: h2c",
            "Connection: Upgrade, HTTP2-Settings",
            _H2_SETTINGS,
        ),
        WireRequest(
            what="h2-prior-knowledge",
            role="escape",
            parts=(h2_prior_knowledge(h, "h2-prior-knowledge"),),
            denied_target=h.url(h.denied, "h2-prior-knowledge"),
        ),
    ]


# ---------------------------------------------------------------------------------------------
# The shared reading


def _escape_hits(
    ctx: CellContext, requests: list[WireRequest], witness: WitnessRecordsLike
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(origin entries, proxy admissions) that show an escaping request got through.

    An origin entry counts when it carries an escape's tag and was not the allowed origin
    serving a request for itself, or when the denied origin served anything with the nonce.
    A proxy line counts when it admitted (or dialed for) the denied host, or a loopback
    address (a target on the proxy's own host: its own listener, a relay back into itself).
    """
    hosts = ctx.world.info.hosts
    allowed = {f"{hosts['allowed'].name}:{hosts['allowed'].http_port}", hosts["allowed"].name}
    denied_name = hosts["denied"].name
    tags = {r.what for r in requests if r.role == "escape"}
    origin = [
        o
        for o in entries_with_nonce(witness.origin, ctx.nonce)
        if o.get("host") == "denied"
        or (
            route_tag(o) in tags
            and not (o.get("host") == "allowed" and str(o.get("host_header")) in allowed)
        )
    ]
    proxy = [
        p
        for p in entries_with_nonce(witness.proxy, ctx.nonce)
        if (p.get("host") == denied_name or _is_loopback(str(p.get("host"))))
        and (p.get("decision") == "allow" or p.get("status") in PAST_RULES_STATUSES)
    ]
    return origin, proxy


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _exercised(attempt: dict[str, Any], request: WireRequest | None) -> bool:
    """Whether the escaping bytes were put to the proxy, or it ended the exchange first.

    Every part written is the plain case. A proxy that answered the carriers and then closed
    (or refused the carrier) has also been asked: the rest had nowhere to go.
    """
    if request is None:
        return False
    sent = attempt.get("sent")
    statuses = attempt.get("statuses") or []
    if not isinstance(sent, int) or not isinstance(statuses, list):
        return False
    if sent == len(request.parts):
        return True
    return sent >= request.carriers and len(statuses) >= max(request.carriers, 1)


def _assess_wire(
    ctx: CellContext,
    report: dict[str, Any],
    witness: WitnessRecordsLike,
    control: dict[str, Any],
    requests: list[WireRequest],
    fix: str,
) -> Assessment:
    """Escaped if a witness saw an escaping request; refused only if each was put to the proxy."""
    escapes = attempts_by_role(report, "escape")
    controls = attempts_by_role(report, "control")
    observed = observed_outcome(escapes)
    if not requests:
        missing = ["prepare() did not run for this cell: no requests to judge"]
        return Assessment("undecided", controls_ok=False, reasons=missing, observed=observed)
    origin, proxy = _escape_hits(ctx, requests, witness)
    reasons: list[str] = []
    no_network = claims_no_network(ctx) and refused_by_no_network([*escapes, *controls])
    escape: Escape
    if origin or proxy:
        got = sorted(
            {str(route_tag(o)) for o in origin} | {str(p.get("target"))[:80] for p in proxy}
        )
        reasons.append(
            f"a request to the denied host got past the proxy: origins served "
            f"{len(origin)} escaping requests, the proxy admitted {len(proxy)} for the denied "
            f"host ({', '.join(got[:6])}); fix: {fix}"
        )
        escape = "escaped"
    elif no_network:
        reasons.append(no_network_reason(escapes))
        escape = "refused"
    else:
        by_what = {r.what: r for r in requests}
        succeeded = [a for a in escapes if a.get("outcome") == "succeeded"]
        unexercised = [
            str(a.get("what"))
            for a in escapes
            if not _exercised(a, by_what.get(str(a.get("what"))))
        ]
        if observed == "error":
            escape = "undecided"
        elif succeeded:
            reasons.append(
                "the payload got an answer past the allowed request, but no origin logged "
                "the escaping request: " + ", ".join(str(a.get("what")) for a in succeeded)
            )
            escape = "disagree"
        elif unexercised:
            reasons.append(
                "the escaping bytes were never put to the proxy: " + ", ".join(unexercised)
            )
            escape = "undecided"
        else:
            escape = "refused"
        reasons.append(f"payload: {attempts_summary(escapes)}")
        reasons.append("no origin served an escaping request; the proxy admitted none")
    inside_ok = no_network or (
        bool(controls)
        and all(
            a.get("outcome") == "succeeded" and "nonce echoed" in str(a.get("detail", ""))
            for a in controls
        )
    )
    return conclude(
        escape,
        observed,
        reasons,
        inside=controls,
        inside_ok=inside_ok,
        host_control=control,
        witness={"origin": origin, "proxy_admitted": proxy},
    )


class _WireSpec(PerCellSpec):
    """A probe whose attempts are raw bytes through the harness proxy."""

    host_readings: tuple[str, ...] = ("proxy decision log", "origin access logs")

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied on every leg: every leg's only route is the proxy, which must refuse these."""
        del policy
        return "denied"

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """The requests of this probe for one cell."""
        raise NotImplementedError

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Build the cell's requests (kept for `assess`) and hand them to the payload."""
        requests = self.build(ctx)
        state = self._cells.get(ctx.nonce)
        self._cells.put(ctx.nonce, {**state, "requests": requests})
        return {"requests": [r.to_task() for r in requests]}

    def requests(self, ctx: CellContext) -> list[WireRequest]:
        """The requests `prepare` built for this cell (empty if it did not run)."""
        found: list[WireRequest] = self._cells.get(ctx.nonce).get("requests", [])
        return found

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """One attempt per request the host built for the cell, named as the request is."""
        requests = (task.get("targets") or {}).get("requests") or []
        return AttemptTable(required=attempts_of(*(str(r.get("what")) for r in requests)))


def _proxy_refuses_framing(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
    """The host sends the proxy a Content-Length + Transfer-Encoding GET: 400, logged."""
    info = ctx.world.info
    allowed = info.hosts["allowed"]
    authority = f"{allowed.name}:{allowed.http_port}"
    url = urlsplit(info.proxy.url)
    auth = ""
    if url.username is not None:
        cred = f"{unquote(url.username)}:{unquote(url.password or '')}"
        auth = "\r\nProxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode()
    head = (
        f"GET http://{authority}/ok?nonce={nonce} HTTP/1.1\r\nHost: {authority}\r\n"
        f"X-Attest-Nonce: {nonce}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked"
        f"{auth}\r\n\r\n0\r\n\r\n"
    )

    def send() -> dict[str, Any]:
        where = (url.hostname or "127.0.0.1", url.port or 80)
        with socket.create_connection(where, HOST_TIMEOUT_S) as sock:
            sock.sendall(head.encode("latin-1"))
            answer = sock.recv(4096).decode("latin-1", "replace")
        first = answer.split("\r\n", 1)[0]
        return host_check("host's ambiguous framing refused", " 400 " in first + " ", first)

    what = "host's ambiguous framing refused"
    checks = [guarded_check(what, send)]
    records = wait_for_records(
        ctx.world, nonce, lambda r: any(p.get("status") == 400 for p in r.proxy)
    )
    logged = [p for p in entries_with_nonce(records.proxy, nonce) if p.get("status") == 400]
    checks.append(host_check("proxy logged the host's 400", bool(logged), f"{len(logged)} lines"))
    return checks


class NetProxySmuggling(_WireSpec):
    """A request hidden in an allowed request's body must never reach an origin."""

    id = "net_proxy_smuggling"
    area = "net"

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """The control and the seven framings."""
        return smuggling_requests(_hosts(ctx))

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The proxy answers the host's ambiguous framing with a logged 400; allowed works."""
        nonce = new_control_nonce()
        return control_record(
            nonce, _proxy_refuses_framing(ctx, nonce) + allowed_control(ctx, nonce)
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """No origin served a smuggled request and the proxy admitted none = refused."""
        fix = (
            "refuse a request with both Content-Length and Transfer-Encoding, conflicting "
            "Content-Lengths, an unknown coding or a folded header (400), and end the upstream "
            "exchange after one request (Connection: close) so no body byte is read as a request"
        )
        return _assess_wire(ctx, report, witness, control, self.requests(ctx), fix)


class NetProxyUpgrade(_WireSpec):
    """Upgrade and HTTP/2 must not reach the denied host or turn a connection into a tunnel."""

    id = "net_proxy_upgrade"
    area = "net"

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """The control, the denied upgrade, two tunnelling upgrades and the HTTP/2 preface."""
        return upgrade_requests(_hosts(ctx))

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The proxy refuses the host's ambiguous framing (its log works); allowed works."""
        nonce = new_control_nonce()
        return control_record(
            nonce, _proxy_refuses_framing(ctx, nonce) + allowed_control(ctx, nonce)
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """No origin served the request behind an upgrade or in the HTTP/2 frame = refused."""
        fix = (
            "judge an Upgrade request like any other (403 for a denied host), strip Upgrade "
            "and never relay the client's bytes after the response as a tunnel, and refuse "
            "the HTTP/2 preface unless each HTTP/2 request is checked"
        )
        return _assess_wire(ctx, report, witness, control, self.requests(ctx), fix)


# The payload replaces this with its proxy's own host:port (the route it was given).
PROXY_SELF: Final = "{proxy}"


def relay_requests(h: _Hosts) -> list[WireRequest]:
    """The control GET and a relay through the proxy back into itself, then to the denied host.

    A CONNECT to the proxy's own address makes the proxy a client of itself: a second request
    inside that tunnel arrives from the proxy's own host, which a proxy that trusts local
    clients (or itself) would not check. The inner request goes to the denied host.
    """
    what = "relay-through-proxy"
    inner = _head(
        f"GET {h.url(h.denied, what)} HTTP/1.1",
        f"Host: {h.denied}",
        f"X-Attest-Nonce: {h.nonce}",
        "Connection: close",
    )
    outer = _head(
        f"CONNECT {PROXY_SELF} HTTP/1.1", f"Host: {PROXY_SELF}", f"X-Attest-Nonce: {h.nonce}"
    )
    return [
        _control_get(h),
        WireRequest(
            what=what,
            role="escape",
            parts=(outer, inner),
            carriers=1,
            denied_target=h.url(h.denied, what),
        ),
    ]


class NetProxyRelay(_WireSpec):
    """A relay through the proxy back into itself must not carry a request past the allowlist."""

    id = "net_proxy_relay"
    area = "net"

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """The control and the relay through the proxy's own address."""
        return relay_requests(_hosts(ctx))

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The proxy refuses the host's own CONNECT to the proxy's address; allowed works."""
        nonce = new_control_nonce()
        url = urlsplit(ctx.world.info.proxy.url)
        authority = f"{url.hostname or '127.0.0.1'}:{url.port or 80}"
        checks = deny_control(
            ctx,
            authority,
            nonce,
            lambda p: p.get("nonce") == nonce and p.get("target") == authority,
        )
        return control_record(nonce, checks + allowed_control(ctx, nonce))

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Nothing admitted to the proxy's own host and the denied origin silent = refused."""
        fix = (
            "refuse a target on the proxy's own host (its listener, any loopback address) and "
            "give a connection the proxy made to itself no trust: check every request it "
            "carries against the allowlist"
        )
        return _assess_wire(ctx, report, witness, control, self.requests(ctx), fix)


# ---------------------------------------------------------------------------------------------
# net_dns_rebinding


def _rebind_address() -> str:
    """A per-cell loopback address, never 127.0.0.1 (which the loopback world's origins use)."""
    return f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def _check_rebinding_answers(first: str, then: str) -> None:
    """Plant only the origins' own address and a loopback address: nothing off this machine.

    A sandbox that brings its own proxy dials whatever the fixture answers.
    """
    if not ipaddress.ip_address(then).is_loopback:
        raise FixtureError(f"net_dns_rebinding will not plant {then}: plant loopback only")
    first_ip = ipaddress.ip_address(first)
    lab = ipaddress.ip_network("198.18.0.0/15")
    if not (first_ip.is_loopback or first_ip in lab):
        raise FixtureError(
            f"net_dns_rebinding will not plant {first}: only the origins' lab or loopback address"
        )


class _PortWitness(LoopbackWitness):
    """A loopback TCP witness on a given port (the allowed origin's), answering a 200."""

    def __init__(self, address: str, port: int) -> None:
        """Check the address; nothing is bound until `start`."""
        super().__init__(
            address,
            banner=b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nrebind",
        )
        self._port = port

    def start(self) -> None:
        """Bind the address on the wanted port and serve from a daemon thread."""
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            tcp.bind((self.address, self._port))
            tcp.listen(16)
        except OSError as exc:
            tcp.close()
            raise FixtureError(
                f"net_dns_rebinding could not listen on {self.address}:{self._port}: {exc}; "
                "free that port on this loopback address"
            ) from exc
        tcp.settimeout(0.2)
        self._socks.append(tcp)
        self.tcp_port = self._port
        self._spawn(self._accept_loop, tcp)


class NetDnsRebinding(_WireSpec):
    """A name whose answer changes between the proxy's check and its dial reaches nothing else."""

    id = "net_dns_rebinding"
    area = "net"
    host_readings = ("per-cell loopback listener", "DNS fixture query log", "origin access logs")

    def not_applicable(self, egress: str) -> str | None:
        """NOT_APPLICABLE outside the lab world, whatever the route.

        The name's first answer must be an address the proxy admits for a planted name, and
        only the lab has one (its origins' 198.18.0.0/15 address); in the loopback world every
        proxy refuses the first answer, so the check-then-dial window is never reached.
        """
        del egress
        return NOT_IN_LAB if current_lab() is None else None

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """Plant the rebinding name, start its listener; the control and one GET for it."""
        dns = getattr(ctx.world, "dns", None)
        if dns is None or not hasattr(dns, "set_answers"):
            return []
        allowed = ctx.world.info.hosts["allowed"]
        address = _rebind_address()
        _check_rebinding_answers(allowed.address, address)
        listener = _PortWitness(address, allowed.http_port)
        listener.start()
        name = f"{ctx.nonce}-rebind.{PRIVATE_NAME_SUFFIX}"
        dns.set_answers(name, [allowed.address, address])
        self._cells.put(ctx.nonce, {"listener": listener, "name": name, "address": address})
        h = _hosts(ctx)
        authority = f"{name}:{allowed.http_port}"
        target = h.url(authority, "get-rebind")
        return [
            _control_get(h),
            WireRequest(
                what="get-rebind",
                role="escape",
                parts=(
                    _head(
                        f"GET {target} HTTP/1.1",
                        f"Host: {authority}",
                        f"X-Attest-Nonce: {ctx.nonce}",
                        "Connection: close",
                    ),
                ),
                denied_target=target,
            ),
        ]

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The fixture rebinds a name of the host's; the listener logs the host; allowed works."""
        nonce = new_control_nonce()
        state = self._cells.get(ctx.nonce)
        listener = self._listener(ctx, "listener")
        dns = getattr(ctx.world, "dns", None)
        if listener is None or dns is None:
            return control_record(
                nonce, [host_check("rebinding prepared", ok=False, detail="no listener")]
            )
        info = ctx.world.info
        name = f"{nonce}-rebind.{PRIVATE_NAME_SUFFIX}"
        first, then = info.hosts["allowed"].address, str(state.get("address"))
        dns.set_answers(name, [first, then])

        def rebinds() -> dict[str, Any]:
            server = (info.dns.host, info.dns.port)
            try:
                got = [resolve(server, name, timeout=HOST_TIMEOUT_S) for _ in range(2)]
            except ResolveError as exc:
                return host_check("fixture rebinds the host's name", ok=False, detail=str(exc))
            ok = got == [[first], [then]]
            return host_check("fixture rebinds the host's name", ok, f"{name} -> {got}")

        def reach() -> dict[str, Any]:
            with socket.create_connection((then, listener.tcp_port), HOST_TIMEOUT_S) as sock:
                sock.sendall(f"GET /?nonce={nonce} HTTP/1.1\r\n\r\n".encode())
                sock.recv(256)
            return host_check("host reaches the rebinding listener", ok=True, detail=then)

        checks = [guarded_check("fixture rebinds the host's name", rebinds)]
        checks.append(guarded_check("host reaches the rebinding listener", reach))
        logged = listener.records_with(nonce)
        checks.append(host_check("listener logged the host", bool(logged), f"{len(logged)} lines"))
        checks += allowed_control(ctx, nonce)
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Escaped if the listener behind the second answer heard anything.

        Refused only if the name was resolved (the fixture logged it) and nothing reached the
        listener.
        """
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        state = self._cells.get(ctx.nonce)
        listener = self._listener(ctx, "listener")
        if listener is None:
            missing = ["prepare() did not run for this cell: no rebinding listener to witness"]
            return Assessment("undecided", controls_ok=False, reasons=missing, observed=observed)
        name, address = str(state.get("name")), str(state.get("address"))
        # Any connection counts (a proxy may dial and send nothing), but the host control's.
        host_nonce = str(control.get("nonce") or "\0")
        heard = [e for e in listener.records_with("") if host_nonce not in str(e.get("data", ""))]
        queried = [q for q in witness.dns if str(q.get("name", "")).rstrip(".").lower() == name]
        reasons: list[str] = []
        no_network = claims_no_network(ctx) and refused_by_no_network([*escapes, *controls])
        first = ctx.world.info.hosts["allowed"].address
        escape: Escape
        if heard:
            reasons.append(
                f"the proxy checked {name}'s first answer ({first}) and dialed its second: the "
                f"listener at {address}:{listener.tcp_port} heard {len(heard)} connections; "
                "fix: resolve once per request and dial exactly the address that was checked"
            )
            escape = "escaped"
        elif no_network:
            reasons.append(no_network_reason(escapes))
            escape = "refused"
        elif ipaddress.ip_address(first).is_loopback:
            reasons.append(
                "the loopback world has no address the proxy admits for a planted name, so "
                "no proxy ever reaches the check-then-dial window: run in the lab (--world lab)"
            )
            escape = "undecided"
        elif not queried:
            reasons.append(f"the DNS fixture never saw {name}: the rebinding was not exercised")
            escape = "undecided"
        elif observed == "error":
            escape = "undecided"
        else:
            reasons.append(
                f"the DNS fixture answered {len(queried)} queries for {name} and nothing reached "
                f"{address}: the proxy dialed only what it checked"
            )
            escape = "refused"
        reasons.append(f"payload: {attempts_summary(escapes)}")
        inside_ok = no_network or (
            bool(controls)
            and all(
                a.get("outcome") == "succeeded" and "nonce echoed" in str(a.get("detail", ""))
                for a in controls
            )
        )
        return conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"listener": heard, "dns": queried},
        )
