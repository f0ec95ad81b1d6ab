"""Allowlist matching for the egress proxy: pure functions, no I/O.

Two checks guard every request. `Allowlist.decide` works on the *name* the client asked for,
after `canonical_host` has reduced it to one spelling (so `ALLOWED.test.` and `allowed.test`
are the same host and `127.1` is no host at all). `address_allowed` then works on the address
the name resolved to, so an allowed name cannot be pointed at the host's own loopback or a
private network unless its rule says so.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

# Labels that a URL parser (WHATWG, inet_aton, curl) may read as part of an IPv4 number:
# decimal, octal (leading 0) and hex (0x...) parts. A host made only of these that is not a
# strict dotted quad is a numeric spelling of an address, and spellings are refused so that no
# rule can be widened (or a literal rule bypassed) by writing the same address differently.
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
_DECIMAL_OCTET = re.compile(r"^(?:0|[1-9][0-9]{0,2})$")
_HOST_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_MAX_HOST = 253


class HostError(ValueError):
    """The host is not one canonical DNS name or IP literal; the message says why."""


@dataclass(frozen=True)
class Rule:
    """One allowlist entry.

    Attributes:
        host: a canonical host (see `canonical_host`): a DNS name or an IP literal.
        suffix: match names strictly below `host` at a label boundary (`*.host`), not the
            name itself; add an exact rule for that.
        ports: the destination ports this rule admits.
        allow_private: admit loopback/private/link-local addresses after resolution (for
            fixture origins that live on 127.0.0.1).
    """

    host: str
    suffix: bool = False
    ports: tuple[int, ...] = (80, 443)
    allow_private: bool = False

    def __post_init__(self) -> None:
        """Refuse a rule whose host is not already canonical: it could never match."""
        if canonical_host(self.host) != self.host:
            raise HostError(
                f"rule host {self.host!r} is not canonical; write {canonical_host(self.host)!r}"
            )
        for port in self.ports:
            if not 0 < port < 65536:
                raise HostError(f"rule for {self.host!r} has port {port} outside 1-65535")

    def matches_host(self, host: str) -> bool:
        """Whether the canonical `host` is covered by this rule (ports aside)."""
        if self.suffix:
            return host.endswith("." + self.host)
        return host == self.host

    def describe(self) -> str:
        """A short human form for logs and deny bodies: `*.allowed.test:443`."""
        name = ("*." if self.suffix else "") + self.host
        return f"{name}:{','.join(str(p) for p in self.ports)}"


@dataclass(frozen=True)
class EgressRequest:
    """What a client asked to reach: the host as written and the port."""

    host: str
    port: int


@dataclass(frozen=True)
class Decision:
    """A verdict on one request, with the reason the proxy repeats in its deny header."""

    allowed: bool
    reason: str
    rule: Rule | None


def _ip_literal(host: str) -> str | None:
    """The canonical text of an IP literal, or None if `host` is not one."""
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in inner:
        try:
            return ipaddress.IPv6Address(inner).compressed
        except ValueError as exc:
            raise HostError(f"{host!r} is not a valid IPv6 literal") from exc
    if host != inner:
        raise HostError(f"{host!r}: brackets are only for IPv6 literals")
    return None


def canonical_host(raw: str) -> str:
    """The one spelling of a host that rules are matched against.

    Lowercase, one trailing dot removed, internationalized names converted to their ASCII
    (IDNA) form, IPv6 literals (with or without brackets) in compressed form without brackets,
    IPv4 only as a strict dotted quad.

    Raises:
        HostError: empty, control characters or spaces, backslash, `@`, `%`, a numeric IPv4
            spelling other than a dotted quad (`127.1`, `0x7f.0.0.1`, `2130706433`,
            `0177.0.0.1`), empty or overlong labels, or any other character a DNS name cannot
            hold.
    """
    _check_characters(raw)
    literal = _ip_literal(raw)
    if literal is not None:
        return literal
    host = raw.removesuffix(".").lower()
    if not host:
        raise HostError(f"host {raw!r} has no labels")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise HostError(f"host {raw!r} is not a valid internationalized name") from exc
    labels = host.split(".")
    if all(_NUMERIC_LABEL.match(label) for label in labels) or _NUMERIC_LABEL.match(labels[-1]):
        return _dotted_quad(raw, labels)
    if len(host) > _MAX_HOST:
        raise HostError(f"host {raw!r} is longer than {_MAX_HOST} characters")
    for label in labels:
        if not _HOST_LABEL.match(label):
            raise HostError(f"host {raw!r} has an invalid label {label!r}")
    return host


def _check_characters(raw: str) -> None:
    if not raw:
        raise HostError("empty host")
    for char in raw:
        if ord(char) <= 0x20 or ord(char) == 0x7F:
            raise HostError(f"control character or space in host {raw!r}")
        # Each of these splits a URL differently in different parsers (userinfo, Windows-style
        # path separators, IPv6 zone ids / percent-encoding), so a host holding one is refused.
        if char in "\\@%":
            raise HostError(f"character {char!r} is not allowed in host {raw!r}")


def _dotted_quad(raw: str, labels: list[str]) -> str:
    # A name whose last label is numeric is read as an IPv4 number by URL parsers, so it is
    # either a strict decimal dotted quad or refused.
    if len(labels) == 4 and all(_DECIMAL_OCTET.match(x) and int(x) <= 255 for x in labels):
        return ".".join(labels)
    raise HostError(
        f"host {raw!r} is a numeric IPv4 spelling; only a dotted-quad decimal literal is accepted"
    )


class Allowlist:
    """An ordered allowlist: the first rule whose host matches decides the ports."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        """Keep the rules in the order given."""
        self.rules = rules

    def decide(self, request: EgressRequest) -> Decision:
        """Decide on a request by its canonical host and port; never raises."""
        try:
            host = canonical_host(request.host)
        except HostError as exc:
            return Decision(allowed=False, reason=f"bad host: {exc}", rule=None)
        matched = [rule for rule in self.rules if rule.matches_host(host)]
        if not matched:
            return Decision(allowed=False, reason="no rule matched", rule=None)
        for rule in matched:
            if request.port in rule.ports:
                return Decision(allowed=True, reason=f"rule {rule.describe()}", rule=rule)
        allowed = sorted({p for rule in matched for p in rule.ports})
        return Decision(
            allowed=False,
            reason=f"port {request.port} not allowed (rule allows {allowed})",
            rule=matched[0],
        )


def address_allowed(ip: str, rule: Rule, *, remote: Sequence[str] = ()) -> tuple[bool, str]:
    """Whether the resolved address `ip` may be dialed under `rule`, and why.

    Loopback, link-local, private, unspecified, multicast, reserved and any other non-global
    address is refused unless `rule.allow_private`. An IPv4-mapped IPv6 address is judged as
    the IPv4 address it maps. An address in one of the `remote` networks counts as a remote
    host: the lab's internet side (198.19.0.0/24), which Python files under "private"
    because it is a benchmarking range, is the world's internet there.
    """
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False, f"resolved address {ip!r} is not an IP address"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for network in remote:
        if address in ipaddress.ip_network(network):
            return True, f"address {address} is a remote host of the lab ({network})"
    kinds = [
        kind
        for kind, flag in (
            # Most specific first: the first kind found is the one the reason names.
            ("unspecified", address.is_unspecified),
            ("loopback", address.is_loopback),
            ("link-local", address.is_link_local),
            ("multicast", address.is_multicast),
            ("reserved", address.is_reserved),
            ("private", address.is_private),
            ("not global", not address.is_global),
        )
        if flag
    ]
    if not kinds:
        return True, f"address {address} is global"
    if rule.allow_private:
        return True, f"address {address} is {kinds[0]}, allowed by rule {rule.describe()}"
    return False, f"address {address} is {kinds[0]}; rule {rule.describe()} forbids private"
