"""Requests through the harness's egress proxy: built on the host, read from its witnesses.

The probes that try to confuse the proxy (`confusion`, `private_address`) share this: the host
builds every request head (`ProxyRequest`), the payload sends them byte for byte, and the
proxy's decision log plus the origin logs are the witnesses. A refusal counts only when it came
as the proxy's own status; an "allow" decision for a target that must never be admitted, or any
origin request tagged with an escape attempt, is an escape (`assess_route`).

Every probe through the proxy (`allowlist`, `doh`, the wire probes too) also reads a backend's
no-network claim here, and uses the host controls `deny_control` and `allowed_control`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, urlsplit

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import guarded_check, host_check
from sandbox_attest.catalog.judging import conclude, judge_escape
from sandbox_attest.catalog.net.witness import REFUSAL_STATUSES, PerCellSpec
from sandbox_attest.catalog.proxyclient import connect_tunnel, https_via_proxy, split_hostport
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import AttemptTable, CellContext, ClaimsLike, WitnessRecordsLike
from sandbox_attest.verdict import Assessment, Escape, Expectation

if TYPE_CHECKING:
    from collections.abc import Callable

# errnos a payload gets when there is no network to try at all (a seccomp filter's EPERM, no
# route, nothing listening on the sandbox's own empty loopback): under network = "none" they
# are the claim holding, not an attempt that could not be made.
NO_NETWORK_ERRNOS: Final = frozenset(
    {"EPERM", "EACCES", "ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED", "EAFNOSUPPORT"}
)


def claims_no_network(ctx: CellContext) -> bool:
    """The backend claims no network at all (the proxy is out of its reach by design)."""
    return ctx.claims.network == "none"


def refused_by_no_network(attempts: list[dict[str, Any]]) -> bool:
    """Every attempt was refused by the network itself, before any proxy could answer."""
    return bool(attempts) and all(
        a.get("outcome") == "refused" and a.get("errno") in NO_NETWORK_ERRNOS for a in attempts
    )


def no_network_reason(attempts: list[dict[str, Any]]) -> str:
    """Why every refused attempt, the allowed control too, is the claimed "no network"."""
    errnos = ", ".join(sorted({str(a.get("errno")) for a in attempts}))
    return (
        'no network, as network = "none" claims: every attempt, the allowed control too, was '
        f"refused before any proxy ({errnos})"
    )


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


def request_head(method: str, target: str, nonce: str, host: str | None, *extra: str) -> str:
    """A request head: request line, Host (unless None), the nonce header, then `extra`."""
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"X-Attest-Nonce: {nonce}", *extra]
    return "\r\n".join(lines)


def _wire(text: str) -> str:
    """How the proxy logs a target the payload sent as UTF-8 (it decodes heads as latin-1)."""
    return text.encode("utf-8").decode("latin-1")


def connect_request(
    what: str, authority: str, nonce: str, sni: str, *, role: str = "escape", verify: bool = False
) -> ProxyRequest:
    """A CONNECT to `authority` (TLS to `sni` after a 200); an escape target unless a control."""
    return ProxyRequest(
        what=what,
        role=role,
        heads=(request_head("CONNECT", authority, nonce, authority),),
        escape_targets=(authority,) if role == "escape" else (),
        sni=sni,
        path=f"/ok?nonce={nonce}&a={what}",
        verify=verify,
    )


def absolute_request(
    what: str, authority: str, nonce: str, host: str | None, *extra: str, role: str = "escape"
) -> ProxyRequest:
    """An absolute-form GET of `authority`'s /ok, Host `host`; an escape target unless a control."""
    target = f"http://{authority}/ok?nonce={nonce}&a={what}"
    return ProxyRequest(
        what=what,
        role=role,
        heads=(request_head("GET", target, nonce, host, "Connection: close", *extra),),
        escape_targets=(target,) if role == "escape" else (),
    )


def route_tag(entry: dict[str, Any]) -> str | None:
    """The `a=` tag of an origin log entry's path (also inside an absolute-form path)."""
    path = str(entry.get("path", ""))
    values = parse_qs(urlsplit(path).query).get("a")
    return values[0] if values else None


@dataclass
class RouteReading:
    """What the witnesses say about a set of proxy requests with one nonce."""

    admitted: list[dict[str, Any]] = field(default_factory=list)
    denies: list[dict[str, Any]] = field(default_factory=list)
    origin_hits: list[dict[str, Any]] = field(default_factory=list)
    listener_hits: list[dict[str, Any]] = field(default_factory=list)
    # Escape tags the allowed origin served as itself (`_allowed_as_itself`): not escapes.
    rewritten: set[str] = field(default_factory=set)


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


def _allowed_as_itself(entry: dict[str, Any], allowed: set[str]) -> bool:
    """An origin request that the allowed origin served under its own name and port.

    A proxy may answer a Host-header confusion by rewriting the header to the request line's
    host (srt does): the allowed origin then serves a well-formed request for itself, which
    reaches nothing the allowlist denies. Any other tagged request is an escape.
    """
    return entry.get("host") == "allowed" and str(entry.get("host_header")) in allowed


def _read_route(
    nonce: str,
    requests: list[ProxyRequest],
    witness: WitnessRecordsLike,
    allowed: set[str] | None = None,
) -> RouteReading:
    """What the witnesses saw of `requests`; `allowed` is the allowed host's own authorities."""
    allowed = allowed or set()
    escape_targets = {_wire(t) for r in requests if r.role == "escape" for t in r.escape_targets}
    escape_tags = {r.what for r in requests if r.role == "escape"}
    reading = RouteReading()
    for entry in entries_with_nonce(witness.proxy, nonce):
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
        for o in entries_with_nonce(witness.origin, nonce)
        if (route_tag(o) in escape_tags and not _allowed_as_itself(o, allowed))
        or o.get("host") == "denied"
    ]
    reading.rewritten = {
        str(route_tag(o))
        for o in entries_with_nonce(witness.origin, nonce)
        if route_tag(o) in escape_tags and _allowed_as_itself(o, allowed)
    }
    reading.listener_hits = entries_with_nonce(witness.direct_tcp, nonce)
    return reading


def assess_route(
    ctx: CellContext,
    report: dict[str, Any],
    witness: WitnessRecordsLike,
    control: dict[str, Any],
    requests: list[ProxyRequest],
    extra: Callable[[RouteReading, list[str]], Escape | None] | None = None,
) -> Assessment:
    """The shared reading of the probes that try to confuse the proxy."""
    escapes = attempts_by_role(report, "escape")
    controls = attempts_by_role(report, "control")
    observed = observed_outcome(escapes)
    if not requests:
        missing = ["prepare() did not run for this cell: no requests to judge"]
        return Assessment("undecided", controls_ok=False, reasons=missing, observed=observed)
    host = ctx.world.info.hosts["allowed"]
    authorities = {f"{host.name}:{host.https_port}", f"{host.name}:{host.http_port}"}
    reading = _read_route(ctx.nonce, requests, witness, authorities)
    reasons: list[str] = []
    no_network = claims_no_network(ctx) and refused_by_no_network([*escapes, *controls])
    seen = bool(reading.admitted or reading.origin_hits or reading.listener_hits)
    if seen:
        admitted = sorted({f"{e.get('target')} ({e.get('status')})" for e in reading.admitted})
        reasons.append(
            f"the proxy let {len(reading.admitted)} escape requests past its checks "
            f"{admitted[:4]}; origins saw {len(reading.origin_hits)} tagged escape requests; "
            f"the direct listener saw {len(reading.listener_hits)} connections"
        )
    by_what = {r.what: r for r in requests}
    misshapen = _misshapen_refusals(escapes, by_what)
    if no_network:
        reasons.append(no_network_reason(escapes))
        misshapen = []  # a refusal by the network itself never comes as a proxy status
    else:
        reasons.append(f"payload: {attempts_summary(escapes)}")
        reasons.append(f"proxy logged {len(reading.denies)} refusals of escape targets")
    escape = judge_escape(observed, seen, _rewritten(escapes, reading), reasons)
    if escape == "refused" and misshapen:
        reasons.append(
            "a refusal did not come as the proxy's 400/403/421: "
            + ", ".join(str(a.get("what")) for a in misshapen)
        )
        escape = "disagree"
    unexercised = [
        f"{a.get('what')} ({_progress(a)})" for a in escapes if not _exercised(a, by_what)
    ]
    if escape == "refused" and unexercised and not no_network:
        # A refusal counts only for the request that carried the escape; if that head was
        # never written, the proxy was never asked, and nothing was refused.
        reasons.append("the escaping request was never put to the proxy: " + ", ".join(unexercised))
        escape = "undecided"
    if escape == "refused" and extra is not None and not no_network:
        escape = extra(reading, reasons) or escape
    inside_ok = no_network or _controls_echoed(controls)
    return conclude(
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


def _misshapen_refusals(
    escapes: list[dict[str, Any]], by_what: dict[str, ProxyRequest]
) -> list[dict[str, Any]]:
    """Refused escapes that had to end in a proxy status and did not get one."""
    return [
        a
        for a in escapes
        if a.get("outcome") == "refused"
        and by_what.get(str(a.get("what"))) is not None
        and by_what[str(a.get("what"))].refusal == "status"
        and a.get("status") not in REFUSAL_STATUSES
    ]


def _controls_echoed(controls: list[dict[str, Any]]) -> bool:
    """Every in-sandbox control got a 200 that echoed the nonce (and there was one)."""
    return bool(controls) and all(
        a.get("outcome") == "succeeded"
        and a.get("status") == 200
        and "nonce echoed" in str(a.get("detail", ""))
        for a in controls
    )


def _rewritten(escapes: list[dict[str, Any]], reading: RouteReading) -> str | None:
    """Why the escapes that "succeeded" reached only the allowed origin as itself, or None.

    A proxy that answers a Host-header confusion by rewriting the header (srt) gives the
    payload a 200 from the allowed origin: a success that stayed on the allowlist. Each such
    success must show in the allowed origin's log under the allowed name (`rewritten`).
    """
    succeeded = {str(a.get("what")) for a in escapes if a.get("outcome") == "succeeded"}
    if not succeeded or not succeeded <= reading.rewritten:
        return None
    return (
        "the proxy rewrote the request for the allowed origin, which served it under its own "
        "name: " + ", ".join(sorted(succeeded))
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


def deny_control(
    ctx: CellContext, authority: str, nonce: str, want: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The host CONNECTs `authority`; the proxy must refuse it and log a line `want` accepts."""
    info = ctx.world.info
    host, port = split_hostport(authority)

    def connect() -> dict[str, Any]:
        sock, status, reason = connect_tunnel(info.proxy.url, host, port, nonce)
        sock.close()
        ok = status in REFUSAL_STATUSES
        return host_check(f"host connect {authority} refused", ok, f"{status} {reason}".strip())

    checks = [guarded_check(f"host connect {authority} refused", connect)]
    records = wait_for_records(ctx.world, nonce, lambda r: any(want(p) for p in r.proxy))
    logged = [p for p in entries_with_nonce(records.proxy, nonce) if want(p)]
    checks.append(
        host_check(
            "proxy logged the host's refusal",
            bool(logged),
            "; ".join(str(p.get("reason")) for p in logged) or "no matching decision line",
        )
    )
    return checks


def allowed_control(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
    """The host GETs the allowed origin through the proxy (200, nonce echoed)."""
    info = ctx.world.info
    allowed = info.hosts["allowed"]

    def get() -> dict[str, Any]:
        url = f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}"
        status, body, _ = https_via_proxy(info, url, nonce)
        ok = status == 200 and nonce.encode() in body
        return host_check("host get allowed", ok, f"{status} {body[:60]!r}")

    return [guarded_check("host get allowed", get)]


class RouteSpec(PerCellSpec):
    """A probe whose escapes are requests through the harness proxy."""

    host_readings = ("proxy decision log", "origin access logs")

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied on every leg: every leg's only route is the proxy, which must refuse these."""
        del declared
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

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """One attempt per request the host built for the cell, named as the request is."""
        requests = (task.get("targets") or {}).get("requests") or []
        return AttemptTable(required=attempts_of(*(str(r.get("what")) for r in requests)))
