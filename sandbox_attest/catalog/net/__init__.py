"""The network probes, host side: through the egress proxy and around it (`direct`).

Through the proxy, each module is one mechanism: `allowlist` (a denied host refused, an allowed
one carrying 18 MiB), `confusion` (spellings, ports, Host headers, keep-alive), `private_address`
(a name resolving to a non-global address), `smuggling`, `upgrade` and `relay` (raw bytes
that hide a request), `rebinding` (a DNS answer that changes between check and dial), and `doh`,
`proxy_dns`, `socks`, `ignored`, `metadata`. `route` reads requests through the proxy and
`proxy_wire` raw bytes through it, for those probes to share. `witness` holds the per-cell
loopback listeners both kinds use; `route` and `direct` never import each other.
"""

from __future__ import annotations

from sandbox_attest.catalog.net.allowlist import NetDeniedHost, NetTransfer18MiB
from sandbox_attest.catalog.net.confusion import NetHostCanonical, NetProxyConfusion
from sandbox_attest.catalog.net.direct import (
    NetDirectEgress,
    NetIpv6UdpIcmp,
    NetLoopbackServices,
    NetProxyEnvOverride,
)
from sandbox_attest.catalog.net.private_address import NetPrivateAddress

__all__ = [
    "NetDeniedHost",
    "NetDirectEgress",
    "NetHostCanonical",
    "NetIpv6UdpIcmp",
    "NetLoopbackServices",
    "NetPrivateAddress",
    "NetProxyConfusion",
    "NetProxyEnvOverride",
    "NetTransfer18MiB",
]
