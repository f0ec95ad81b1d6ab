#!/usr/bin/env python3
"""A wrapper that brings its own allowlist proxy with exactly one deliberate mistake.

Usage: protocol_hole_proxy.py MISTAKE DNS_HOST DNS_PORT ALLOWED_DOMAINS_JSON -- PAYLOAD...

The wrapper starts a small HTTP proxy on 127.0.0.1 (absolute-form GET only), runs the payload
with HTTP_PROXY/HTTPS_PROXY naming it (a command spec with egress = "own"), and stops. The
proxy does what the harness's proxy does (sandbox_attest/world/egress/proxy.py): it admits a request
only for an allowlisted host:port (ALLOWED_DOMAINS_JSON, the spec's {allowed_domains_json}),
refuses a Host: header that differs from the target, refuses ambiguous body framing, resolves
the name through the DNS fixture, refuses a non-lab answer, dials that address once and ends
the upstream exchange after one request. MISTAKE names the one thing it does wrong:

- `none`: nothing (the baseline the mistakes are measured against).
- `keepalive`: it keeps the upstream connection open after a request (no Connection: close)
  and frames the request body by Content-Length only, as a keep-alive proxy does; an origin
  that frames that body differently (ours ignores a GET's body) reads it as a second request
  that the proxy never checked: request smuggling (net_proxy_smuggling must FAIL).
- `upgrade`: on a request carrying Upgrade: it forwards the head as it came and then relays
  bytes both ways as a tunnel without waiting for a 101, so whatever the client sends next
  reaches the allowed upstream unchecked (net_proxy_upgrade must FAIL).
- `rebind`: it checks the address of one resolution and dials the address of a second one
  (a check-then-dial window), as a proxy that checks with one lookup and connects by name
  does (net_dns_rebinding must FAIL).
- `address-allow`: it admits an IP-literal target when an allowed name resolves to that
  address, on any port, as an address-based allowlist does; a denied host that shares the
  address (as hosts behind one CDN do, and as the lab's origins do) is reached by it
  (net_doh_bypass must FAIL).

- `self-relay`: it admits a CONNECT to its own listener and trusts the connections it makes
  to itself, as a proxy that exempts local clients does; a request relayed through the proxy
  back into it is then never checked (net_proxy_relay must FAIL).

CONNECT is served too (the same checks, then a byte tunnel after the 200).

Test data (tests/integration/test_proxy_protocol_holes.py); stdlib only. It never resolves
through the system resolver and never dials anything outside 127.0.0.0/8 and 198.18.0.0/15
(the lab), whatever the fixture answers.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

TIMEOUT = 5.0
DIALABLE = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("198.18.0.0/15"))
LAB = ipaddress.ip_network("198.18.0.0/15")
HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "upgrade"}


class Refusal(Exception):
    """A refusal with its status and reason."""

    def __init__(self, status: int, reason: str) -> None:
        """Keep the status and reason."""
        super().__init__(reason)
        self.status = status
        self.reason = reason


def resolve(dns: tuple[str, int], name: str) -> str:
    """The first A record of `name` from the DNS fixture (a raw UDP query)."""
    qid = secrets.randbelow(65536)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    packet = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question + b"\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.sendto(packet, dns)
        data = sock.recv(4096)
    _, _, _, count = struct.unpack("!HHHH", data[:8])
    pos = 12 + len(question) + 4
    for _ in range(count):
        while data[pos] != 0 and data[pos] & 0xC0 != 0xC0:
            pos += data[pos] + 1
        pos += 2 if data[pos] & 0xC0 == 0xC0 else 1
        rtype, _, _, size = struct.unpack("!HHIH", data[pos : pos + 10])
        pos += 10
        if rtype == 1 and size == 4:
            return socket.inet_ntoa(data[pos : pos + 4])
        pos += size
    raise Refusal(502, f"{name} has no A record")


def rule_for(allowed: list[str], host: str, port: int) -> str | None:
    """The allowlist entry admitting host:port ("exact" or "suffix"), or None."""
    for entry in allowed:
        pattern, _, want = entry.rpartition(":")
        if int(want) != port:
            continue
        if pattern == host:
            return "exact"
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return "suffix"
    return None


def allowed_address(dns: tuple[str, int], allowed: list[str], literal: str) -> bool:
    """Whether some exactly allowed name resolves to `literal` (the `address-allow` mistake)."""
    names = {e.rpartition(":")[0] for e in allowed if not e.startswith("*.")}
    for name in names:
        with contextlib.suppress(Refusal, OSError):
            if resolve(dns, name) == literal:
                return True
    return False


def address_ok(address: str, rule: str) -> bool:
    """A lab address always; the loopback world's 127.0.0.1 only for an exact rule."""
    ip = ipaddress.ip_address(address)
    return ip in LAB or (rule == "exact" and address == "127.0.0.1")


def dial(address: str, port: int) -> socket.socket:
    """Connect, but never outside loopback and the lab, whatever the fixture answered."""
    if not any(ipaddress.ip_address(address) in net for net in DIALABLE):
        raise Refusal(403, f"will not dial {address}: outside loopback and the lab")
    return socket.create_connection((address, port), TIMEOUT)


class Conn:
    """Buffered reads from one socket."""

    def __init__(self, sock: socket.socket) -> None:
        """Wrap `sock`."""
        self.sock = sock
        self.buf = b""

    def fill(self) -> bool:
        """Read more; False at the end."""
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            return False
        self.buf += chunk
        return bool(chunk)

    def head(self) -> bytes | None:
        """The next head without its blank line, or None at the end."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > 65536 or not self.fill():
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head

    def take(self, n: int) -> bytes:
        """Exactly `n` bytes (fewer at the end)."""
        while len(self.buf) < n and self.fill():
            pass
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def parse(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    """Method, target and headers; a folded or malformed line is a 400."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in {"HTTP/1.1", "HTTP/1.0"}:
        raise Refusal(400, "malformed request line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise Refusal(400, "malformed header line")
        headers.append((name, value.strip()))
    return parts[0], parts[1], headers


def values(headers: list[tuple[str, str]], name: str) -> list[str]:
    """Every value of header `name`."""
    return [v for n, v in headers if n.lower() == name]


class Proxy:
    """The proxy; `mistake` is the one thing it does wrong."""

    def __init__(self, mistake: str, dns: tuple[str, int], allowed: list[str]) -> None:
        """Bind 127.0.0.1 on a free port."""
        self.mistake = mistake
        self.dns = dns
        self.allowed = allowed
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        # Local ports of the connections this proxy made to its own listener (`self-relay`).
        self.own_ports: set[int] = set()

    def serve(self) -> None:
        """Accept until the listener is closed."""
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(client,), daemon=True).start()

    def handle(self, client: socket.socket) -> None:
        """Serve one client connection (several requests under `keepalive`)."""
        client.settimeout(TIMEOUT)
        conn = Conn(client)
        upstream: socket.socket | None = None
        try:
            while True:
                head = conn.head()
                if head is None:
                    return
                # The mistake of `self-relay`: a connection from this proxy itself is trusted
                # (read after the head: by then the dial that made it has been recorded).
                peer_port = client.getpeername()[1]
                trusted = self.mistake == "self-relay" and peer_port in self.own_ports
                upstream = self.request(conn, head, upstream, trusted)
                if upstream is None or self.mistake != "keepalive":
                    return
        except Refusal as refusal:
            body = f"refused: {refusal.reason}\n".encode()
            with contextlib.suppress(OSError):
                client.sendall(
                    f"HTTP/1.1 {refusal.status} Refused\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: close\r\n\r\n".encode()
                    + body
                )
        except OSError:
            return
        finally:
            if upstream is not None:
                upstream.close()
            client.close()

    def admit(
        self,
        target: str,
        headers: list[tuple[str, str]],
        connect: bool = False,
        trusted: bool = False,
    ) -> tuple[str, int, str, str]:
        """Host, port, path and the vetted address of an absolute-form or CONNECT request."""
        if connect:
            authority, path = target, ""
        elif target.startswith("http://"):
            rest = target[len("http://") :]
            cut = min((i for i in map(rest.find, "/?") if i != -1), default=len(rest))
            authority, path = rest[:cut], rest[cut:] or "/"
        else:
            raise Refusal(400, "absolute-form http:// or CONNECT only")
        host, _, port_text = authority.partition(":")
        if not (port_text or "80").isdigit():
            # A bracketed IPv6 literal or a fragment in the authority: refused with a status,
            # never a dropped connection (net_host_canonical reads a refusal by its status).
            raise Refusal(400, f"bad authority {authority!r}")
        host, port = host.lower(), int(port_text or "80")
        rule = rule_for(self.allowed, host, port)
        if self.mistake == "self-relay" and connect and (host, port) == ("127.0.0.1", self.port):
            return host, port, path, host  # the mistake: its own listener is a fine target
        if rule is None and trusted:
            rule = "exact"  # the mistake: a request from itself skips the allowlist
        literal = host.replace(".", "").isdigit()
        if rule is None and literal and self.mistake == "address-allow":
            # The mistake: an address is admitted because an allowed name points at it.
            if allowed_address(self.dns, self.allowed, host):
                return host, port, path, host
        if rule is None:
            raise Refusal(403, f"{host}:{port} is not on the allowlist")
        for value in values(headers, "host"):
            if value.lower() != authority.lower():
                raise Refusal(421, "Host header differs from the target")
        address = resolve(self.dns, host)
        if not address_ok(address, rule):
            raise Refusal(403, f"{host} resolved to {address}, which is not allowed")
        if self.mistake == "rebind":
            # The mistake: the dial resolves the name again instead of using `address`.
            address = resolve(self.dns, host)
        return host, port, path, address

    def request(
        self, conn: Conn, head: bytes, upstream: socket.socket | None, trusted: bool = False
    ) -> socket.socket | None:
        """Admit and forward one request; returns the upstream kept open, if any."""
        method, target, headers = parse(head)
        if method == "CONNECT":
            host, port, path, address = self.admit(target, [], connect=True, trusted=trusted)
            upstream = dial(address, port)
            if (address, port) == ("127.0.0.1", self.port):
                self.own_ports.add(upstream.getsockname()[1])
            conn.sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.splice(conn, upstream)
            upstream.close()
            return None
        host, port, path, address = self.admit(target, headers, trusted=trusted)
        te, cl = values(headers, "transfer-encoding"), values(headers, "content-length")
        if self.mistake != "keepalive" and (te and cl or len(set(cl)) > 1):
            raise Refusal(400, "ambiguous body framing")
        if te and self.mistake != "keepalive":
            raise Refusal(400, "chunked bodies are not supported here")
        size = int(cl[0]) if cl and cl[0].isdigit() else 0
        tunnel = self.mistake == "upgrade" and bool(values(headers, "upgrade"))
        keep = self.mistake == "keepalive" or tunnel
        out = [f"{method} {path} HTTP/1.1"]
        for name, value in headers:
            if name.lower() in HOP and not tunnel:
                continue
            out.append(f"{name}: {value}")
        if not keep:
            out.append("Connection: close")
        if upstream is None:
            upstream = dial(address, port)
        upstream.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + conn.take(size))
        if tunnel:
            self.splice(conn, upstream)
            return None
        self.relay_one(upstream, conn.sock, until_close=not keep)
        return upstream if keep else None

    def relay_one(self, upstream: socket.socket, client: socket.socket, until_close: bool) -> None:
        """Relay one response: to the close, or its head and Content-Length body."""
        up = Conn(upstream)
        upstream.settimeout(TIMEOUT)
        if until_close:
            while up.fill():
                pass
            client.sendall(up.buf)
            return
        head = up.head()
        if head is None:
            raise Refusal(502, "no response")
        size = 0
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                size = int(value.strip())
        client.sendall(head + b"\r\n\r\n" + up.take(size))

    def splice(self, conn: Conn, upstream: socket.socket) -> None:
        """Relay bytes both ways until either side ends."""
        if conn.buf:
            upstream.sendall(conn.buf)

        def down() -> None:
            with contextlib.suppress(OSError):
                while chunk := upstream.recv(65536):
                    conn.sock.sendall(chunk)
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)

        thread = threading.Thread(target=down, daemon=True)
        thread.start()
        with contextlib.suppress(OSError):
            while chunk := conn.sock.recv(65536):
                upstream.sendall(chunk)
        thread.join(TIMEOUT)


def main(argv: list[str]) -> int:
    """Start the proxy, run the payload with it announced, stop."""
    cut = argv.index("--")
    mistake, dns_host, dns_port, allowed_json = argv[1:cut]
    payload = argv[cut + 1 :]
    # The harness's availability check renders placeholders as `<name>`: no fixture then, and
    # the test command runs beside a proxy that has nothing to admit.
    port = int(dns_port) if dns_port.isdigit() else 0
    allowed = json.loads(allowed_json) if allowed_json.startswith("[") else []
    proxy = Proxy(mistake, (dns_host, port), allowed)
    threading.Thread(target=proxy.serve, daemon=True).start()
    url = f"http://127.0.0.1:{proxy.port}"
    env = dict(os.environ, HTTP_PROXY=url, HTTPS_PROXY=url, http_proxy=url, https_proxy=url)
    try:
        return subprocess.run(payload, env=env, check=False).returncode
    finally:
        proxy.listener.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
