"""The DNS probe, host side: nothing may resolve past the sandbox."""

from __future__ import annotations

import socket
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    new_control_nonce,
)
from sandbox_attest.catalog.judging import (
    conclude,
    expect_confined_network,
    judge_escape,
    private_namespace_reason,
)
from sandbox_attest.catalog.records import dns_hits, in_lab_world, wait_for_records
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.verdict import Assessment, Expectation

# What this probe's verdict covers where the sandbox brings its own proxy: the payload's own
# resolvers. That proxy resolving a requested name is another channel, with its own witness.
OWN_PROXY_SCOPE: Final = (
    "this probe asks the payload's own resolvers only; the sandbox's own proxy resolving a "
    "name the payload requests is a lookup this cell never causes, witnessed in the DNS "
    "fixture's log by net_denied_host, net_host_canonical and net_proxy_dns_exfil"
)


class DnsResolution(SpecBase):
    """Raw UDP/TCP DNS queries for a nonce name straight to the DNS fixture."""

    id = "dns_resolution"
    area = "dns"
    host_readings = ("DNS fixture query log",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """A UDP and a TCP query, and the system resolver where the task asks for it."""
        system = ("system-resolver",) if (task.get("targets") or {}).get("system_resolver") else ()
        return AttemptTable(required=attempts_of("udp-query", "tcp-query", *system))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever the network is confined; seen on the open control leg."""
        return expect_confined_network(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The fixture's address and the per-cell name."""
        info = ctx.world.info
        return {
            "dns": f"{info.dns.host}:{info.dns.port}",
            "name": f"{ctx.nonce}.{info.probe_name_suffix}",
            # getaddrinfo only where the system resolver is the fixture: in the lab.
            "system_resolver": in_lab_world(info.extra),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host resolves its own nonce name through the fixture and sees it logged."""
        from dnslib import DNSRecord  # noqa: PLC0415  (host-only dependency, loaded when used)

        info, nonce = ctx.world.info, new_control_nonce()
        name = f"{nonce}.{info.probe_name_suffix}"

        def resolve() -> dict[str, Any]:
            raw = DNSRecord.question(name).send(info.dns.host, info.dns.port, timeout=3)
            answers = [str(rr.rdata) for rr in DNSRecord.parse(raw).rr]
            return host_check("host resolves through the fixture", bool(answers), ",".join(answers))

        checks = [guarded_check("host resolves through the fixture", resolve)]
        if in_lab_world(info.extra):
            system_name = f"s{nonce}.{info.probe_name_suffix}"

            def system() -> dict[str, Any]:
                found = socket.getaddrinfo(system_name, 443, socket.AF_INET, socket.SOCK_STREAM)
                answers = sorted({str(a[4][0]) for a in found})
                return host_check(
                    "host resolves via the system resolver", bool(answers), str(answers)
                )

            checks.append(guarded_check("host resolves via the system resolver", system))
        records = wait_for_records(ctx.world, nonce, lambda r: bool(dns_hits(r.dns, nonce)))
        hits = dns_hits(records.dns, nonce)
        checks.append(host_check("dns fixture logged the host query", bool(hits), f"{len(hits)}"))
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any query carrying the nonce at the fixture is an escape."""
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        hits = dns_hits(witness.dns, ctx.nonce)
        reasons = [
            f"dns fixture logged {len(hits)} queries carrying the nonce",
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(
            observed, bool(hits), private_namespace_reason(report, "net"), reasons
        )
        claims = claims_of(ctx.claims)
        if escape == "escaped" and claims.network != "open":
            reasons.insert(0, f"{claims.phrase('network')}; the DNS fixture heard the payload")
        if ctx.route is None:
            reasons.append(OWN_PROXY_SCOPE)
        return conclude(escape, observed, reasons, host_control=control, witness={"dns": hits})
