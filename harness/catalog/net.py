"""Network probes: the denied host, direct egress and the 18 MiB transfer, host side."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from harness.verdict import Assessment, Escape, Expectation
from harness.world.listeners import LOOPBACK

if TYPE_CHECKING:
    from harness.backends.base import DeclaredPolicy
from harness.catalog.base import (
    HOST_TIMEOUT_S,
    CellContext,
    WitnessRecordsLike,
    _attempts,
    _capability,
    _capability_escape,
    _check,
    _conclude,
    _confined_network,
    _control,
    _control_nonce,
    _guarded,
    _https_via_proxy,
    _judge,
    _observed,
    _origin_control,
    _private_namespace,
    _Spec,
    _split,
    _summary,
    _tunnel,
    _wait_for,
    _with_nonce,
)


class NetDeniedHost(_Spec):
    """The proxy refuses the denied fixture host on every leg; the allowed host works."""

    id = "net_denied_host"
    area = "net"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied on every leg: the proxy is every leg's route and has no rule for it."""
        del policy
        return "denied"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Name the denied and allowed hosts and their ports."""
        hosts = ctx.world.info.hosts
        denied, allowed = hosts["denied"], hosts["allowed"]
        return {
            "denied": {
                "name": denied.name,
                "http_port": denied.http_port,
                "https_port": denied.https_port,
            },
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host is denied the same way and logged; the allowed host answers it."""
        info, nonce = ctx.world.info, _control_nonce()
        denied, allowed = info.hosts["denied"], info.hosts["allowed"]

        def connect_denied() -> dict[str, Any]:
            sock, status, reason = _tunnel(info.proxy.url, denied.name, denied.https_port, nonce)
            sock.close()
            return _check("host connect denied", status == 403, f"{status} {reason}".strip())

        def get_allowed() -> dict[str, Any]:
            url = f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}"
            status, body, _ = _https_via_proxy(info, url, nonce)
            ok = status == 200 and nonce.encode() in body
            return _check("host get allowed", ok, f"{status} {body[:60]!r}")

        checks = [_guarded("host connect denied", connect_denied)]
        checks.append(_guarded("host get allowed", get_allowed))
        records = _wait_for(
            ctx.world,
            nonce,
            lambda r: (
                any(p.get("decision") == "deny" for p in _with_nonce(r.proxy, nonce))
                and bool(_with_nonce(r.origin, nonce))
            ),
        )
        denies = [p for p in _with_nonce(records.proxy, nonce) if p.get("decision") == "deny"]
        checks.append(_check("proxy logged the host's deny", bool(denies), f"{len(denies)} deny"))
        hits = [o for o in _with_nonce(records.origin, nonce) if o.get("host") == "allowed"]
        checks.append(_check("allowed origin logged the host", bool(hits), f"{len(hits)} hits"))
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """403 for both forms + silent denied origin + allowed control = refused."""
        escapes = _attempts(report, "escape")
        controls = _attempts(report, "control")
        observed = _observed(escapes)
        denied_name = ctx.world.info.hosts["denied"].name
        proxied = _with_nonce(witness.proxy, ctx.nonce)
        allowed_through = [
            p for p in proxied if p.get("decision") == "allow" and p.get("host") == denied_name
        ]
        denies = [p for p in proxied if p.get("decision") == "deny"]
        origin_hits = [
            o for o in _with_nonce(witness.origin, ctx.nonce) if o.get("host") == "denied"
        ]
        reasons: list[str] = []
        if origin_hits or allowed_through:
            reasons.append(
                f"denied origin saw {len(origin_hits)} requests with the nonce; "
                f"proxy allowed {len(allowed_through)} to {denied_name}"
            )
        forms = [a for a in escapes if a.get("status") == 403]
        if observed == "refused":
            why = "; ".join(sorted({str(a.get("detail")) for a in forms})) or "no reason header"
            reasons.append(
                f"proxy answered 403 for {len(forms)} of {len(escapes)} forms "
                f"({_summary(escapes)}): {why}"
            )
            if len(forms) != len(escapes):
                reasons.append("a refusal did not come as the proxy's 403")
        else:
            reasons.append(f"payload: {_summary(escapes)}")
        reasons.append(f"proxy logged {len(denies)} denies with the nonce")
        escape = _judge(observed, bool(origin_hits or allowed_through), None, reasons)
        if escape == "refused" and len(forms) != len(escapes):
            escape = "disagree"
        inside_ok = bool(controls) and all(
            a.get("outcome") == "succeeded" and a.get("status") == 200 for a in controls
        )
        return _conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"proxy": proxied, "denied_origin": origin_hits},
        )


class NetDirectEgress(_Spec):
    """A direct TCP/UDP socket to the host's listener, bypassing the proxy."""

    id = "net_direct_egress"
    area = "net"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied wherever the network is confined; seen on the open control leg."""
        return _confined_network(policy)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The witness's TCP and UDP address, and every other address to try at its ports.

        In the lab that is every address the lab assigned (the internet side's and the host
        side's own) and the host's loopback: witnesses answer on all of them, so a sandbox
        with any path out is seen whatever address it picks. The payload adds the addresses
        of its own interfaces, read from its own namespace (delivered locally: never a
        gateway). On the loopback world the witness is on 127.0.0.1 alone.
        """
        info = ctx.world.info
        direct = info.direct_egress
        lab = [str(a) for a in info.extra.get("lab_addresses") or []]
        extra = [a for a in (*lab, *([LOOPBACK] if lab else [])) if a != _split(direct.tcp)[0]]
        return {"tcp": direct.tcp, "udp": direct.udp, "extra_addresses": extra}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches the same listener over TCP and UDP and is logged."""
        direct, nonce = ctx.world.info.direct_egress, _control_nonce()
        payload = f"nonce={nonce}\n".encode()

        def tcp() -> dict[str, Any]:
            with socket.create_connection(_split(direct.tcp), HOST_TIMEOUT_S) as sock:
                sock.sendall(payload)
            return _check("host tcp connect", ok=True, detail=f"sent to {direct.tcp}")

        def udp() -> dict[str, Any]:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.sendto(payload, _split(direct.udp))
            return _check("host udp datagram", ok=True, detail=f"sent to {direct.udp}")

        checks = [_guarded("host tcp connect", tcp), _guarded("host udp datagram", udp)]
        records = _wait_for(
            ctx.world,
            nonce,
            lambda r: bool(_with_nonce(r.direct_tcp, nonce) and _with_nonce(r.direct_udp, nonce)),
        )
        for kind, entries in (("tcp", records.direct_tcp), ("udp", records.direct_udp)):
            seen = _with_nonce(entries, nonce)
            checks.append(_check(f"listener logged host {kind}", bool(seen), f"{len(seen)}"))
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any connection or datagram with the nonce at the listener is an escape."""
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        tcp = _with_nonce(witness.direct_tcp, ctx.nonce)
        udp = _with_nonce(witness.direct_udp, ctx.nonce)
        reached = sorted({str(e.get("local")) for e in tcp if e.get("local")})
        reasons = [
            f"listener saw {len(tcp)} connections and {len(udp)} datagrams with the nonce"
            + (f" (reached {', '.join(reached)})" if reached else ""),
            f"payload: {_summary(escapes)}",
        ]
        escape = _judge(observed, bool(tcp or udp), _private_namespace(report, "net"), reasons)
        seen_out = host_seen_path_out(ctx)
        if seen_out:
            escape = "escaped"
            reasons.insert(0, seen_out)
        return _conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"direct_tcp": tcp, "direct_udp": udp, "host_view": ctx.host_view},
        )


def host_seen_path_out(ctx: CellContext) -> str:
    """A path out that the host saw in the payload's network namespace, or "".

    Read from /proc at the rendezvous (harness/hostview.py), so no packet had to be sent and
    no report could hide it: under a claim of no network, or of the proxy as the only route,
    the payload sharing the harness's network namespace, or a default route in its own, is
    a way out.
    """
    view = ctx.host_view
    if ctx.policy.network == "open" or not view.get("seen"):
        return ""
    claim = f'claims network = "{ctx.policy.network}"'
    # Every process that carried this cell's launcher counts: a wrapper that runs the real
    # payload unconfined beside a confined decoy must not be judged by the decoy alone.
    for process in (view, *(view.get("others") or [])):
        pid = process.get("pid", "?")
        if "net" in (process.get("shared_with_harness") or []):
            netns = (process.get("namespaces") or {}).get("net", "?")
            return (
                f"{claim}; the payload (host pid {pid}) ran in the harness's network "
                f"namespace ({netns}), seen by the host"
            )
        routes = process.get("default_routes") or []
        if routes:
            route = routes[0]
            return (
                f"{claim}; the payload's network namespace (host pid {pid}) has a default "
                f"route (via {route.get('gateway')} dev {route.get('dev')}), seen by the host "
                "without a packet sent"
            )
    return ""


class NetTransfer18MiB(_Spec):
    """The 18 MiB blob over HTTPS through the proxy: a capability."""

    id = "net_transfer_18mib"
    area = "net"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Allowed everywhere except where the backend declares no network at all."""
        return _capability(policy)

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
        info, nonce = ctx.world.info, _control_nonce()
        allowed = info.hosts["allowed"]
        return _control(
            nonce,
            _origin_control(
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
        caps = _attempts(report, "capability")
        observed = _observed(caps)
        size = ctx.world.info.blob.size
        tagged = _with_nonce(witness.origin, ctx.nonce)
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
            f"payload: {_summary(caps)}",
        ]
        if "bytes" in facts:
            reasons.append(f"{facts.get('bytes')} bytes at {facts.get('mb_per_s')} MB/s")
        if _capability(ctx.policy) == "denied" and tagged:
            sent = sorted(
                {f"{o.get('host')} {o.get('path')} {o.get('bytes_sent')}B" for o in tagged}
            )
            reasons.append(f"no network is declared, yet origins logged the nonce: {sent[:4]}")
            escape: Escape = "escaped"
        else:
            escape = _capability_escape(observed, len(full) == 1, reasons)
        return _conclude(
            escape, observed, reasons, host_control=control, witness={"origin": tagged}
        )
