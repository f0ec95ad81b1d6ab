#!/usr/bin/python3
"""Deliberately broken egress servers for the issue-28 proxy holes (tests/data/newclasses/*.toml).

    python3 route_holes.py MODE UNIX_SOCKET DNS_HOST DNS_PORT ALLOWED_CSV -- CMD ARGS...

Listens on UNIX_SOCKET (the harness's stdlib shim relays a loopback port inside the sandbox
to it), runs CMD, serves until CMD exits and exits with its code. MODE:

  resolve-first  an HTTP proxy (CONNECT, absolute-form) that resolves the requested host
                 BEFORE it checks ALLOWED_CSV (`name:port,...`): the hole of
                 net_proxy_dns_exfil. Every denied request still gets its 403.
  allow-internal an HTTP proxy that checks its allowlist before it resolves, but also admits
                 every `*.internal` host "for internal services": the hole of
                 net_metadata_service (the metadata service's names end in .internal).
  socks5         an open SOCKS5 relay (no auth, CONNECT to any name, UDP ASSOCIATE refused):
                 the hole of net_socks5.
  no-label-boundary
                 an HTTP proxy that checks its allowlist before it resolves, but matches a
                 host by string suffix, not on a label boundary (`evilallowed.test` passes as
                 `allowed.test`), and answers 403 "upstream failed: NXDOMAIN for <host>" when
                 the lookup then fails: the hole of net_host_canonical (issue 26).
  correct        the same HTTP proxy done right: the canonical host (lower case, one trailing
                 dot dropped) and port must be on ALLOWED_CSV exactly, checked before any
                 lookup; the clean wrapper of tests/integration/test_identity_proxy.py.

Network rule (DEVELOPERS.md): names are resolved only through the DNS fixture named on the
command line (never the system resolver), and only an answer on loopback or in the lab's
198.18.0.0/15 is dialled; anything else is refused. Stdlib only.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from typing import Callable, Optional, Set, Tuple

Dns = Optional[Tuple[str, int]]
Serve = Callable[[socket.socket, Dns, Set[str]], None]


def resolve(dns: Dns, name: str) -> str | None:
    """An A query for `name` to the DNS fixture; the address, or None."""
    if dns is None:
        return None
    qid = int.from_bytes(os.urandom(2), "big")
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p) + b"\0"
    packet = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)
    fam = socket.AF_INET6 if ":" in dns[0] else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_DGRAM)
    sock.settimeout(3)
    try:
        sock.sendto(packet, dns)
        data = sock.recv(4096)
    except OSError:
        return None
    finally:
        sock.close()
    if len(data) < 16 or struct.unpack("!H", data[6:8])[0] == 0:
        return None
    return socket.inet_ntoa(data[-4:])


def harness_owned(address: str | None) -> bool:
    """Loopback or the lab's range: the only places this server may ever dial."""
    try:
        a = [int(x) for x in (address or "").split(".")]
    except ValueError:
        return False
    return len(a) == 4 and (a[0] == 127 or (a[0] == 198 and a[1] in (18, 19)))


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            chunk = src.recv(65536)
            if not chunk:
                break
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def splice(conn: socket.socket, upstream: socket.socket) -> None:
    threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
    pump(conn, upstream)


FORBIDDEN = (b"HTTP/1.1 403 Forbidden\r\nX-Proxy-Deny-Reason: not on the list\r\n"
             b"Content-Length: 0\r\nConnection: close\r\n\r\n")


def serve_http(conn: socket.socket, dns: Dns, allowed: Set[str]) -> None:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            return
        head += chunk
    words = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(words) < 2:
        return
    method, target = words[0], words[1]
    hostport = target if method == "CONNECT" else target.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    address = resolve(dns, host)  # the hole: before the allowlist is read
    if address is None or hostport not in allowed or not harness_owned(address) or method != "CONNECT":
        conn.sendall(FORBIDDEN)
        return
    upstream = socket.create_connection((address, int(port)), timeout=10)
    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    rest = head.split(b"\r\n\r\n", 1)[1]
    if rest:
        upstream.sendall(rest)
    splice(conn, upstream)


def canonical(host: str) -> str:
    """Lower case, one trailing dot dropped: `ALLOWED.test.` is `allowed.test`."""
    host = host.lower()
    return host[:-1] if host.endswith(".") else host


def admits_internal(host: str, port: str, allowed: Set[str]) -> bool:
    # The hole: a suffix rule for internal names beside the allowlist.
    return "%s:%s" % (host, port) in allowed or host.endswith(".internal")


def admits_exactly(host: str, port: str, allowed: Set[str]) -> bool:
    return "%s:%s" % (canonical(host), port) in allowed


def admits_suffix(host: str, port: str, allowed: Set[str]) -> bool:
    # The hole: a string suffix, no label boundary (`evilallowed.test` ends in `allowed.test`).
    return any(canonical(host).endswith(a.rpartition(":")[0]) and port == a.rpartition(":")[2]
               for a in allowed)


Admits = Callable[[str, str, Set[str]], bool]


def checking_proxy(admits: Admits) -> Serve:
    """An HTTP proxy that asks `admits` before it resolves (the allowlist first)."""
    return lambda conn, dns, allowed: serve_checked(conn, dns, allowed, admits)


def serve_checked(conn: socket.socket, dns: Dns, allowed: Set[str], admits: Admits) -> None:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            return
        head += chunk
    words = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(words) < 3:
        return
    method, target, version = words[0], words[1], words[2]
    tunnel = method == "CONNECT"
    hostport = target if tunnel else target.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not admits(host, port, allowed):
        conn.sendall(FORBIDDEN)
        return
    address = resolve(dns, canonical(host))
    if address is None:
        conn.sendall(FORBIDDEN.replace(b"not on the list", b"upstream failed: NXDOMAIN for "
                                       + canonical(host).encode("latin-1", "replace")))
        return
    if not harness_owned(address):
        conn.sendall(FORBIDDEN)
        return
    upstream = socket.create_connection((address, int(port)), timeout=10)
    rest = head.split(b"\r\n\r\n", 1)[1]
    if tunnel:
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    else:
        # absolute-form to origin-form, the rest of the head as it came
        path = "/" + target.split("://", 1)[-1].split("/", 1)[1] if "/" in target.split(
            "://", 1)[-1] else "/"
        first = ("%s %s %s" % (method, path, version)).encode("latin-1")
        rest = first + b"\r\n" + head.split(b"\r\n", 1)[1].split(b"\r\n\r\n", 1)[0] + (
            b"\r\n\r\n") + rest
    if rest:
        upstream.sendall(rest)
    splice(conn, upstream)


def recv_exact(conn: socket.socket, size: int) -> bytes:
    buf = b""
    while len(buf) < size:
        chunk = conn.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


def socks_reply(code: int) -> bytes:
    return b"\x05" + bytes([code]) + b"\x00\x01" + b"\x00" * 6


def serve_socks(conn: socket.socket, dns: Dns, allowed: Set[str]) -> None:
    del allowed  # the hole: an open relay checks nothing
    version, count = recv_exact(conn, 2)
    methods = recv_exact(conn, count)
    if version != 5 or 0 not in methods:
        conn.sendall(b"\x05\xff")
        return
    conn.sendall(b"\x05\x00")
    _, command, _, atyp = recv_exact(conn, 4)
    if atyp == 3:
        host = recv_exact(conn, recv_exact(conn, 1)[0]).decode("latin-1")
        address: str | None = resolve(dns, host)
    elif atyp == 1:
        address = socket.inet_ntoa(recv_exact(conn, 4))
    else:
        conn.sendall(socks_reply(8))
        return
    port = struct.unpack("!H", recv_exact(conn, 2))[0]
    if command != 1:
        conn.sendall(socks_reply(7))  # UDP ASSOCIATE and BIND: not over a unix relay
        return
    if address is None or not harness_owned(address):
        conn.sendall(socks_reply(4))
        return
    upstream = socket.create_connection((address, port), timeout=10)
    conn.sendall(socks_reply(0))
    splice(conn, upstream)


def handle(serve: Serve, conn: socket.socket, dns: Dns, allowed: Set[str]) -> None:
    try:
        serve(conn, dns, allowed)
    except (OSError, ConnectionError, ValueError):
        pass
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    mode, path, dns_host, dns_port, allowed = argv[1:6]
    cmd = argv[argv.index("--") + 1:]
    serve: Serve = {"resolve-first": serve_http, "allow-internal": checking_proxy(admits_internal),
                    "socks5": serve_socks, "no-label-boundary": checking_proxy(admits_suffix),
                    "correct": checking_proxy(admits_exactly)}[mode]
    # The availability check renders placeholders it cannot know yet as `<name>`: then there
    # is no fixture to ask, and every name stays unresolved (refused).
    dns = (dns_host, int(dns_port)) if dns_port.isdigit() else None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            args = (serve, conn, dns, set(allowed.split(",")))
            threading.Thread(target=handle, args=args, daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
