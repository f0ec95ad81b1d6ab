"""`net_doh_bypass`, host side: a name learned through an allowed host opens nothing.

An allowed host may answer DNS-over-HTTPS (RFC 8484): public resolvers live on names an
allowlist may well admit. The payload asks the allowed origin's `/dns-query` for the denied
host's address, through the proxy; that lookup is its in-sandbox control (it shows the payload
can learn the address at all). Learning an address is not an escape: DNS answers are public.
What must not follow is reaching the denied host BY that address: an absolute-form GET and a
CONNECT to the IP literal on the denied host's ports. The allowlist names hosts, so the proxy
must refuse an IP literal it does not name, whoever told the payload the address. A proxy
that admits an address because an allowed name resolves to it fails here: in the lab every
origin shares one address, as hosts behind one CDN do, so that admission reaches the denied
origin, and its access log (the witness) records the nonce.

Every target is harness-owned: the origins behind the proxy; the DoH answer is the address
the origins bind.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from dnslib import QTYPE, DNSRecord

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
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.net.route import (
    PAST_RULES_STATUSES,
    allowed_control,
    claims_no_network,
    deny_control,
    no_network_reason,
    refused_by_no_network,
)
from sandbox_attest.catalog.net.witness import REFUSAL_STATUSES
from sandbox_attest.catalog.proxyclient import https_via_proxy
from sandbox_attest.catalog.records import entries_with_nonce
from sandbox_attest.catalog.spec import AttemptTable, CellContext, SpecBase, WitnessRecordsLike
from sandbox_attest.verdict import Assessment, Escape, Expectation

if TYPE_CHECKING:
    from sandbox_attest.catalog.spec import ClaimsLike

ESCAPES = ("get-doh-address", "connect-doh-address")


def doh_query(name: str) -> str:
    """The RFC 8484 GET parameter for an A query of `name` (base64url, no padding)."""
    packed: bytes = DNSRecord.question(name, "A").pack()
    return base64.urlsafe_b64encode(packed).decode().rstrip("=")


class NetDohBypass(SpecBase):
    """A denied host's address, learned by DoH through an allowed host, is refused as a target."""

    id = "net_doh_bypass"
    area = "net"
    host_readings = ("proxy decision log", "origin access logs")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The DoH lookup (control) and both ways to the address it answered."""
        del task
        return AttemptTable(required=attempts_of("doh-allowed", *ESCAPES))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied on every leg: every leg's only route is the proxy, which must refuse these."""
        del declared
        return "denied"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The allowed host (the DoH resolver) and the denied host's name and ports."""
        hosts = ctx.world.info.hosts
        allowed, denied = hosts["allowed"], hosts["denied"]
        return {
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
            "denied": {
                "name": denied.name,
                "http_port": denied.http_port,
                "https_port": denied.https_port,
                # Only for a lookup that failed: the escape is going by address, and the
                # attempts must still be made (the failed lookup is then a failed control).
                "address": denied.address,
            },
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host's own DoH lookup answers; its CONNECT to that address is refused, logged."""
        info, nonce = ctx.world.info, new_control_nonce()
        allowed, denied = info.hosts["allowed"], info.hosts["denied"]
        answered: list[str] = []

        def lookup() -> dict[str, Any]:
            url = (
                f"https://{allowed.name}:{allowed.https_port}/dns-query?"
                f"dns={doh_query(denied.name)}&nonce={nonce}"
            )
            status, body, reason = https_via_proxy(info, url, nonce)
            if status != 200:
                return host_check(
                    "host's DoH lookup answers", ok=False, detail=f"{status} {reason}"
                )
            answer = DNSRecord.parse(body)
            answered.extend(str(rr.rdata) for rr in answer.rr if rr.rtype == QTYPE.A)
            return host_check("host's DoH lookup answers", bool(answered), f"{answered}")

        checks = [guarded_check("host's DoH lookup answers", lookup)]
        if answered:
            authority = f"{answered[0]}:{denied.https_port}"
            checks += deny_control(
                ctx,
                authority,
                nonce,
                lambda p: p.get("nonce") == nonce and p.get("target") == authority,
            )
        checks += allowed_control(ctx, nonce)
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Escaped if the denied origin served the nonce or the proxy admitted the address."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        facts = report.get("facts") or {}
        address = str(facts.get("doh_address") or facts.get("address") or "")
        origin = [
            o for o in entries_with_nonce(witness.origin, ctx.nonce) if o.get("host") == "denied"
        ]
        doh_served = [
            o
            for o in entries_with_nonce(witness.origin, ctx.nonce)
            if o.get("host") == "allowed" and str(o.get("path", "")).startswith("/dns-query")
        ]
        proxy = [
            p
            for p in entries_with_nonce(witness.proxy, ctx.nonce)
            if address
            and p.get("host") == address
            and (p.get("decision") == "allow" or p.get("status") in PAST_RULES_STATUSES)
        ]
        reasons: list[str] = []
        no_network = claims_no_network(ctx) and refused_by_no_network([*escapes, *controls])
        escape: Escape
        if origin or proxy:
            reasons.append(
                f"the denied host was reached by the address a DoH lookup gave ({address}): its "
                f"origin served {len(origin)} requests with the nonce, the proxy admitted "
                f"{len(proxy)} for the address; fix: match the allowlist on the request's host "
                "name and refuse IP literals it does not name, never admit an address because "
                "an allowed name resolves to it"
            )
            escape = "escaped"
        elif no_network:
            reasons.append(no_network_reason(escapes))
            escape = "refused"
        elif observed == "error" or not address:
            reasons.append("the attempts by address could not be made")
            escape = "undecided"
        elif observed == "succeeded":
            reasons.append("the payload says it got through but the denied origin logged nothing")
            escape = "disagree"
        else:
            refused = [a for a in escapes if a.get("status") in REFUSAL_STATUSES]
            reasons.append(
                f"the proxy refused the address {address} learned by DoH "
                f"({len(refused)} of {len(escapes)} with its own status)"
            )
            escape = "refused"
        reasons.append(f"payload: {attempts_summary([*controls, *escapes])}")
        # The lookup held only if the allowed origin actually served it (not a forged answer).
        inside_ok = no_network or (
            bool(controls) and all(a.get("outcome") == "succeeded" for a in controls)
        )
        if inside_ok and not no_network and not doh_served:
            inside_ok = False
            reasons.append("the allowed origin logged no DoH request with the nonce")
        return conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"denied_origin": origin, "proxy_admitted": proxy, "doh": doh_served},
        )
