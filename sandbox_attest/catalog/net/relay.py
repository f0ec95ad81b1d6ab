"""`net_proxy_relay`, host side: a relay through the proxy back into itself.

A CONNECT to the proxy's own address, then inside that tunnel a request to the denied host: a
proxy that trusts connections from its own host would not check it. Judged by
`proxy_wire.assess_wire`, which counts any admission of a loopback target.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from sandbox_attest.catalog.controls import control_record, new_control_nonce
from sandbox_attest.catalog.net.proxy_wire import (
    WireHosts,
    WireRequest,
    WireSpec,
    control_get,
    wire_head,
    wire_hosts,
)
from sandbox_attest.catalog.net.route import allowed_control, deny_control
from sandbox_attest.catalog.spec import CellContext

# The payload replaces this with its proxy's own host:port (the route it was given).
PROXY_SELF: Final = "{proxy}"


def relay_requests(h: WireHosts) -> list[WireRequest]:
    """The control GET and a relay through the proxy back into itself, then to the denied host.

    A CONNECT to the proxy's own address makes the proxy a client of itself: a second request
    inside that tunnel arrives from the proxy's own host, which a proxy that trusts local
    clients (or itself) would not check. The inner request goes to the denied host.
    """
    what = "relay-through-proxy"
    inner = wire_head(
        f"GET {h.url(h.denied, what)} HTTP/1.1",
        f"Host: {h.denied}",
        f"X-Attest-Nonce: {h.nonce}",
        "Connection: close",
    )
    outer = wire_head(
        f"CONNECT {PROXY_SELF} HTTP/1.1", f"Host: {PROXY_SELF}", f"X-Attest-Nonce: {h.nonce}"
    )
    return [
        control_get(h),
        WireRequest(
            what=what,
            role="escape",
            parts=(outer, inner),
            carriers=1,
            denied_target=h.url(h.denied, what),
        ),
    ]


class NetProxyRelay(WireSpec):
    """A relay through the proxy back into itself must not carry a request past the allowlist."""

    id = "net_proxy_relay"
    area = "net"
    fix = (
        "refuse a target on the proxy's own host (its listener, any loopback address) and "
        "give a connection the proxy made to itself no trust: check every request it "
        "carries against the allowlist"
    )

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """The control and the relay through the proxy's own address."""
        return relay_requests(wire_hosts(ctx))

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
