"""The DNS fixture: UDP and TCP answers, NXDOMAIN, wildcard, the query log, rebinding."""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING

import pytest
from dnslib import RCODE, DNSRecord

from sandbox_attest.errors import FixtureError
from sandbox_attest.world.dns import DnsFixture, ResolveError, resolve

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def zone() -> Iterator[DnsFixture]:
    """A fixture with one exact name and one wildcard suffix."""
    with DnsFixture({"allowed.test": "127.0.0.1"}, wildcard={"probe.test": "127.0.0.2"}) as dns:
        yield dns


def _udp(port: int, name: str, qtype: str = "A") -> DNSRecord:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(DNSRecord.question(name, qtype).pack(), ("127.0.0.1", port))
        return DNSRecord.parse(sock.recv(4096))


def _tcp(port: int, name: str, qtype: str = "A") -> DNSRecord:
    packet = DNSRecord.question(name, qtype).pack()
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(struct.pack("!H", len(packet)) + packet)
        (length,) = struct.unpack("!H", sock.recv(2))
        data = b""
        while len(data) < length:
            data += sock.recv(length - len(data))
        return DNSRecord.parse(data)


class TestDnsFixture:
    @pytest.mark.parametrize("query", [_udp, _tcp], ids=["udp", "tcp"])
    def test_answers_a_on_both_transports(self, zone: DnsFixture, query: object) -> None:
        """An exact name gets its A record over UDP and over TCP on the same port."""
        reply = query(zone.port, "Allowed.Test.")  # type: ignore[operator]
        assert reply.header.rcode == RCODE.NOERROR
        assert reply.header.aa == 1
        assert [str(rr.rdata) for rr in reply.rr] == ["127.0.0.1"]

    @pytest.mark.parametrize("name", ["nope.test", "example.com", "test.evil", "probe.test"])
    def test_nxdomain_for_unknown_and_out_of_zone(self, zone: DnsFixture, name: str) -> None:
        """Unknown names, in the zone or not, are NXDOMAIN and never forwarded."""
        reply = _udp(zone.port, name)
        assert reply.header.rcode == RCODE.NXDOMAIN
        assert reply.rr == []

    def test_wildcard_strictly_below(self, zone: DnsFixture) -> None:
        """Any name strictly below a wildcard suffix answers with its address."""
        assert resolve(("127.0.0.1", zone.port), "n123.probe.test") == ["127.0.0.2"]
        assert resolve(("127.0.0.1", zone.port), "a.b.probe.test") == ["127.0.0.2"]

    def test_aaaa_is_nodata(self, zone: DnsFixture) -> None:
        """AAAA for a known name is NOERROR with no answers."""
        reply = _tcp(zone.port, "allowed.test", "AAAA")
        assert reply.header.rcode == RCODE.NOERROR
        assert reply.rr == []

    def test_query_log_fields(self, zone: DnsFixture) -> None:
        """Every query is logged in order with name, type, transport, peer and rcode."""
        _udp(zone.port, "ALLOWED.test.")
        _tcp(zone.port, "missing.test", "AAAA")
        log = zone.queries()
        assert [(q["name"], q["qtype"], q["transport"], q["rcode"]) for q in log] == [
            ("allowed.test", "A", "udp", "NOERROR"),
            ("missing.test", "AAAA", "tcp", "NXDOMAIN"),
        ]
        assert all(str(q["peer"]).startswith("127.0.0.1:") for q in log)
        assert isinstance(log[0]["time"], float)
        assert log[0]["time"] <= log[1]["time"]  # type: ignore[operator]

    def test_rebinding_sequence(self, zone: DnsFixture) -> None:
        """set_answers gives the n-th query addresses[min(n, len-1)]."""
        zone.set_answers("rebind.test", ["127.0.0.1", "127.0.0.3", "127.0.0.4"])
        server = ("127.0.0.1", zone.port)
        got = [resolve(server, "rebind.test")[0] for _ in range(5)]
        assert got == ["127.0.0.1", "127.0.0.3", "127.0.0.4", "127.0.0.4", "127.0.0.4"]

    def test_resolve_nxdomain_names_server_and_name(self, zone: DnsFixture) -> None:
        """The client raises ResolveError naming the server and the name."""
        with pytest.raises(
            ResolveError, match=rf"127\.0\.0\.1:{zone.port}.*NXDOMAIN.*'gone\.test'"
        ):
            resolve(("127.0.0.1", zone.port), "gone.test")

    def test_resolve_timeout(self) -> None:
        """A silent server is a ResolveError after the timeout, naming the server."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
            silent.bind(("127.0.0.1", 0))
            port = silent.getsockname()[1]
            with pytest.raises(ResolveError, match=f"127.0.0.1:{port} did not answer"):
                resolve(("127.0.0.1", port), "allowed.test", timeout=0.3)

    def test_out_of_zone_record_refused(self) -> None:
        """A record outside the zone is a configuration error, not a silent forward."""
        with pytest.raises(FixtureError, match="outside the zone"):
            DnsFixture({"example.com": "127.0.0.1"})
