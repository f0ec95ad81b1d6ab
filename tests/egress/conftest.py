"""Fixtures for the egress tests: trustme PKI, the DNS fixture, origins and the proxy process.

Nothing here is a mock: the DNS fixture is the real dnslib server and the proxy runs as its
real child process.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

import pytest
import trustme

from sandbox_attest.world.dns import DnsFixture
from sandbox_attest.world.egress.config import ProxyConfig
from sandbox_attest.world.egress.proxy import ProxyProcess, start_proxy
from tests.egress.egress_helpers import Origin, OriginMode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from sandbox_attest.world.egress.rules import Rule


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """The test CA; leaves for the fixture names are issued from it."""
    return trustme.CA()


@pytest.fixture(scope="session")
def tls_server_ctx(ca: trustme.CA) -> ssl.SSLContext:
    """Server-side TLS for every fixture name used here."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("allowed.test", "a.allowed.test", "denied.test").configure_cert(ctx)
    return ctx


@pytest.fixture(scope="session")
def tls_client_ctx(ca: trustme.CA) -> ssl.SSLContext:
    """Client-side TLS trusting only the test CA."""
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


@pytest.fixture
def make_origin() -> Iterator[Callable[..., Origin]]:
    """Start origins on demand; all stopped at teardown."""
    started: list[Origin] = []

    def make(mode: OriginMode, **kwargs: object) -> Origin:
        origin = Origin(mode, **kwargs).start()  # type: ignore[arg-type]
        started.append(origin)
        return origin

    yield make
    for origin in started:
        origin.stop()


@pytest.fixture
def dns() -> Iterator[DnsFixture]:
    """The DNS fixture with the names these tests use (all on loopback)."""
    fixture = DnsFixture(
        {
            "allowed.test": "127.0.0.1",
            "denied.test": "127.0.0.1",
            "evilallowed.test": "127.0.0.1",
            "allowed.test.evil.test": "127.0.0.1",
        },
        wildcard={"allowed.test": "127.0.0.1"},
    )
    with fixture:
        yield fixture


@pytest.fixture
def make_proxy(tmp_path: Path, dns: DnsFixture) -> Iterator[Callable[..., ProxyProcess]]:
    """Start the real proxy subprocess with the given rules; stopped at teardown."""
    started: list[ProxyProcess] = []

    def make(rules: tuple[Rule, ...], **kwargs: object) -> ProxyProcess:
        config = ProxyConfig(
            rules=rules,
            dns=("127.0.0.1", dns.port),
            unix_socket=tmp_path / f"proxy{len(started)}.sock",
            tcp=True,
            decision_log=tmp_path / f"decisions{len(started)}.jsonl",
            **kwargs,  # type: ignore[arg-type]
        )
        proxy = start_proxy(config)
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.stop()
