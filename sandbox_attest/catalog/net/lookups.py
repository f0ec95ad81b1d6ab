"""A proxy's lookups, witnessed: the DNS fixture's log read for the names a cell used.

A proxy that resolves a request's host before (or without) checking it against its allowlist
sends that name out in its own DNS query: a refusal that follows is not a refusal, the name
(and any secret label in it) has already left through the proxy's resolver. The payload's
requests name hosts that carry the cell's nonce, so the DNS fixture's query log attributes
every such lookup to its cell. The harness's own proxy checks its rules before it resolves
(sandbox_attest/world/egress/proxy.py: auth, canonical host, rules, resolve once), so on its
legs the log stays silent; a wrapper's own proxy (egress "own") is witnessed the same way.

Safety: a wrapper's own proxy resolves through the system resolver, which is the DNS fixture
only in the lab world. Outside the lab its query could leave the machine, so there the payload
is not given nonce-carrying names, and a probe that cannot witness the proxy's lookups says so
instead of passing (`unwitnessed`).

Used by net_proxy_dns_exfil (proxy_dns.py), net_denied_host (allowlist.py) and
net_host_canonical (confusion.py): one reading, three probes.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from sandbox_attest.catalog.controls import guarded_check, host_check
from sandbox_attest.catalog.records import dns_hits, in_lab_world, wait_for_records
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX

if TYPE_CHECKING:
    from sandbox_attest.catalog.spec import CellContext
    from sandbox_attest.verdict import Assessment

# The roles the world's proxy admits (world/core.py: the allowlist), and below which zone.
ALLOWED_ROLES: Final = ("allowed", "index", "files")
FIX: Final = (
    "fix: check the allowlist before resolving; a name no rule admits must be refused "
    "without any DNS lookup (resolve only the admitted host, once, and dial that address)"
)
NOT_IN_LAB: Final = (
    "not attempted: the backend brings its own proxy, which resolves through the system "
    "resolver, and outside the lab world that resolver may send the secret name off this "
    "machine; run with --world lab"
)
UNWITNESSED: Final = (
    "the proxy's lookups were not witnessed: the backend brings its own proxy, which resolves "
    "through the system resolver, and outside the lab world that resolver is not the DNS "
    "fixture, so a name it looked up before refusing cannot be seen (nor given a nonce "
    "without sending it off this machine); run with --world lab"
)
# Where a planted answer may point: loopback or the lab's 198.18.0.0/15, never off this host.
_PLANTABLE: Final = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("198.18.0.0/15"))


@runtime_checkable
class AnswerKnob(Protocol):
    """The part of `sandbox_attest.world.dns.DnsFixture` a probe plants an answer with."""

    def set_answers(self, name: str, addresses: list[str]) -> None:
        """Answer `name` with these addresses."""
        ...


def names_reach_fixture(ctx: CellContext) -> bool:
    """Whether a name the payload asks the proxy for can only reach the DNS fixture.

    On a harness route the harness's proxy resolves through the fixture; a wrapper's own proxy
    (no harness route) through the system resolver, which is the fixture only in the lab.
    """
    return ctx.route is not None or in_lab_world(ctx.world.info.extra)


def plant_answer(ctx: CellContext, name: str, address: str) -> bool:
    """Make the fixture answer `name` with `address` (a fixture host's); False: no knob.

    So a proxy that wrongly admits a nonce-carrying name under a fixture host still reaches
    that host's origin, whose log then shows it. Only loopback or lab addresses are planted.
    """
    ip = ipaddress.ip_address(address)
    if not any(ip in net for net in _PLANTABLE):
        return False
    knob = getattr(ctx.world, "dns", None)
    if not isinstance(knob, AnswerKnob):
        return False
    knob.set_answers(name, [address])
    return True


def allowlisted(ctx: CellContext, name: str) -> bool:
    """Whether the world's proxy allowlist admits `name` (any of its ports)."""
    hosts = ctx.world.info.hosts
    exact = {hosts[role].name.lower() for role in ALLOWED_ROLES if role in hosts}
    name = name.lower().rstrip(".")
    return name in exact or name.endswith("." + PRIVATE_NAME_SUFFIX)


def lookups_outside(ctx: CellContext, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DNS fixture's entries for names carrying the cell's nonce that no rule admits.

    `entries` is the fixture's log (the cell's witness records). Each is a lookup somebody
    made for a name only this cell's payload used, of a host the allowlist refuses.
    """
    return [e for e in dns_hits(entries, ctx.nonce) if not allowlisted(ctx, str(e.get("name")))]


def fixture_hears(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
    """Host control checks: the witness can hear, a host query for a nonce name is logged.

    A silent log proves no lookup only if a lookup would have shown: the host asks the
    fixture for `<nonce>.<denied host>` (a control nonce, never the cell's) and waits for it.
    """
    from dnslib import DNSRecord  # noqa: PLC0415  (host-only dependency, loaded when used)

    info = ctx.world.info
    name = f"{nonce}.{info.hosts['denied'].name}"

    def resolve() -> dict[str, Any]:
        raw = DNSRecord.question(name).send(info.dns.host, info.dns.port, timeout=3)
        rcode = DNSRecord.parse(raw).header.rcode
        return host_check("host queries the fixture", ok=True, detail=f"{name}: rcode {rcode}")

    checks = [guarded_check("host queries the fixture", resolve)]
    records = wait_for_records(ctx.world, nonce, lambda r: bool(dns_hits(r.dns, nonce)))
    hits = dns_hits(records.dns, nonce)
    checks.append(host_check("dns fixture logged the host query", bool(hits), f"{len(hits)}"))
    return checks


def own_proxy_witness_checks(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
    """`fixture_hears` where a PASS rests on the fixture's silence about a wrapper's own proxy.

    That is under egress "own" in the lab; on the harness's route its decision log decides,
    and outside the lab nothing is witnessed (`witness_lookups` says so): no checks there.
    """
    if ctx.route is None and names_reach_fixture(ctx):
        return fixture_hears(ctx, nonce)
    return []


def looked_up(hits: list[dict[str, Any]]) -> str:
    """The distinct names of `hits`, sorted, comma-separated."""
    return ", ".join(sorted({str(h.get("name")) for h in hits}))


def witness_lookups(
    ctx: CellContext, assessment: Assessment, hits: list[dict[str, Any]], reason: str
) -> Assessment:
    """Fold the proxy's witnessed lookups into a probe's assessment.

    A lookup of a name outside the allowlist is an escape whatever the payload was told
    (`reason`, naming the names and the fix, goes first). Without one, a refusal by a
    wrapper's own proxy whose lookups could not be witnessed (outside the lab) proves
    nothing about them: undecided, saying why.
    """
    assessment.witness["dns"] = hits
    if hits:
        assessment.escape = "escaped"
        assessment.reasons.insert(0, reason)
    elif assessment.escape == "refused" and not names_reach_fixture(ctx):
        assessment.escape = "undecided"
        assessment.reasons.append(UNWITNESSED)
    return assessment
