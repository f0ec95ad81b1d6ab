"""What the world looks like from outside: the JSON `sandbox-attest serve` prints.

This module holds only the shape. `sandbox_attest.world.core` starts the world and fills it in;
probes receive a copy (without the proxy secret) inside their task; other tools script against the
JSON, so the keys below are a public contract: add keys, never rename or remove them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from sandbox_attest.host import disguise

FixtureHostKey = Literal["allowed", "denied", "index", "files"]
FIXTURE_HOST_KEYS: tuple[FixtureHostKey, ...] = ("allowed", "denied", "index", "files")

# The reserved zone of RFC 6761: no real resolver will ever answer for it, so a name that
# escapes to a real resolver cannot reach a real host either.
FIXTURE_ZONE = "test"
# Any name below this one resolves (to 127.0.0.1) in the DNS fixture; probes put their nonce in
# the first label so the query log can attribute every query to one cell.
PROBE_NAME_SUFFIX = disguise.DNS_NAME_SUFFIX

# The request header (and query parameter `nonce=`) by which a probe tags its requests so the
# fixture logs can attribute them to one matrix cell. It is not secret.
NONCE_HEADER = "X-Attest-Nonce"


@dataclass(frozen=True)
class HostInfo:
    """One fixture origin: a name in the fixture zone served over HTTPS and plain HTTP."""

    name: str  # e.g. "allowed.test"
    address: str  # what the DNS fixture answers for the name ("127.0.0.1")
    https_port: int
    http_port: int


@dataclass(frozen=True)
class ProxyInfo:
    """Where the egress proxy listens. `url` carries the per-start secret as userinfo."""

    url: str  # http://sandbox-attest:SECRET@127.0.0.1:PORT
    socket: str  # unix socket path (no auth: reaching it is the capability)
    port: int  # loopback TCP port (Proxy-Authorization required)


@dataclass(frozen=True)
class DnsInfo:
    """The dnslib fixture, authoritative for FIXTURE_ZONE, on UDP and TCP."""

    host: str
    port: int


@dataclass(frozen=True)
class BlobInfo:
    """The deterministic transfer blob served by every origin at `/blob`."""

    url: str  # https://allowed.test:PORT/blob
    size: int  # 18_874_368
    sha256: str


@dataclass(frozen=True)
class IndexInfo:
    """The PEP 503 index on the index host; its file links point at the files host.

    `url_template` contains `{nonce}`: `https://index.test:PORT/c/{nonce}/simple/`, so that
    the index and file hosts' access logs attribute every fetch to one cell.
    """

    url_template: str
    denied_url_template: str  # the same index path on the denied host (the proxy must 403)
    package: str  # distribution name, e.g. "kiln-helpers"
    module: str  # import name, e.g. "kiln_helpers"
    version: str
    wheel_nonce: str  # the value the wheel's module exposes as NONCE


@dataclass(frozen=True)
class DirectEgressInfo:
    """Plain listeners a sandbox must never reach; their accept logs are the witness."""

    tcp: str  # "127.0.0.1:PORT"
    udp: str  # "127.0.0.1:PORT"


@dataclass(frozen=True)
class DaemonInfo:
    """Fake docker-style daemons answering `GET /_ping` on host unix sockets."""

    unix: str  # filesystem path
    abstract: str | None  # abstract-namespace name without the leading NUL (Linux only)


@dataclass(frozen=True)
class WorldInfo:
    """Everything a probe, a backend or a script needs to address the world."""

    proxy: ProxyInfo
    ca_bundle: str
    dns: DnsInfo
    hosts: dict[str, HostInfo]
    blob: BlobInfo
    index: IndexInfo
    direct_egress: DirectEgressInfo
    daemon: DaemonInfo
    run_dir: str
    probe_name_suffix: str = PROBE_NAME_SUFFIX
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        """The `serve` JSON object (includes the proxy secret inside `proxy.url`)."""
        return asdict(self)

    def for_probe(self) -> dict[str, Any]:
        """The copy a probe receives: the same keys with the proxy secret removed."""
        data = asdict(self)
        data["proxy"] = {"socket": self.proxy.socket, "port": self.proxy.port}
        return data
