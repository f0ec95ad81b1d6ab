"""`net_dns_rebinding`, host side: a name whose answer changes between check and dial.

An allowlisted name below `private.test` whose first DNS answer is the origins' lab address
and every later one a per-cell loopback address where the host listens: a proxy that checks
one answer and dials another reaches that listener, the witness here.

The rebinding name's answers are the origins' own address and a loopback address, never
anything else (`_check_rebinding_answers`).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from typing import Any, Final

from sandbox_attest.catalog.attempts import attempts_by_role, attempts_summary, observed_outcome
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    new_control_nonce,
)
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.net.proxy_wire import (
    WireRequest,
    WireSpec,
    control_get,
    wire_head,
    wire_hosts,
)
from sandbox_attest.catalog.net.route import (
    allowed_control,
    claims_no_network,
    no_network_reason,
    refused_by_no_network,
)
from sandbox_attest.catalog.net.witness import LoopbackWitness
from sandbox_attest.catalog.spec import HOST_TIMEOUT_S, CellContext, WitnessRecordsLike
from sandbox_attest.errors import FixtureError
from sandbox_attest.verdict import Assessment, Escape
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.lab import current_lab

NOT_IN_LAB: Final = (
    "needs the lab world: the rebinding name's first answer must be an address the proxy "
    "admits for a planted name, and only the lab's origins have one; run as root on Linux "
    "(--world lab)"
)


# ---------------------------------------------------------------------------------------------
# net_dns_rebinding


def _rebind_address() -> str:
    """A per-cell loopback address, never 127.0.0.1 (which the loopback world's origins use)."""
    return f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def _check_rebinding_answers(first: str, then: str) -> None:
    """Plant only the origins' own address and a loopback address: nothing off this machine.

    A sandbox that brings its own proxy dials whatever the fixture answers.
    """
    if not ipaddress.ip_address(then).is_loopback:
        raise FixtureError(f"net_dns_rebinding will not plant {then}: plant loopback only")
    first_ip = ipaddress.ip_address(first)
    lab = ipaddress.ip_network("198.18.0.0/15")
    if not (first_ip.is_loopback or first_ip in lab):
        raise FixtureError(
            f"net_dns_rebinding will not plant {first}: only the origins' lab or loopback address"
        )


class _PortWitness(LoopbackWitness):
    """A loopback TCP witness on a given port (the allowed origin's), answering a 200."""

    def __init__(self, address: str, port: int) -> None:
        """Check the address; nothing is bound until `start`."""
        super().__init__(
            address,
            banner=b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nrebind",
        )
        self._port = port

    def start(self) -> None:
        """Bind the address on the wanted port and serve from a daemon thread."""
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            tcp.bind((self.address, self._port))
            tcp.listen(16)
        except OSError as exc:
            tcp.close()
            raise FixtureError(
                f"net_dns_rebinding could not listen on {self.address}:{self._port}: {exc}; "
                "free that port on this loopback address"
            ) from exc
        tcp.settimeout(0.2)
        self._socks.append(tcp)
        self.tcp_port = self._port
        self._spawn(self._accept_loop, tcp)


class NetDnsRebinding(WireSpec):
    """A name whose answer changes between the proxy's check and its dial reaches nothing else."""

    id = "net_dns_rebinding"
    area = "net"
    host_readings = ("per-cell loopback listener", "DNS fixture query log", "origin access logs")

    def not_applicable(self, egress: str) -> str | None:
        """NOT_APPLICABLE outside the lab world, whatever the route.

        The name's first answer must be an address the proxy admits for a planted name, and
        only the lab has one (its origins' 198.18.0.0/15 address); in the loopback world every
        proxy refuses the first answer, so the check-then-dial window is never reached.
        """
        del egress
        return NOT_IN_LAB if current_lab() is None else None

    def build(self, ctx: CellContext) -> list[WireRequest]:
        """Plant the rebinding name, start its listener; the control and one GET for it."""
        dns = getattr(ctx.world, "dns", None)
        if dns is None or not hasattr(dns, "set_answers"):
            return []
        allowed = ctx.world.info.hosts["allowed"]
        address = _rebind_address()
        _check_rebinding_answers(allowed.address, address)
        listener = _PortWitness(address, allowed.http_port)
        listener.start()
        name = f"{ctx.nonce}-rebind.{PRIVATE_NAME_SUFFIX}"
        dns.set_answers(name, [allowed.address, address])
        self._cells.put(ctx.nonce, {"listener": listener, "name": name, "address": address})
        h = wire_hosts(ctx)
        authority = f"{name}:{allowed.http_port}"
        target = h.url(authority, "get-rebind")
        return [
            control_get(h),
            WireRequest(
                what="get-rebind",
                role="escape",
                parts=(
                    wire_head(
                        f"GET {target} HTTP/1.1",
                        f"Host: {authority}",
                        f"X-Attest-Nonce: {ctx.nonce}",
                        "Connection: close",
                    ),
                ),
                denied_target=target,
            ),
        ]

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The fixture rebinds a name of the host's; the listener logs the host; allowed works."""
        nonce = new_control_nonce()
        state = self._cells.get(ctx.nonce)
        listener = self._listener(ctx, "listener")
        dns = getattr(ctx.world, "dns", None)
        if listener is None or dns is None:
            return control_record(
                nonce, [host_check("rebinding prepared", ok=False, detail="no listener")]
            )
        info = ctx.world.info
        name = f"{nonce}-rebind.{PRIVATE_NAME_SUFFIX}"
        first, then = info.hosts["allowed"].address, str(state.get("address"))
        dns.set_answers(name, [first, then])

        def rebinds() -> dict[str, Any]:
            server = (info.dns.host, info.dns.port)
            try:
                got = [resolve(server, name, timeout=HOST_TIMEOUT_S) for _ in range(2)]
            except ResolveError as exc:
                return host_check("fixture rebinds the host's name", ok=False, detail=str(exc))
            ok = got == [[first], [then]]
            return host_check("fixture rebinds the host's name", ok, f"{name} -> {got}")

        def reach() -> dict[str, Any]:
            with socket.create_connection((then, listener.tcp_port), HOST_TIMEOUT_S) as sock:
                sock.sendall(f"GET /?nonce={nonce} HTTP/1.1\r\n\r\n".encode())
                sock.recv(256)
            return host_check("host reaches the rebinding listener", ok=True, detail=then)

        checks = [guarded_check("fixture rebinds the host's name", rebinds)]
        checks.append(guarded_check("host reaches the rebinding listener", reach))
        logged = listener.records_with(nonce)
        checks.append(host_check("listener logged the host", bool(logged), f"{len(logged)} lines"))
        checks += allowed_control(ctx, nonce)
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Escaped if the listener behind the second answer heard anything.

        Refused only if the name was resolved (the fixture logged it) and nothing reached the
        listener.
        """
        escapes = attempts_by_role(report, "escape")
        controls = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        state = self._cells.get(ctx.nonce)
        listener = self._listener(ctx, "listener")
        if listener is None:
            missing = ["prepare() did not run for this cell: no rebinding listener to witness"]
            return Assessment("undecided", controls_ok=False, reasons=missing, observed=observed)
        name, address = str(state.get("name")), str(state.get("address"))
        # Any connection counts (a proxy may dial and send nothing), but the host control's.
        host_nonce = str(control.get("nonce") or "\0")
        heard = [e for e in listener.records_with("") if host_nonce not in str(e.get("data", ""))]
        queried = [q for q in witness.dns if str(q.get("name", "")).rstrip(".").lower() == name]
        reasons: list[str] = []
        no_network = claims_no_network(ctx) and refused_by_no_network([*escapes, *controls])
        first = ctx.world.info.hosts["allowed"].address
        escape: Escape
        if heard:
            reasons.append(
                f"the proxy checked {name}'s first answer ({first}) and dialed its second: the "
                f"listener at {address}:{listener.tcp_port} heard {len(heard)} connections; "
                "fix: resolve once per request and dial exactly the address that was checked"
            )
            escape = "escaped"
        elif no_network:
            reasons.append(no_network_reason(escapes))
            escape = "refused"
        elif ipaddress.ip_address(first).is_loopback:
            reasons.append(
                "the loopback world has no address the proxy admits for a planted name, so "
                "no proxy ever reaches the check-then-dial window: run in the lab (--world lab)"
            )
            escape = "undecided"
        elif not queried:
            reasons.append(f"the DNS fixture never saw {name}: the rebinding was not exercised")
            escape = "undecided"
        elif observed == "error":
            escape = "undecided"
        else:
            reasons.append(
                f"the DNS fixture answered {len(queried)} queries for {name} and nothing reached "
                f"{address}: the proxy dialed only what it checked"
            )
            escape = "refused"
        reasons.append(f"payload: {attempts_summary(escapes)}")
        inside_ok = no_network or (
            bool(controls)
            and all(
                a.get("outcome") == "succeeded" and "nonce echoed" in str(a.get("detail", ""))
                for a in controls
            )
        )
        return conclude(
            escape,
            observed,
            reasons,
            inside=controls,
            inside_ok=inside_ok,
            host_control=control,
            witness={"listener": heard, "dns": queried},
        )
