"""net_private_address: a proxy that dials the host's loopback is FAIL, not INCONCLUSIVE (issue 27).

The probe plants loopback answers (127.0.0.1, 127.0.0.2, 0.0.0.0) for names the allowlist
admits on the allowed origin's ports. A wrapper's own proxy that dials them really connects to
the host's loopback at those ports. Before, nothing listened there unless the world's origin
happened to (the loopback world's 127.0.0.1): the proxy's dial failed, the payload saw 502, and
the cell was INCONCLUSIVE where FAIL is true. Now the spec has a witness at every loopback
address and port its requests name (the world's own origin where it listens there, else a
listener planted for the cell), and a connection carrying the cell's nonce is FAIL naming it.

The "proxy" below is this test: it resolves each planted name from the answer the spec planted
and dials it on loopback, as a proxy with no address check would (0.0.0.0 dialed as Linux does,
to 127.0.0.1). Nothing is sent anywhere but loopback.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from typing import TYPE_CHECKING, Any, cast

from sandbox_attest.catalog import PROBES
from sandbox_attest.catalog.net.private_address import NetPrivateAddress
from sandbox_attest.verdict import Verdict, decide
from sandbox_attest.world.info import HostInfo
from tests.catalog.test_assess import OK_CONTROL, Records
from tests.catalog.test_proxy_lookups import KnobWorld, attempt, ctx_for, query

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.catalog import CellContext
    from sandbox_attest.catalog.net.route import ProxyRequest

SPEC = cast("NetPrivateAddress", PROBES["net_private_address"])
# A lab origin's address (198.18.0.0/15): only data here, nothing is ever sent to it.
LAB_ORIGIN = "198.18.1.10"


def free_port() -> int:
    """A TCP port free on loopback just now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass
class AnswerWorld(KnobWorld):
    """A knob world whose DNS fixture has a port, as the spec's answer knob needs."""

    port: int = 53


def cell(tmp_path: Path, *, lab: bool, origin: str) -> CellContext:
    """A cell under a wrapper's own proxy; the allowed origin at `origin`, on free ports."""
    ctx = ctx_for("net_private_address", tmp_path, own=True, lab=lab)
    world = AnswerWorld(info=ctx.world.info)
    hosts = dict(world.info.hosts)
    https, http = free_port(), free_port()
    hosts["allowed"] = HostInfo(
        name="allowed.test", address=origin, https_port=https, http_port=http
    )
    world.info = dataclasses.replace(world.info, hosts=hosts)
    return dataclasses.replace(ctx, world=world)


def lab_cell(tmp_path: Path) -> CellContext:
    """In the lab: the origins live off the host side, nothing of the world on its loopback."""
    return cell(tmp_path, lab=True, origin=LAB_ORIGIN)


def dial(address: str, port: int, line: bytes) -> bool:
    """Connect to a loopback `address` and send `line`; whether anything listened."""
    ip = ipaddress.ip_address(address)
    assert ip.is_loopback or ip.is_unspecified  # the network rule: loopback only
    target = "127.0.0.1" if ip.is_unspecified else address  # what Linux does with 0.0.0.0
    try:
        with socket.create_connection((target, port), timeout=2) as sock:
            sock.sendall(line)
    except OSError:
        return False
    return True


def dialing_proxy(ctx: CellContext, request: ProxyRequest) -> dict[str, Any]:
    """What a proxy with no address check makes of one escape: its dial, the payload's view."""
    world = cast("KnobWorld", ctx.world)
    method, target = request.heads[0].split()[:2]
    authority = target.split("/")[2] if method == "GET" else target
    name, port = authority.rsplit(":", 1)
    address = world.planted[name][0]
    if method == "GET":
        path = target.split(authority, 1)[1]
        line = f"GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
    else:
        line = f"nonce={ctx.nonce} a={request.what}\n".encode()
    if not dial(address, int(port), line):
        return attempt(request.what, "escape", "refused", 502) | {"detail": "502 Bad Gateway"}
    return attempt(request.what, "escape", "succeeded", 200) | {"detail": "tunnel open"}


def judge(ctx: CellContext) -> tuple[Verdict, str, dict[str, Any]]:
    """Prepare, let the dialing proxy carry every escape, assess and decide."""
    SPEC.prepare(ctx)
    try:
        attempts = []
        for r in SPEC.requests(ctx):
            if r.role == "control":
                attempts.append(
                    attempt(r.what, r.role, "succeeded", 200) | {"detail": "nonce echoed"}
                )
            else:
                attempts.append(dialing_proxy(ctx, r))
        world = cast("KnobWorld", ctx.world)
        dns = [query(name) for name in world.planted]
        assessment = SPEC.assess(ctx, {"attempts": attempts}, Records(dns=dns), OK_CONTROL)
    finally:
        SPEC.cleanup(ctx)
    decision = decide(SPEC.expectation(ctx.claims), assessment)
    return decision.verdict, decision.reason, assessment.witness


class TestLoopbackWitness:
    def test_a_proxy_that_dials_the_hosts_loopback_fails(self, tmp_path: Path) -> None:
        """Every planted answer dialed on the host's loopback: FAIL, naming where it landed."""
        ctx = lab_cell(tmp_path)
        https = ctx.world.info.hosts["allowed"].https_port
        verdict, reason, _ = judge(ctx)
        assert verdict is Verdict.FAIL, reason
        http = ctx.world.info.hosts["allowed"].http_port
        heard = reason.split("the witness at ", 1)[1].split(" heard this cell's nonce")[0]
        assert set(heard.split(", ")) == {
            f"127.0.0.1:{http}",
            f"127.0.0.1:{https}",
            f"127.0.0.2:{https}",
        }
        assert "the proxy dialed the host's loopback" in reason

    def test_witnesses_are_gone_after_the_cell(self, tmp_path: Path) -> None:
        """The cell's cleanup stops what it planted: the ports are free again."""
        ctx = lab_cell(tmp_path)
        judge(ctx)
        https = ctx.world.info.hosts["allowed"].https_port
        assert not dial("127.0.0.2", https, b"x")

    def test_where_the_origin_listens_it_is_the_witness(self, tmp_path: Path) -> None:
        """The loopback world's origin listens on 127.0.0.1: nothing planted there, TLS kept."""
        ctx = cell(tmp_path, lab=False, origin="127.0.0.1")
        built = {r.what: r for r in SPEC.build(ctx)}
        assert built["connect-loopback"].after == "tls-get"
        assert built["connect-unspecified"].after == "tls-get"
        assert built["connect-loopback-range"].after == "send-nonce"

    def test_a_proxy_that_refuses_still_passes(self, tmp_path: Path) -> None:
        """Every planted name looked up and refused with 403, the witnesses silent: PASS."""
        ctx = lab_cell(tmp_path)
        SPEC.prepare(ctx)
        try:
            attempts = [
                attempt(r.what, r.role, "succeeded", 200) | {"detail": "nonce echoed"}
                if r.role == "control"
                else attempt(r.what, r.role, "refused", 403) | {"detail": "403 Forbidden"}
                for r in SPEC.requests(ctx)
            ]
            dns = [query(name) for name in cast("KnobWorld", ctx.world).planted]
            assessment = SPEC.assess(ctx, {"attempts": attempts}, Records(dns=dns), OK_CONTROL)
        finally:
            SPEC.cleanup(ctx)
        decision = decide(SPEC.expectation(ctx.claims), assessment)
        assert decision.verdict is Verdict.PASS, decision.reason
        places = cast("dict[str, Any]", assessment.witness["loopback"])["places"]
        assert set(places.values()) == {"a witness planted for the cell"}
