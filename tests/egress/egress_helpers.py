"""Helpers for the egress tests: real loopback origins and small raw-socket HTTP clients.

Nothing here is a mock: origins are threaded TCP/TLS servers on 127.0.0.1 (trustme certs).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import random
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sandbox_attest.catalog.records import WITNESS_WAIT_S
from sandbox_attest.world.egress.wire import PROXY_USER

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sandbox_attest.world.egress.proxy import ProxyProcess

SHIM = Path(__file__).resolve().parents[2] / "sandbox_attest" / "world" / "egress" / "shim.py"
BLOCK = 1024 * 1024
_BASE = random.Random(20261130).randbytes(BLOCK)  # noqa: S311  (test data, not secrets)

OriginMode = Literal["http", "tls", "echo", "source"]


def blob_block(i: int) -> bytes:
    """The i-th MiB of the deterministic test blob (its index stamped in, so order matters)."""
    return i.to_bytes(8, "big") + _BASE[8:]


def blob_sha256(size: int) -> str:
    """The sha256 of the first `size` bytes of the blob (size a multiple of 1 MiB)."""
    digest = hashlib.sha256()
    for i in range(size // BLOCK):
        digest.update(blob_block(i))
    return digest.hexdigest()


@dataclass
class Origin:
    """A small threaded loopback origin whose accept count and request log are witnesses.

    The accept thread counts a connection some time after the proxy's dial completed, so a
    test reads the count with `wait_for_accepts(n)` (a positive: wait, with the assessors'
    deadline, until n are counted) or `settled_accepts()` (an exact count, including zero, of
    every connection made before the call), never by reading `accepts` bare.

    Attributes:
        on_accept: test seam. Runs in the accept thread after `accept()` returned and before
            the connection is counted; a test blocks it on an Event to hold the count back
            and show that readers wait for it. None (the default) runs nothing.
        before_echo_close: test seam. In "echo" mode, runs after the client's EOF and before
            the origin ends its own side, so a test can keep the upstream half open and show
            that a tunnel ends for another reason. None (the default) closes at once.
    """

    mode: OriginMode
    host: str = "127.0.0.1"
    port: int = 0
    size: int = 0
    tls: ssl.SSLContext | None = None
    accepts: int = 0
    requests: list[dict[str, object]] = field(default_factory=list)
    trailing: list[bytes] = field(default_factory=list)
    offered: int = 0
    on_accept: Callable[[], None] | None = None
    before_echo_close: Callable[[], object] | None = None
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _conns: list[socket.socket] = field(default_factory=list)
    # Guards accepts, _conns and _markers; notified on every count and every marker reached.
    _counted: threading.Condition = field(default_factory=threading.Condition)
    # settled_accepts() markers: the marker connection's local address -> the count when the
    # accept thread reached it (None until then).
    _markers: dict[tuple[str, int], int | None] = field(default_factory=dict)
    _stopping: bool = False

    def start(self) -> Origin:
        """Listen and accept in a thread."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(256)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        """Close the listener and every live connection; join the threads."""
        self._stopping = True
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._counted:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=10)

    def wait_for_accepts(self, n: int, timeout: float = WITNESS_WAIT_S) -> int:
        """The accept count once it reaches `n`, or at the deadline; the caller compares.

        Returns as soon as `n` connections are counted, so a count that goes on past `n`
        later is not seen: for "exactly n, and no more" use `settled_accepts()`.

        Args:
            n: how many accepts the test expects.
            timeout: seconds to wait; the default is the deadline the assessors give a
                lagging witness (`sandbox_attest.catalog.records.WITNESS_WAIT_S`).
        """
        with self._counted:
            self._counted.wait_for(lambda: self.accepts >= n, timeout=timeout)
            return self.accepts

    def settled_accepts(self, timeout: float = WITNESS_WAIT_S) -> int:
        """The exact count of connections made to this origin before the call (zero included).

        Connects a marker connection of its own and waits until the accept thread reaches
        it. The listen queue is first in, first out, so by then every connection whose
        handshake completed earlier has been counted; the marker itself is not counted,
        served or logged.

        Raises:
            AssertionError: the accept thread did not reach the marker within `timeout`.
        """
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as marker:
            # Bind first so the marker's address is registered before the accept can happen.
            marker.bind((self.host, 0))
            address: tuple[str, int] = marker.getsockname()
            with self._counted:
                self._markers[address] = None
            marker.settimeout(timeout)
            marker.connect((self.host, self.port))
            with self._counted:
                reached = self._counted.wait_for(
                    lambda: self._markers[address] is not None, timeout=timeout
                )
                count = self._markers.pop(address)
        if not reached or count is None:
            raise AssertionError(f"origin {self.host}:{self.port} did not accept its marker")
        return count

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            with self._counted:
                if peer in self._markers:
                    self._markers[peer] = self.accepts
                    self._counted.notify_all()
                    conn.close()
                    continue
            if self.on_accept is not None:
                self.on_accept()
            with self._counted:
                self.accepts += 1
                self._conns.append(conn)
                self._counted.notify_all()
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.mode == "echo":
                self._echo(conn)
            elif self.mode == "source":
                self._source(conn)
            elif self.mode == "tls":
                assert self.tls is not None
                with self.tls.wrap_socket(conn, server_side=True) as tls_conn:
                    self._http(tls_conn, linger=False)
            else:
                self._http(conn, linger=True)
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def _echo(self, conn: socket.socket) -> None:
        buf = bytearray(256 * 1024)
        while n := conn.recv_into(buf):
            conn.sendall(memoryview(buf)[:n])
        if self.before_echo_close is not None:
            self.before_echo_close()
        conn.shutdown(socket.SHUT_WR)

    def _source(self, conn: socket.socket) -> None:
        for i in range(self.size // BLOCK):
            conn.sendall(blob_block(i))
            self.offered += BLOCK
        conn.shutdown(socket.SHUT_WR)

    def _http(self, conn: socket.socket, *, linger: bool) -> None:
        conn.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            # Read the whole chunked body before answering, as a real origin does: answering
            # early lets the proxy close the upstream mid-body, and the body's arrival would
            # then depend on thread timing.
            length, rest = _chunked_length(conn, rest)
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        body, extra = rest[:length], rest[length:]
        nonce = headers.get("x-attest-nonce", "")
        self.requests.append({"line": lines[0], "headers": headers, "body": body, "raw_head": head})
        payload = f"ok {nonce}".encode()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nX-Proxy-Deny-Reason: forged-by-origin\r\n"
            b"Content-Type: text/plain\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        if not linger:
            return
        # Keep reading after the response: anything that arrives is a request the proxy
        # should never have forwarded on this connection.
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(3)
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                extra += chunk
        self.trailing.append(extra)


def _recv_at_least(conn: socket.socket, data: bytes, size: int) -> bytes:
    """`data` plus what `conn` sends until at least `size` bytes are held.

    Raises:
        OSError: the peer closed first (a truncated body).
    """
    while len(data) < size:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("peer closed inside a chunked body")
        data += chunk
    return data


def _chunked_length(conn: socket.socket, data: bytes) -> tuple[int, bytes]:
    """Length of the complete chunked body at the start of `data`, reading more as needed.

    Returns the offset just past the trailers' empty line (bytes after it are not the body)
    and the data read so far, which holds at least that many bytes.
    """
    pos = 0
    while True:
        while (end := data.find(b"\r\n", pos)) == -1:
            data = _recv_at_least(conn, data, len(data) + 1)
        size = int(data[pos:end].split(b";", 1)[0].strip(), 16)
        pos = end + 2
        if size == 0:
            while True:  # trailers, up to the empty line
                while (end := data.find(b"\r\n", pos)) == -1:
                    data = _recv_at_least(conn, data, len(data) + 1)
                line_empty = end == pos
                pos = end + 2
                if line_empty:
                    return pos, data
        pos += size + 2
        data = _recv_at_least(conn, data, pos)


def auth_header(secret: str, user: str = PROXY_USER) -> str:
    """A Proxy-Authorization header line (with CRLF) for `user:secret`."""
    token = base64.b64encode(f"{user}:{secret}".encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


def tcp_client(proxy: ProxyProcess) -> socket.socket:
    """A fresh TCP connection to the proxy."""
    assert proxy.port is not None
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=10)


def read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response head; returns (status, lowercased headers, bytes read past it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed inside the response head: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(" ")[1]), headers, rest


def read_all(sock: socket.socket) -> bytes:
    """Everything until EOF."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def exchange(proxy: ProxyProcess, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one raw request over TCP, read the whole response: (status, headers, body)."""
    with tcp_client(proxy) as sock:
        sock.sendall(request)
        status, headers, rest = read_head(sock)
        if status == 200 and request.startswith(b"CONNECT"):
            sock.shutdown(socket.SHUT_WR)  # end the tunnel: an echo origin then closes too
        return status, headers, rest + read_all(sock)


def connect_request(target: str, secret: str | None, extra: str = "") -> bytes:
    """A CONNECT head for `target` (authenticated when `secret` is given)."""
    auth = auth_header(secret) if secret else ""
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}{extra}\r\n".encode()


def fd_count(pid: int) -> int:
    """Open descriptors of a process."""
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def vm_rss_kib(pid: int) -> int:
    """Resident set size of a process in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS line")


@contextlib.contextmanager
def running_shim(socket_path: Path, *extra: str) -> Iterator[int]:
    """The shim in serve mode bridging a free loopback port to `socket_path`; yields the port."""
    with shim_process(socket_path, *extra) as (port, _):
        yield port


@contextlib.contextmanager
def shim_process(
    socket_path: Path, *extra: str, python: str = sys.executable
) -> Iterator[tuple[int, int]]:
    """The shim in serve mode with extra arguments, on `python`; yields (port, pid)."""
    proc = subprocess.Popen(
        [python, str(SHIM), "--unix", str(socket_path), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY 127.0.0.1:"), line
        yield int(line.rsplit(":", 1)[1]), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll `predicate` until true or the deadline; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
