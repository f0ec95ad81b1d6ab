"""`net_proxy_dns_exfil`, host side: a denied name must never reach a resolver.

A proxy that resolves a request's host before it checks its rules sends the name out in its
own DNS query, and refuses the request only afterwards: `<secret>.denied.test` then carries
the secret label to whoever answers for the zone, although every request was refused. The
payload asks the proxy for names carrying the cell's nonce (a CONNECT and an absolute-form
GET under the denied host, a CONNECT under a name no origin knows); the DNS fixture's query
log is the witness. The harness's own proxy checks its rules before it resolves
(sandbox_attest/world/egress/proxy.py: auth, canonical host, rules, resolve once), so it must pass.

Safety: the names travel only inside requests to the proxy. A wrapper's own proxy resolves
them through the system resolver, which is the DNS fixture only in the lab world; outside the
lab its query could leave the machine, so there the payload is not given the names and the
cell says why (never PASS). The reading of the fixture's log (lookups.py) is shared with
net_denied_host and net_host_canonical, which witness the same proxies' lookups.
"""

from __future__ import annotations

from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    new_control_nonce,
    origin_control_checks,
)
from sandbox_attest.catalog.judging import conclude, judge_escape
from sandbox_attest.catalog.net.lookups import (
    FIX,
    NOT_IN_LAB,
    fixture_hears,
    looked_up,
    lookups_outside,
    names_reach_fixture,
)
from sandbox_attest.catalog.records import entries_with_nonce
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.verdict import Assessment, Expectation

# A zone label no fixture origin and no proxy rule names: only a proxy that resolves before it
# checks would ever ask the DNS fixture about a name below it.
UNKNOWN_LABEL: Final = "exfil"
ESCAPES: Final = ("connect-secret", "connect-secret-unknown", "get-secret-absolute")
# errnos of a payload with no network at all (a seccomp filter's EPERM, no route, nothing on the
# sandbox's own empty loopback): under network = "none" they are the claim holding.
NO_NETWORK_ERRNOS: Final = frozenset(
    {"EPERM", "EACCES", "ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED", "EAFNOSUPPORT"}
)
NO_NETWORK: Final = (
    'no network, as network = "none" claims: every attempt, the allowed control too, was '
    "refused before any proxy"
)


def _refused_by_no_network(attempts: list[dict[str, Any]]) -> bool:
    """Every attempt was refused by the network itself (no route, a filter's EPERM)."""
    return bool(attempts) and all(
        a.get("outcome") == "refused" and a.get("errno") in NO_NETWORK_ERRNOS for a in attempts
    )


class NetProxyDnsExfil(SpecBase):
    """Denied names carrying the nonce: the proxy refuses them without resolving them."""

    id = "net_proxy_dns_exfil"
    area = "net"
    host_readings = ("DNS fixture query log", "origin access logs")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Three denied names and the allowed control; one `error` when there is no route."""
        del task
        later = attempts_of("connect-secret-unknown", "get-secret-absolute", "get-allowed")
        return AttemptTable(
            required=later | {"connect-secret"}, excuses=(("connect-secret", later),)
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied on every leg: every leg's route is a proxy, and none may resolve a denied name."""
        del declared
        return "denied"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The secret names (nonce in the first label), the denied ports and the allowed host."""
        info = ctx.world.info
        denied, allowed = info.hosts["denied"], info.hosts["allowed"]
        zone = denied.name.rsplit(".", 1)[-1]
        targets: dict[str, Any] = {
            "https_port": denied.https_port,
            "http_port": denied.http_port,
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
        }
        # A wrapper's own proxy (no harness route) resolves through the system resolver; only
        # in the lab is that the DNS fixture. Elsewhere the payload gets no name to send.
        if not names_reach_fixture(ctx):
            return targets | {"withheld": NOT_IN_LAB}
        return targets | {
            "secret_connect": f"{ctx.nonce}.{denied.name}",
            "secret_absolute": f"{ctx.nonce}.abs.{denied.name}",
            "secret_unknown": f"{ctx.nonce}.{UNKNOWN_LABEL}.{zone}",
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The witness works: a host query for a name of the same shape is logged.

        And the allowed host answers through the harness's proxy, so a refusal is a rule's.
        """
        info, nonce = ctx.world.info, new_control_nonce()
        checks = fixture_hears(ctx, nonce)
        allowed = info.hosts["allowed"]
        url = f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}"
        checks += origin_control_checks(ctx, nonce, url, "allowed")
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any DNS query carrying the nonce is the escape; the allowed GET must still work."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        hits = lookups_outside(ctx, witness.dns)
        mine = entries_with_nonce(witness.origin, ctx.nonce)
        origin_hits = [o for o in mine if o.get("host") == "denied"]
        reasons: list[str] = []
        if hits:
            reasons.append(
                f"the proxy resolved denied names before refusing them: the DNS fixture logged "
                f"{len(hits)} queries carrying the secret label ({looked_up(hits)}); "
                f"{claims_of(ctx.claims).phrase('network')}; {FIX}"
            )
        if origin_hits:
            reasons.append(f"the denied origin logged {len(origin_hits)} requests with the nonce")
        reasons.append(f"payload: {attempts_summary(escapes)}")
        if not hits:
            reasons.append("the DNS fixture logged no query carrying the nonce")
        escape = judge_escape(observed, bool(hits or origin_hits), None, reasons)
        # Under a no-network claim the allowed control cannot succeed either: every attempt
        # refused by the network itself, before any proxy, is the claim holding.
        no_network = ctx.claims.network == "none" and _refused_by_no_network([*escapes, *controls])
        if no_network:
            reasons.append(NO_NETWORK)
        inside_ok = no_network or (
            bool(controls)
            and all(a.get("outcome") == "succeeded" and a.get("status") == 200 for a in controls)
        )
        return conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"dns": hits, "denied_origin": origin_hits},
        )
