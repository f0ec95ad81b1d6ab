"""The host's own requests through the egress proxy (CONNECT and GET), for the net controls."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from sandbox_attest.catalog.spec import HOST_TIMEOUT_S
from sandbox_attest.host import disguise

if TYPE_CHECKING:
    from sandbox_attest.world.info import WorldInfo


def split_hostport(hostport: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets or not) as the host and the port number."""
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def connect_tunnel(
    proxy_url: str, host: str, port: int, nonce: str
) -> tuple[socket.socket, int, str]:
    """CONNECT through the proxy; returns the socket, the status and the deny reason."""
    parts = urlsplit(proxy_url)
    lines = [f"CONNECT {host}:{port} HTTP/1.1", f"Host: {host}:{port}", f"X-Attest-Nonce: {nonce}"]
    if parts.username is not None:
        cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        lines.append("Proxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode())
    sock = socket.create_connection((parts.hostname or "", parts.port or 80), HOST_TIMEOUT_S)
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        buf = b""
        while b"\r\n\r\n" not in buf and len(buf) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    except OSError:
        sock.close()
        raise
    head = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    words = head[0].split()
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    reason = next(
        (
            line.split(":", 1)[1].strip()
            for line in head[1:]
            if line.lower().startswith(f"{disguise.PROXY_DENY_HEADER.lower()}:")
        ),
        "",
    )
    return sock, status, reason


def https_via_proxy(info: WorldInfo, url: str, nonce: str) -> tuple[int, bytes, str]:
    """GET `url` (https, fixture host) through the proxy; returns status, body, deny reason."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    sock, status, reason = connect_tunnel(info.proxy.url, host, port, nonce)
    if status != 200:
        sock.close()
        return status, b"", reason
    ctx = ssl.create_default_context(cafile=info.ca_bundle)
    conn = http.client.HTTPConnection(host, port, timeout=HOST_TIMEOUT_S)
    try:
        conn.sock = ctx.wrap_socket(sock, server_hostname=host)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"X-Attest-Nonce": nonce})
        response = conn.getresponse()
        return response.status, response.read(), ""
    finally:
        conn.close()
        sock.close()
