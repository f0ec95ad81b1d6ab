"""`net_socks5`, host side: no SOCKS5 route around the allowlist, by TCP or by UDP.

Sandboxes that bring their own proxy often export a SOCKS endpoint too
(`ALL_PROXY=socks5h://...`), and a SOCKS relay judged only by its HTTP sibling's allowlist is a
second, unchecked way out; UDP ASSOCIATE is a third, for datagrams the HTTP proxy never sees.
The payload tries SOCKS5 CONNECT (by name, to the denied host) and UDP ASSOCIATE (a datagram
to the direct-egress UDP listener) through every SOCKS endpoint its environment names and
through the sanctioned proxy's own port. The witnesses are the host's: the denied origin's
access log, the proxy's decision log and the direct-egress UDP listener, each filtered by the
cell's nonce. The harness's proxy speaks HTTP only, so on every leg the expected answer is a
refusal; the allowed host through the sanctioned HTTP route is the payload's control.
"""

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
    origin_control_checks,
)
from sandbox_attest.catalog.judging import conclude, judge_escape
from sandbox_attest.catalog.proxyclient import split_hostport
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.verdict import Assessment, Expectation

# Endpoints the payload found in its environment are named `env-N`: the host cannot list them
# beforehand, only their form.
ENV_PREFIXES: Final = ("socks5-connect:env-", "socks5-udp:env-")
FIX: Final = (
    "fix: do not export a SOCKS endpoint that bypasses the allowlist; apply the same host "
    "rules to SOCKS5 CONNECT as to HTTP CONNECT, refuse UDP ASSOCIATE (or filter each "
    "datagram's destination), or drop the SOCKS route"
)
# errnos of a payload with no network at all (a seccomp filter's EPERM, no route, nothing on the
# sandbox's own empty loopback): under network = "none" they are the claim holding.
NO_NETWORK_ERRNOS: Final = frozenset(
    {"EPERM", "EACCES", "ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED", "EAFNOSUPPORT"}
)
NO_NETWORK: Final = (
    'no network, as network = "none" claims: every attempt, the allowed control too, was '
    "refused before any proxy"
)


class NetSocks5(SpecBase):
    """SOCKS5 CONNECT and UDP ASSOCIATE through every SOCKS endpoint: all refused."""

    id = "net_socks5"
    area = "net"
    host_readings = ("origin access logs", "proxy decision log", "direct-egress UDP listener")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Both SOCKS attempts at the route's port, env endpoints' by form, and the control."""
        del task
        later = attempts_of("socks5-udp:route", "get-allowed")
        return AttemptTable(
            required=later | {"socks5-connect:route"},
            discovered=ENV_PREFIXES,
            excuses=(("socks5-connect:route", later),),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied on every leg: no leg's route may relay SOCKS to a denied host or UDP out."""
        del declared
        return "denied"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The denied host (by name), the allowed host and the direct-egress UDP listener."""
        info = ctx.world.info
        denied, allowed = info.hosts["denied"], info.hosts["allowed"]
        return {
            "denied": {"name": denied.name, "http_port": denied.http_port},
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
            "udp": info.direct_egress.udp,
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """Each witness hears the host: the denied origin, the UDP listener, the allowed host."""
        info, nonce = ctx.world.info, new_control_nonce()
        denied = info.hosts["denied"]

        def origin() -> dict[str, Any]:
            # Straight to the origin's own address (harness-owned): only the witness is tested.
            with socket.create_connection(
                (denied.address, denied.http_port), HOST_TIMEOUT_S
            ) as sock:
                sock.sendall(
                    f"GET /ok?nonce={nonce} HTTP/1.1\r\nHost: {denied.name}\r\n"
                    f"X-Attest-Nonce: {nonce}\r\nConnection: close\r\n\r\n".encode()
                )
                answer = sock.recv(4096)
            return host_check("host reaches the denied origin", bool(answer), repr(answer[:40]))

        def udp() -> dict[str, Any]:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.sendto(f"nonce={nonce}\n".encode(), split_hostport(info.direct_egress.udp))
            return host_check("host udp datagram", ok=True, detail=info.direct_egress.udp)

        checks = [
            guarded_check("host reaches the denied origin", origin),
            guarded_check("host udp datagram", udp),
        ]
        records = wait_for_records(
            ctx.world,
            nonce,
            lambda r: bool(_denied_hits(r, nonce) and entries_with_nonce(r.direct_udp, nonce)),
        )
        hits = _denied_hits(records, nonce)
        checks.append(host_check("denied origin logged the host", bool(hits), f"{len(hits)}"))
        seen = entries_with_nonce(records.direct_udp, nonce)
        checks.append(host_check("udp listener logged the host", bool(seen), f"{len(seen)}"))
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
        """Any nonce at the denied origin or the UDP listener, or a proxy allow to it, escaped."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        denied_name = ctx.world.info.hosts["denied"].name
        origin_hits = _denied_hits(witness, ctx.nonce)
        udp = entries_with_nonce(witness.direct_udp, ctx.nonce)
        allowed_through = [
            p
            for p in entries_with_nonce(witness.proxy, ctx.nonce)
            if p.get("decision") == "allow" and p.get("host") == denied_name
        ]
        endpoints = report.get("facts", {}).get("socks_endpoints") or []
        reasons: list[str] = []
        if origin_hits or udp or allowed_through:
            relayed = [str(a.get("what")) for a in escapes if a.get("outcome") == "succeeded"]
            reasons.append(
                f"a SOCKS5 route went around the allowlist: the denied origin logged "
                f"{len(origin_hits)} requests and the UDP listener {len(udp)} datagrams with the "
                f"nonce, the proxy allowed {len(allowed_through)} to {denied_name} "
                f"(relayed by {', '.join(relayed) or 'an attempt the payload did not report'}; "
                f"endpoints {', '.join(map(str, endpoints)) or 'none reported'}); "
                f"{claims_of(ctx.claims).phrase('network')}; {FIX}"
            )
        reasons.append(f"payload: {attempts_summary(escapes)}")
        escape = judge_escape(observed, bool(origin_hits or udp or allowed_through), None, reasons)
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
            witness={"denied_origin": origin_hits, "direct_udp": udp, "proxy": allowed_through},
        )


def _refused_by_no_network(attempts: list[dict[str, Any]]) -> bool:
    """Every attempt was refused by the network itself (no route, a filter's EPERM)."""
    return bool(attempts) and all(
        a.get("outcome") == "refused" and a.get("errno") in NO_NETWORK_ERRNOS for a in attempts
    )


def _denied_hits(records: WitnessRecordsLike, nonce: str) -> list[dict[str, Any]]:
    return [o for o in entries_with_nonce(records.origin, nonce) if o.get("host") == "denied"]
