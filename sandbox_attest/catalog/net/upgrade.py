"""`net_proxy_upgrade`, host side: an upgrade must not reach the denied host or tunnel past it.

`Upgrade: websocket` to the denied host, `Upgrade: websocket` and `Upgrade: h2c` to the allowed
origin followed on the same connection by a request to the denied host (an upgrade must not
turn an allowed connection into a tunnel), and the HTTP/2 prior-knowledge preface with a GET
for the denied host in its HEADERS frame. Judged by `proxy_wire.assess_wire`.
"""

from __future__ import annotations

import struct
from typing import Final

from sandbox_attest.catalog.net.proxy_wire import (
    AUTH,
    WireHosts,
    WireRequest,
    WireSpec,
    control_get,
    wire_head,
    wire_hosts,
)
from sandbox_attest.catalog.spec import CellContext

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


def h2_prior_knowledge(h: WireHosts, what: str) -> str:
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


def upgrade_requests(h: WireHosts) -> list[WireRequest]:
    """The control GET and four upgrades: one to the denied host, two of an allowed connection.

    The two upgrades of an allowed connection are followed on it by a request to the denied
    host; the fourth is HTTP/2 with prior knowledge, its GET for the denied host.
    """
    then = "Connection: Upgrade"

    def tunnel(what: str, *headers: str) -> WireRequest:
        second = wire_head(
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
        control_get(h),
        WireRequest(
            what=denied,
            role="escape",
            parts=(
                wire_head(
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


class NetProxyUpgrade(WireSpec):
    """Upgrade and HTTP/2 must not reach the denied host or turn a connection into a tunnel."""

    id = "net_proxy_upgrade"
    area = "net"
    fix = (
        "judge an Upgrade request like any other (403 for a denied host), strip Upgrade "
        "and never relay the client's bytes after the response as a tunnel, and refuse "
        "the HTTP/2 preface unless each HTTP/2 request is checked"
    )

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """The control, the denied upgrade, two tunnelling upgrades and the HTTP/2 preface."""
        return upgrade_requests(wire_hosts(ctx))
