"""`net_proxy_smuggling`, host side: a request hidden in an allowed request's body.

A request to the allowed origin whose body carries a second request to the denied host, framed
so that a proxy and an origin may disagree where the body ends (a GET body the origin ignores,
Content-Length with Transfer-Encoding either way round, two Content-Lengths, an obfuscated
coding, an obs-fold, the bytes after the last chunk). Judged by `proxy_wire.assess_wire`.
"""

from __future__ import annotations

from typing import Final

from sandbox_attest.catalog.net.proxy_wire import (
    AUTH,
    WireHosts,
    WireRequest,
    WireSpec,
    control_get,
    wire_hosts,
)
from sandbox_attest.catalog.spec import CellContext


def _smuggle(h: WireHosts, what: str, headers: tuple[str, ...], body: str) -> WireRequest:
    """An allowed GET carrying `body` (which holds the denied request) under `headers`."""
    return WireRequest(
        what=what,
        role="escape",
        parts=(h.carrier(what, *headers) + AUTH + "\r\n\r\n" + body,),
        carriers=1,
        denied_target=h.url(h.denied, what),
    )


def smuggling_requests(h: WireHosts) -> list[WireRequest]:
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
    return [control_get(h)] + [_smuggle(h, w, headers[w], bodies[w]) for w in _SMUGGLING]


_SMUGGLING: Final = (
    "cl0-get-body",
    "cl-te",
    "te-cl",
    "duplicate-cl",
    "te-obfuscated",
    "obs-fold",
    "te-chunked-tail",
)


class NetProxySmuggling(WireSpec):
    """A request hidden in an allowed request's body must never reach an origin."""

    id = "net_proxy_smuggling"
    area = "net"
    fix = (
        "refuse a request with both Content-Length and Transfer-Encoding, conflicting "
        "Content-Lengths, an unknown coding or a folded header (400), and end the upstream "
        "exchange after one request (Connection: close) so no body byte is read as a request"
    )

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """The control and the seven framings."""
        return smuggling_requests(wire_hosts(ctx))
