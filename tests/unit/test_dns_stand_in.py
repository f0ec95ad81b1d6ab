"""DnsFixture.stand_in: a name outside the zone answered with a harness-owned address only."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest
from dnslib import RCODE, DNSRecord

from sandbox_attest.errors import FixtureError
from sandbox_attest.world.dns import DnsFixture

if TYPE_CHECKING:
    from collections.abc import Iterator

NAME = "instance-data.ec2.internal"


@pytest.fixture
def dns() -> Iterator[DnsFixture]:
    """A fixture with one in-zone name."""
    with DnsFixture({"allowed.test": "127.0.0.1"}) as fixture:
        yield fixture


def _ask(port: int, name: str, qtype: str = "A") -> DNSRecord:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(DNSRecord.question(name, qtype).pack(), ("127.0.0.1", port))
        return DNSRecord.parse(sock.recv(4096))


class TestStandIn:
    def test_out_of_zone_name_is_nxdomain_until_planted(self, dns: DnsFixture) -> None:
        """Before stand_in the name is NXDOMAIN; after it, A answers the planted address."""
        assert _ask(dns.port, NAME).header.rcode == RCODE.NXDOMAIN
        dns.stand_in(NAME, "198.18.0.2")
        reply = _ask(dns.port, NAME.upper())
        assert reply.header.rcode == RCODE.NOERROR
        assert [str(rr.rdata) for rr in reply.rr] == ["198.18.0.2"]

    def test_other_types_get_nodata(self, dns: DnsFixture) -> None:
        """A planted stand-in answers AAAA with NOERROR and no record, never an address."""
        dns.stand_in(NAME, "127.0.0.1")
        reply = _ask(dns.port, NAME, "AAAA")
        assert (reply.header.rcode, reply.rr) == (RCODE.NOERROR, [])

    @pytest.mark.parametrize("address", ["10.0.0.1", "192.0.2.1", "8.8.8.8", "198.20.0.1"])
    def test_refuses_an_address_the_harness_does_not_own(
        self, dns: DnsFixture, address: str
    ) -> None:
        """Only loopback or the lab's 198.18.0.0/15 may answer a name outside the zone."""
        with pytest.raises(FixtureError, match="only a loopback or lab"):
            dns.stand_in(NAME, address)
        assert _ask(dns.port, NAME).header.rcode == RCODE.NXDOMAIN

    def test_queries_are_logged(self, dns: DnsFixture) -> None:
        """A query for a stand-in is in the log like any other: the fixture stays a witness."""
        dns.stand_in(NAME, "127.0.0.1")
        _ask(dns.port, NAME)
        assert [q["name"] for q in dns.queries()] == [NAME]
