"""Network probes of the egress proxy's allowlist itself, host side.

`net_denied_host` and `net_transfer_18mib` test the allowlist itself: a denied host must be
refused, an allowed one must carry 18 MiB byte-exact. Every target is harness-owned.
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
    guarded_check,
    host_check,
    new_control_nonce,
    origin_control_checks,
)
from sandbox_attest.catalog.judging import (
    capability_escape,
    conclude,
    expect_capability,
    judge_escape,
)
from sandbox_attest.catalog.net.lookups import (
    FIX,
    looked_up,
    lookups_outside,
    names_reach_fixture,
    own_proxy_witness_checks,
    plant_answer,
    witness_lookups,
)
from sandbox_attest.catalog.net.route import (
    claims_no_network,
    no_network_reason,
    refused_by_no_network,
)
from sandbox_attest.catalog.proxyclient import connect_tunnel, https_via_proxy
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.verdict import Assessment, Escape, Expectation

# Under a wrapper's own proxy (egress "own") the harness's decision log sees nothing.
OWN_PROXY_WITNESSES: Final = (
    "the sandbox's own proxy keeps no decision log the host reads: the DNS fixture's log and "
    "the origins' logs are the witnesses"
)


class NetDeniedHost(SpecBase):
    """The proxy refuses the denied fixture host on every leg; the allowed host works."""

    id = "net_denied_host"
    area = "net"
    host_readings = ("proxy decision log", "origin access logs", "DNS fixture query log")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Absolute-form and CONNECT to the denied host, and the allowed GET.

        Without a proxy route the payload makes none and says so in one `error` attempt.
        """
        del task
        later = attempts_of("connect-denied", "get-allowed")
        return AttemptTable(
            required=later | {"get-denied-absolute"},
            excuses=(("get-denied-absolute", later),),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied on every leg: the proxy is every leg's route and has no rule for it."""
        del declared
        return "denied"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Name the denied and allowed hosts and their ports.

        A wrapper's own proxy is asked for the denied host under a name carrying the nonce
        (`denied_request_name`), so the DNS fixture's log attributes its lookups to this cell.
        """
        hosts = ctx.world.info.hosts
        denied, allowed = hosts["denied"], hosts["allowed"]
        return {
            "denied": {
                "name": denied_request_name(ctx),
                "http_port": denied.http_port,
                "https_port": denied.https_port,
            },
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host is denied the same way and logged; the allowed host answers it."""
        info, nonce = ctx.world.info, new_control_nonce()
        denied, allowed = info.hosts["denied"], info.hosts["allowed"]

        def connect_denied() -> dict[str, Any]:
            sock, status, reason = connect_tunnel(
                info.proxy.url, denied.name, denied.https_port, nonce
            )
            sock.close()
            return host_check("host connect denied", status == 403, f"{status} {reason}".strip())

        def get_allowed() -> dict[str, Any]:
            url = f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}"
            status, body, _ = https_via_proxy(info, url, nonce)
            ok = status == 200 and nonce.encode() in body
            return host_check("host get allowed", ok, f"{status} {body[:60]!r}")

        checks = [guarded_check("host connect denied", connect_denied)]
        checks.append(guarded_check("host get allowed", get_allowed))
        checks += own_proxy_witness_checks(ctx, nonce)
        records = wait_for_records(
            ctx.world,
            nonce,
            lambda r: (
                any(p.get("decision") == "deny" for p in entries_with_nonce(r.proxy, nonce))
                and bool(entries_with_nonce(r.origin, nonce))
            ),
        )
        denies = [
            p for p in entries_with_nonce(records.proxy, nonce) if p.get("decision") == "deny"
        ]
        checks.append(
            host_check("proxy logged the host's deny", bool(denies), f"{len(denies)} deny")
        )
        hits = [o for o in entries_with_nonce(records.origin, nonce) if o.get("host") == "allowed"]
        checks.append(host_check("allowed origin logged the host", bool(hits), f"{len(hits)} hits"))
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """403 for both forms + silent denied origin + allowed control = refused."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        denied_name = ctx.world.info.hosts["denied"].name
        proxied = entries_with_nonce(witness.proxy, ctx.nonce)
        allowed_through = [
            p for p in proxied if p.get("decision") == "allow" and p.get("host") == denied_name
        ]
        denies = [p for p in proxied if p.get("decision") == "deny"]
        origin_hits = [
            o for o in entries_with_nonce(witness.origin, ctx.nonce) if o.get("host") == "denied"
        ]
        reasons: list[str] = []
        if origin_hits or allowed_through:
            reasons.append(
                f"denied origin saw {len(origin_hits)} requests with the nonce; "
                f"proxy allowed {len(allowed_through)} to {denied_name}"
            )
        forms = [a for a in escapes if a.get("status") == 403]
        no_network = claims_no_network(ctx) and refused_by_no_network([*escapes, *controls])
        if no_network:
            reasons.append(no_network_reason(escapes))
        elif observed == "refused":
            why = "; ".join(sorted({str(a.get("detail")) for a in forms})) or "no reason header"
            reasons.append(
                f"proxy answered 403 for {len(forms)} of {len(escapes)} forms "
                f"({attempts_summary(escapes)}): {why}"
            )
            if len(forms) != len(escapes):
                reasons.append("a refusal did not come as the proxy's 403")
        else:
            reasons.append(f"payload: {attempts_summary(escapes)}")
        if ctx.route is None:
            reasons.append(OWN_PROXY_WITNESSES)
        else:
            reasons.append(f"proxy logged {len(denies)} denies with the nonce")
        escape = judge_escape(observed, bool(origin_hits or allowed_through), None, reasons)
        if escape == "refused" and len(forms) != len(escapes) and not no_network:
            escape = "disagree"
        # Under a no-network claim the allowed control cannot succeed either: its refusal by
        # the network is the claim holding (the host control still shows the proxy works).
        inside_ok = no_network or (
            bool(controls)
            and all(a.get("outcome") == "succeeded" and a.get("status") == 200 for a in controls)
        )
        assessment = conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"proxy": proxied, "denied_origin": origin_hits},
        )
        hits = lookups_outside(ctx, witness.dns)
        exfil = (
            f"DNS exfiltration through the proxy's resolver: the DNS fixture logged lookups of "
            f"{looked_up(hits)}, names carrying the cell's nonce that the allowlist does not "
            f"admit (a secret label in such a name leaves with the query, refused or not); {FIX}"
        )
        return witness_lookups(ctx, assessment, hits, exfil)


def denied_request_name(ctx: CellContext) -> str:
    """The name the payload asks the proxy for the denied host by.

    Under a wrapper's own proxy in the lab: a name below the denied host carrying the nonce,
    which the fixture answers with the denied origin's address (so a proxy that admits it
    still reaches that origin, and its log shows it; unplanted, its lookup is still seen).
    Elsewhere the denied host's own name: the harness's proxy never resolves a name before
    its rules admit it, and outside the lab a nonce name could leave this machine through the
    system resolver.
    """
    denied = ctx.world.info.hosts["denied"]
    if ctx.route is not None or not names_reach_fixture(ctx):
        return denied.name
    name = f"{ctx.nonce}.{denied.name}"
    plant_answer(ctx, name, denied.address)
    return name


class NetTransfer18MiB(SpecBase):
    """The 18 MiB blob over HTTPS through the proxy: a capability."""

    id = "net_transfer_18mib"
    area = "net"
    host_readings = ("origin access log",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The one HTTPS download of the blob."""
        del task
        return AttemptTable(required=attempts_of("blob-https"))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Allowed everywhere except where the backend declares no network at all."""
        return expect_capability(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The allowed host, the nonce-tagged blob path, its size and sha256."""
        info = ctx.world.info
        allowed = info.hosts["allowed"]
        return {
            "host": allowed.name,
            "port": allowed.https_port,
            "path": f"/c/{ctx.nonce}/blob",
            "size": info.blob.size,
            "sha256": info.blob.sha256,
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches the allowed origin through the proxy and the origin logs it."""
        info, nonce = ctx.world.info, new_control_nonce()
        allowed = info.hosts["allowed"]
        return control_record(
            nonce,
            origin_control_checks(
                ctx,
                nonce,
                f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}",
                "allowed",
            ),
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Payload hash match + one complete full-size response logged = escaped (seen).

        Where no network is declared, ANY origin entry with the nonce is an escape: a partial
        transfer is traffic that must not exist, and the origin's log decides, not the payload.
        """
        caps = attempts_by_role(report, "capability")
        observed = observed_outcome(caps)
        size = ctx.world.info.blob.size
        tagged = entries_with_nonce(witness.origin, ctx.nonce)
        full = [
            o
            for o in tagged
            if o.get("host") == "allowed"
            and str(o.get("path", "")).endswith("/blob")
            and o.get("complete")
            and int(o.get("bytes_sent") or 0) >= size
        ]
        facts = report.get("facts", {})
        reasons = [
            f"allowed origin logged {len(full)} complete {size}-byte responses with the nonce",
            f"payload: {attempts_summary(caps)}",
        ]
        if "bytes" in facts:
            reasons.append(f"{facts.get('bytes')} bytes at {facts.get('mb_per_s')} MB/s")
        if expect_capability(ctx.claims) == "denied" and tagged:
            sent = sorted(
                {f"{o.get('host')} {o.get('path')} {o.get('bytes_sent')}B" for o in tagged}
            )
            reasons.append(f"no network is declared, yet origins logged the nonce: {sent[:4]}")
            escape: Escape = "escaped"
        else:
            escape = capability_escape(observed, len(full) == 1, reasons)
        return conclude(escape, observed, reasons, host_control=control, witness={"origin": tagged})
