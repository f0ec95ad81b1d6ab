"""The network probes, host side: through the egress proxy (`route`) and around it (`direct`).

`witness` holds the per-cell loopback listeners both kinds use; `route` and `direct` never
import each other.
"""

from __future__ import annotations

from sandbox_attest.catalog.net.direct import (
    NetDirectEgress,
    NetIpv6UdpIcmp,
    NetLoopbackServices,
    NetProxyEnvOverride,
)
from sandbox_attest.catalog.net.route import (
    NetDeniedHost,
    NetHostCanonical,
    NetPrivateAddress,
    NetProxyConfusion,
    NetTransfer18MiB,
)

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
