"""Raw bytes through the harness's egress proxy, host side: what the wire probes share.

Four probes (issue 28, "Through the proxy": `smuggling`, `upgrade`, `relay`, `rebinding`) share
one payload, `probes/net_proxy_wire.py`, which writes host-built bytes to the proxy
(`WireRequest`) and reports the statuses it got back.

The witnesses are the host's: the origins' access logs (a request tagged with an escape's
`a=` that an origin served as anything but the allowed host itself, or anything the denied
origin served with the nonce) and the harness proxy's decision log (an admission for the denied
host), read by `assess_wire`. What the payload says only counts as a refusal when the escaping
bytes were actually put to the proxy. Every target is harness-owned.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
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
    no_network_reason,
    refused_by_no_network,
    route_tag,
)
from sandbox_attest.catalog.net.witness import PerCellSpec
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    WitnessRecordsLike,
)
from sandbox_attest.verdict import Assessment, Escape, Expectation

if TYPE_CHECKING:
    from sandbox_attest.catalog.spec import ClaimsLike


# The payload replaces this with the Proxy-Authorization line (or nothing) in every part.
AUTH: Final = "{auth}"


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


def wire_head(*lines: str) -> str:
    """A request head with the auth placeholder after the last header and the blank line."""
    return "\r\n".join(lines) + AUTH + "\r\n\r\n"


@dataclass(frozen=True)
class WireHosts:
    """The allowed and denied origins' plain-HTTP authorities for one cell."""

    allowed: str
    denied: str
    nonce: str

    def url(self, authority: str, tag: str) -> str:
        """The plain-HTTP /ok URL at `authority`, with the nonce and the `a=` tag."""
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


def wire_hosts(ctx: CellContext) -> WireHosts:
    """The cell's allowed and denied plain-HTTP authorities and its nonce."""
    hosts = ctx.world.info.hosts
    allowed, denied = hosts["allowed"], hosts["denied"]
    return WireHosts(
        allowed=f"{allowed.name}:{allowed.http_port}",
        denied=f"{denied.name}:{denied.http_port}",
        nonce=ctx.nonce,
    )


def control_get(h: WireHosts) -> WireRequest:
    """The control: a plain GET of the allowed origin, which must answer with the nonce."""
    return WireRequest(
        what="get-allowed",
        role="control",
        parts=(
            wire_head(
                f"GET {h.url(h.allowed, 'get-allowed')} HTTP/1.1",
                f"Host: {h.allowed}",
                f"X-Attest-Nonce: {h.nonce}",
                "Connection: close",
            ),
        ),
    )


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


def assess_wire(
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


class WireSpec(PerCellSpec):
    """A probe whose attempts are raw bytes through the harness proxy."""

    host_readings: tuple[str, ...] = ("proxy decision log", "origin access logs")
    # What a proxy that lets these requests through must change (the FAIL's fix).
    fix: str = ""

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied on every leg: every leg's only route is the proxy, which must refuse these."""
        del declared
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

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The proxy refuses the host's ambiguous framing (logged 400); the allowed host works."""
        nonce = new_control_nonce()
        return control_record(
            nonce, proxy_refuses_framing(ctx, nonce) + allowed_control(ctx, nonce)
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """No origin served a request the proxy should have refused, and it admitted none."""
        return assess_wire(ctx, report, witness, control, self.requests(ctx), self.fix)


def proxy_refuses_framing(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
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
