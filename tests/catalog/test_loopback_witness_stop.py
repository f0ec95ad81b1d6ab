"""A loopback witness stops at once, and its stop is never logged as traffic.

`stop` shuts every socket down before closing it, which wakes a thread blocked in accept or
recvfrom (close alone leaves it waiting out its poll, which cost each cell 0.15 to 0.3 s).
The wake-up reads as an empty datagram on UDP; it must not be logged as one a payload sent.
"""

from __future__ import annotations

import socket

import pytest

from sandbox_attest.catalog.net.witness import LoopbackWitness, has_ipv6_loopback
from sandbox_attest.catalog.records import poll_until

ADDRESSES = ["127.0.0.1", *(["::1"] if has_ipv6_loopback() else [])]


@pytest.mark.parametrize("address", ADDRESSES)
def test_stop_logs_nothing_and_ends_every_thread(address: str) -> None:
    """A stop after real traffic: the traffic is logged once, the stop not at all."""
    witness = LoopbackWitness(address, tcp=True, udp=True)
    witness.start()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    assert witness.udp_port is not None
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"stop-test-nonce\n", (address, witness.udp_port))
    # The serving thread logs after the datagram arrives: wait for it.
    seen = poll_until(lambda: witness.records_with("stop-test-nonce"), bool)
    threads = list(witness._threads)
    witness.stop()
    assert [e["proto"] for e in witness.records_with("")] == [e["proto"] for e in seen] == ["udp"]
    assert not [t for t in threads if t.is_alive()]
