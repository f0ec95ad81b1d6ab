"""`net_proxy_ignored`, host side: the network is cut below the proxy, not by its variables.

A sandbox whose only cut is HTTP(S)_PROXY holds only for the programs that read it; Node's
fetch, Go binaries built without the environment proxy, raw sockets and libraries told "no
proxy" go straight out. The payload reaches for the ALLOWED host, which the proxy would
admit, without the proxy (by its address; in the lab also by name and through urllib with
an empty proxy map), so only a cut below the proxy stops it. The witness is the allowed
origin's access log: an entry with the cell's nonce and `via=` in its query came straight
from the payload, since the payload's proxied control never carries `via=`.
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING, Any, Final

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
from sandbox_attest.catalog.judging import (
    conclude,
    expect_confined_network,
    judge_escape,
    private_namespace_reason,
)
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

if TYPE_CHECKING:
    from collections.abc import Mapping

FIX: Final = (
    "fix: cut the payload's network below the proxy (its own network namespace with no route "
    "out, or a filter that refuses connect) so the proxy is its only way out; proxy "
    "variables bind only the programs that read them"
)
NO_NETWORK_ERRNOS: Final = frozenset(
    {"EPERM", "EACCES", "ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED", "EAFNOSUPPORT"}
)


def _in_lab(extra: Mapping[str, Any]) -> bool:
    world = extra.get("world")
    return isinstance(world, dict) and world.get("kind") == "lab"


class NetProxyIgnored(SpecBase):
    """Straight to the allowed host, ignoring the proxy variables: refused below the proxy."""

    id = "net_proxy_ignored"
    area = "net"
    host_readings = ("origin access logs",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """By address always; by name and urllib in the lab; the proxied control."""
        lab = ("raw-by-name", "urllib-no-proxy")
        system = lab if (task.get("targets") or {}).get("system_resolver") else ()
        return AttemptTable(required=attempts_of("raw-by-address", *system, "get-allowed"))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever the network is confined; reached on the open control leg."""
        return expect_confined_network(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The allowed host, its own address and whether the system resolver is the fixture."""
        info = ctx.world.info
        allowed = info.hosts["allowed"]
        return {
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
            "address": allowed.address,
            "system_resolver": _in_lab(info.extra),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches the allowed origin straight, by address, and is logged with `via=`.

        And through the proxy, so the payload's proxied control has a working route.
        """
        info, nonce = ctx.world.info, new_control_nonce()
        allowed = info.hosts["allowed"]

        def straight() -> dict[str, Any]:
            tls = ssl.create_default_context(cafile=info.ca_bundle)
            with (
                socket.create_connection(
                    (allowed.address, allowed.https_port), HOST_TIMEOUT_S
                ) as raw,
                tls.wrap_socket(raw, server_hostname=allowed.name) as sock,
            ):
                sock.sendall(
                    f"GET /ok?nonce={nonce}&via=host HTTP/1.1\r\nHost: {allowed.name}\r\n"
                    f"X-Attest-Nonce: {nonce}\r\nConnection: close\r\n\r\n".encode()
                )
                head = sock.recv(4096)
            return host_check("host reaches allowed straight", head.startswith(b"HTTP/1.1 200"), "")

        checks = [guarded_check("host reaches allowed straight", straight)]
        records = wait_for_records(ctx.world, nonce, lambda r: bool(_straight_hits(r, nonce)))
        hits = _straight_hits(records, nonce)
        checks.append(host_check("allowed origin logged the host", bool(hits), f"{len(hits)}"))
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
        """Any request with the nonce and `via=` at the allowed origin went around the proxy."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        hits = _straight_hits(witness, ctx.nonce)
        reasons: list[str] = []
        if hits:
            ways = sorted({str(h.get("path", "")).rsplit("via=", 1)[-1] for h in hits})
            reasons.append(
                f"the allowed origin logged {len(hits)} requests that bypassed the proxy "
                f"({', '.join(ways)}): a program that ignores the proxy variables goes straight "
                "out"
            )
            claims = claims_of(ctx.claims)
            if claims.network != "open":
                reasons[-1] += f"; {claims.phrase('network')}; {FIX}"
        reasons.append(f"payload: {attempts_summary(escapes)}")
        escape = judge_escape(
            observed, bool(hits), private_namespace_reason(report, "net"), reasons
        )
        no_network = ctx.claims.network == "none" and all(
            a.get("outcome") == "refused" and a.get("errno") in NO_NETWORK_ERRNOS for a in controls
        )
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
            witness={"allowed_origin": hits},
        )


def _straight_hits(records: WitnessRecordsLike, nonce: str) -> list[dict[str, Any]]:
    """Allowed-origin requests tagged `via=`: only the straight attempts carry it."""
    return [
        o
        for o in entries_with_nonce(records.origin, nonce)
        if o.get("host") == "allowed" and "via=" in str(o.get("path", ""))
    ]
