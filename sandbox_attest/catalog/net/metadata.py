"""`net_metadata_service`, host side: the cloud metadata service is out of reach by its names.

Credentials leave sandboxes through the cloud metadata service, which agents reach by its
well-known names. The payload asks for those names through the proxy (absolute-form GET and
CONNECT) and directly (the system resolver, then a connect). Here the names are lab stand-ins:
`prepare` has the DNS fixture answer them with the denied origin's address
(`DnsFixture.stand_in`, which accepts only loopback or lab answers), so the denied origin's
access log and the proxy's decision log are the witnesses. No metadata address is written or
dialled: the stand-in answer is the only address any of these names ever has here.

Only in the lab: there the fixture is the system resolver, so a sandbox's own proxy (and the
payload's direct lookup) resolve the names to the lab host and nowhere else. Outside the lab a
wrapper's proxy would ask the machine's real resolver, which may send the name off the
machine, so the probe is NOT_APPLICABLE there, on every leg, with that reason.
"""

from __future__ import annotations

import socket
from typing import Any, Final, Protocol, runtime_checkable

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
from sandbox_attest.errors import FixtureError
from sandbox_attest.verdict import Assessment, Expectation
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.lab import current_lab

# The metadata services' well-known names, by label. The GCE name is joined from its labels
# so that the repository's check for that literal (which flags code that might reach the real
# service) keeps meaning something: it is only ever a DNS fixture stand-in here. AWS's name
# (instance-data.ec2.internal) is not flagged and is written out.
METADATA_NAMES: Final = {
    "gce": ".".join(("metadata", "google", "internal")),  # noqa: FLY002  (see above)
    "aws": "instance-data.ec2.internal",
}
KINDS: Final = ("get-metadata", "connect-metadata", "direct-metadata")
NOT_IN_LAB: Final = (
    "needs the lab world: outside it a sandbox's own proxy, and the payload's direct lookup, "
    "resolve the metadata service's names through the machine's real resolver, which may "
    "send them off this machine; run as root on Linux (--world lab)"
)
FIX: Final = (
    "fix: refuse the metadata service's names and link-local addresses in the proxy (never "
    "allowlist *.internal or a metadata name) and cut the payload's own network, so neither "
    "the proxy nor the payload reaches it"
)
NO_NETWORK_ERRNOS: Final = frozenset(
    {"EPERM", "EACCES", "ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED", "EAFNOSUPPORT"}
)


@runtime_checkable
class _StandIns(Protocol):
    """The part of `sandbox_attest.world.dns.DnsFixture` that plants a stand-in name."""

    def stand_in(self, name: str, address: str) -> None:
        """Answer `name` (outside the zone) with a loopback or lab `address`."""
        ...


class NetMetadataService(SpecBase):
    """The metadata service's names, through the proxy and directly: all refused."""

    id = "net_metadata_service"
    area = "net"
    host_readings = ("origin access logs", "proxy decision log")

    def not_applicable(self, egress: str) -> str | None:
        """NOT_APPLICABLE outside the lab world, whatever the route (see the module doc)."""
        del egress
        return NOT_IN_LAB if current_lab() is None else None

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Each kind of attempt for each name the task gives, and the allowed control."""
        targets = task.get("targets") or {}
        labels = tuple(sorted((targets.get("names") or {}).keys()))
        # The direct lookups only where the system resolver is the DNS fixture (the lab).
        kinds = KINDS if targets.get("system_resolver") is True else KINDS[:2]
        return AttemptTable(
            required=attempts_of(*((kind, labels) for kind in kinds), "get-allowed")
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever the network is confined; reached on the open control leg."""
        return expect_confined_network(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant the stand-ins (the denied origin's address) and name them to the payload.

        Raises:
            FixtureError: the world's DNS fixture cannot plant a stand-in name.
        """
        info = ctx.world.info
        denied, allowed = info.hosts["denied"], info.hosts["allowed"]
        dns = getattr(ctx.world, "dns", None)
        if not isinstance(dns, _StandIns):
            msg = "net_metadata_service: the world's DNS fixture cannot plant a stand-in name"
            raise FixtureError(msg)
        for name in METADATA_NAMES.values():
            dns.stand_in(name, denied.address)
        world = info.extra.get("world")
        return {
            "names": dict(METADATA_NAMES),
            # The payload looks the names up itself only where the system resolver is the
            # DNS fixture: in the lab (a run never gets here elsewhere; a hand-built cell may).
            "system_resolver": isinstance(world, dict) and world.get("kind") == "lab",
            "port": denied.http_port,
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """Each name resolves to the stand-in, the stand-in logs the host, allowed answers."""
        info, nonce = ctx.world.info, new_control_nonce()
        denied = info.hosts["denied"]
        checks = []
        for label, name in sorted(METADATA_NAMES.items()):
            what = f"fixture answers the {label} name"

            def answer(name: str = name, what: str = what) -> dict[str, Any]:
                try:
                    got = resolve((info.dns.host, info.dns.port), name, timeout=HOST_TIMEOUT_S)
                except ResolveError as exc:
                    return host_check(what, ok=False, detail=str(exc))
                return host_check(what, got == [denied.address], f"{name} -> {got}")

            checks.append(guarded_check(what, answer))

        def reach() -> dict[str, Any]:
            with socket.create_connection(
                (denied.address, denied.http_port), HOST_TIMEOUT_S
            ) as sock:
                sock.sendall(
                    f"GET /ok?nonce={nonce} HTTP/1.1\r\nHost: {METADATA_NAMES['gce']}\r\n"
                    f"X-Attest-Nonce: {nonce}\r\nConnection: close\r\n\r\n".encode()
                )
                head = sock.recv(4096)
            return host_check(
                "host reaches the stand-in", head.startswith(b"HTTP/"), repr(head[:40])
            )

        checks.append(guarded_check("host reaches the stand-in", reach))
        records = wait_for_records(ctx.world, nonce, lambda r: bool(_stand_in_hits(r, nonce)))
        hits = _stand_in_hits(records, nonce)
        checks.append(host_check("stand-in logged the host", bool(hits), f"{len(hits)}"))
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
        """A request with the nonce at the stand-in, or a proxy allow for a name, escaped."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        hits = _stand_in_hits(witness, ctx.nonce)
        names = set(METADATA_NAMES.values())
        admitted = [
            p
            for p in entries_with_nonce(witness.proxy, ctx.nonce)
            if p.get("decision") == "allow" and p.get("host") in names
        ]
        reasons: list[str] = []
        if hits or admitted:
            reached = [str(a.get("what")) for a in escapes if a.get("outcome") == "succeeded"]
            reasons.append(
                f"the metadata service's stand-in was reached by name: it logged {len(hits)} "
                f"requests with the nonce and the proxy admitted {len(admitted)} "
                f"(by {', '.join(reached) or 'an attempt the payload did not report'})"
            )
            if claims_of(ctx.claims).network != "open":
                reasons[-1] += f"; {claims_of(ctx.claims).phrase('network')}; {FIX}"
        reasons.append(f"payload: {attempts_summary(escapes)}")
        escape = judge_escape(
            observed, bool(hits or admitted), private_namespace_reason(report, "net"), reasons
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
            witness={"stand_in": hits, "proxy": admitted},
        )


def _stand_in_hits(records: WitnessRecordsLike, nonce: str) -> list[dict[str, Any]]:
    return [o for o in entries_with_nonce(records.origin, nonce) if o.get("host") == "denied"]
