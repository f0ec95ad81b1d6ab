"""The DNS fixture: a dnslib server authoritative for the `test` zone, and a small client.

The fixture is a witness as much as a resolver: every query is logged with its transport and
source so that a probe's lookup (or a sandbox's leak to it) is visible from the host. It never
forwards upstream: a name it does not know gets NXDOMAIN, whether inside the zone or not, so a
lookup through it can never reach a real resolver.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Self

from dnslib import QTYPE, RCODE, RR, A, DNSRecord

from sandbox_attest.errors import FixtureError

if TYPE_CHECKING:
    from types import TracebackType

ZONE = "test"
_TTL = 1  # short on purpose: nothing downstream should cache a rebinding answer for long
_MAX_TCP_MESSAGE = 65535
_POLL_S = 0.2  # how often the serving threads look at the stop flag
# Where a stand-in (`DnsFixture.stand_in`) may point: this host, or the lab's own range. A
# stand-in name lives outside the zone, so its answer must be one no real host can have.
_STAND_IN_NETS = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("198.18.0.0/15"))


class ResolveError(FixtureError):
    """A lookup through the DNS fixture failed (NXDOMAIN, timeout, malformed answer)."""


def _normalize(name: str) -> str:
    return name.rstrip(".").lower()


def _check_ipv4(address: str) -> str:
    try:
        return str(ipaddress.IPv4Address(address))
    except ValueError as exc:
        raise FixtureError(
            f"DNS fixture record {address!r} is not an IPv4 literal; give dotted-quad addresses"
        ) from exc


class DnsFixture:
    """An authoritative dnslib server for the `test` zone on one loopback UDP+TCP port.

    Args:
        records: exact name (lowercase, no trailing dot) -> IPv4 literal.
        wildcard: zone suffix (e.g. "kiln.test") -> IPv4 answered for any name strictly
            below it.
        host: the address to bind (loopback, or the lab's DNS address).
        port: the port to bind, 0 for a free one.

    Attributes:
        port: the port, the same number for UDP and TCP (0 until `start`).
    """

    def __init__(
        self,
        records: dict[str, str],
        wildcard: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """Build the zone; nothing is bound until `start` (on `port`, 0 for a free one)."""
        self.host = host
        self.port = 0
        self._want_port = port
        self._records = {_normalize(k): _check_ipv4(v) for k, v in records.items()}
        self._wildcard = {_normalize(k): _check_ipv4(v) for k, v in (wildcard or {}).items()}
        for name in [*self._records, *self._wildcard]:
            if name != ZONE and not name.endswith("." + ZONE):
                raise FixtureError(
                    f"DNS fixture name {name!r} is outside the zone {ZONE!r}; "
                    "use a name ending in '.test'"
                )
        self._sequences: dict[str, list[str]] = {}
        self._stand_ins: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._log: list[dict[str, object]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._udp: socket.socket | None = None
        self._tcp: socket.socket | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Bind UDP and TCP on the same free port and start serving."""
        if self._udp is not None:
            raise FixtureError("DNS fixture already started; call stop() first")
        self._udp, self._tcp = self._bind_pair()
        self.port = self._udp.getsockname()[1]
        self._stop.clear()
        for target, label in ((self._serve_udp, "udp"), (self._serve_tcp, "tcp")):
            thread = threading.Thread(target=target, name=f"dns-{label}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _bind_pair(self) -> tuple[socket.socket, socket.socket]:
        # The kernel picks a free UDP port; the same TCP port can be taken by someone else in
        # between, so retry a few times with a fresh UDP port.
        last: OSError | None = None
        for _ in range(20):
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            # A fixed port (53: the lab's system resolver cannot name another) or a free one.
            udp.bind((self.host, self._want_port))
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                tcp.bind((self.host, udp.getsockname()[1]))
            except OSError as exc:
                last = exc
                udp.close()
                tcp.close()
                continue
            tcp.listen(64)
            udp.settimeout(_POLL_S)
            tcp.settimeout(_POLL_S)
            return udp, tcp
        raise FixtureError(
            f"DNS fixture could not bind UDP and TCP on one port of {self.host}: {last}; "
            "free some loopback ports and retry"
        )

    def stop(self) -> None:
        """Stop serving and close both sockets; safe to call twice."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()
        for sock in (self._udp, self._tcp):
            if sock is not None:
                sock.close()
        self._udp = self._tcp = None

    def not_serving(self) -> str | None:
        """Why the fixture does not serve right now, or None while both threads run.

        A stopped or crashed fixture logs no query, which a cell would read as "the sandbox
        resolved nothing": the world's health check asks this before it trusts the log.
        """
        if self._udp is None or not self._threads or self._stop.is_set():
            return "it was stopped"
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead:
            return f"its serving thread{'s' if len(dead) > 1 else ''} {', '.join(dead)} ended"
        return None

    def __enter__(self) -> Self:
        """Start the fixture."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the fixture."""
        self.stop()

    # -- witness and knobs ----------------------------------------------------------------

    def queries(self) -> list[dict[str, object]]:
        """Every query received so far, in order (a copy)."""
        with self._lock:
            return [dict(entry) for entry in self._log]

    def set_answers(self, name: str, addresses: list[str]) -> None:
        """Answer the n-th query for `name` with `addresses[min(n, len - 1)]`.

        This is the rebinding knob: the first lookup can say one thing and later ones another.
        The count starts at zero again with each call.
        """
        if not addresses:
            raise FixtureError("set_answers needs at least one address")
        key = _normalize(name)
        checked = [_check_ipv4(a) for a in addresses]
        with self._lock:
            self._sequences[key] = checked
            self._counts[key] = 0

    def stand_in(self, name: str, address: str) -> None:
        """Answer `name`, outside the zone, with `address`: a lab host standing for a real one.

        For the names of services a sandbox must never reach that have no name in `.test`
        (net_metadata_service: the cloud metadata service's well-known names). In the lab the
        fixture is the system resolver, so a sandbox's own proxy resolves such a name here and
        reaches only the lab host; every other name outside the zone stays NXDOMAIN.

        Raises:
            FixtureError: `address` is neither loopback nor in the lab's 198.18.0.0/15.
        """
        ip = ipaddress.ip_address(_check_ipv4(address))
        if not any(ip in net for net in _STAND_IN_NETS):
            raise FixtureError(
                f"stand-in {name!r} -> {address}: only a loopback or lab (198.18.0.0/15) "
                "address may answer a name outside the zone; point it at a fixture host"
            )
        with self._lock:
            self._stand_ins[_normalize(name)] = address

    # -- answering ------------------------------------------------------------------------

    def _lookup(self, name: str) -> str | None:
        """The address for `name`, advancing a rebinding sequence; None means NXDOMAIN."""
        with self._lock:
            sequence = self._sequences.get(name)
            if sequence is not None:
                n = self._counts[name]
                self._counts[name] = n + 1
                return sequence[min(n, len(sequence) - 1)]
        if name in self._records:
            return self._records[name]
        for suffix, address in self._wildcard.items():
            if name.endswith("." + suffix):
                return address
        return None

    def _answer(self, data: bytes, transport: str, peer: tuple[str, int]) -> bytes | None:
        try:
            request = DNSRecord.parse(data)
        except Exception:
            return None  # garbage is dropped, as a real server would
        reply = request.reply()  # sets QR and AA; recursion is never offered
        reply.header.ra = 0
        question = request.q
        name = _normalize(str(question.qname))
        qtype = QTYPE.get(question.qtype, str(question.qtype))
        in_zone = name == ZONE or name.endswith("." + ZONE)
        # Only A/AAAA advance a rebinding sequence: other types must not consume answers.
        address = self._lookup(name) if in_zone and qtype in {"A", "AAAA"} else None
        with self._lock:
            stand_in = self._stand_ins.get(name)
        if stand_in is not None:  # a planted stand-in: an A answer, NODATA for other types
            address = stand_in if qtype == "A" else None
        known = address is not None or stand_in is not None or (in_zone and self._known(name))
        if not known:
            reply.header.rcode = RCODE.NXDOMAIN
        elif qtype == "A" and address is not None:
            reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=_TTL))
        # AAAA and other types for a known name: NOERROR with no answers (NODATA).
        rcode = "NXDOMAIN" if not known else "NOERROR"
        with self._lock:
            self._log.append(
                {
                    "time": time.time(),
                    "name": name,
                    "qtype": qtype,
                    "transport": transport,
                    "peer": f"{peer[0]}:{peer[1]}",
                    "rcode": rcode,
                }
            )
        packed: bytes = reply.pack()
        return packed

    def _known(self, name: str) -> bool:
        with self._lock:
            if name in self._sequences:
                return True
        return name in self._records or any(name.endswith("." + s) for s in self._wildcard)

    def _serve_udp(self) -> None:
        sock = self._udp
        assert sock is not None  # noqa: S101  (start() sets it before the thread exists)
        while not self._stop.is_set():
            try:
                data, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = self._answer(data, "udp", peer)
            if reply is not None:
                if len(reply) > 512:
                    reply = DNSRecord.parse(reply).truncate().pack()
                with contextlib.suppress(OSError):
                    sock.sendto(reply, peer)

    def _serve_tcp(self) -> None:
        sock = self._tcp
        assert sock is not None  # noqa: S101  (start() sets it before the thread exists)
        while not self._stop.is_set():
            try:
                conn, peer = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(
                target=self._handle_tcp, args=(conn, peer), name="dns-tcp-conn", daemon=True
            ).start()

    def _handle_tcp(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        with conn:
            conn.settimeout(5.0)
            try:
                while not self._stop.is_set():
                    header = _recv_exact(conn, 2)
                    if header is None:
                        return
                    (length,) = struct.unpack("!H", header)
                    data = _recv_exact(conn, length)
                    if data is None:
                        return
                    reply = self._answer(data, "tcp", peer)
                    if reply is None:
                        return
                    conn.sendall(struct.pack("!H", len(reply)) + reply)
            except OSError:
                return


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _query_tcp(server: tuple[str, int], packet: bytes, name: str, deadline: float) -> DNSRecord:
    remaining = max(deadline - time.monotonic(), 0.001)
    with socket.create_connection(server, timeout=remaining) as tcp:
        tcp.sendall(struct.pack("!H", len(packet)) + packet)
        header = _recv_exact(tcp, 2)
        body = _recv_exact(tcp, struct.unpack("!H", header)[0]) if header else None
    if body is None:
        raise ResolveError(
            f"DNS server {server[0]}:{server[1]} closed TCP before answering {name!r}"
        )
    return DNSRecord.parse(body)


def resolve(server: tuple[str, int], name: str, timeout: float = 2.0) -> list[str]:
    """Resolve `name` to IPv4 addresses through the DNS fixture at `server` (A records only).

    UDP first; a truncated answer is retried over TCP. The whole call respects `timeout`.

    Raises:
        ResolveError: NXDOMAIN, any other error rcode, a timeout, or a malformed answer; the
            message names the server and the name.
    """
    where = f"{server[0]}:{server[1]}"
    deadline = time.monotonic() + timeout
    query = DNSRecord.question(name, "A")
    packet = query.pack()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.connect(server)
            udp.sendall(packet)
            while True:
                udp.settimeout(max(deadline - time.monotonic(), 0.001))
                data = udp.recv(4096)
                reply = DNSRecord.parse(data)
                if reply.header.id == query.header.id:
                    break
        if reply.header.tc:
            reply = _query_tcp(server, packet, name, deadline)
    except TimeoutError as exc:
        raise ResolveError(
            f"DNS server {where} did not answer {name!r} within {timeout:g}s; "
            "is the DNS fixture running?"
        ) from exc
    except OSError as exc:
        raise ResolveError(f"DNS server {where} unreachable for {name!r}: {exc}") from exc
    except ResolveError:
        raise
    except Exception as exc:
        raise ResolveError(f"DNS server {where} sent a malformed answer for {name!r}") from exc
    rcode = RCODE.get(reply.header.rcode, str(reply.header.rcode))
    if rcode != "NOERROR":
        raise ResolveError(f"DNS server {where} answered {rcode} for {name!r}")
    return [str(rr.rdata) for rr in reply.rr if rr.rtype == QTYPE.A]


__all__ = ["DnsFixture", "ResolveError", "resolve"]
