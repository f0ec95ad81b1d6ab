"""The egress proxy's child process: its listeners, one thread per client, admission, relaying.

Admission order, for every client: auth (TCP only) -> canonical host -> rules -> resolve ONCE
through the DNS fixture -> check the resolved address -> dial THAT address with a timeout. Each
refusal is an HTTP status with an `X-Proxy-Deny-Reason` header and a body naming the host and
the reason, and a JSON line in the decision log (the host-side witness of every attempt).

Started by `sandbox_attest.world.egress.proxy.start_proxy` as `python -m
sandbox_attest.world.egress.proxy CONFIG.json`, which runs `main` here; the per-start secret
arrives on stdin. Parsing and the byte movers are in `wire`, the unix socket's handoff in
`handoff`, the decision lines in `decisions`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_attest.host.proctitle import proxy_title, set_title
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.egress.config import READY_PREFIX, ProxyConfig
from sandbox_attest.world.egress.decisions import DecisionLog, DecisionRecord
from sandbox_attest.world.egress.handoff import Leash, take_handoff
from sandbox_attest.world.egress.rules import (
    Allowlist,
    EgressRequest,
    HostError,
    address_allowed,
    canonical_host,
)
from sandbox_attest.world.egress.wire import (
    DENY_HEADER,
    HOP_BY_HOP,
    MAX_HEAD,
    NONCE_HEADER,
    PROXY_USER,
    STATUS_REASONS,
    Refusal,
    RequestHead,
    abort_sockets,
    body_framing,
    drain,
    filter_response_head,
    forward_body,
    header_safe,
    nonce_from_target,
    parse_head,
    pump,
    quote_excerpt,
    split_authority,
)
from sandbox_attest.world.netguard import (
    OutsideLabError,
    check_destination,
    register_lab_namespaces,
)

if TYPE_CHECKING:
    from collections.abc import Callable


# The bytes a request line may begin with: a method is a token (RFC 9110 5.6.2), after any
# empty lines a server may skip (RFC 9112 2.2).
_TOKEN_BYTES = frozenset(
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)


def _refuse_if_not_http(received: bytes) -> None:
    """Refuse at once a connection whose first byte cannot begin an HTTP request.

    A SOCKS greeting (0x05) or a TLS ClientHello (0x16) would otherwise wait out the head
    deadline for a line that never comes; the refusal says what it looked like.

    Raises:
        Refusal: 400, naming the first byte.
    """
    head = received.lstrip(b"\r\n")
    if head and head[0] not in _TOKEN_BYTES:
        guess = {0x05: " (a SOCKS5 greeting?)", 0x04: " (a SOCKS4 request?)", 0x16: " (TLS?)"}
        raise Refusal(
            400,
            f"not an HTTP request: it begins with byte 0x{head[0]:02x}"
            f"{guess.get(head[0], '')}; this proxy speaks HTTP only",
        )


class _Server:
    def __init__(self, config: ProxyConfig, secret: str) -> None:
        self.config = config
        self.secret = secret
        self.allowlist = Allowlist(config.rules)
        self.log = DecisionLog(config.decision_log, secret)
        self.listeners: list[socket.socket] = []
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(config.max_clients)

    # -- lifecycle ----------------------------------------------------------------------------

    def bind(self) -> dict[str, object]:
        ready: dict[str, object] = {"pid": os.getpid(), "port": None, "socket": None}
        if self.config.unix_socket is not None:
            path = self.config.unix_socket
            if path.is_socket():
                path.unlink()  # a stale socket from a killed run; the path is ours by config
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            listener.listen(512)
            self.listeners.append(listener)
            threading.Thread(target=self._accept_loop, args=(listener, False), daemon=True).start()
            ready["socket"] = str(path)
        if self.config.tcp:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(512)
            self.listeners.append(listener)
            threading.Thread(target=self._accept_loop, args=(listener, True), daemon=True).start()
            ready["port"] = listener.getsockname()[1]
        return ready

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def request_stop(self, _signum: int, _frame: object) -> None:
        self._stop.set()

    def close(self) -> None:
        for listener in self.listeners:
            with contextlib.suppress(OSError):
                listener.close()
        if self.config.unix_socket is not None:
            self.config.unix_socket.unlink(missing_ok=True)
        self.log.close()

    def _accept_loop(self, listener: socket.socket, needs_auth: bool) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)  # EMFILE and friends: back off instead of spinning
                continue
            label = f"tcp:{peer[0]}:{peer[1]}" if needs_auth else "unix"
            if self._slots.acquire(blocking=False):
                self._spawn(self._handle, conn, label, needs_auth, holds_slot=True)
            else:
                self._spawn(self._turn_away, conn, label, needs_auth, holds_slot=False)

    def _spawn(
        self, target: Callable[..., None], conn: socket.socket, *args: object, holds_slot: bool
    ) -> None:
        """Serve `conn` in its own thread; if no thread can start, drop it, never the loop."""
        try:
            threading.Thread(target=target, args=(conn, *args), daemon=True).start()
        except RuntimeError:  # "can't start new thread": out of memory or a tasks limit
            print("egress proxy: cannot start a thread; connection dropped", file=sys.stderr)
            sys.stderr.flush()  # before the close, so whoever sees the drop can read why
            conn.close()
            if holds_slot:
                self._slots.release()
            time.sleep(0.05)

    def _turn_away(self, conn: socket.socket, label: str, needs_auth: bool) -> None:
        """Answer 503 to a client over the concurrency limit (it holds no slot).

        A handed-over connection is taken first, so the payload itself reads the 503.
        """
        record = DecisionRecord(client=label, decision="deny", status=503)
        record.reason = f"proxy busy: {self.config.max_clients} clients already connected"
        client = conn
        try:
            if not needs_auth:
                client, _ = take_handoff(conn, record, self.config.head_timeout)
        except (Refusal, OSError):
            pass  # not a clean handoff: the 503 goes to the unix connection itself
        self.log.write(record)
        try:
            self._refuse(client, Refusal(503, record.reason), record)
        finally:
            if client is not conn:
                client.close()
            conn.close()

    # -- one client ---------------------------------------------------------------------------

    def _handle(self, conn: socket.socket, label: str, needs_auth: bool) -> None:
        """Serve one accepted connection; `needs_auth` is the TCP route, else the unix route.

        Owns the connection's lifetime: the slot, the decision line, and the close of `conn`
        and of the handed-over client (each exactly once, after the leash let go of it);
        `_serve` owns the upstream's close.
        """
        record = DecisionRecord(client=label)
        client = conn
        leash: Leash | None = None
        logged = False
        try:
            initial = b""
            if not needs_auth:
                client, initial = take_handoff(conn, record, self.config.head_timeout)
                leash = Leash(conn, client) if client is not conn else None
            self._serve(client, initial, record, needs_auth=needs_auth, leash=leash)
        except Refusal as refusal:
            record.status = refusal.status
            record.reason = refusal.reason
            record.decision = "deny"
            if leash is not None:
                leash.note(record)
            # Deny lines are written before the answer, so a client that has read its 403
            # can already find the line (the witness never lags the refusal it records).
            self.log.write(record)
            logged = True
            self._refuse(client, refusal, record)
        except Exception as exc:
            if not isinstance(exc, OSError):
                # A bug must not kill the proxy or leak the descriptors; say so loudly.
                traceback.print_exc(file=sys.stderr)
            if record.decision == "allow":
                record.reason = f"{record.reason}; connection ended: {exc.__class__.__name__}"
            else:
                record.reason = f"client connection failed: {exc.__class__.__name__}"
        finally:
            self._finish(conn, client, leash, record, logged=logged)

    def _finish(
        self,
        conn: socket.socket,
        client: socket.socket,
        leash: Leash | None,
        record: DecisionRecord,
        *,
        logged: bool,
    ) -> None:
        """Close `conn` and `client` once each, free the slot, write the line if not yet done.

        Every way a client ends comes through here: refused, leash fired, either side closed
        or reset, a head timeout, a bug.
        """
        if leash is not None:
            leash.release()  # before the closes: the watcher may still shut these down
        if client is not conn:
            client.close()
        conn.close()
        self._slots.release()
        if not logged:
            if leash is not None:
                leash.note(record)  # last, so the line ends with the cut when it was one
            self.log.write(record)

    def _serve(
        self,
        client: socket.socket,
        initial: bytes,
        record: DecisionRecord,
        *,
        needs_auth: bool,
        leash: Leash | None = None,
    ) -> None:
        """Read the head, admit, then tunnel or forward; raises Refusal for every refusal.

        Owns the upstream: a handed-over client's `leash` holds it from the dial on, so a cut
        wakes the pump reading it, and lets go of it before it is closed here.
        """
        head, rest = self._read_head(client, record, initial)
        record.method = head.method
        record.target = head.target[:2048]
        # The nonce is read before auth so that even a 407 is attributed to its cell.
        record.nonce = head.get(NONCE_HEADER) or nonce_from_target(head)
        if needs_auth:
            self._check_auth(head)
        host, port, path = self._target(head, record)
        # Body framing is checked before the dial: a smuggling shape never costs a connect.
        framing = body_framing(head) if head.method != "CONNECT" else 0
        upstream = self._admit(host, port, record)
        record.decision = "allow"
        try:
            if leash is not None:
                leash.hold(upstream)
            if head.method == "CONNECT":
                self._connect(client, upstream, rest, record)
            else:
                self._forward_http(
                    client,
                    upstream,
                    head=head,
                    rest=rest,
                    host=host,
                    port=port,
                    path=path,
                    framing=framing,
                    record=record,
                )
        finally:
            if leash is not None:
                # The watcher may be shutting the upstream down right now: end it first, so
                # its shutdown can never land on a descriptor number reused after this close.
                leash.release()
            upstream.close()

    def _read_head(
        self, client: socket.socket, record: DecisionRecord, initial: bytes = b""
    ) -> tuple[RequestHead, bytes]:
        deadline = time.monotonic() + self.config.head_timeout
        buf = bytearray(initial)
        # Bytes handed over with the connection (`take_handoff`) are judged before any wait.
        _refuse_if_not_http(initial)
        while True:
            end = buf.find(b"\r\n\r\n")
            if end != -1:
                if end + 4 > MAX_HEAD:
                    raise Refusal(431, f"request head over {MAX_HEAD} bytes")
                break
            if len(buf) >= MAX_HEAD:
                raise Refusal(431, f"request head over {MAX_HEAD} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Refusal(
                    408, f"request head not complete within {self.config.head_timeout:g}s"
                )
            client.settimeout(remaining)
            try:
                chunk = client.recv(MAX_HEAD - len(buf))
            except TimeoutError:
                raise Refusal(
                    408, f"request head not complete within {self.config.head_timeout:g}s"
                ) from None
            if not chunk:
                record.reason = "client closed before a complete request head"
                raise OSError("client closed before a complete request head")
            buf += chunk
            _refuse_if_not_http(bytes(buf))
        client.settimeout(None)
        return parse_head(bytes(buf[:end])), bytes(buf[end + 4 :])

    def _check_auth(self, head: RequestHead) -> None:
        value = head.get("Proxy-Authorization")
        if value is None:
            raise Refusal(407, "proxy authentication required")
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "basic":
            raise Refusal(407, "proxy authentication must be Basic")
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise Refusal(407, "malformed Basic credentials") from None
        user, sep, password = decoded.partition(b":")
        ok = hmac.compare_digest(password, self.secret.encode())
        if not sep or user != PROXY_USER.encode() or not ok:
            raise Refusal(407, "bad proxy credentials")

    def _target(self, head: RequestHead, record: DecisionRecord) -> tuple[str, int, str]:
        """Canonical host, port and origin-form path of the request."""
        if head.method == "CONNECT":
            raw_host, port = split_authority(head.target, default_port=None)
            path = ""
        else:
            scheme, sep, remainder = head.target.partition("://")
            if not sep or scheme.lower() != "http":
                raise Refusal(
                    400,
                    "request target must be absolute-form http://... (use CONNECT for https)",
                )
            cut = min((i for i in map(remainder.find, "/?#") if i != -1), default=len(remainder))
            authority, path = remainder[:cut], remainder[cut:]
            path = path.split("#", 1)[0]
            if not path.startswith("/"):
                path = "/" + path
            raw_host, port = split_authority(authority, default_port=80)
        record.host, record.port = raw_host, port
        try:
            host = canonical_host(raw_host)
        except HostError as exc:
            raise Refusal(400, f"bad host: {exc}", raw_host) from None
        record.host = host
        if head.method != "CONNECT":
            self._check_host_header(head, host, port)
        return host, port, path

    def _check_host_header(self, head: RequestHead, host: str, port: int) -> None:
        value = head.get("Host")
        if value is None:
            return
        raw_host, header_port = split_authority(value.strip(), default_port=80)
        try:
            header_host = canonical_host(raw_host)
        except HostError as exc:
            raise Refusal(400, f"bad Host header: {exc}", host) from None
        if (header_host, header_port) != (host, port):
            raise Refusal(
                421,
                f"Host header {header_host}:{header_port} differs from the request target",
                host,
            )

    def _admit(self, host: str, port: int, record: DecisionRecord) -> socket.socket:
        """Rules, one resolution, the address check and the one dial; returns the upstream."""
        decision = self.allowlist.decide(EgressRequest(host, port))
        record.reason = decision.reason
        if not decision.allowed or decision.rule is None:
            raise Refusal(403, decision.reason, host)
        rule = decision.rule
        try:
            ipaddress.ip_address(host)
            is_literal = True  # an IP literal allowed by an exact rule: nothing to resolve
        except ValueError:
            is_literal = False
        if is_literal:
            address = host
        else:
            try:
                addresses = resolve(self.config.dns, host, timeout=self.config.dial_timeout)
            except ResolveError as exc:
                raise Refusal(502, f"name did not resolve: {exc}", host) from None
            if not addresses:
                raise Refusal(502, "name has no A record in the DNS fixture", host)
            address = addresses[0]
        record.address = address
        ok, why = address_allowed(address, rule, remote=self.config.remote_networks)
        if not ok:
            raise Refusal(403, why, host)
        try:
            check_destination(address)
        except OutsideLabError as exc:
            raise Refusal(403, str(exc), host) from None
        record.reason = f"{decision.reason}; {why}"
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.settimeout(self.config.dial_timeout)
        try:
            upstream.connect((address, port))
        except TimeoutError:
            upstream.close()
            raise Refusal(
                504, f"dial {address}:{port} timed out after {self.config.dial_timeout:g}s", host
            ) from None
        except OSError as exc:
            upstream.close()
            raise Refusal(
                502, f"dial {address}:{port} failed: {exc.strerror or exc}", host
            ) from None
        upstream.settimeout(None)
        return upstream

    def _refuse(self, client: socket.socket, refusal: Refusal, record: DecisionRecord) -> None:
        host = refusal.host or record.host or record.target or "?"
        where = f"{host}:{record.port}" if record.port is not None else host
        body = f"egress denied to {quote_excerpt(where)}: {refusal.reason}\n".encode(
            "utf-8", "replace"
        )
        header_reason = header_safe(refusal.reason)
        lines = [
            f"HTTP/1.1 {refusal.status} {STATUS_REASONS.get(refusal.status, 'Error')}",
            f"{DENY_HEADER}: {header_reason}",
            "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        if refusal.status == 407:
            lines.append(f'Proxy-Authenticate: Basic realm="{PROXY_USER}"')
        with contextlib.suppress(OSError):
            client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            client.shutdown(socket.SHUT_WR)
            drain(client)

    # -- data paths ---------------------------------------------------------------------------

    def _connect(
        self, client: socket.socket, upstream: socket.socket, rest: bytes, record: DecisionRecord
    ) -> None:
        """Answer an admitted CONNECT, forward what came with its head, then tunnel."""
        record.status = 200
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if rest:
            upstream.sendall(rest)
            record.bytes_up += len(rest)
        self._tunnel(client, upstream, record)

    def _tunnel(
        self, client: socket.socket, upstream: socket.socket, record: DecisionRecord
    ) -> None:
        counts = [0, 0]

        def up() -> None:
            counts[0] = pump(client, upstream, abort=(client, upstream))

        thread = threading.Thread(target=up, daemon=True)
        thread.start()
        try:
            counts[1] = pump(upstream, client, abort=(client, upstream))
        finally:
            thread.join()
            record.bytes_up += counts[0]
            record.bytes_down += counts[1]

    def _forward_http(
        self,
        client: socket.socket,
        upstream: socket.socket,
        *,
        head: RequestHead,
        rest: bytes,
        host: str,
        port: int,
        path: str,
        framing: int | None,
        record: DecisionRecord,
    ) -> None:
        connection_tokens = {
            t.strip().lower() for v in head.get_all("Connection") for t in v.split(",")
        }
        lines = [f"{head.method} {path} {head.version}"]
        for name, value in head.headers:
            lowered = name.lower()
            if lowered in HOP_BY_HOP or lowered in connection_tokens or lowered == "host":
                continue
            lines.append(f"{name}: {value}")
        host_value = f"[{host}]" if ":" in host else host
        lines.append(f"Host: {host_value}" + (f":{port}" if port != 80 else ""))
        lines.append("Connection: close")  # one request per client connection, never a second
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        upstream.sendall(out)
        record.bytes_up += len(out)
        counts = [0]

        def send_body() -> None:
            try:
                counts[0] = forward_body(client, upstream, rest, framing)
            except (OSError, Refusal):
                abort_sockets(client, upstream)

        thread = threading.Thread(target=send_body, daemon=True)
        thread.start()
        try:
            self._relay_response(client, upstream, record)
        finally:
            # The response is complete: whatever the client still sends is a second request or
            # the tail of an unread body, and neither may reach this upstream.
            abort_sockets(client, upstream)
            thread.join()
            record.bytes_up += counts[0]

    def _relay_response(
        self, client: socket.socket, upstream: socket.socket, record: DecisionRecord
    ) -> None:
        buf = bytearray()
        while True:
            end = buf.find(b"\r\n\r\n")
            if end != -1:
                head_bytes, buf = bytes(buf[:end]), buf[end + 4 :]
                status, out = filter_response_head(head_bytes)
                client.sendall(out)
                record.bytes_down += len(out)
                if 100 <= status < 200 and status != 101:
                    continue  # an interim response; the final one follows
                record.status = status
                break
            if len(buf) > MAX_HEAD:
                raise Refusal(502, "origin response head too large", record.host)
            chunk = upstream.recv(65536)
            if not chunk:
                raise Refusal(502, "origin closed without a response", record.host)
            buf += chunk
        if buf:
            client.sendall(buf)
            record.bytes_down += len(buf)
        record.bytes_down += pump(upstream, client, abort=(client, upstream))


# ---------------------------------------------------------------------------------------------
# Entry point of the child process
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the proxy from a config file; the secret arrives on stdin. Returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m sandbox_attest.world.egress.proxy CONFIG.json  (secret on stdin)",
            file=sys.stderr,
        )
        return 2
    # Every wrapper can read this process's command line in /proc: a neutral one, in the
    # shape the sweep finds an orphaned proxy by (sandbox_attest/host/proctitle.py, issue 23).
    set_title(proxy_title(args[0]))
    config = ProxyConfig.from_json(json.loads(Path(args[0]).read_text(encoding="utf-8")))
    register_lab_namespaces(*config.lab_namespaces)
    secret = sys.stdin.readline().strip()
    if not secret:
        print("egress proxy: no secret on stdin; start it with start_proxy()", file=sys.stderr)
        return 2
    server = _Server(config, secret)
    signal.signal(signal.SIGTERM, server.request_stop)
    signal.signal(signal.SIGINT, server.request_stop)
    try:
        ready = server.bind()
        sys.stdout.write(READY_PREFIX + json.dumps(ready) + "\n")
        sys.stdout.flush()
        server.wait()
    finally:
        server.close()
    return 0
