"""Per-cell loopback listeners: the host witness of the network probes.

A `LoopbackWitness` (a service with a banner, a rogue proxy, IPv6/UDP listeners) is started by
a spec's `prepare` and stopped in `cleanup`; its log of connections and datagrams, filtered by
the cell's nonce, is what the host saw. `PerCellSpec` keeps that per-cell state for the specs
of both `route` and `direct`, which is why it lives below them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from sandbox_attest.catalog.controls import control_record, host_check, new_control_nonce
from sandbox_attest.catalog.spec import CellContext, SpecBase
from sandbox_attest.errors import FixtureError
from sandbox_attest.verdict import Assessment

if TYPE_CHECKING:
    from collections.abc import Callable


# no rule or a forbidden address (403), a Host header naming another host (421).
REFUSAL_STATUSES = frozenset({400, 403, 421})
_POLL_S = 0.2
_READ_WINDOW_S = 2.0
_PREFIX_LIMIT = 512
SERVICE_BANNER = b"SA-LOOPBACK-SERVICE ok\n"
ROGUE_REPLY = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n"
    b"Connection: close\r\n\r\nrogue-ok\n"
)


# ---------------------------------------------------------------------------------------------
# A per-cell loopback listener: the witness of the probes that go around the proxy.


class LoopbackWitness:
    """TCP and/or UDP on one loopback address, logging the first bytes of everything.

    A TCP peer is read until its first newline (or `_PREFIX_LIMIT` bytes, or `_READ_WINDOW_S`),
    logged, and then answered with `banner` if one is set: the log line is written before the
    answer, so a client that got the banner can already be found in the log.

    Args:
        address: a loopback literal (`127.0.0.1`, `::1`); anything else is refused.
        tcp: listen on TCP.
        udp: listen on UDP.
        banner: bytes to answer each TCP peer with, or None to stay silent.
    """

    def __init__(
        self, address: str, *, tcp: bool = True, udp: bool = False, banner: bytes | None = None
    ) -> None:
        """Check the address; nothing is bound until `start`."""
        ip = ipaddress.ip_address(address)
        if not ip.is_loopback:
            raise FixtureError(f"LoopbackWitness must bind a loopback address, not {address!r}")
        self.address = str(ip)
        self.family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        self.tcp_port = 0
        self.udp_port = 0
        self._want = (tcp, udp)
        self._banner = banner
        self._log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Bind on ephemeral ports and serve from daemon threads.

        Raises:
            FixtureError: a socket could not be bound (the message names the address).
        """
        try:
            if self._want[0]:
                tcp = socket.socket(self.family, socket.SOCK_STREAM)
                self._socks.append(tcp)
                tcp.bind((self.address, 0))
                tcp.listen(16)
                tcp.settimeout(_POLL_S)
                self.tcp_port = tcp.getsockname()[1]
                self._spawn(self._accept_loop, tcp)
            if self._want[1]:
                udp = socket.socket(self.family, socket.SOCK_DGRAM)
                self._socks.append(udp)
                udp.bind((self.address, 0))
                udp.settimeout(_POLL_S)
                self.udp_port = udp.getsockname()[1]
                self._spawn(self._udp_loop, udp)
        except OSError as exc:
            self.stop()
            raise FixtureError(
                f"loopback witness could not bind {self.address}: {exc}; "
                "check that the loopback interface is up for this address family"
            ) from exc

    def hostport(self, port: int) -> str:
        """`127.0.0.1:PORT` or `[::1]:PORT`."""
        return f"[{self.address}]:{port}" if ":" in self.address else f"{self.address}:{port}"

    def record(self, entry: dict[str, Any]) -> None:
        """Append one log entry (`proto`, `peer`, `data`); the serving threads call this."""
        with self._lock:
            self._log.append({"time": time.time(), **entry})

    def records_with(self, nonce: str) -> list[dict[str, Any]]:
        """Entries whose bytes carry `nonce`."""
        with self._lock:
            return [dict(e) for e in self._log if nonce in str(e.get("data", ""))]

    def stop(self) -> None:
        """Close every socket and join the threads; safe to call twice."""
        self._stop.set()
        for sock in self._socks:
            # shutdown wakes a thread blocked in accept/recvfrom now (close alone does not):
            # each stop otherwise waited out a poll of up to _POLL_S, 0.15 to 0.3 s a cell.
            # An unconnected UDP socket answers ENOTCONN, and is woken all the same.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(_READ_WINDOW_S + 1.0)
        self._socks, self._threads = [], []

    def _spawn(self, target: Callable[[socket.socket], None], sock: socket.socket) -> None:
        thread = threading.Thread(target=target, args=(sock,), daemon=True, name="net-wide")
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        with conn:
            conn.settimeout(_READ_WINDOW_S)
            data = b""
            with contextlib.suppress(OSError):
                while b"\n" not in data and len(data) < _PREFIX_LIMIT:
                    chunk = conn.recv(_PREFIX_LIMIT)
                    if not chunk:
                        break
                    data += chunk
            self.record({"proto": "tcp", "peer": _peer(peer), "data": data.decode("latin-1")})
            if self._banner is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(self._banner)

    def _udp_loop(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data, peer = sock.recvfrom(_PREFIX_LIMIT)
            except TimeoutError:
                continue
            except OSError:
                return
            if self._stop.is_set():
                return  # woken by stop's shutdown (an empty read), not a datagram
            self.record({"proto": "udp", "peer": _peer(peer), "data": data.decode("latin-1")})


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def has_ipv6_loopback() -> bool:
    """Whether this host can bind ::1 (no IPv6 loopback means the v6 attempts are moot)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


class _Cells:
    """Per-cell state of one spec instance (the catalogue holds one instance per probe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_nonce: dict[str, dict[str, Any]] = {}

    def put(self, nonce: str, state: dict[str, Any]) -> None:
        with self._lock:
            self._by_nonce[nonce] = state

    def get(self, nonce: str) -> dict[str, Any]:
        with self._lock:
            return self._by_nonce.get(nonce, {})

    def pop(self, nonce: str) -> dict[str, Any]:
        with self._lock:
            return self._by_nonce.pop(nonce, {})


def _stop_listeners(state: dict[str, Any]) -> None:
    for value in state.values():
        if isinstance(value, LoopbackWitness):
            value.stop()


class PerCellSpec(SpecBase):
    """A spec that keeps per-cell state from `prepare` (its own listeners) until `cleanup`.

    The catalogue holds one instance per probe and cells may run in parallel, so the state is
    keyed by the cell's nonce; `cleanup` stops every listener the cell started.
    """

    def __init__(self) -> None:
        """No cell prepared yet."""
        self._cells = _Cells()

    def _listener(self, ctx: CellContext, key: str) -> LoopbackWitness | None:
        """The cell's listener kept under `key`, or None when `prepare` did not start it."""
        value = self._cells.get(ctx.nonce).get(key)
        return value if isinstance(value, LoopbackWitness) else None

    def cleanup(self, ctx: CellContext) -> None:
        """Stop the cell's listeners and forget the cell."""
        _stop_listeners(self._cells.pop(ctx.nonce))


def unprepared_control(what: str) -> dict[str, Any]:
    """The host control of a cell whose `prepare` never ran: failed, saying so."""
    return control_record(
        new_control_nonce(), [host_check(what, ok=False, detail="prepare() did not run")]
    )


def unprepared_assessment(what: str, observed: Any) -> Assessment:
    """The assessment of a cell whose `prepare` never ran: nothing could witness it."""
    reasons = [f"prepare() did not run for this cell: no {what} to witness"]
    return Assessment("undecided", controls_ok=False, reasons=reasons, observed=observed)
