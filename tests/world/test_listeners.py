"""Direct-egress listeners and fake daemons: what reaches them is logged with its nonce."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.world.listeners import DirectEgressListener, FakeDaemon

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


def wait_for(
    predicate: Callable[[], list[dict[str, Any]]], timeout: float = 5.0
) -> list[dict[str, Any]]:
    """Poll until `predicate` returns a non-empty list."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, "nothing was logged"
        time.sleep(0.02)
    return found


@pytest.fixture
def listener() -> Iterator[DirectEgressListener]:
    """A running direct-egress listener."""
    with DirectEgressListener() as running:
        yield running


class TestDirectEgress:
    def test_tcp_connection_logged_with_its_bytes(self, listener: DirectEgressListener) -> None:
        """A TCP connection's first bytes land in the log and match its nonce."""
        with socket.create_connection(("127.0.0.1", listener.tcp_port), timeout=5) as sock:
            sock.sendall(b"hello tcp-nonce-1\n")
            local_port = sock.getsockname()[1]
            [record] = wait_for(lambda: listener.records_with("tcp-nonce-1")["tcp"])
        assert record["data"] == "hello tcp-nonce-1\n"
        assert record["peer"] == f"127.0.0.1:{local_port}"
        assert listener.records_with("other")["tcp"] == []

    def test_silent_connection_is_still_logged(self, listener: DirectEgressListener) -> None:
        """A connect that sends nothing is logged at accept, with empty data."""
        with socket.create_connection(("127.0.0.1", listener.tcp_port), timeout=5):
            [record] = wait_for(lambda: listener.records()["tcp"])
        assert (record["data"], record["size"]) == ("", 0)

    def test_prefix_is_capped_at_512_bytes(self, listener: DirectEgressListener) -> None:
        """Only the first 512 bytes of a connection are kept."""
        with socket.create_connection(("127.0.0.1", listener.tcp_port), timeout=5) as sock:
            sock.sendall(b"cap-nonce" + b"x" * 2000)
            wait_for(lambda: [r for r in listener.records()["tcp"] if r["size"] == 512])

    def test_udp_datagram_logged(self, listener: DirectEgressListener) -> None:
        """A UDP datagram carrying the nonce is logged with its size."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"udp-nonce-7 payload", ("127.0.0.1", listener.udp_port))
            [record] = wait_for(lambda: listener.records_with("udp-nonce-7")["udp"])
        assert (record["transport"], record["size"]) == ("udp", 19)
        assert listener.records_with("udp-nonce-7")["tcp"] == []

    def test_stop_closes_ports(self) -> None:
        """After stop() the TCP port refuses connections, and a second stop() is harmless."""
        listener = DirectEgressListener()
        listener.start()
        port = listener.tcp_port
        listener.stop()
        listener.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)


def ping(address: str, nonce: str, path: str = "/_ping") -> bytes:
    """Send a docker-style GET over a unix socket and return the raw response."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(address)
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: docker\r\nX-Attest-Nonce: {nonce}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


class TestFakeDaemon:
    def test_unix_socket_answers_ping(self, tmp_path: Path) -> None:
        """GET /_ping on the unix socket answers 200 OK with an Api-Version, logged with nonce."""
        with FakeDaemon(path=tmp_path / "d.sock") as daemon:
            reply = ping(daemon.address, "dn-1")
            [entry] = daemon.records("dn-1")
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\nApi-Version: " in reply
        assert reply.endswith(b"\r\n\r\nOK")
        assert entry["socket"] == "unix"
        assert entry["request_line"] == "GET /_ping HTTP/1.1"
        assert entry["headers"]["X-Attest-Nonce"] == "dn-1"

    def test_abstract_socket_answers_ping(self) -> None:
        """The abstract-namespace daemon answers too, and has no file on disk."""
        with FakeDaemon(abstract="sandbox-attest-test-abstract") as daemon:
            assert daemon.address == "\0sandbox-attest-test-abstract"
            reply = ping(daemon.address, "dn-2")
            entries = daemon.records("dn-2")
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert [e["socket"] for e in entries] == ["abstract"]

    def test_other_paths_are_404_and_logged(self, tmp_path: Path) -> None:
        """Any other path gets docker's JSON 404 and is still logged."""
        with FakeDaemon(path=tmp_path / "d.sock") as daemon:
            reply = ping(daemon.address, "dn-3", "/containers/json")
            assert daemon.records("dn-3")[0]["request_line"].startswith("GET /containers/json")
        assert reply.startswith(b"HTTP/1.1 404 ")

    def test_stop_removes_socket_file(self, tmp_path: Path) -> None:
        """stop() removes the socket file; a second stop() is harmless."""
        path = tmp_path / "d.sock"
        daemon = FakeDaemon(path=path)
        daemon.start()
        assert path.is_socket()
        daemon.stop()
        daemon.stop()
        assert not path.exists()

    def test_needs_exactly_one_address(self, tmp_path: Path) -> None:
        """Giving both or neither address is a FixtureError."""
        with pytest.raises(FixtureError, match="exactly one"):
            FakeDaemon()
        with pytest.raises(FixtureError, match="exactly one"):
            FakeDaemon(path=tmp_path / "x", abstract="y")

    def test_long_path_names_the_fix(self, tmp_path: Path) -> None:
        """A socket path over the sun_path limit is refused with the fix in the message."""
        with pytest.raises(FixtureError, match="shorter run directory"):
            FakeDaemon(path=tmp_path / ("d" * 120))
