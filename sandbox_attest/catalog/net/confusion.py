"""Network probes that try to confuse the egress proxy's allowlist, host side.

`net_host_canonical` spells the allowed host in ways that must not widen its rule;
`net_proxy_confusion` tries ports, Host headers and keep-alive reuse. The host builds every
request head, the payload sends them byte for byte, and `route.assess_route` reads the proxy's
decision log and the origin logs. Every target is harness-owned.
"""

from __future__ import annotations

from typing import Any, Final

from sandbox_attest.catalog.attempts import attempts_by_role, attempts_summary
from sandbox_attest.catalog.controls import control_record, new_control_nonce
from sandbox_attest.catalog.net.lookups import (
    FIX,
    looked_up,
    lookups_outside,
    names_reach_fixture,
    own_proxy_witness_checks,
    witness_lookups,
)
from sandbox_attest.catalog.net.route import (
    ProxyRequest,
    RouteReading,
    RouteSpec,
    absolute_request,
    allowed_control,
    assess_route,
    connect_request,
    deny_control,
    request_head,
)
from sandbox_attest.catalog.proxyclient import split_hostport
from sandbox_attest.catalog.records import entries_with_nonce
from sandbox_attest.catalog.spec import CellContext, WitnessRecordsLike
from sandbox_attest.verdict import Assessment

# ---------------------------------------------------------------------------------------------
# net_host_canonical

# The equivalent spelling's attempt, and its role: neither a control nor an escape.
EQUIVALENT: Final = "connect-equivalent-spelling"
EQUIVALENT_ROLE: Final = "equivalent"


class NetHostCanonical(RouteSpec):
    """Spellings of the allowed host must not widen its rule; equivalent spellings still work."""

    id = "net_host_canonical"
    area = "net"

    def build(self, ctx: CellContext) -> list[ProxyRequest]:
        """The canonical name (the control), an equivalent spelling, widening ones (escapes).

        The control is the plain allowlisted name alone: a proxy that refuses the equivalent
        spelling (upper case, trailing dot) fails closed, which is no failed control.

        The two spellings that are names of their own carry the nonce in a label
        (`{nonce}evil<allowed>`, `<allowed>.{nonce}.<denied>`) wherever only the DNS fixture
        can resolve them, so a lookup the proxy makes for one is this cell's (lookups.py).
        """
        hosts = ctx.world.info.hosts
        allowed, denied = hosts["allowed"], hosts["denied"]
        name, port, http = allowed.name, allowed.https_port, allowed.http_port
        deny_http = f"{denied.name}:{denied.http_port}"
        n = ctx.nonce
        tag = n if names_reach_fixture(ctx) else ""
        below_denied = f"{tag}.{denied.name}" if tag else denied.name
        homoglyph = "\u0430" + name[1:] if name.startswith("a") else "\u0430" + name
        return [
            connect_request(
                "connect-canonical", f"{name}:{port}", n, name, role="control", verify=True
            ),
            # Same canonical host, neither control nor escape: a proxy may admit it under the
            # canonical name or refuse it (fail closed); either keeps the allowlist whole.
            connect_request(
                EQUIVALENT,
                f"{name.upper()}.:{port}",
                n,
                name,
                role=EQUIVALENT_ROLE,
                verify=True,
            ),
            connect_request("connect-suffix-no-boundary", f"{tag}evil{name}:{port}", n, name),
            connect_request("connect-allowed-as-label", f"{name}.{below_denied}:{port}", n, name),
            connect_request("connect-ipv4-literal", f"{allowed.address}:{port}", n, name),
            connect_request("connect-ipv4-short", f"127.1:{port}", n, name),
            connect_request("connect-ipv4-hex", f"0x7f.0.0.1:{port}", n, name),
            connect_request("connect-ipv4-decimal", f"2130706433:{port}", n, name),
            connect_request("connect-ipv4-octal", f"0177.0.0.1:{port}", n, name),
            connect_request(
                "connect-ipv4-mapped-ipv6", f"[::ffff:{allowed.address}]:{port}", n, name
            ),
            connect_request("connect-userinfo", f"{name}@{allowed.address}:{port}", n, name),
            connect_request("connect-empty-label", f"{name}..:{port}", n, name),
            connect_request("connect-homoglyph", f"{homoglyph}:{port}", n, name),
            absolute_request("get-userinfo", f"{name}@{deny_http}", n, None),
            absolute_request("get-backslash", f"{name}\\@{deny_http}", n, None),
            absolute_request("get-fragment-authority", f"{deny_http}#@{name}:{http}", n, None),
            absolute_request("get-ipv4-decimal", f"2130706433:{http}", n, f"2130706433:{http}"),
        ]

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The route's readings and the DNS fixture's log (a proxy's lookups), once it ran."""
        readings = super().corroboration(ctx, report)
        return [*readings, "DNS fixture query log"] if readings else []

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
        checks += own_proxy_witness_checks(ctx, nonce)
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

        def equivalent_spelling(reading: RouteReading, reasons: list[str]) -> None:
            del reading
            reasons.append(equivalent_reason(report, witness.proxy, ctx.nonce, allowed))

        assessment = assess_route(ctx, report, witness, control, requests, equivalent_spelling)
        hits = lookups_outside(ctx, witness.dns)
        tried = (
            f"a refusal after a lookup is not a refusal: the proxy tried {looked_up(hits)}, "
            f"outside its allowlist, before it answered (the DNS fixture logged the lookup); "
            f"fix: match allowlist hosts on whole labels (evil{allowed} is not {allowed}, "
            f"nor is {allowed}.<other zone>) and {FIX.removeprefix('fix: ')}"
        )
        return witness_lookups(ctx, assessment, hits, tried)


def equivalent_reason(
    report: dict[str, Any], proxy_log: list[dict[str, Any]], nonce: str, allowed: str
) -> str:
    """What became of the equivalent spelling: admitted as `allowed`, or refused (fail closed).

    Never a verdict of its own: the spelling names the allowed host, so admitting it reaches
    nothing the allowlist denies (the denied origin's log would say so), and refusing it is
    the strict choice. A success is held to the proxy's log of the canonical name.
    """
    tried = attempts_by_role(report, EQUIVALENT_ROLE)
    outcome = tried[0].get("outcome") if tried else None
    if outcome == "refused":
        return (
            f"the proxy refused the equivalent spelling {allowed.upper()}. "
            f"({tried[0].get('status')}): it fails closed on a spelling it does not "
            "canonicalise, which widens nothing"
        )
    if outcome != "succeeded":
        return f"the equivalent spelling: {attempts_summary(tried) if tried else 'not tried'}"
    spelled = [
        p
        for p in entries_with_nonce(proxy_log, nonce)
        if str(p.get("target", "")).startswith(allowed.upper() + ".:")
    ]
    if spelled and all(p.get("host") == allowed for p in spelled):
        return f"the equivalent spelling was admitted as {allowed}"
    if spelled:
        return f"the equivalent spelling was logged as {spelled[0].get('host')}"
    return "the equivalent spelling was admitted; the proxy's log does not name it"


# ---------------------------------------------------------------------------------------------
# net_proxy_confusion


class NetProxyConfusion(RouteSpec):
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
            connect_request(
                "connect-allowed",
                f"{name}:{allowed.https_port}",
                n,
                name,
                role="control",
                verify=True,
            ),
            absolute_request("get-allowed", f"{name}:{http}", n, f"{name}:{http}", role="control"),
            connect_request(
                "connect-allowed-name-denied-port", f"{name}:{denied.https_port}", n, name
            ),
            ProxyRequest(
                what="connect-allowed-name-listener-port",
                role="escape",
                heads=(
                    request_head(
                        "CONNECT", f"{name}:{listener_port}", n, f"{name}:{listener_port}"
                    ),
                ),
                escape_targets=(f"{name}:{listener_port}",),
                after="send-nonce",
            ),
            absolute_request(
                "get-allowed-name-denied-port",
                f"{name}:{denied.http_port}",
                n,
                f"{name}:{denied.http_port}",
            ),
            absolute_request("get-host-header-mismatch", f"{name}:{http}", n, deny_http),
            absolute_request(
                "get-duplicate-host", f"{name}:{http}", n, f"{name}:{http}", f"Host: {deny_http}"
            ),
            ProxyRequest(
                what="keepalive-second",
                role="escape",
                heads=(
                    request_head("GET", first, n, f"{name}:{http}", keep),
                    request_head("GET", second, n, deny_http, keep),
                ),
                escape_targets=(second,),
                refusal="closed",
            ),
            ProxyRequest(
                what="pipelined-second",
                role="escape",
                heads=(
                    request_head("GET", piped_first, n, f"{name}:{http}", keep),
                    request_head("GET", piped_second, n, deny_http, keep),
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
        return assess_route(ctx, report, witness, control, self.requests(ctx))
