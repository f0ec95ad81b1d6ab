"""Network probes through the harness's egress proxy, host side.

`net_denied_host` and `net_transfer_18mib` test the allowlist itself: a denied host must be
refused, an allowed one must carry 18 MiB byte-exact. Three more (`net_host_canonical`,
`net_proxy_confusion`, `net_private_address`) try to confuse it: the host builds every request
head, the payload sends them byte for byte, and the proxy's decision log plus the origin logs
are the witnesses. A refusal counts only when it came as the proxy's own status; an "allow"
decision for a target that must never be admitted, or any origin request tagged with an
escape attempt, is an escape.

Every target is harness-owned. The one exception is by construction never dialed:
`net_private_address` plants link-local and private ANSWERS in the DNS fixture, and `prepare`
refuses to plant an address the proxy's own address check would let through.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit

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
    origin_control_checks,
)
from sandbox_attest.catalog.judging import (
    capability_escape,
    conclude,
    expect_capability,
    judge_escape,
)
from sandbox_attest.catalog.proxyclient import connect_tunnel, https_via_proxy, split_hostport
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    PolicyLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.errors import FixtureError
from sandbox_attest.verdict import Assessment, Escape, Expectation
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.egress.rules import Rule, address_allowed

if TYPE_CHECKING:
    from collections.abc import Callable
from sandbox_attest.catalog.net.witness import REFUSAL_STATUSES, PerCellSpec

# errnos a payload gets when there is no network to try at all (a seccomp filter's EPERM, no
# route, nothing listening on the sandbox's own empty loopback): under network = "none" they
# are the claim holding, not an attempt that could not be made.
NO_NETWORK_ERRNOS: Final = frozenset(
    {"EPERM", "EACCES", "ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED", "EAFNOSUPPORT"}
)


def claims_no_network(ctx: CellContext) -> bool:
    """The backend claims no network at all (the proxy is out of its reach by design)."""
    return ctx.policy.network == "none"


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


def _own_proxy(ctx: CellContext) -> bool:
    """The backend may bring its own proxy: the runner gives such a cell no harness route.

    Callers also check that the harness proxy logged nothing for the cell: a context built
    without a route (by hand, in tests) whose requests went through the harness proxy is
    judged on that proxy's log as usual.
    """
    return ctx.route is None


class NetDeniedHost(SpecBase):
    """The proxy refuses the denied fixture host on every leg; the allowed host works."""

    id = "net_denied_host"
    area = "net"
    host_readings = ("proxy decision log", "origin access logs")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Absolute-form and CONNECT to the denied host, and the allowed GET.

        Without a proxy route the payload makes none and says so in one `error` attempt.
        """
        del task
        later = attempts_of("connect-denied", "get-allowed")
        return AttemptTable(
            required=later | {"get-denied-absolute"},
            excuses=(("get-denied-absolute", later),),
        )

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied on every leg: the proxy is every leg's route and has no rule for it."""
        del policy
        return "denied"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Name the denied and allowed hosts and their ports."""
        hosts = ctx.world.info.hosts
        denied, allowed = hosts["denied"], hosts["allowed"]
        return {
            "denied": {
                "name": denied.name,
                "http_port": denied.http_port,
                "https_port": denied.https_port,
            },
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host is denied the same way and logged; the allowed host answers it."""
        info, nonce = ctx.world.info, new_control_nonce()
        denied, allowed = info.hosts["denied"], info.hosts["allowed"]

        def connect_denied() -> dict[str, Any]:
            sock, status, reason = connect_tunnel(
                info.proxy.url, denied.name, denied.https_port, nonce
            )
            sock.close()
            return host_check("host connect denied", status == 403, f"{status} {reason}".strip())

        def get_allowed() -> dict[str, Any]:
            url = f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}"
            status, body, _ = https_via_proxy(info, url, nonce)
            ok = status == 200 and nonce.encode() in body
            return host_check("host get allowed", ok, f"{status} {body[:60]!r}")

        checks = [guarded_check("host connect denied", connect_denied)]
        checks.append(guarded_check("host get allowed", get_allowed))
        records = wait_for_records(
            ctx.world,
            nonce,
            lambda r: (
                any(p.get("decision") == "deny" for p in entries_with_nonce(r.proxy, nonce))
                and bool(entries_with_nonce(r.origin, nonce))
            ),
        )
        denies = [
            p for p in entries_with_nonce(records.proxy, nonce) if p.get("decision") == "deny"
        ]
        checks.append(
            host_check("proxy logged the host's deny", bool(denies), f"{len(denies)} deny")
        )
        hits = [o for o in entries_with_nonce(records.origin, nonce) if o.get("host") == "allowed"]
        checks.append(host_check("allowed origin logged the host", bool(hits), f"{len(hits)} hits"))
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """403 for both forms + silent denied origin + allowed control = refused."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        denied_name = ctx.world.info.hosts["denied"].name
        proxied = entries_with_nonce(witness.proxy, ctx.nonce)
        allowed_through = [
            p for p in proxied if p.get("decision") == "allow" and p.get("host") == denied_name
        ]
        denies = [p for p in proxied if p.get("decision") == "deny"]
        origin_hits = [
            o for o in entries_with_nonce(witness.origin, ctx.nonce) if o.get("host") == "denied"
        ]
        reasons: list[str] = []
        if origin_hits or allowed_through:
            reasons.append(
                f"denied origin saw {len(origin_hits)} requests with the nonce; "
                f"proxy allowed {len(allowed_through)} to {denied_name}"
            )
        forms = [a for a in escapes if a.get("status") == 403]
        no_network = claims_no_network(ctx) and refused_by_no_network([*escapes, *controls])
        if no_network:
            reasons.append(no_network_reason(escapes))
        elif observed == "refused":
            why = "; ".join(sorted({str(a.get("detail")) for a in forms})) or "no reason header"
            reasons.append(
                f"proxy answered 403 for {len(forms)} of {len(escapes)} forms "
                f"({attempts_summary(escapes)}): {why}"
            )
            if len(forms) != len(escapes):
                reasons.append("a refusal did not come as the proxy's 403")
        else:
            reasons.append(f"payload: {attempts_summary(escapes)}")
        reasons.append(f"proxy logged {len(denies)} denies with the nonce")
        escape = judge_escape(observed, bool(origin_hits or allowed_through), None, reasons)
        if escape == "refused" and len(forms) != len(escapes) and not no_network:
            escape = "disagree"
        # Under a no-network claim the allowed control cannot succeed either: its refusal by
        # the network is the claim holding (the host control still shows the proxy works).
        inside_ok = no_network or (
            bool(controls)
            and all(a.get("outcome") == "succeeded" and a.get("status") == 200 for a in controls)
        )
        return conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"proxy": proxied, "denied_origin": origin_hits},
        )


class NetTransfer18MiB(SpecBase):
    """The 18 MiB blob over HTTPS through the proxy: a capability."""

    id = "net_transfer_18mib"
    area = "net"
    host_readings = ("origin access log",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The one HTTPS download of the blob."""
        del task
        return AttemptTable(required=attempts_of("blob-https"))

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Allowed everywhere except where the backend declares no network at all."""
        return expect_capability(policy)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The allowed host, the nonce-tagged blob path, its size and sha256."""
        info = ctx.world.info
        allowed = info.hosts["allowed"]
        return {
            "host": allowed.name,
            "port": allowed.https_port,
            "path": f"/c/{ctx.nonce}/blob",
            "size": info.blob.size,
            "sha256": info.blob.sha256,
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches the allowed origin through the proxy and the origin logs it."""
        info, nonce = ctx.world.info, new_control_nonce()
        allowed = info.hosts["allowed"]
        return control_record(
            nonce,
            origin_control_checks(
                ctx,
                nonce,
                f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}",
                "allowed",
            ),
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Payload hash match + one complete full-size response logged = escaped (seen).

        Where no network is declared, ANY origin entry with the nonce is an escape: a partial
        transfer is traffic that must not exist, and the origin's log decides, not the payload.
        """
        caps = attempts_by_role(report, "capability")
        observed = observed_outcome(caps)
        size = ctx.world.info.blob.size
        tagged = entries_with_nonce(witness.origin, ctx.nonce)
        full = [
            o
            for o in tagged
            if o.get("host") == "allowed"
            and str(o.get("path", "")).endswith("/blob")
            and o.get("complete")
            and int(o.get("bytes_sent") or 0) >= size
        ]
        facts = report.get("facts", {})
        reasons = [
            f"allowed origin logged {len(full)} complete {size}-byte responses with the nonce",
            f"payload: {attempts_summary(caps)}",
        ]
        if "bytes" in facts:
            reasons.append(f"{facts.get('bytes')} bytes at {facts.get('mb_per_s')} MB/s")
        if expect_capability(ctx.policy) == "denied" and tagged:
            sent = sorted(
                {f"{o.get('host')} {o.get('path')} {o.get('bytes_sent')}B" for o in tagged}
            )
            reasons.append(f"no network is declared, yet origins logged the nonce: {sent[:4]}")
            escape: Escape = "escaped"
        else:
            escape = capability_escape(observed, len(full) == 1, reasons)
        return conclude(escape, observed, reasons, host_control=control, witness={"origin": tagged})


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


def route_tag(entry: dict[str, Any]) -> str | None:
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
) -> _RouteReading:
    """What the witnesses saw of `requests`; `allowed` is the allowed host's own authorities."""
    allowed = allowed or set()
    escape_targets = {_wire(t) for r in requests if r.role == "escape" for t in r.escape_targets}
    escape_tags = {r.what for r in requests if r.role == "escape"}
    reading = _RouteReading()
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


def _assess_route(
    ctx: CellContext,
    report: dict[str, Any],
    witness: WitnessRecordsLike,
    control: dict[str, Any],
    requests: list[ProxyRequest],
    extra: Callable[[_RouteReading, list[str]], Escape | None] | None = None,
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
    misshapen = [
        a
        for a in escapes
        if a.get("outcome") == "refused"
        and by_what.get(str(a.get("what"))) is not None
        and by_what[str(a.get("what"))].refusal == "status"
        and a.get("status") not in REFUSAL_STATUSES
    ]
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
    inside_ok = no_network or (
        bool(controls)
        and all(
            a.get("outcome") == "succeeded"
            and a.get("status") == 200
            and "nonce echoed" in str(a.get("detail", ""))
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
        witness={
            "admitted": reading.admitted,
            "denied": reading.denies,
            "origin": reading.origin_hits,
            "direct_tcp": reading.listener_hits,
        },
    )


def _rewritten(escapes: list[dict[str, Any]], reading: _RouteReading) -> str | None:
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


class _RouteSpec(PerCellSpec):
    """A probe whose escapes are requests through the harness proxy."""

    host_readings = ("proxy decision log", "origin access logs")

    def expectation(self, policy: PolicyLike) -> Expectation:
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

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """One attempt per request the host built for the cell, named as the request is."""
        requests = (task.get("targets") or {}).get("requests") or []
        return AttemptTable(required=attempts_of(*(str(r.get("what")) for r in requests)))


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
        nonce = new_control_nonce()
        port = ctx.world.info.hosts["allowed"].https_port
        target = f"127.1:{port}"
        checks = deny_control(
            ctx,
            target,
            nonce,
            lambda p: p.get("nonce") == nonce and p.get("target") == target,
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
        """Refused spellings + no admitted escape target + no tagged origin hit = refused."""
        requests = self.requests(ctx)
        allowed = ctx.world.info.hosts["allowed"].name

        def equivalent_admitted_as_canonical(reading: _RouteReading, reasons: list[str]) -> None:
            # The equivalent spelling must have been admitted under the canonical name.
            del reading
            spelled = [
                p
                for p in entries_with_nonce(witness.proxy, ctx.nonce)
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
        listener_port = split_hostport(info.direct_egress.tcp)[1]
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
        nonce = new_control_nonce()
        hosts = ctx.world.info.hosts
        target = f"{hosts['allowed'].name}:{hosts['denied'].https_port}"
        checks = deny_control(
            ctx,
            target,
            nonce,
            lambda p: p.get("nonce") == nonce and p.get("target") == target,
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
        """Every confusion refused (or its connection closed), nothing admitted or logged."""
        return _assess_route(ctx, report, witness, control, self.requests(ctx))


# ---------------------------------------------------------------------------------------------
# net_private_address


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

        def after_resolution(reading: _RouteReading, reasons: list[str]) -> Escape | None:
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

        return _assess_route(ctx, report, witness, control, requests, after_resolution)


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
