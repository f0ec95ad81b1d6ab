"""The egress proxy's wire: what it reads and writes on a client's connection, and the byte movers.

Request heads are parsed strictly (`parse_head`, `split_authority`, `body_framing`): every
shape the proxy does not accept is a `Refusal`, an HTTP status with the reason the server
answers and logs. An origin's response head loses its hop-by-hop headers and any forged deny
header (`filter_response_head`).

The data path is one thread per direction with blocking sockets, so the kernel gives
backpressure for free: a direction never reads more than the other side accepted. Bytes move
through one preallocated buffer per direction with `recv_into` (`buffer_copy`), or, on Linux
when one end is a unix socket, with `os.splice` through a pipe (`splice_copy`; measured faster
there, slower TCP to TCP); `pump` picks one. A stdlib asyncio stream version moved about a
tenth of the bytes per CPU second, which is why this is threads.

Runs in the proxy's child process (`sandbox_attest.world.egress.server`); the host side takes
only `PROXY_USER` from here.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

from sandbox_attest.host import disguise

# The proxy URL sits in the payload's environment, which a wrapper reads: a neutral name (issue 23).
PROXY_USER = "agent"
DENY_HEADER = disguise.PROXY_DENY_HEADER
NONCE_HEADER = "X-Attest-Nonce"
MAX_HEAD = 64 * 1024  # a request head of exactly this many bytes (CRLFCRLF included) is accepted
# The copy buffer starts small (most connections carry a few KiB) and doubles each time a read
# fills it, up to 4 MiB: on 256 MiB TCP -> TCP (bench/bench_relay_copy.py) 4 MiB moved as many
# or up to 1.1x the bytes per second of 1 MiB (fewer syscalls and wake-ups); 8 or 16 MiB, tried
# the same way, no more. Public so that the benchmark can try other ceilings.
_BUFFER_START = 64 * 1024
BUFFER_MAX = 4 * 1024 * 1024
_PIPE_SIZE = 1024 * 1024
_LINGER_S = 0.5  # after an error response, read what the client still sends so close() won't RST
_LINGER_BYTES = 1024 * 1024
_NONCE_PATH = re.compile(r"/c/([^/?#]+)/")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Hop-by-hop headers (RFC 9110 7.6.1) plus the proxy's own: never forwarded to an origin.
# Transfer-Encoding is kept: the body is relayed as it came, so its framing must travel with it.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
STATUS_REASONS = {
    200: "Connection established",
    400: "Bad Request",
    403: "Forbidden",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class Refusal(Exception):  # noqa: N818  (control flow, never escapes the handler)
    """Answer the client with `status` and end the connection."""

    def __init__(self, status: int, reason: str, host: str | None = None) -> None:
        """A refusal with its HTTP `status`, its `reason`, and the host it names if known."""
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.host = host


@dataclass
class RequestHead:
    """A parsed request head: the request line and the headers, in order, as sent."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def get_all(self, name: str) -> list[str]:
        """Every value of header `name` (case-insensitive), in order."""
        lowered = name.lower()
        return [v for k, v in self.headers if k.lower() == lowered]

    def get(self, name: str) -> str | None:
        """The one value of header `name`, or None; a repeated header is a 400."""
        values = self.get_all(name)
        if len(values) > 1:
            raise Refusal(400, f"duplicate {name} header")
        return values[0] if values else None


# ---------------------------------------------------------------------------------------------
# Parsing helpers
# ---------------------------------------------------------------------------------------------


def parse_head(raw: bytes) -> RequestHead:
    """Parse a request head (without its CRLFCRLF); anything malformed is a 400."""
    text = raw.decode("latin-1")
    lines = text.split("\r\n")
    if any("\n" in line or "\r" in line for line in lines):
        raise Refusal(400, "bare CR or LF in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise Refusal(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.match(method) or version not in {"HTTP/1.1", "HTTP/1.0"}:
        raise Refusal(400, "malformed request line")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise Refusal(400, "malformed header line")
        if any(ord(c) < 0x20 and c != "\t" for c in value):
            raise Refusal(400, f"control character in header {name}")
        headers.append((name, value.strip(" \t")))
    return RequestHead(method=method, target=target, version=version, headers=headers)


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """Raw host and port of `host[:port]` or `[v6][:port]`; no port and no default is a 400."""
    if authority.startswith("["):
        close = authority.find("]")
        if close == -1:
            raise Refusal(400, f"unterminated IPv6 literal in {quote_excerpt(authority)}")
        host, after = authority[: close + 1], authority[close + 1 :]
        if after and not after.startswith(":"):
            raise Refusal(400, f"junk after IPv6 literal in {quote_excerpt(authority)}")
        port_text = after[1:] if after else None
    elif authority.count(":") == 1:
        host, _, port_text = authority.partition(":")
    elif ":" in authority:
        raise Refusal(400, f"IPv6 literal without brackets in {quote_excerpt(authority)}")
    else:
        host, port_text = authority, None
    if port_text is None or port_text == "":
        if default_port is None:
            raise Refusal(400, f"CONNECT target {quote_excerpt(authority)} needs host:port")
        return host, default_port
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        raise Refusal(400, f"bad port in {quote_excerpt(authority)}")
    return host, int(port_text)


def nonce_from_target(head: RequestHead) -> str | None:
    """The cell nonce in an absolute-form target's query or `/c/NONCE/` path, if any."""
    if head.method == "CONNECT":
        return None
    _, sep, remainder = head.target.partition("://")
    if not sep:
        return None
    cut = min((i for i in map(remainder.find, "/?") if i != -1), default=len(remainder))
    return _nonce_from_path(remainder[cut:].split("#", 1)[0])


def _nonce_from_path(path: str) -> str | None:
    _, _, query = path.partition("?")
    values = parse_qs(query).get("nonce")
    if values:
        return values[0]
    match = _NONCE_PATH.search(path.split("?", 1)[0])
    return match.group(1) if match else None


def body_framing(head: RequestHead) -> int | None:
    """Bytes of request body to forward, or None for chunked framing."""
    te = head.get_all("Transfer-Encoding")
    cl = head.get_all("Content-Length")
    if te and cl:
        raise Refusal(400, "Transfer-Encoding together with Content-Length")
    if te:
        if len(te) != 1 or te[0].strip().lower() != "chunked":
            raise Refusal(400, "only 'Transfer-Encoding: chunked' is supported")
        return None
    if cl:
        if len(set(cl)) != 1 or not cl[0].isdigit() or not cl[0].isascii():
            raise Refusal(400, "malformed or conflicting Content-Length")
        return int(cl[0])
    return 0


class _Reader:
    """Buffered reads from the client, starting with bytes already read with the head."""

    def __init__(self, sock: socket.socket, initial: bytes) -> None:
        self.sock = sock
        self.buf = bytearray(initial)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise OSError("client closed inside the request body")
        self.buf += chunk

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) == -1:
            if len(self.buf) > 8192:
                raise Refusal(400, "chunk line too long")
            self._fill()
        out = bytes(self.buf[: end + 2])
        del self.buf[: end + 2]
        return out

    def copy(self, n: int, dst: socket.socket) -> int:
        sent = 0
        while sent < n:
            if not self.buf:
                self._fill()
            take = min(n - sent, len(self.buf))
            dst.sendall(self.buf[:take])
            del self.buf[:take]
            sent += take
        return sent


def forward_body(
    client: socket.socket, upstream: socket.socket, rest: bytes, framing: int | None
) -> int:
    """Send the request body to `upstream` as framed (`body_framing`); returns the bytes sent."""
    reader = _Reader(client, rest)
    if framing is not None:
        return reader.copy(framing, upstream)
    total = 0
    while True:
        size_line = reader.line()
        size_text = size_line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise Refusal(400, "malformed chunk size") from None
        upstream.sendall(size_line)
        total += len(size_line)
        if size == 0:
            while True:  # trailers, up to the empty line
                trailer = reader.line()
                upstream.sendall(trailer)
                total += len(trailer)
                if trailer == b"\r\n":
                    return total
        total += reader.copy(size + 2, upstream)


def filter_response_head(raw: bytes) -> tuple[int, bytes]:
    """The origin's status and its response head as the client gets it (hop-by-hop dropped)."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise Refusal(502, "origin sent a malformed status line")
    status = int(parts[1])
    kept = [lines[0]]
    for line in lines[1:]:
        name = line.partition(":")[0].strip().lower()
        # An origin must not be able to forge the proxy's own verdict header.
        if name == DENY_HEADER.lower() or name in HOP_BY_HOP:
            continue
        kept.append(line)
    if status >= 200:
        kept.append("Connection: close")
    return status, ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1")


def quote_excerpt(text: str) -> str:
    """`text` cut to 200 characters, in single quotes, for a refusal's message."""
    return "'" + text[:200].replace("'", "\\'") + "'"


def header_safe(text: str) -> str:
    """`text` as printable ASCII of at most 300 characters, for a response header."""
    return "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in text)[:300]


# ---------------------------------------------------------------------------------------------
# Byte movers
# ---------------------------------------------------------------------------------------------


def abort_sockets(*socks: socket.socket) -> None:
    """Wake every thread blocked on these sockets; they close in their owner's finally."""
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def drain(sock: socket.socket) -> None:
    """Read and drop what the client still sends, for a short while (`_LINGER_S`)."""
    # Reading what the client still sends lets it read our error before close() would RST.
    deadline = time.monotonic() + _LINGER_S
    seen = 0
    buf = bytearray(65536)
    while seen < _LINGER_BYTES:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        sock.settimeout(remaining)
        try:
            n = sock.recv_into(buf)
        except OSError:
            return
        if n == 0:
            return
        seen += n


def pump(src: socket.socket, dst: socket.socket, abort: tuple[socket.socket, ...]) -> int:
    """Copy src to dst until EOF, then half-close dst; on error wake the other direction.

    Returns the number of bytes moved (also when the copy ended in an error). Blocking writes
    are the backpressure: nothing is read from `src` until `dst` accepted the previous chunk.
    Splice only when a unix socket is an end (bench/bench_relay_copy.py, 256 MiB, ratios to a
    direct loopback read): TCP -> TCP it lost to the buffer (0.37-0.43x against 0.48-0.52x);
    TCP -> unix it was even or ahead (0.73-1.01x against 0.70-0.83x).
    """
    moved = [0]
    unix_end = socket.AF_UNIX in (src.family, dst.family)
    try:
        src.settimeout(None)
        dst.settimeout(None)
        (splice_copy if _HAVE_SPLICE and unix_end else buffer_copy)(src, dst, moved)
    except OSError:
        abort_sockets(*abort)
        return moved[0]
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)  # pass the half-close through
    return moved[0]


_HAVE_SPLICE = hasattr(os, "splice") and sys.platform.startswith("linux")


def splice_copy(src: socket.socket, dst: socket.socket, moved: list[int]) -> None:
    """Copy src to dst through a pipe with `os.splice` (Linux); adds to `moved[0]`."""
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a smaller pipe still works, only slower
            import fcntl  # noqa: PLC0415  (Linux only, like splice itself)

            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        src_fd, dst_fd = src.fileno(), dst.fileno()
        while True:
            n = os.splice(src_fd, write_end, _PIPE_SIZE, flags=os.SPLICE_F_MOVE)
            if n == 0:
                return
            while n:
                out = os.splice(read_end, dst_fd, n, flags=os.SPLICE_F_MOVE)
                n -= out
                moved[0] += out
    finally:
        os.close(read_end)
        os.close(write_end)


def buffer_copy(src: socket.socket, dst: socket.socket, moved: list[int]) -> None:
    """Copy src to dst through a buffer that grows up to `BUFFER_MAX`; adds to `moved[0]`."""
    buf = bytearray(_BUFFER_START)
    view = memoryview(buf)
    while n := src.recv_into(buf):
        dst.sendall(view[:n])
        moved[0] += n
        if n == len(buf) < BUFFER_MAX:
            buf = bytearray(2 * len(buf))
            view = memoryview(buf)
