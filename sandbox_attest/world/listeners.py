"""Host-side witnesses a sandbox must never reach: direct-egress listeners and fake daemons.

`DirectEgressListener` is a plain TCP and UDP endpoint on 127.0.0.1. Nothing legitimate talks
to it, so every connection or datagram it logs is a direct-egress escape (or the host's own
control attempt, told apart by the nonce in the bytes).

`FakeDaemon` answers docker-style `GET /_ping` on a unix socket (a filesystem path, or on Linux
an abstract-namespace name that a mount namespace cannot hide). A sandbox that can reach it
could have reached a real daemon socket; the request log, tagged by nonce, is the witness.

`ConnectionTrackingMixIn` is shared with `sandbox_attest.world.origins`: it lets a threaded server
stop *all* of its connection threads, not just the accept loop, so a world leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self
from urllib.parse import parse_qs, urlsplit

from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise
from sandbox_attest.world.info import NONCE_HEADER

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

LOOPBACK = "127.0.0.1"
PREFIX_LIMIT = 512  # bytes of each connection/datagram kept in the log
TCP_READ_WINDOW_S = 2.0  # how long a connection may take to send its first bytes
# sockaddr_un.sun_path is 108 bytes on Linux and 104 on macOS; stay under both.
_UNIX_PATH_MAX = 103


class ConnectionTrackingMixIn(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """Thread-per-connection serving whose threads `close_connections` can end and join.

    `socketserver.ThreadingMixIn` with daemon threads forgets them; a slow client streaming
    the 18 MiB blob would outlive `stop()`. Here each connection's socket is recorded, so stop
    can shut the sockets down (unblocking the handlers) and join the threads.
    """

    daemon_threads = True
    connection_timeout: ClassVar[float] = 30.0

    _track_lock: threading.Lock
    _tracked: dict[threading.Thread, socket.socket]

    def init_tracking(self) -> None:
        """Set up the bookkeeping; call from the server's `__init__` before serving."""
        self._track_lock = threading.Lock()
        self._tracked = {}

    def server_activate(self) -> None:
        """Listen on a non-blocking socket, so the serving loop can always see shutdown().

        `serve_forever` polls, then accepts. accept(2) says why that is not enough: the
        connection that poll reported "might have been removed by an asynchronous network
        error or another thread before accept() is called", and a blocking accept then waits
        for the next client, deaf to shutdown() (a soak run hung for good in an origin's
        stop). Non-blocking, that accept fails with EAGAIN, which socketserver drops, and
        the loop polls again.
        """
        super().server_activate()
        # (the TCPServer or UnixStreamServer this mixes into made `socket`; BaseServer has none)
        listener: socket.socket = self.socket  # type: ignore[attr-defined]
        listener.setblocking(False)  # noqa: FBT003  (the socket API's own positional flag)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve `request` in a new daemon thread that is remembered until it ends."""
        thread = threading.Thread(
            target=self._serve_tracked,
            args=(request, client_address),
            daemon=True,
            name=f"{type(self).__name__}-conn",
        )
        with self._track_lock:
            self._tracked[thread] = request
        thread.start()

    def _serve_tracked(self, request: socket.socket, client_address: Any) -> None:
        try:
            request.settimeout(self.connection_timeout)
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._track_lock:
                self._tracked.pop(threading.current_thread(), None)

    def track_socket(self, sock: socket.socket) -> None:
        """Record `sock` (e.g. the TLS wrapper) as the current thread's connection."""
        with self._track_lock:
            self._tracked[threading.current_thread()] = sock

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Drop client-side network failures quietly; report anything else on stderr."""
        exc = sys.exception()
        if isinstance(exc, OSError):
            # Resets, timeouts and failed TLS handshakes are the clients' business (the
            # negative-control tests cause them on purpose), not a fixture failure.
            return
        super().handle_error(request, client_address)

    def close_connections(self, timeout: float = 5.0) -> None:
        """Shut every open connection down and join its thread (at most `timeout` each)."""
        with self._track_lock:
            tracked = list(self._tracked.items())
        for _, sock in tracked:
            fd = sock.fileno()
            if fd < 0:
                continue
            # Shut down through a dup of the fd: calling shutdown() on an SSLSocket from this
            # thread would also drop its SSL object under the handler's feet.
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as dup:
                dup.shutdown(socket.SHUT_RDWR)
        for thread, _ in tracked:
            thread.join(timeout)


def shut_down(servers: Mapping[str, socketserver.BaseServer], timeout: float) -> list[str]:
    """Ask every serving loop to end, all at once; the names of any still running after it.

    Each loop ends within one poll interval. `socketserver.shutdown` itself would wait for
    ever on a wedged loop, so each runs in a thread of its own, waited on up to `timeout`:
    stopping a fixture never hangs a run (or the test suite) in its teardown. A wedged loop's
    stopper is left behind with it (a daemon thread); the caller reports the loop by name.
    """
    stoppers = {
        name: threading.Thread(target=server.shutdown, daemon=True, name=f"stop-{name}")
        for name, server in servers.items()
    }
    for stopper in stoppers.values():
        stopper.start()
    deadline = time.monotonic() + timeout
    for stopper in stoppers.values():
        stopper.join(max(0.0, deadline - time.monotonic()))
    return [name for name, stopper in stoppers.items() if stopper.is_alive()]


def _now() -> float:
    return time.time()


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address or "")


class DirectEgressListener:
    """A TCP and a UDP listener (127.0.0.1, or every address) that log everything reaching them.

    One selector thread serves both; TCP connections are read for up to `TCP_READ_WINDOW_S`
    or `PREFIX_LIMIT` bytes, then closed. It never answers: a connect that succeeded and a
    datagram that arrived are the whole witness. Use as a context manager or start()/stop().
    """

    def __init__(self, host: str = LOOPBACK, *, tcp_port: int = 0, udp_port: int = 0) -> None:
        """Prepare (but do not bind) the listeners.

        Args:
            host: where to bind: a loopback address, or "::" for every address of the
                namespace, IPv4 and IPv6 alike (the lab's witnesses for the whole class).
            tcp_port: the TCP port, 0 for a free one (the lab gives both sides one port).
            udp_port: the UDP port, likewise.
        """
        self._host = host
        self._want = (tcp_port, udp_port)
        self._lock = threading.Lock()
        self._tcp_log: list[dict[str, Any]] = []
        self._udp_log: list[dict[str, Any]] = []
        self._tcp: socket.socket | None = None
        self._udp: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self.tcp_port = 0
        self.udp_port = 0

    def __enter__(self) -> Self:
        """Start and return the listener."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the listener."""
        self.stop()

    def start(self) -> None:
        """Bind both sockets on ephemeral ports and start the serving thread.

        Raises:
            FixtureError: a socket could not be bound.
        """
        try:
            if self._host == "::":
                self._tcp = socket.create_server(
                    ("::", self._want[0]), family=socket.AF_INET6, dualstack_ipv6=True
                )
                self._udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
                self._udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            else:
                self._tcp = socket.create_server((self._host, self._want[0]))
                self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._udp.bind((self._host, self._want[1]))
        except OSError as exc:
            self._close_sockets()
            raise FixtureError(
                f"direct-egress listener could not bind {self._host}: {exc}"
            ) from exc
        self._tcp.setblocking(False)  # noqa: FBT003  (stdlib signature)
        self._udp.setblocking(False)  # noqa: FBT003  (stdlib signature)
        self.tcp_port = self._tcp.getsockname()[1]
        self.udp_port = self._udp.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._loop, name="direct-egress", daemon=True)
        self._thread.start()

    def is_serving(self) -> bool:
        """Whether the serving thread runs: a dead listener would witness no escape."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the thread and close every socket; safe to call twice."""
        if self._thread is not None and self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
            self._thread.join(5.0)
            self._thread = None
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._tcp, self._udp, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._tcp = self._udp = self._wake_r = self._wake_w = None

    def _loop(self) -> None:
        assert self._tcp is not None  # noqa: S101  (set by start())
        assert self._udp is not None  # noqa: S101
        assert self._wake_r is not None  # noqa: S101
        sel = selectors.DefaultSelector()
        sel.register(self._tcp, selectors.EVENT_READ, "accept")
        sel.register(self._udp, selectors.EVENT_READ, "udp")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        # open connection -> (its log record, raw bytes so far, deadline)
        conns: dict[socket.socket, tuple[dict[str, Any], bytearray, float]] = {}
        try:
            while True:
                now = time.monotonic()
                timeout = min((d for _, _, d in conns.values()), default=now + 1.0) - now
                for key, _ in sel.select(max(timeout, 0.0)):
                    if key.data == "wake":
                        return
                    if key.data == "accept":
                        self._accept(sel, conns)
                    elif key.data == "udp":
                        self._datagram()
                    else:
                        self._read(sel, conns, key.fileobj)  # type: ignore[arg-type]  # always a socket here
                now = time.monotonic()
                for conn in [c for c, (_, _, d) in conns.items() if d <= now]:
                    self._finish(sel, conns, conn)
        finally:
            for conn in list(conns):
                self._finish(sel, conns, conn)
            sel.close()

    def _accept(
        self,
        sel: selectors.BaseSelector,
        conns: dict[socket.socket, tuple[dict[str, Any], bytearray, float]],
    ) -> None:
        assert self._tcp is not None  # noqa: S101
        try:
            conn, address = self._tcp.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)  # noqa: FBT003  (stdlib signature)
        record: dict[str, Any] = {
            "time": _now(),
            "transport": "tcp",
            "peer": _peer(address),
            # The address the sandbox reached: on a wildcard bind (the lab), which one it was.
            "local": _peer(conn.getsockname()),
            "data": "",
            "size": 0,
        }
        # Logged at accept, not at close: the connect itself is the escape, even with no bytes.
        with self._lock:
            self._tcp_log.append(record)
        conns[conn] = (record, bytearray(), time.monotonic() + TCP_READ_WINDOW_S)
        sel.register(conn, selectors.EVENT_READ, "conn")

    def _read(
        self,
        sel: selectors.BaseSelector,
        conns: dict[socket.socket, tuple[dict[str, Any], bytearray, float]],
        conn: socket.socket,
    ) -> None:
        record, buf, _ = conns[conn]
        try:
            data = conn.recv(PREFIX_LIMIT - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        buf += data
        with self._lock:
            record["data"] = buf.decode("utf-8", "backslashreplace")
            record["size"] = len(buf)
            record["_raw"] = bytes(buf)
        if not data or len(buf) >= PREFIX_LIMIT:
            self._finish(sel, conns, conn)

    @staticmethod
    def _finish(
        sel: selectors.BaseSelector,
        conns: dict[socket.socket, tuple[dict[str, Any], bytearray, float]],
        conn: socket.socket,
    ) -> None:
        conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        conn.close()

    def _datagram(self) -> None:
        assert self._udp is not None  # noqa: S101
        while True:
            try:
                data, address = self._udp.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            prefix = data[:PREFIX_LIMIT]
            with self._lock:
                self._udp_log.append(
                    {
                        "time": _now(),
                        "transport": "udp",
                        "peer": _peer(address),
                        "data": prefix.decode("utf-8", "backslashreplace"),
                        "size": len(data),
                        "_raw": prefix,
                    }
                )

    @staticmethod
    def _public(record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if not k.startswith("_")}

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """Copies of the logs: `{"tcp": [...], "udp": [...]}`, oldest first.

        Each record has `time`, `transport`, `peer`, `data` (the received prefix, UTF-8 with
        backslash escapes) and `size` (bytes received, capped at 512 for TCP).
        """
        with self._lock:
            return {
                "tcp": [self._public(r) for r in self._tcp_log],
                "udp": [self._public(r) for r in self._udp_log],
            }

    def records_with(self, nonce: str) -> dict[str, list[dict[str, Any]]]:
        """Like `records`, keeping only connections/datagrams whose bytes contain `nonce`."""
        needle = nonce.encode()
        with self._lock:
            return {
                name: [self._public(r) for r in log if needle in r.get("_raw", b"")]
                for name, log in (("tcp", self._tcp_log), ("udp", self._udp_log))
            }


SocketKind = Literal["unix", "abstract"]


class _DaemonHandler(BaseHTTPRequestHandler):
    """Answers like the Docker engine's `/_ping`; everything else is docker's JSON 404."""

    server: _DaemonServer
    protocol_version = "HTTP/1.1"
    server_version = disguise.DAEMON_SERVER
    sys_version = ""

    def do_GET(self) -> None:
        """Log the request, then answer `/_ping` with OK or anything else with 404."""
        self._log_request()
        if urlsplit(self.path).path in {"/_ping", "/v1.43/_ping"}:
            self._reply(200, b"OK", "text/plain; charset=utf-8")
        else:
            self._reply(404, b'{"message":"page not found"}\n', "application/json")

    def do_HEAD(self) -> None:
        """Docker clients also probe with HEAD /_ping; log it and answer like GET."""
        self._log_request()
        self._reply(200, b"", "text/plain; charset=utf-8")

    def _log_request(self) -> None:
        headers = {k: v for k, v in self.headers.items()}  # noqa: C416  (Message is not a dict)
        nonce = self.headers.get(NONCE_HEADER)
        if not nonce:
            values = parse_qs(urlsplit(self.path).query).get("nonce")
            nonce = values[0] if values else None
        self.server.record(
            {
                "time": _now(),
                "socket": self.server.kind,
                "request_line": self.requestline,
                "headers": headers,
                "nonce": nonce,
            }
        )

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Api-Version", "1.43")
        self.send_header("Docker-Experimental", "false")
        self.send_header("Ostype", "linux")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (base signature)
        """Silence the stderr access log; `FakeDaemon.records` is the log."""

    def address_string(self) -> str:
        """Unix peers have no address; name the socket kind instead."""
        return self.server.kind


class _DaemonServer(ConnectionTrackingMixIn, socketserver.UnixStreamServer):
    connection_timeout = 10.0

    def __init__(
        self, address: str, kind: SocketKind, record: Callable[[dict[str, Any]], None]
    ) -> None:
        self.kind: SocketKind = kind
        self.record = record
        self.init_tracking()
        super().__init__(address, _DaemonHandler)


class FakeDaemon:
    """A docker-style daemon stand-in on one unix socket: a filesystem path or an abstract name.

    Give exactly one of `path` or `abstract`. Abstract names are Linux-only; the name is given
    without its leading NUL. `stop()` removes the socket file.
    """

    def __init__(self, *, path: Path | None = None, abstract: str | None = None) -> None:
        """Prepare the daemon for `path` or `abstract` (exactly one)."""
        if (path is None) == (abstract is None):
            raise FixtureError("FakeDaemon needs exactly one of path= or abstract=")
        if abstract is not None and not sys.platform.startswith("linux"):
            raise FixtureError(
                f"abstract unix sockets exist only on Linux (this is {sys.platform}); "
                "use FakeDaemon(path=...)"
            )
        if path is not None and len(os.fsencode(path)) > _UNIX_PATH_MAX:
            raise FixtureError(
                f"unix socket path {str(path)!r} is longer than {_UNIX_PATH_MAX} bytes; "
                "use a shorter run directory"
            )
        self.path = path
        self.abstract = abstract
        self.kind: SocketKind = "unix" if path is not None else "abstract"
        self._lock = threading.Lock()
        self._log: list[dict[str, Any]] = []
        self._server: _DaemonServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        """Start and return the daemon."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the daemon."""
        self.stop()

    @property
    def address(self) -> str:
        """The `bind()`/`connect()` address: the path, or the name with its leading NUL."""
        return str(self.path) if self.path is not None else f"\0{self.abstract}"

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._log.append(entry)

    def start(self) -> None:
        """Bind the socket and serve in a background thread.

        Raises:
            FixtureError: the socket could not be bound (path exists, name taken).
        """
        try:
            self._server = _DaemonServer(self.address, self.kind, self._record)
        except OSError as exc:
            raise FixtureError(
                f"fake daemon could not bind its {self.kind} socket {self.address!r}: {exc}"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"fake-daemon-{self.kind}",
            daemon=True,
        )
        self._thread.start()

    def is_serving(self) -> bool:
        """Whether the serving thread runs: a dead daemon would witness no connection."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop serving, end open connections, remove the socket file; safe to call twice."""
        server, self._server = self._server, None
        stuck = shut_down({self.kind: server}, 5.0) if server is not None else []
        if server is not None:
            server.server_close()
            server.close_connections()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        if self.path is not None and server is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if stuck:
            raise FixtureError(f"the fake {self.kind} daemon's serving loop did not stop")

    def records(self, nonce: str | None = None) -> list[dict[str, Any]]:
        """Copies of the request log, oldest first; only `nonce`'s requests if given."""
        with self._lock:
            return [dict(r) for r in self._log if nonce is None or r["nonce"] == nonce]
