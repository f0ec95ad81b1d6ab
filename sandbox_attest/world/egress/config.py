"""What the host tells the egress proxy's child process, and the line the child answers with.

`ProxyConfig` crosses as a JSON file named on the child's command line (it holds no secret;
the per-start secret goes on stdin). The child prints `READY_PREFIX` and a JSON object with
where it listens once it does. Both sides import this module: the host side
(`sandbox_attest.world.egress.proxy`) and the child (`sandbox_attest.world.egress.server`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_attest.world.egress.rules import Rule

READY_PREFIX = "READY "


@dataclass(frozen=True)
class ProxyConfig:
    """What the proxy process needs; serialised to JSON for the child.

    Attributes:
        rules: the allowlist, in order.
        dns: the DNS fixture's (host, port); the only resolver the proxy uses.
        unix_socket: where to listen on a unix socket (no auth), or None.
        tcp: whether to listen on 127.0.0.1:0 too (Basic auth with the per-start secret).
        decision_log: JSON-lines file the proxy appends one line per client to.
        dial_timeout: seconds for the upstream TCP connect before answering 504.
        head_timeout: seconds for a client to send its whole request head (slow drips).
        max_clients: client connections served at once; more get 503. A handoff leaves the
            sandbox holding no descriptor for the connection, so this is what bounds the
            proxy's descriptors and threads.
    """

    rules: tuple[Rule, ...]
    dns: tuple[str, int]
    unix_socket: Path | None
    tcp: bool
    decision_log: Path
    dial_timeout: float = 5.0
    head_timeout: float = 10.0
    max_clients: int = 512
    # In the lab (sandbox_attest/world/lab.py): the networks where the fixture hosts live, which the
    # address check treats as remote hosts, and the namespaces the proxy may send to them
    # from (sandbox_attest/world/netguard.py). Empty outside the lab.
    remote_networks: tuple[str, ...] = ()
    lab_namespaces: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON object the child reads (holds no secret)."""
        return {
            "rules": [
                {
                    "host": r.host,
                    "suffix": r.suffix,
                    "ports": list(r.ports),
                    "allow_private": r.allow_private,
                }
                for r in self.rules
            ],
            "dns": list(self.dns),
            "unix_socket": str(self.unix_socket) if self.unix_socket else None,
            "tcp": self.tcp,
            "decision_log": str(self.decision_log),
            "dial_timeout": self.dial_timeout,
            "head_timeout": self.head_timeout,
            "max_clients": self.max_clients,
            "remote_networks": list(self.remote_networks),
            "lab_namespaces": list(self.lab_namespaces),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProxyConfig:
        """Rebuild a config from `to_json` output."""
        return cls(
            rules=tuple(
                Rule(
                    host=r["host"],
                    suffix=bool(r["suffix"]),
                    ports=tuple(int(p) for p in r["ports"]),
                    allow_private=bool(r["allow_private"]),
                )
                for r in data["rules"]
            ),
            dns=(str(data["dns"][0]), int(data["dns"][1])),
            unix_socket=Path(data["unix_socket"]) if data["unix_socket"] else None,
            tcp=bool(data["tcp"]),
            decision_log=Path(data["decision_log"]),
            dial_timeout=float(data["dial_timeout"]),
            head_timeout=float(data["head_timeout"]),
            max_clients=int(data["max_clients"]),
            remote_networks=tuple(str(n) for n in data.get("remote_networks", [])),
            lab_namespaces=tuple(str(n) for n in data.get("lab_namespaces", [])),
        )
