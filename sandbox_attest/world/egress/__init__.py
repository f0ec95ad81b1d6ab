"""The egress route out of a sandbox: allowlist rules, the proxy process, the in-sandbox shim.

`rules` is pure matching; `proxy` starts the proxy as its own process (`start_proxy`), whose
child side is `server` (with `wire`, `handoff`, `decisions`) and whose config is `config`;
`shim.py` is a stdlib-only script copied or bound into sandboxes (never imported by host code)
that hands each connection it accepts to the proxy's unix socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox_attest.world.egress.rules import (
    Allowlist,
    Decision,
    EgressRequest,
    HostError,
    Rule,
    address_allowed,
    canonical_host,
)

if TYPE_CHECKING:
    from sandbox_attest.world.egress.config import ProxyConfig
    from sandbox_attest.world.egress.proxy import ProxyProcess, start_proxy

_PROXY_NAMES = frozenset({"ProxyProcess", "start_proxy"})


def __getattr__(name: str) -> Any:
    # Lazy on purpose: the proxy runs as `python -m world.egress.proxy`, and importing it
    # here eagerly would load it twice in that process (runpy warns about exactly that).
    # `config` is lazy too: only a process that starts a proxy needs it.
    if name in _PROXY_NAMES:
        from sandbox_attest.world.egress import proxy  # noqa: PLC0415

        return getattr(proxy, name)
    if name == "ProxyConfig":
        from sandbox_attest.world.egress import config  # noqa: PLC0415

        return config.ProxyConfig
    raise AttributeError(f"module 'sandbox_attest.world.egress' has no attribute {name!r}")


__all__ = [
    "Allowlist",
    "Decision",
    "EgressRequest",
    "HostError",
    "ProxyConfig",
    "ProxyProcess",
    "Rule",
    "address_allowed",
    "canonical_host",
    "start_proxy",
]
