"""The network probes through and around the proxy: live (control, bubblewrap, weakened), tables.

Live cells go through the real `CellRunner` with the real running world, the real `none` and
`bubblewrap` backends, and (for the probes whose enforcement is the proxy) a second, real proxy
started with a deliberately lax allowlist. The decision-table tests feed each assessor
hand-made reports and witness records.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from sandbox_attest.backends.base import START_MARKER, Backend, DeclaredClaims
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog import PROBES, CellContext, probe_path
from sandbox_attest.catalog.net import direct
from sandbox_attest.catalog.net import private_address as route
from sandbox_attest.catalog.net.confusion import NetProxyConfusion
from sandbox_attest.catalog.net.direct import NetIpv6UdpIcmp, NetLoopbackServices
from sandbox_attest.catalog.net.private_address import NetPrivateAddress
from sandbox_attest.catalog.net.witness import LoopbackWitness
from sandbox_attest.errors import FixtureError
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.verdict import Verdict, decide
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX, WitnessRecords, World, start_world
from sandbox_attest.world.egress.config import ProxyConfig
from sandbox_attest.world.egress.proxy import ProxyProcess, start_proxy
from sandbox_attest.world.egress.rules import Rule
from sandbox_attest.world.info import ProxyInfo, WorldInfo
from tests.reachable import reachable_tempdir

WIDE = (
    "net_host_canonical",
    "net_proxy_confusion",
    "net_proxy_env_override",
    "net_loopback_services",
    "net_private_address",
    "net_ipv6_udp_icmp",
)
AROUND = ("net_proxy_env_override", "net_loopback_services", "net_ipv6_udp_icmp")
THROUGH = ("net_host_canonical", "net_proxy_confusion", "net_private_address")
OPEN = DeclaredClaims(network="open", filesystem="open", ipc="open")
PROXY = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")

needs_bwrap = pytest.mark.needs_bwrap


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One real running world for the module, under a short /tmp path (unix socket limits)."""
    with (
        reachable_tempdir("sa-nw-") as base,
        start_world(base / "w") as running,
    ):
        yield running


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """Cell scratch space for the module."""
    with reachable_tempdir("sa-nwc-") as base:
        yield base


def make_runner(world: Any, scratch: Path, backends: dict[str, Backend]) -> CellRunner:
    """A runner over the control leg plus `backends`."""
    everything: dict[str, Backend] = {"none": NoneBackend(), **backends}
    return CellRunner(
        world=cast("World", world),
        scratch=scratch,
        backends=everything,
        availability={name: b.availability() for name, b in everything.items()},
        platform="linux",
    )


def cell(backend: str, probe: str) -> Cell:
    """A matrix cell with a 60 s budget."""
    return Cell(backend, ProbeRow(probe, 60), None)


def why(entry: Mapping[str, Any]) -> str:
    """The verdict line with the evidence a failing assertion needs."""
    return json.dumps(
        {k: entry.get(k) for k in ("verdict", "reason", "attempts", "control")}, default=str
    )[:6000]


@pytest.fixture(scope="module")
def live(world: World, scratch: Path) -> dict[tuple[str, str], CellEntry]:
    """Every wide probe on the control leg, then under real bubblewrap (one runner)."""
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required for these tests: apt-get install bubblewrap")
    runner = make_runner(world, scratch, {"bubblewrap": BubblewrapBackend()})
    results = {}
    for backend in ("none", "bubblewrap"):
        for probe in WIDE:
            results[backend, probe] = runner.run_cell(cell(backend, probe))
    return results


class TestControlLeg:
    @pytest.mark.parametrize("probe", WIDE)
    def test_passes(self, live: dict[tuple[str, str], dict[str, Any]], probe: str) -> None:
        """Unconfined, each probe's host control works and its verdict is PASS."""
        entry = live["none", probe]
        assert entry["verdict"] == "PASS", why(entry)
        assert entry["control"]["host"]["ok"], why(entry)

    @pytest.mark.parametrize("probe", AROUND)
    def test_around_probes_escape_unconfined(
        self, live: dict[tuple[str, str], dict[str, Any]], probe: str
    ) -> None:
        """Around the proxy, the escape is seen by the host on the open leg."""
        assert live["none", probe]["escape"] == "escaped", why(live["none", probe])

    @pytest.mark.parametrize("probe", THROUGH)
    def test_through_probes_refused_even_unconfined(
        self, live: dict[tuple[str, str], dict[str, Any]], probe: str
    ) -> None:
        """Through the proxy, every confusion is refused on the open leg too."""
        assert live["none", probe]["escape"] == "refused", why(live["none", probe])

    def test_ipv6_listener_saw_tcp6_and_raw_socket_counted(
        self, live: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        """The [::1] listener logged the payload's connection; root's raw socket is seen."""
        entry = live["none", "net_ipv6_udp_icmp"]
        assert entry["witness"]["listeners"]["tcp6-connect"], why(entry)
        assert entry["witness"]["listeners"]["udp4-datagram"], why(entry)
        raw = {a["what"]: a["outcome"] for a in entry["witness"]["local_in_host_netns"]}
        caps = entry["control"]["host"]["capabilities"]
        assert (raw.get("raw-socket") == "succeeded") == (caps["raw-socket"] == "ok")

    def test_private_address_refused_after_resolution(
        self, live: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        """Each planted name was resolved to its planted address and refused, none dialed."""
        entry = live["none", "net_private_address"]
        denied = entry["witness"]["denied"]
        assert {d["address"] for d in denied} == {a for _, a in route.PRIVATE_ANSWERS}
        assert all(d["status"] == 403 and "forbids private" in d["reason"] for d in denied)
        assert entry["witness"]["admitted"] == []
        assert entry["witness"]["origin"] == []


@needs_bwrap
class TestBubblewrap:
    @pytest.mark.parametrize("probe", WIDE)
    def test_passes(self, live: dict[tuple[str, str], dict[str, Any]], probe: str) -> None:
        """Under real bubblewrap each wide probe is refused or contained, controls ok: PASS."""
        entry = live["bubblewrap", probe]
        assert entry["verdict"] == "PASS", why(entry)
        assert entry["escape"] in {"refused", "contained"}, why(entry)

    def test_raw_and_packet_sockets_refused(
        self, live: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        """Inside bubblewrap (caps dropped) raw and packet socket creation is EPERM."""
        attempts = {a["what"]: a for a in live["bubblewrap", "net_ipv6_udp_icmp"]["attempts"]}
        assert attempts["raw-socket"]["errno"] == "EPERM"
        assert attempts["packet-socket"]["errno"] == "EPERM"
        assert attempts["tcp6-connect"]["errno"] == "ECONNREFUSED"


@needs_bwrap
class TestWeakenedBubblewrap:
    @pytest.mark.parametrize("probe", AROUND)
    def test_share_net_fails(self, world: World, scratch: Path, probe: str) -> None:
        """Bwrap with the host's network namespace: the host witness sees the escape: FAIL."""
        runner = make_runner(
            world, scratch, {"bubblewrap": BubblewrapBackend(weaken=frozenset({"share-net"}))}
        )
        runner.run_cell(cell("none", probe))
        entry = runner.run_cell(cell("bubblewrap", probe))
        assert entry["verdict"] == "FAIL", why(entry)
        assert entry["reason"].startswith("escape observed by the host"), why(entry)


class LaxWorld:
    """The real world seen through a second, real proxy started with a lax allowlist."""

    def __init__(self, world: World, proxy: ProxyProcess) -> None:
        """Swap the proxy in the world's description; every other fixture is the world's."""
        assert proxy.url is not None
        assert proxy.port is not None
        self.dns = world.dns
        self._world = world
        self._proxy = proxy
        self.info: WorldInfo = dataclasses.replace(
            world.info,
            proxy=ProxyInfo(url=proxy.url, socket=str(proxy.socket), port=proxy.port),
        )

    def check_health(self, since: float | None = None) -> None:
        """The world's fixtures, and the lax proxy in place of the world's own, are alive."""
        self._world.check_health(since)
        status = self._proxy.exit_status()
        if status is not None:
            msg = f"the lax proxy died (exit {status}); rerun"
            raise FixtureError(msg)

    def records(self, nonce: str) -> WitnessRecords:
        """The world's records with the lax proxy's decisions in place of its own."""
        records = self._world.records(nonce)
        records.proxy = [d for d in self._proxy.decisions() if d.get("nonce") == nonce]
        return records


@pytest.fixture(scope="module")
def lax_world(world: World, scratch: Path) -> Iterator[LaxWorld]:
    """A real proxy admitting any .test name on the origin and listener ports, privately."""
    info = world.info
    ports = sorted(
        {p for h in info.hosts.values() for p in (h.https_port, h.http_port)}
        | {int(info.direct_egress.tcp.rpartition(":")[2])}
    )
    # Only loopback answers are ever planted while this proxy is used (see the test), so its
    # allow_private can only ever dial 127.0.0.1.
    rules = (Rule(host="test", suffix=True, ports=tuple(ports), allow_private=True),)
    proxy = start_proxy(
        ProxyConfig(
            rules=rules,
            dns=(info.dns.host, info.dns.port),
            unix_socket=scratch / "lax.sock",
            tcp=True,
            decision_log=scratch / "lax-decisions.jsonl",
        )
    )
    with proxy:
        yield LaxWorld(world, proxy)


@needs_bwrap
class TestLaxProxy:
    @pytest.mark.parametrize("probe", THROUGH)
    def test_lax_allowlist_fails(
        self,
        lax_world: LaxWorld,
        scratch: Path,
        probe: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A proxy whose rule widens past the canonical host/port/address: FAIL under bwrap."""
        # Never plant a non-loopback answer for a proxy that would dial it.
        monkeypatch.setattr(route, "PRIVATE_ANSWERS", (("loopback", "127.0.0.1"),))
        runner = make_runner(lax_world, scratch, {"bubblewrap": BubblewrapBackend()})
        entry = runner.run_cell(cell("bubblewrap", probe))
        assert entry["verdict"] == "FAIL", why(entry)
        assert entry["witness"]["admitted"], why(entry)


# ---------------------------------------------------------------------------------------------
# Decision tables with hand-made records.


def ctx_for(world: World, probe: str, nonce: str, declared: DeclaredClaims = PROXY) -> CellContext:
    """A cell context on the real world (prepare needs its ports)."""
    # The decision tables never touch the cell's paths; nothing is created there.
    base = Path(tempfile.gettempdir()) / "sa-nwu-unused"
    return CellContext(
        probe=probe,
        backend="bubblewrap",
        nonce=nonce,
        world=world,
        workspace=base,
        cell_dir=base,
        claims=declared,
    )


def records(**kinds: list[dict[str, Any]]) -> WitnessRecords:
    """Hand-made witness records (empty unless given)."""
    base: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("origin", "dns", "proxy", "direct_tcp", "direct_udp", "daemon")
    }
    return WitnessRecords(**(base | kinds))


def attempt(what: str, role: str, outcome: str, **extra: Any) -> dict[str, Any]:
    """One report attempt."""
    return {
        "what": what,
        "role": role,
        "outcome": outcome,
        "errno": None,
        "status": None,
        "detail": "",
    } | extra


HOST_OK = {"ok": True, "nonce": "hcontrol", "checks": [{"what": "x", "ok": True, "detail": ""}]}
HOST_DEAD = {"ok": False, "nonce": "hcontrol", "checks": [{"what": "x", "ok": False, "detail": ""}]}


class TestRouteDecisionTable:
    """net_proxy_confusion (the shared reading of the three probes through the proxy)."""

    def report(
        self, spec: NetProxyConfusion, ctx: CellContext, status: int, *, reuse_sent: int = 2
    ) -> dict[str, Any]:
        """Every escape refused with `status`, both controls 200 with the nonce echoed.

        A connection-reuse escape wrote `reuse_sent` heads and had every head but the last
        answered when it was sent in full (what the payload reports as `sent`/`answered`).
        """
        requests = spec.requests(ctx)
        attempts = []
        for r in requests:
            heads = len(r.heads)
            if r.role == "control":
                attempts.append(
                    attempt(r.what, "control", "succeeded", status=200, detail="nonce echoed")
                )
            elif r.refusal == "closed":
                answered = heads - 1 if reuse_sent == heads else 0
                progress = {"sent": reuse_sent, "answered": answered, "heads": heads}
                attempts.append(attempt(r.what, "escape", "refused", **progress))
            else:
                progress = {"sent": heads, "answered": heads, "heads": heads}
                attempts.append(attempt(r.what, "escape", "refused", status=status, **progress))
        return {"attempts": attempts, "facts": {}}

    def run(
        self,
        world: World,
        status: int,
        witness: WitnessRecords,
        control: dict[str, Any],
        *,
        reuse_sent: int = 2,
    ) -> tuple[Verdict, str]:
        """Prepare a cell, assess the hand-made report and records, decide."""
        spec = NetProxyConfusion()
        ctx = ctx_for(world, spec.id, "nunit0001")
        spec.prepare(ctx)
        try:
            report = self.report(spec, ctx, status, reuse_sent=reuse_sent)
            assessment = spec.assess(ctx, report, witness, control)
        finally:
            spec.cleanup(ctx)
        decision = decide(spec.expectation(ctx.claims), assessment)
        return decision.verdict, decision.reason

    def test_clean_refusal_passes(self, world: World) -> None:
        """403s, no admitted target, working controls: PASS."""
        assert self.run(world, 403, records(), HOST_OK)[0] is Verdict.PASS

    def test_forged_refusal_with_admitted_target_fails(self, world: World) -> None:
        """The payload says 403 but the proxy logged an allow for an escape target: FAIL."""
        spec = NetProxyConfusion()
        ctx = ctx_for(world, spec.id, "nunit0001")
        target = spec.build(ctx)[2].escape_targets[0]
        proxy = [{"nonce": "nunit0001", "target": target, "decision": "allow", "status": 200}]
        verdict, reason = self.run(world, 403, records(proxy=proxy), HOST_OK)
        assert verdict is Verdict.FAIL, reason

    def test_forged_refusal_with_tagged_origin_hit_fails(self, world: World) -> None:
        """A second request that reached an origin (its tag in the path) is FAIL."""
        origin = [
            {
                "nonce": "nunit0001",
                "host": "denied",
                "path": "/ok?nonce=nunit0001&a=keepalive-second",
            }
        ]
        verdict, _ = self.run(world, 403, records(origin=origin), HOST_OK)
        assert verdict is Verdict.FAIL

    def test_reuse_never_exercised_is_inconclusive(self, world: World) -> None:
        """A connection that ended before response 1 never carried the second request."""
        verdict, reason = self.run(world, 403, records(), HOST_OK, reuse_sent=1)
        assert verdict is Verdict.INCONCLUSIVE
        assert "never put to the proxy: keepalive-second (1 of 2 heads written" in reason

    def test_reuse_without_progress_facts_is_inconclusive(self, world: World) -> None:
        """A refusal with no sent/answered facts (an old payload) is not evidence."""
        verdict, _ = self.run(world, 403, records(), HOST_OK, reuse_sent=0)
        assert verdict is Verdict.INCONCLUSIVE

    def test_untagged_denied_origin_hit_fails(self, world: World) -> None:
        """The denied origin logging the nonce is FAIL even when the path lost its a= tag."""
        origin = [{"nonce": "nunit0001", "host": "denied", "path": "/ok"}]
        verdict, reason = self.run(world, 403, records(origin=origin), HOST_OK)
        assert verdict is Verdict.FAIL, reason

    def test_dead_host_control_is_inconclusive(self, world: World) -> None:
        """A refusal whose host control failed proves nothing: INCONCLUSIVE."""
        verdict, reason = self.run(world, 403, records(), HOST_DEAD)
        assert verdict is Verdict.INCONCLUSIVE
        assert "positive control failed" in reason

    def test_refusal_not_by_the_proxy_is_inconclusive(self, world: World) -> None:
        """A 502 is not the proxy's refusal before the dial: the reading disagrees."""
        verdict, reason = self.run(world, 502, records(), HOST_OK)
        assert verdict is Verdict.INCONCLUSIVE
        assert "400/403/421" in reason

    def test_past_allowlist_failure_counts_as_admitted(self, world: World) -> None:
        """A decision line with 502 for an escape target means it passed the rules: FAIL."""
        spec = NetProxyConfusion()
        ctx = ctx_for(world, spec.id, "nunit0001")
        target = spec.build(ctx)[2].escape_targets[0]
        proxy = [{"nonce": "nunit0001", "target": target, "decision": "deny", "status": 502}]
        assert self.run(world, 403, records(proxy=proxy), HOST_OK)[0] is Verdict.FAIL

    @pytest.mark.parametrize("status", [407, 431, None])
    def test_refusal_before_the_rules_is_not_admitted(
        self, world: World, status: int | None
    ) -> None:
        """A 407/431/status-less deny line stopped before the allowlist: never a FAIL."""
        spec = NetProxyConfusion()
        ctx = ctx_for(world, spec.id, "nunit0001")
        target = spec.build(ctx)[2].escape_targets[0]
        proxy = [{"nonce": "nunit0001", "target": target, "decision": "deny", "status": status}]
        verdict, reason = self.run(world, 403, records(proxy=proxy), HOST_OK)
        assert verdict is Verdict.PASS, reason


class TestPrivateAddressDecisionTable:
    def run(self, world: World, denies: list[dict[str, Any]]) -> tuple[Verdict, str]:
        """Assess a refused report against `denies` as the proxy's decision lines."""
        spec = NetPrivateAddress()
        nonce = "nunit0002"
        ctx = ctx_for(world, spec.id, nonce)
        spec.prepare(ctx)
        try:
            attempts = [
                attempt(
                    r.what,
                    r.role,
                    "succeeded" if r.role == "control" else "refused",
                    status=200 if r.role == "control" else 403,
                    detail="nonce echoed",
                )
                for r in spec.requests(ctx)
            ]
            lines = [d | {"nonce": nonce} for d in denies]
            assessment = spec.assess(ctx, {"attempts": attempts}, records(proxy=lines), HOST_OK)
        finally:
            spec.cleanup(ctx)
        decision = decide("denied", assessment)
        return decision.verdict, decision.reason

    def lines(self, world: World, reason: str) -> list[dict[str, Any]]:
        """One 403 decision line per planted name/target with `reason`."""
        allowed = world.info.hosts["allowed"]
        out = []
        for kind, address in route.PRIVATE_ANSWERS:
            host = f"nunit0002-{kind}.{PRIVATE_NAME_SUFFIX}"
            out.append(
                {
                    "target": f"{host}:{allowed.https_port}",
                    "host": host,
                    "status": 403,
                    "decision": "deny",
                    "address": address,
                    "reason": reason,
                }
            )
        host = f"nunit0002-loopback.{PRIVATE_NAME_SUFFIX}"
        out.append(
            {
                "target": f"http://{host}:{allowed.http_port}/ok?nonce=nunit0002&a=get-loopback",
                "host": host,
                "status": 403,
                "decision": "deny",
                "address": "127.0.0.1",
                "reason": reason,
            }
        )
        return out

    def test_refused_after_resolution_passes(self, world: World) -> None:
        """Every planted name refused by the address check: PASS."""
        verdict, reason = self.run(world, self.lines(world, "address x; rule forbids private"))
        assert verdict is Verdict.PASS, reason

    def test_refused_before_resolution_is_inconclusive(self, world: World) -> None:
        """A 403 from the allowlist never exercised the address check: INCONCLUSIVE."""
        verdict, reason = self.run(world, self.lines(world, "no rule matched"))
        assert verdict is Verdict.INCONCLUSIVE
        assert "after resolution" in reason

    def test_dial_attempted_fails(self, world: World) -> None:
        """A 504 'dial timed out' for a planted name means the proxy dialed it: FAIL."""
        lines = self.lines(world, "address x; rule forbids private")
        lines[2] |= {"status": 504, "reason": "dial 127.0.0.2:1 timed out"}
        assert self.run(world, lines)[0] is Verdict.FAIL

    def test_refuses_to_plant_a_global_answer(
        self, world: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """prepare() never plants an address the proxy would dial."""
        # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed; prepare() must refuse it before
        # anything is planted, so nothing is ever sent anywhere.
        monkeypatch.setattr(route, "PRIVATE_ANSWERS", (("global", "192.0.2.1"),))
        spec = NetPrivateAddress()
        with pytest.raises(FixtureError, match="off this host"):
            spec.prepare(ctx_for(world, spec.id, "nunit0003"))


class TestAroundDecisionTables:
    def test_loopback_service_forged_refusal_fails(self, world: World) -> None:
        """The service logged the nonce while the payload says refused: FAIL."""
        spec = NetLoopbackServices()
        ctx = ctx_for(world, spec.id, "nunit0004")
        spec.prepare(ctx)
        try:
            service = spec._cells.get("nunit0004")["service"]
            service.record({"proto": "tcp", "peer": "127.0.0.1:1", "data": "PING nonce=nunit0004"})
            report = {
                "attempts": [attempt("tcp-service", "escape", "refused", errno="ECONNREFUSED")],
                "facts": {},
            }
            assessment = spec.assess(ctx, report, records(), HOST_OK)
        finally:
            spec.cleanup(ctx)
        assert decide("denied", assessment).verdict is Verdict.FAIL

    def test_no_ipv6_loopback_names_the_fix(
        self, world: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without ::1 the cell is undecided, and the reason says how to enable it."""
        monkeypatch.setattr(direct, "has_ipv6_loopback", lambda: False)
        spec = NetIpv6UdpIcmp()
        ctx = ctx_for(world, spec.id, "nunit0006")
        spec.prepare(ctx)
        try:
            report = {"attempts": [attempt("udp4-datagram", "escape", "refused")], "facts": {}}
            assessment = spec.assess(ctx, report, records(), HOST_OK | {"capabilities": {}})
        finally:
            spec.cleanup(ctx)
        assert assessment.escape == "undecided"
        assert "sysctl -w net.ipv6.conf.lo.disable_ipv6=0" in assessment.reasons[0]

    @pytest.mark.parametrize(
        ("netns", "escape"),
        [("net:[1]", "contained"), (None, "disagree")],
        ids=["private", "unknown"],
    )
    def test_ipv6_udp_success_unseen(self, world: World, netns: str | None, escape: str) -> None:
        """A datagram 'sent' that no host listener saw: contained in a private netns."""
        spec = NetIpv6UdpIcmp()
        ctx = ctx_for(world, spec.id, "nunit0005")
        spec.prepare(ctx)
        try:
            report = {
                "attempts": [attempt("udp4-datagram", "escape", "succeeded")],
                "facts": {"netns": netns},
            }
            assessment = spec.assess(ctx, report, records(), HOST_OK | {"capabilities": {}})
        finally:
            spec.cleanup(ctx)
        assert assessment.escape == escape

    def test_ipv6_dead_control_is_inconclusive(self, world: World) -> None:
        """All refused but the host could not reach its own listeners: INCONCLUSIVE."""
        spec = NetIpv6UdpIcmp()
        ctx = ctx_for(world, spec.id, "nunit0006")
        spec.prepare(ctx)
        try:
            report = {
                "attempts": [attempt("tcp6-connect", "escape", "refused", errno="ECONNREFUSED")],
                "facts": {},
            }
            assessment = spec.assess(ctx, report, records(), HOST_DEAD)
        finally:
            spec.cleanup(ctx)
        assert decide("denied", assessment).verdict is Verdict.INCONCLUSIVE

    def test_raw_socket_in_host_netns_is_escape(self, world: World) -> None:
        """A raw socket created in the host's own network namespace is an escape."""
        spec = NetIpv6UdpIcmp()
        ctx = ctx_for(world, spec.id, "nunit0007")
        spec.prepare(ctx)
        try:
            ns = str(Path("/proc/self/ns/net").readlink())
            report = {
                "attempts": [attempt("raw-socket", "escape", "succeeded")],
                "facts": {"netns": ns},
            }
            assessment = spec.assess(
                ctx, report, records(), HOST_OK | {"capabilities": {"raw-socket": "ok"}}
            )
        finally:
            spec.cleanup(ctx)
        assert assessment.escape == "escaped"
        assert decide("denied", assessment).verdict is Verdict.FAIL

    def test_capability_the_host_lacks_is_not_judged(self, world: World) -> None:
        """A refused ping the host itself cannot send does not count as a refusal."""
        spec = NetIpv6UdpIcmp()
        ctx = ctx_for(world, spec.id, "nunit0008")
        spec.prepare(ctx)
        try:
            report = {
                "attempts": [
                    attempt("icmp-echo", "escape", "refused", errno="EACCES"),
                    attempt("udp4-datagram", "escape", "error"),
                ],
                "facts": {},
            }
            assessment = spec.assess(
                ctx, report, records(), HOST_OK | {"capabilities": {"icmp-echo": "EACCES"}}
            )
        finally:
            spec.cleanup(ctx)
        assert assessment.escape == "undecided"
        assert any("icmp-echo" in r for r in assessment.reasons)


class TestLoopbackWitness:
    def test_refuses_non_loopback(self) -> None:
        """A witness never binds anything but loopback."""
        with pytest.raises(FixtureError, match="loopback"):
            LoopbackWitness("192.0.2.1")

    def test_logs_before_answering(self) -> None:
        """A peer that got the banner is already in the log, attributed by its nonce."""
        witness = LoopbackWitness("127.0.0.1", tcp=True, udp=True, banner=b"hi\n")
        witness.start()
        try:
            with socket.create_connection(("127.0.0.1", witness.tcp_port), 5) as sock:
                sock.sendall(b"nonce=nabc\n")
                assert sock.recv(16) == b"hi\n"
            assert [e["proto"] for e in witness.records_with("nabc")] == ["tcp"]
            assert witness.records_with("nother") == []
        finally:
            witness.stop()


def test_payloads_are_stdlib_and_exit_zero_on_a_bad_task(tmp_path: Path) -> None:
    """Each payload prints its marker and one JSON line, exit 0, even for a missing task."""
    for probe in WIDE:
        assert probe in PROBES
        proc = subprocess.run(
            [sys.executable, "-I", "-S", str(probe_path(probe)), str(tmp_path / "missing.json")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        lines = proc.stdout.splitlines()
        assert proc.returncode == 0
        assert lines[0] == f"{START_MARKER} "
        report = json.loads(lines[1])
        # Without a task a shared payload cannot know which probe it serves: it names itself.
        assert report["probe"] == probe_path(probe).stem
        assert report["attempts"][0]["outcome"] == "error"


def test_payload_reports_how_far_a_reused_connection_got() -> None:
    """A proxy that hangs up before response 1: the payload says 1 head written, 0 answered."""
    spec = importlib.util.spec_from_file_location("payload_requests", probe_path(THROUGH[0]))
    assert spec is not None
    assert spec.loader is not None
    payload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(payload)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def hang_up() -> None:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.close()

        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        request = {"what": "keepalive-second", "role": "escape", "heads": ["GET / HTTP/1.1"] * 2}
        result = payload.run_request(request, ("127.0.0.1", port, ""), "n1", "")
        thread.join(5)
    assert (result["outcome"], result["sent"], result["answered"], result["heads"]) == (
        "refused",
        1,
        0,
        2,
    )


@pytest.mark.parametrize("spec", [NetLoopbackServices(), NetIpv6UdpIcmp()], ids=lambda s: s.id)
def test_unprepared_cell_is_undecided_and_cleanup_stops_listeners(
    world: World, spec: NetLoopbackServices | NetIpv6UdpIcmp
) -> None:
    """Without prepare() nothing witnesses the cell; after cleanup its listeners are gone."""
    ctx = ctx_for(world, spec.id, "nunit0007")
    report = {"attempts": [attempt("x", "escape", "refused")], "facts": {}}
    assessment = spec.assess(ctx, report, records(), HOST_OK)
    assert (assessment.escape, assessment.controls_ok) == ("undecided", False)
    assert not spec.host_control(ctx)["ok"]
    spec.prepare(ctx)
    kept = spec._listener(ctx, "service") or spec._listener(ctx, "v4")
    assert kept is not None
    spec.cleanup(ctx)
    assert spec._listener(ctx, "service") is None
    assert spec._listener(ctx, "v4") is None
    assert kept._stop.is_set()


def test_unmeasured_capabilities_fail_the_control(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the payload user's capabilities cannot be measured, the control fails, named."""
    spec = NetIpv6UdpIcmp()
    ctx = ctx_for(world, spec.id, "nunit0008")
    monkeypatch.setattr(
        direct,
        "payload_capabilities",
        lambda _user: dict.fromkeys(("icmp-echo", "raw-socket"), "unmeasured (exit 1: boom)"),
    )
    spec.prepare(ctx)
    try:
        control = spec.host_control(ctx)
    finally:
        spec.cleanup(ctx)
    assert not control["ok"]
    failed = [c for c in control["checks"] if not c["ok"]]
    assert [c["what"] for c in failed] == ["payload user's local capabilities measured"]
    assert "boom" in failed[0]["detail"]
