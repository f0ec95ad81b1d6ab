"""Network probes around the egress proxy, host side: direct egress, loopback, IPv6/UDP/ICMP.

`net_direct_egress` dials the host's direct-egress listeners, bypassing the proxy. Three more
(`net_proxy_env_override`, `net_loopback_services`, `net_ipv6_udp_icmp`) get per-cell loopback
listeners from `prepare` (a service with a banner, a rogue proxy, IPv6/UDP listeners) whose
logs are the witnesses. A success that reached only the sandbox's own loopback is
containment, not escape; a path out that the host read from /proc (the harness's network
namespace, a default route) is an escape without a packet sent.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
from dataclasses import replace
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
)
from sandbox_attest.catalog.judging import (
    conclude,
    expect_confined_network,
    host_namespace,
    judge_escape,
    private_namespace_reason,
)
from sandbox_attest.catalog.proxyclient import split_hostport
from sandbox_attest.catalog.records import entries_with_nonce, poll_until, wait_for_records
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    host_processes,
    host_seen_own_network,
    own_kernel_ran,
)
from sandbox_attest.catalog.witness.kernel import (
    KernelJudgement,
    ReportedAttempt,
    address_match,
    corroborate,
    either,
    socket_match,
)
from sandbox_attest.claims import SHARED_NETNS_CUTS, claims_of
from sandbox_attest.verdict import Assessment, Expectation
from sandbox_attest.world.listeners import LOOPBACK

if TYPE_CHECKING:
    from collections.abc import Callable
from sandbox_attest.catalog.capabilities import LOCAL_CAPABILITIES, payload_capabilities
from sandbox_attest.catalog.net.witness import (
    ROGUE_REPLY,
    SERVICE_BANNER,
    LoopbackWitness,
    PerCellSpec,
    has_ipv6_loopback,
    unprepared_assessment,
    unprepared_control,
)


class NetDirectEgress(SpecBase):
    """A direct TCP/UDP socket to the host's listener, bypassing the proxy."""

    id = "net_direct_egress"
    area = "net"
    host_readings = ("direct-egress listeners",)

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The listeners, and the host's reading of the payload's network namespace."""
        found = super().corroboration(ctx, report)
        own = host_seen_own_network(ctx)
        return [*found, own] if found and own else found

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """TCP and UDP to the listener, to every lab address given, and to the payload's own.

        The payload's own addresses are found inside, so only their form is known here.
        """
        targets = task.get("targets") or {}
        tried = {split_hostport(str(targets.get("tcp", ":0")))[0]}
        given = []
        for address in targets.get("extra_addresses") or ():
            if address not in tried:
                tried.add(address)
                given += [f"tcp-{address}", f"udp-{address}"]
        return AttemptTable(
            required=attempts_of("tcp-direct", "udp-direct", *given),
            discovered=("tcp-own-", "udp-own-"),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever the network is confined; seen on the open control leg."""
        return expect_confined_network(declared)

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
        extra = [
            a for a in (*lab, *([LOOPBACK] if lab else [])) if a != split_hostport(direct.tcp)[0]
        ]
        return {"tcp": direct.tcp, "udp": direct.udp, "extra_addresses": extra}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches the same listener over TCP and UDP and is logged."""
        direct, nonce = ctx.world.info.direct_egress, new_control_nonce()
        payload = f"nonce={nonce}\n".encode()

        def tcp() -> dict[str, Any]:
            with socket.create_connection(split_hostport(direct.tcp), HOST_TIMEOUT_S) as sock:
                sock.sendall(payload)
            return host_check("host tcp connect", ok=True, detail=f"sent to {direct.tcp}")

        def udp() -> dict[str, Any]:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.sendto(payload, split_hostport(direct.udp))
            return host_check("host udp datagram", ok=True, detail=f"sent to {direct.udp}")

        checks = [guarded_check("host tcp connect", tcp), guarded_check("host udp datagram", udp)]
        records = wait_for_records(
            ctx.world,
            nonce,
            lambda r: bool(
                entries_with_nonce(r.direct_tcp, nonce) and entries_with_nonce(r.direct_udp, nonce)
            ),
        )
        for kind, entries in (("tcp", records.direct_tcp), ("udp", records.direct_udp)):
            seen = entries_with_nonce(entries, nonce)
            checks.append(host_check(f"listener logged host {kind}", bool(seen), f"{len(seen)}"))
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any connection or datagram with the nonce at the listener is an escape."""
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        tcp = entries_with_nonce(witness.direct_tcp, ctx.nonce)
        udp = entries_with_nonce(witness.direct_udp, ctx.nonce)
        if not (tcp or udp) and any(a.get("outcome") == "succeeded" for a in escapes):
            # A success the listener has not heard (yet) may be in flight through a relay: a
            # slirp-style gateway answers the connect itself and dials the host afterwards,
            # late under load. It is waited for as long as any witness, never judged early.
            late = wait_for_records(
                ctx.world,
                ctx.nonce,
                lambda r: bool(
                    entries_with_nonce(r.direct_tcp, ctx.nonce)
                    or entries_with_nonce(r.direct_udp, ctx.nonce)
                ),
            )
            tcp = entries_with_nonce(late.direct_tcp, ctx.nonce)
            udp = entries_with_nonce(late.direct_udp, ctx.nonce)
        reached = sorted({str(e.get("local")) for e in tcp if e.get("local")})
        reasons = [
            f"listener saw {len(tcp)} connections and {len(udp)} datagrams with the nonce"
            + (f" (reached {', '.join(reached)})" if reached else ""),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(
            observed, bool(tcp or udp), private_namespace_reason(report, "net"), reasons
        )
        claims = claims_of(ctx.claims)
        if escape == "escaped" and claims.network != "open":
            reasons.insert(0, f"{claims.phrase('network')}; the listener heard the payload")
        seen_out = host_seen_path_out(ctx)
        if seen_out and claims.network_cut in SHARED_NETNS_CUTS:
            # Sharing the harness's namespace is this cut's design, not a way out: the
            # filter (or the profile) must refuse every connect, and no witness may hear one.
            held = escape != "escaped" and observed == "refused"
            note = (
                f"{claims.phrase('network')}: it shares the harness's network namespace by "
                "design, so it is judged by the refused connects"
            )
            if held:
                note += ": every direct attempt was refused and no witness heard anything"
            # A FAIL leads with the claim it broke; a held claim with how it was judged.
            reasons.insert(1 if escape == "escaped" else 0, note)
        elif seen_out:
            escape = "escaped"
            reasons.insert(0, seen_out)
        return conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            # The host's reading of the payload's network namespace is the witness here; its
            # kernel events are not (this probe does not judge by them), and they already sit
            # bounded in the cell's own host_view: copied whole, one gVisor cell's runsc
            # events made 1.6 MB of the evidence.
            witness={
                "direct_tcp": tcp,
                "direct_udp": udp,
                "host_view": {k: v for k, v in ctx.host_view.items() if k != "kernel"},
            },
        )


def host_seen_path_out(ctx: CellContext) -> str:
    """A path out that the host saw in the payload's network namespace, or "".

    Read from /proc at the rendezvous (run/hostview.py), so no packet had to be sent and
    no report could hide it: under a claim of no network, or of the proxy as the only route,
    the payload sharing the harness's network namespace, or a default route in its own, is
    a way out.
    """
    view = ctx.host_view
    if ctx.claims.network == "open" or not view.get("seen"):
        return ""
    claim = claims_of(ctx.claims).phrase("network")
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


# The probes that judge the proxy's own checks: each asks the proxy for something its allowlist
# refuses, and a refusal holds for the payload only where the proxy is its one route out.
PROXY_PROBES: Final = frozenset(
    {
        "net_denied_host",
        "net_host_canonical",
        "net_proxy_confusion",
        "net_private_address",
        "net_proxy_dns_exfil",
        "net_socks5",
        "net_proxy_smuggling",
        "net_proxy_upgrade",
        "net_dns_rebinding",
        "net_doh_bypass",
        "net_proxy_relay",
    }
)


def around_the_proxy(ctx: CellContext, assessment: Assessment) -> Assessment:
    """`assessment`, an escape where the host saw a way around the proxy that `ctx.probe` judges.

    A proxy probe (`PROXY_PROBES`) reads the proxy's answers, and the proxy may well refuse
    every request the payload put to it; but under a network claim cut by a namespace, a
    payload the host saw in the harness's network namespace (or with a default route in its
    own, `host_seen_path_out`) reaches whatever the proxy refuses without asking it. That
    path out is this cell's hole too, read from /proc at the rendezvous, so no report can hide
    it. Not under a cut that shares the harness's namespace by design (`seccomp`,
    `proxy-only`): net_direct_egress judges those by their refused connects. It does not
    change an escape already seen, nor any other probe's reading.
    """
    if ctx.probe not in PROXY_PROBES or assessment.escape == "escaped":
        return assessment
    if claims_of(ctx.claims).network_cut in SHARED_NETNS_CUTS:
        return assessment
    seen_out = host_seen_path_out(ctx)
    if not seen_out:
        return assessment
    around = (
        f"{seen_out}: the proxy is not the payload's only route out, so what it refuses "
        "here is reachable around it (net_direct_egress shows the direct route); fix: give "
        "the payload a network namespace of its own with no route out (bwrap --unshare-net, "
        "docker --network none), so the proxy is its one way out"
    )
    return replace(
        assessment,
        escape="escaped",
        reasons=[around, *assessment.reasons],
        corroborated_by=[*assessment.corroborated_by, "the host's /proc view of the payload"],
    )


# ---------------------------------------------------------------------------------------------
# Probes around the proxy: their own listeners.


def _direct_get(address: str, port: int, host_header: str, path: str, nonce: str) -> int:
    conn = http.client.HTTPConnection(address, port, timeout=HOST_TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"Host": host_header, "X-Attest-Nonce": nonce})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _tcp_line(hostport: str, line: bytes) -> bytes:
    with socket.create_connection(split_hostport(hostport), HOST_TIMEOUT_S) as sock:
        sock.sendall(line)
        reply = b""
        with contextlib.suppress(TimeoutError):
            while b"\n" not in reply and len(reply) < 512:
                chunk = sock.recv(512)
                if not chunk:
                    break
                reply += chunk
        return reply


def _udp_send(hostport: str, data: bytes) -> None:
    host, port = split_hostport(hostport)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.sendto(data, (host, port))


def _denied_origin_hits(witness: WitnessRecordsLike, nonce: str) -> list[dict[str, Any]]:
    return [o for o in entries_with_nonce(witness.origin, nonce) if o.get("host") == "denied"]


def _origin_direct_control(ctx: CellContext, nonce: str) -> list[dict[str, Any]]:
    """The host GETs the denied origin straight on its port; the origin logs it."""
    denied = ctx.world.info.hosts["denied"]

    def get() -> dict[str, Any]:
        host = f"{denied.name}:{denied.http_port}"
        status = _direct_get(denied.address, denied.http_port, host, f"/ok?nonce={nonce}", nonce)
        return host_check("host get denied origin directly", status == 200, f"{status}")

    checks = [guarded_check("host get denied origin directly", get)]
    records = wait_for_records(ctx.world, nonce, lambda r: bool(_denied_origin_hits(r, nonce)))
    hits = _denied_origin_hits(records, nonce)
    checks.append(host_check("denied origin logged the host", bool(hits), f"{len(hits)} hits"))
    return checks


def _listener_control(
    what: str, listener: LoopbackWitness, nonce: str, action: Callable[[], dict[str, Any]]
) -> list[dict[str, Any]]:
    checks = [guarded_check(what, action)]
    seen = poll_until(lambda: listener.records_with(nonce), bool)
    checks.append(host_check(f"{what}: listener logged it", bool(seen), f"{len(seen)} entries"))
    return checks


class NetLoopbackServices(PerCellSpec):
    """Host services on 127.0.0.1 (a per-cell service, an origin's port) are out of reach."""

    id = "net_loopback_services"
    area = "net"
    host_readings = ("per-cell loopback listeners", "origin access logs")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The loopback service and the origin, both dialed directly."""
        del task
        return AttemptTable(required=attempts_of("tcp-service", "http-origin-direct"))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever the network is confined; seen on the open control leg."""
        return expect_confined_network(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the cell's service (answers a banner); name it and the denied origin's port."""
        service = LoopbackWitness("127.0.0.1", tcp=True, banner=SERVICE_BANNER)
        service.start()
        self._cells.put(ctx.nonce, {"service": service})
        denied = ctx.world.info.hosts["denied"]
        return {
            "service": service.hostport(service.tcp_port),
            "origin": {"address": denied.address, "port": denied.http_port, "host": denied.name},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host gets the service's banner and the denied origin's answer, both logged."""
        service = self._listener(ctx, "service")
        if service is None:
            return unprepared_control("service")
        nonce = new_control_nonce()
        hostport = service.hostport(service.tcp_port)

        def ping() -> dict[str, Any]:
            reply = _tcp_line(hostport, f"PING nonce={nonce}\n".encode())
            return host_check("host reaches the service", reply == SERVICE_BANNER, repr(reply))

        checks = _listener_control("host reaches the service", service, nonce, ping)
        checks += _origin_direct_control(ctx, nonce)
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Service log or denied-origin log with the nonce = escape; else refused/contained."""
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        service = self._listener(ctx, "service")
        if service is None:
            return unprepared_assessment("service", observed)
        service_hits = service.records_with(ctx.nonce)
        origin_hits = _denied_origin_hits(witness, ctx.nonce)
        reasons = [
            (
                f"service saw {len(service_hits)} connections and the denied origin "
                f"{len(origin_hits)} direct requests with the nonce"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(
            observed,
            bool(service_hits or origin_hits),
            private_namespace_reason(report, "net"),
            reasons,
        )
        return conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"service": service_hits, "denied_origin": origin_hits},
        )


class NetProxyEnvOverride(PerCellSpec):
    """`NO_PROXY=*` or a rogue `ALL_PROXY` must not open a way around the proxy."""

    id = "net_proxy_env_override"
    area = "net"
    host_readings = ("per-cell loopback listeners", "origin access logs")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The two overrides and the proxied control."""
        del task
        return AttemptTable(
            required=attempts_of("no-proxy-star", "rogue-all-proxy", "proxy-route-allowed")
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever the network is confined: the variables are the payload's to change."""
        return expect_confined_network(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the cell's rogue proxy (answers 200 to anything, dials nothing)."""
        rogue = LoopbackWitness("127.0.0.1", tcp=True, banner=ROGUE_REPLY)
        rogue.start()
        self._cells.put(ctx.nonce, {"rogue": rogue})
        hosts = ctx.world.info.hosts
        denied, allowed = hosts["denied"], hosts["allowed"]
        return {
            "rogue_proxy": rogue.hostport(rogue.tcp_port),
            "denied": {
                "name": denied.name,
                "address": denied.address,
                "http_port": denied.http_port,
            },
            "allowed": {"name": allowed.name, "https_port": allowed.https_port},
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches the rogue proxy and the denied origin directly, both logged."""
        rogue = self._listener(ctx, "rogue")
        if rogue is None:
            return unprepared_control("rogue")
        nonce = new_control_nonce()
        hostport = rogue.hostport(rogue.tcp_port)

        def via_rogue() -> dict[str, Any]:
            line = f"GET http://denied.test/ok?nonce={nonce} HTTP/1.1\r\n\r\n".encode()
            reply = _tcp_line(hostport, line)
            return host_check(
                "host reaches the rogue proxy", reply.startswith(b"HTTP/1.1 200"), repr(reply[:40])
            )

        checks = _listener_control("host reaches the rogue proxy", rogue, nonce, via_rogue)
        checks += _origin_direct_control(ctx, nonce)
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Rogue proxy or denied origin saw the nonce = escape; the proxy route must still work."""
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        rogue = self._listener(ctx, "rogue")
        if rogue is None:
            return unprepared_assessment("rogue proxy", observed)
        rogue_hits = rogue.records_with(ctx.nonce)
        origin_hits = _denied_origin_hits(witness, ctx.nonce)
        reasons = [
            (
                f"rogue proxy saw {len(rogue_hits)} and the denied origin {len(origin_hits)} "
                "requests with the nonce"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(
            observed,
            bool(rogue_hits or origin_hits),
            private_namespace_reason(report, "net"),
            reasons,
        )
        # Where the declared route is a proxy, it must still work after the variables were
        # restored: otherwise the refusals may only show a dead network, not enforcement.
        inside_ok = ctx.claims.network != "proxy" or (
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
            witness={"rogue_proxy": rogue_hits, "denied_origin": origin_hits},
        )


# AF_PACKET (Linux); `socket` lacks the name elsewhere, and the kernel's number is what counts.
PACKET_FAMILY = 17


def _connected(event: dict[str, Any]) -> bool:
    return event.get("syscall") == "connect"


def _never(event: dict[str, Any]) -> bool:
    del event
    return False


def _socket_route(
    witness: LoopbackWitness, kind: int, port: int
) -> tuple[tuple[str, ...], Any, Any]:
    """How the kernel shows a TCP or UDP attempt at `witness`: syscalls, match, what counts.

    Its connect/sendto to the listener, or a refused socket() of that family and kind (a
    filter that refuses the socket itself).

    A TCP connect that succeeded reached the listener; a UDP connect sends nothing, so only
    its refusal is read.
    """
    default = socket.IPPROTO_TCP if kind == socket.SOCK_STREAM else socket.IPPROTO_UDP
    refused_socket = socket_match(witness.family, kind, (0, default))
    match = either(
        address_match(witness.address, port),
        lambda e: bool(e.get("error")) and refused_socket(e),
    )
    return (
        ("connect", "sendto", "socket"),
        match,
        _connected if kind == socket.SOCK_STREAM else _never,
    )


class NetIpv6UdpIcmp(PerCellSpec):
    """IPv6 TCP/UDP, IPv4 UDP, ICMP echo and raw/packet sockets, past a TCP-minded filter."""

    id = "net_ipv6_udp_icmp"
    area = "net"
    kernel_witness = True
    host_readings = ("per-cell loopback listeners",)

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The listeners, and for the socket kinds no listener hears, the host's netns reading.

        ICMP echo, raw and packet sockets reach no host listener; only the host seeing the
        payload in a network namespace of its own backs their refusal (or containment).
        """
        found = super().corroboration(ctx, report)
        own = host_seen_own_network(ctx)
        if found and own:
            return [*found, own]
        # A kernel of its own shows the host no process whose namespace it could read: the
        # listeners back the kinds they hear, and `assess` leaves the unheard kinds unjudged.
        return found if found and _own_kernel_unseen(ctx) else []

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """IPv6 TCP/UDP, IPv4 UDP, ICMP echo, raw and packet sockets: one attempt each."""
        del task
        return AttemptTable(
            required=attempts_of(
                "tcp6-connect",
                "udp6-datagram",
                "udp4-datagram",
                "icmp-echo",
                "raw-socket",
                "packet-socket",
            )
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever the network is confined; seen on the open control leg."""
        return expect_confined_network(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the [::1] TCP+UDP listener (if the host has IPv6 loopback) and a UDP one."""
        state: dict[str, Any] = {}
        v4 = LoopbackWitness("127.0.0.1", tcp=False, udp=True)
        v4.start()
        state["v4"] = v4
        targets: dict[str, Any] = {
            "tcp6": None,
            "udp6": None,
            "udp4": v4.hostport(v4.udp_port),
            "icmp": "127.0.0.1",
        }
        if has_ipv6_loopback():
            v6 = LoopbackWitness("::1", tcp=True, udp=True)
            v6.start()
            state["v6"] = v6
            targets["tcp6"] = v6.hostport(v6.tcp_port)
            targets["udp6"] = v6.hostport(v6.udp_port)
        self._cells.put(ctx.nonce, state)
        return targets

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reaches each listener (logged); its own local capabilities are recorded."""
        nonce = new_control_nonce()
        v4, v6 = self._listener(ctx, "v4"), self._listener(ctx, "v6")
        checks: list[dict[str, Any]] = []
        line = f"nonce={nonce}\n".encode()
        if v6 is not None:
            tcp6, udp6 = v6.hostport(v6.tcp_port), v6.hostport(v6.udp_port)

            def tcp() -> dict[str, Any]:
                _tcp_line(tcp6, line)
                return host_check("host tcp6 connect", ok=True, detail=tcp6)

            def udp() -> dict[str, Any]:
                _udp_send(udp6, line)
                return host_check("host udp6 datagram", ok=True, detail=udp6)

            checks += _listener_control("host tcp6 connect", v6, nonce, tcp)
            checks += _listener_control("host udp6 datagram", v6, nonce, udp)
        if v4 is not None:
            udp4 = v4.hostport(v4.udp_port)

            def udp_v4() -> dict[str, Any]:
                _udp_send(udp4, line)
                return host_check("host udp4 datagram", ok=True, detail=udp4)

            checks += _listener_control("host udp4 datagram", v4, nonce, udp_v4)
        capabilities = payload_capabilities(ctx.user)
        unmeasured = sorted(w for w, v in capabilities.items() if v.startswith("unmeasured"))
        # An attempt the host could not measure would drop out of the judgement as "the host
        # lacks it": not measuring is a failed control, never a silent pass. (Only a failure
        # is added: a passing check must not turn a control with no listener checks green.)
        if unmeasured:
            checks.append(
                host_check(
                    "payload user's local capabilities measured",
                    ok=False,
                    detail="; ".join(f"{w}: {capabilities[w]}" for w in unmeasured),
                )
            )
        result = control_record(nonce, checks)
        result["capabilities"] = capabilities
        result["ipv6_loopback"] = v6 is not None
        return result

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Listener hits or a local capability used in the host's namespace = escape."""
        del witness  # this probe's witnesses are its own listeners and the namespace
        escapes = attempts_by_role(report, "escape")
        v4, v6 = self._listener(ctx, "v4"), self._listener(ctx, "v6")
        if v4 is None:
            return unprepared_assessment("listeners", observed_outcome(escapes))
        hits = {
            "udp4-datagram": [e for e in v4.records_with(ctx.nonce) if e["proto"] == "udp"],
            "tcp6-connect": [],
            "udp6-datagram": [],
        }
        if v6 is not None:
            for entry in v6.records_with(ctx.nonce):
                hits["tcp6-connect" if entry["proto"] == "tcp" else "udp6-datagram"].append(entry)
        private = private_namespace_reason(report, "net")
        theirs = report.get("facts", {}).get("netns")
        host_ns = theirs is not None and private is None and theirs == host_namespace("net")
        local_seen = [
            a
            for a in escapes
            if a.get("what") in LOCAL_CAPABILITIES and a.get("outcome") == "succeeded" and host_ns
        ]
        # A local capability the host itself lacks cannot be seen refused: leave it out.
        capabilities = control.get("capabilities", {})
        absent = [w for w in LOCAL_CAPABILITIES if capabilities.get(w, "ok") != "ok"]
        judged = [
            a for a in escapes if not (a.get("what") in absent and a.get("outcome") != "succeeded")
        ]
        judged, unheard = _without_unheard(ctx, judged)
        observed = observed_outcome(judged)
        seen = [w for w, entries in hits.items() if entries]
        reasons = []
        if seen or local_seen:
            reasons.append(
                "host saw "
                + ", ".join(
                    [f"{w} ({len(hits[w])} with the nonce)" for w in seen]
                    + [f"{a['what']} succeeded in the host's network namespace" for a in local_seen]
                )
            )
        reasons.append(f"payload: {attempts_summary(escapes)}")
        if absent:
            reasons.append(
                f"not judged (the host itself cannot): {', '.join(absent)} "
                f"({', '.join(capabilities[w] for w in absent)})"
            )
        reasons.extend(unheard)
        escape = judge_escape(observed, bool(seen or local_seen), private, reasons)
        kernel = self.kernel_judgement(ctx, judged, v4, v6)
        if kernel is not None and kernel.escapes:
            escape = "escaped"
            reasons.insert(
                0, "the kernel saw the payload get through: " + "; ".join(kernel.escapes)
            )
        if v6 is None and escape != "escaped":
            reasons.insert(
                0,
                "the host has no IPv6 loopback: the IPv6 attempts cannot be judged "
                "(enable it: sysctl -w net.ipv6.conf.lo.disable_ipv6=0)",
            )
            escape = "undecided"
        if kernel is not None and kernel.all_corroborated:
            reasons.append("; ".join(kernel.corroborated))
        assessment = conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={
                "listeners": hits,
                "local_in_host_netns": local_seen,
                **({"kernel": kernel.as_witness()} if kernel is not None else {}),
            },
        )
        if kernel is not None and kernel.all_corroborated:
            # A filter in the harness's own namespace refused each attempt in the kernel:
            # that backs the refusals no listener or namespace reading can.
            assessment.corroborated_by = ["the kernel's answer to each attempt (kernel witness)"]
        return assessment

    @staticmethod
    def kernel_judgement(
        ctx: CellContext,
        attempts: list[dict[str, Any]],
        v4: LoopbackWitness | None,
        v6: LoopbackWitness | None,
    ) -> KernelJudgement | None:
        """The kernel's answer to each judged attempt, on a filter sandbox (else None).

        TCP and UDP: see `_socket_route`. ICMP echo, raw and packet sockets are refused at
        `socket()`; creating a raw or packet one is the attempt itself.
        """
        routes: dict[str, tuple[tuple[str, ...], Any, Any]] = {
            "icmp-echo": (
                ("socket", "sendto"),
                either(
                    socket_match(socket.AF_INET, socket.SOCK_DGRAM, (socket.IPPROTO_ICMP,)),
                    address_match("127.0.0.1", 0),
                ),
                _never,
            ),
            "raw-socket": (("socket",), socket_match(socket.AF_INET, socket.SOCK_RAW), None),
            "packet-socket": (("socket",), socket_match(PACKET_FAMILY, socket.SOCK_RAW), None),
        }
        for what, witness, kind, port in (
            ("udp4-datagram", v4, socket.SOCK_DGRAM, "udp_port"),
            ("tcp6-connect", v6, socket.SOCK_STREAM, "tcp_port"),
            ("udp6-datagram", v6, socket.SOCK_DGRAM, "udp_port"),
        ):
            if witness is not None:
                routes[what] = _socket_route(witness, kind, getattr(witness, port))
        reported = [
            ReportedAttempt(
                label=str(a.get("what")),
                outcome=str(a.get("outcome")),
                syscalls=routes[str(a.get("what"))][0],
                match=routes[str(a.get("what"))][1],
                counts=routes[str(a.get("what"))][2] or (lambda _e: True),
            )
            for a in attempts
            if str(a.get("what")) in routes
        ]
        return corroborate(ctx, reported, "net") if reported else None


def _own_kernel_unseen(ctx: CellContext) -> bool:
    """A payload on a kernel of its own ran (its ready file landed), and no host process is it."""
    return own_kernel_ran(ctx) and not host_processes(ctx)


def _without_unheard(
    ctx: CellContext, judged: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """`judged` less the ICMP, raw and packet attempts under kernel = "own"; and the reason.

    No witness outside the sandbox hears those, and the host reads no process of the payload
    to place them in a namespace: on a kernel of its own they are that kernel's business, not
    judged either way. Elsewhere `judged` is returned as it is, with no reason.
    """
    if not _own_kernel_unseen(ctx):
        return judged, []
    unheard = [str(a.get("what")) for a in judged if a.get("what") in LOCAL_CAPABILITIES]
    if not unheard:
        return judged, []
    kept = [a for a in judged if a.get("what") not in unheard]
    why = (
        f"not judged ({claims_of(ctx.claims).phrase('kernel')}: no witness outside the sandbox "
        f"hears them, and the host reads no process of the payload): {', '.join(unheard)}"
    )
    return kept, [why]
