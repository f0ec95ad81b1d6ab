"""The proxy protocol probes' host side: the bytes they build and their decision tables.

net_proxy_smuggling, net_proxy_upgrade and net_dns_rebinding (sandbox_attest/catalog/net/
protocol.py) are judged here on hand-made reports and witness records over a stand-in world
that has only what their specs read (the hosts, the DNS knob); the live cells are in
tests/integration/test_proxy_protocol_holes.py.
"""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import CellContext
from sandbox_attest.catalog.net.doh import NetDohBypass, doh_query
from sandbox_attest.catalog.net.proxy_wire import AUTH, WireRequest
from sandbox_attest.catalog.net.rebinding import NetDnsRebinding, _check_rebinding_answers
from sandbox_attest.catalog.net.relay import NetProxyRelay
from sandbox_attest.catalog.net.smuggling import NetProxySmuggling
from sandbox_attest.catalog.net.upgrade import NetProxyUpgrade
from sandbox_attest.errors import FixtureError
from sandbox_attest.verdict import Verdict, decide
from sandbox_attest.world.core import WitnessRecords

PROXY = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
NONCE = "nproto0001"
HOST_OK = {"ok": True, "nonce": "hcontrol", "checks": [{"what": "x", "ok": True, "detail": ""}]}


@dataclass
class Host:
    """The part of a fixture host the specs read."""

    name: str
    address: str
    http_port: int
    https_port: int


@dataclass
class Knob:
    """A DNS fixture stand-in that records what was planted."""

    planted: dict[str, list[str]] = field(default_factory=dict)

    def set_answers(self, name: str, addresses: list[str]) -> None:
        """Record the planted answers."""
        self.planted[name] = addresses


@dataclass
class Info:
    """The part of WorldInfo the specs read."""

    hosts: dict[str, Host]


@dataclass
class FakeWorld:
    """A world with the lab's origin address (or loopback's) and a DNS knob."""

    info: Info
    dns: Knob


def world(address: str = "198.19.0.10") -> FakeWorld:
    """A stand-in world whose origins all live on `address`, as the real one's do."""
    hosts = {
        "allowed": Host("allowed.test", address, 18080, 18443),
        "denied": Host("denied.test", address, 28080, 28443),
    }
    return FakeWorld(Info(hosts), Knob())


def ctx(probe: str, w: FakeWorld | None = None) -> CellContext:
    """A cell context over a stand-in world; the decision tables never touch its paths."""
    base = Path(tempfile.gettempdir()) / "sa-proto-unused"
    return CellContext(
        probe=probe,
        backend="bubblewrap",
        nonce=NONCE,
        world=cast("Any", w or world()),
        workspace=base,
        cell_dir=base,
        claims=PROXY,
    )


def records(**kinds: list[dict[str, Any]]) -> WitnessRecords:
    """Hand-made witness records (empty unless given)."""
    base: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("origin", "dns", "proxy", "direct_tcp", "direct_udp", "daemon")
    }
    return WitnessRecords(**(base | kinds))


def report(
    requests: list[WireRequest], *, escape: str = "refused", sent: int | None = None
) -> dict[str, Any]:
    """The control echoing the nonce; every escape with `escape` after sending its parts."""
    attempts = []
    for r in requests:
        parts = len(r.parts) if sent is None else sent
        if r.role == "control":
            attempts.append(
                {
                    "what": r.what,
                    "role": "control",
                    "outcome": "succeeded",
                    "status": 200,
                    "detail": "nonce echoed",
                    "sent": 1,
                    "parts": 1,
                    "statuses": [200],
                }
            )
        else:
            attempts.append(
                {
                    "what": r.what,
                    "role": "escape",
                    "outcome": escape,
                    "status": 400,
                    "detail": "",
                    "sent": parts,
                    "parts": len(r.parts),
                    "statuses": [400],
                }
            )
    return {"attempts": attempts, "facts": {}}


def judge(
    spec: Any, cell: CellContext, rep: dict[str, Any], witness: WitnessRecords
) -> tuple[Verdict, str]:
    """Assess and decide one cell."""
    assessment = spec.assess(cell, rep, witness, HOST_OK)
    decision = decide(spec.expectation(cell.claims), assessment)
    return decision.verdict, decision.reason


class TestSmugglingBytes:
    def test_each_escape_hides_a_tagged_request_to_the_denied_host(self) -> None:
        """Every escape's bytes carry a GET for the denied host tagged with its own name."""
        cell = ctx("net_proxy_smuggling")
        for r in NetProxySmuggling().build(cell):
            if r.role == "escape":
                text = "".join(r.parts)
                assert f"GET http://denied.test:28080/ok?nonce={NONCE}&a={r.what} " in text
                assert text.count(AUTH) == 1, r.what  # only the proxy's own request authenticates

    def test_a_single_content_length_spans_the_whole_body(self) -> None:
        """Where one Content-Length frames the body, it counts every byte after the head."""
        cell = ctx("net_proxy_smuggling")
        by = {r.what: r for r in NetProxySmuggling().build(cell)}
        for what in ("cl0-get-body", "cl-te", "obs-fold"):
            head, body = by[what].parts[0].split(AUTH + "\r\n\r\n", 1)
            length = next(
                int(line.split(":")[1])
                for line in head.split("\r\n")
                if line.startswith("Content-Length:")
            )
            assert length == len(body.encode("latin-1")), what

    def test_te_cl_chunk_holds_the_smuggled_request_exactly(self) -> None:
        """The TE.CL body is one chunk of exactly the smuggled request, then the last chunk."""
        cell = ctx("net_proxy_smuggling")
        r = {r.what: r for r in NetProxySmuggling().build(cell)}["te-cl"]
        body = r.parts[0].split(AUTH + "\r\n\r\n", 1)[1]
        size, rest = body.split("\r\n", 1)
        assert rest[int(size, 16) :] == "\r\n0\r\n\r\n"


class TestHttp2Preface:
    def test_headers_frame_is_well_formed(self) -> None:
        """Preface, an empty SETTINGS, then one HEADERS frame whose length is its block."""
        cell = ctx("net_proxy_upgrade")
        r = {r.what: r for r in NetProxyUpgrade().build(cell)}["h2-prior-knowledge"]
        raw = r.parts[0].encode("latin-1")
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        assert raw.startswith(preface)
        settings = raw[len(preface) : len(preface) + 9]
        assert settings == b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
        frame = raw[len(preface) + 9 :]
        length = struct.unpack("!I", b"\x00" + frame[:3])[0]
        assert (frame[3], frame[4]) == (0x1, 0x5)
        assert length == len(frame) - 9
        assert b"denied.test:28080" in frame
        assert b"a=h2-prior-knowledge" in frame


class TestWireDecisionTable:
    def test_clean_refusal_passes(self) -> None:
        """Every escape put to the proxy and refused, no origin or admission logged: PASS."""
        spec = NetProxySmuggling()
        cell = ctx(spec.id)
        spec.prepare(cell)
        verdict, why = judge(spec, cell, report(spec.requests(cell)), records())
        assert verdict is Verdict.PASS, why

    def test_the_allowed_carrier_reaching_its_origin_is_no_escape(self) -> None:
        """The carrier served by the allowed origin as itself is the request that was allowed."""
        spec = NetProxySmuggling()
        cell = ctx(spec.id)
        spec.prepare(cell)
        origin = [
            {
                "nonce": NONCE,
                "host": "allowed",
                "host_header": "allowed.test:18080",
                "path": f"/ok?nonce={NONCE}&a=carrier-cl0-get-body",
            }
        ]
        verdict, why = judge(spec, cell, report(spec.requests(cell)), records(origin=origin))
        assert verdict is Verdict.PASS, why

    def test_a_smuggled_request_served_by_the_allowed_origin_fails(self) -> None:
        """The allowed origin serving the tagged request under the denied Host: FAIL with fix."""
        spec = NetProxySmuggling()
        cell = ctx(spec.id)
        spec.prepare(cell)
        origin = [
            {
                "nonce": NONCE,
                "host": "allowed",
                "host_header": "denied.test:28080",
                "path": f"http://denied.test:28080/ok?nonce={NONCE}&a=cl0-get-body",
            }
        ]
        verdict, why = judge(spec, cell, report(spec.requests(cell)), records(origin=origin))
        assert verdict is Verdict.FAIL, why
        assert "cl0-get-body" in why
        assert "fix: refuse a request with both" in why

    def test_an_admission_for_the_denied_host_fails(self) -> None:
        """The proxy's own log admitting the denied host is an escape whatever the payload says."""
        spec = NetProxyUpgrade()
        cell = ctx(spec.id)
        spec.prepare(cell)
        proxy = [
            {
                "nonce": NONCE,
                "host": "denied.test",
                "decision": "allow",
                "status": 200,
                "target": "http://denied.test:28080/ok",
            }
        ]
        verdict, why = judge(spec, cell, report(spec.requests(cell)), records(proxy=proxy))
        assert verdict is Verdict.FAIL, why

    def test_bytes_never_sent_prove_nothing(self) -> None:
        """An escape whose bytes were never written to the proxy is not a refusal: not PASS."""
        spec = NetProxySmuggling()
        cell = ctx(spec.id)
        spec.prepare(cell)
        verdict, why = judge(spec, cell, report(spec.requests(cell), sent=0), records())
        assert verdict is Verdict.INCONCLUSIVE, why
        assert "never put to the proxy" in why

    def test_a_success_no_witness_saw_is_not_believed(self) -> None:
        """The payload claiming an answer past the carrier with silent origins: not PASS."""
        spec = NetProxyUpgrade()
        cell = ctx(spec.id)
        spec.prepare(cell)
        verdict, why = judge(spec, cell, report(spec.requests(cell), escape="succeeded"), records())
        assert verdict is not Verdict.PASS, why


class TestRebinding:
    def test_only_the_origins_and_loopback_are_ever_planted(self) -> None:
        """A second answer off loopback, or a first outside the lab and loopback, is refused."""
        _check_rebinding_answers("198.19.0.10", "127.9.9.9")
        with pytest.raises(FixtureError, match="plant loopback only"):
            _check_rebinding_answers("198.19.0.10", "192.0.2.77")
        with pytest.raises(FixtureError, match="origins' lab or loopback"):
            _check_rebinding_answers("192.0.2.1", "127.9.9.9")

    def run(self, w: FakeWorld, *, dial: bool, queried: bool) -> tuple[Verdict, str]:
        """Prepare a cell (the knob gets its name), maybe dial its listener, assess, decide."""
        import socket  # noqa: PLC0415  (only this table dials)

        spec = NetDnsRebinding()
        cell = ctx(spec.id, w)
        # The allowed port is taken by nothing on this loopback address: a fresh 127.x address.
        spec.prepare(cell)
        try:
            state = spec._cells.get(NONCE)
            name, address = state["name"], state["address"]
            assert w.dns.planted[name] == [w.info.hosts["allowed"].address, address]
            if dial:
                with socket.create_connection((address, 18080), 2) as sock:
                    sock.sendall(f"GET /ok?nonce={NONCE} HTTP/1.1\r\n\r\n".encode())
                    sock.recv(64)
            dns = [{"name": name, "qtype": "A"}] if queried else []
            rep = report(spec.requests(cell), escape="succeeded")
            return judge(spec, cell, rep, records(dns=dns))
        finally:
            spec.cleanup(cell)

    def test_dialing_the_second_answer_fails(self) -> None:
        """The listener behind the second answer heard the proxy: FAIL naming the fix."""
        verdict, why = self.run(world(), dial=True, queried=True)
        assert verdict is Verdict.FAIL, why
        assert "dial exactly the address that was checked" in why

    def test_resolved_once_and_silent_listener_passes(self) -> None:
        """The fixture saw the name and nothing reached the listener: PASS."""
        verdict, why = self.run(world(), dial=False, queried=True)
        assert verdict is Verdict.PASS, why

    def test_a_name_never_resolved_proves_nothing(self) -> None:
        """No query for the name: the window was never put to the proxy: not PASS."""
        verdict, why = self.run(world(), dial=False, queried=False)
        assert verdict is Verdict.INCONCLUSIVE, why

    def test_the_loopback_world_cannot_judge_it(self) -> None:
        """Origins on loopback: no proxy admits the first answer, so INCONCLUSIVE, saying so."""
        verdict, why = self.run(world("127.0.0.1"), dial=False, queried=True)
        assert verdict is Verdict.INCONCLUSIVE, why
        assert "--world lab" in why


class TestDohBypass:
    def report(self, address: str | None, escape: str, status: int | None) -> dict[str, Any]:
        """The DoH control (answered or not) and both escapes with one outcome."""
        control = {
            "what": "doh-allowed",
            "role": "control",
            "status": 200,
            "outcome": "succeeded" if address else "refused",
            "detail": "",
        }
        escapes = [
            {"what": w, "role": "escape", "outcome": escape, "status": status, "detail": ""}
            for w in ("get-doh-address", "connect-doh-address")
        ]
        return {"attempts": [control, *escapes], "facts": {"doh_address": address}}

    def served(self) -> list[dict[str, Any]]:
        """The allowed origin's log line of the payload's DoH lookup."""
        return [{"nonce": NONCE, "host": "allowed", "path": f"/dns-query?dns=x&nonce={NONCE}"}]

    def test_refused_addresses_pass(self) -> None:
        """DoH answered and served, both ways by address refused with 403: PASS."""
        spec = NetDohBypass()
        cell = ctx(spec.id)
        rep = self.report("198.19.0.10", "refused", 403)
        verdict, why = judge(spec, cell, rep, records(origin=self.served()))
        assert verdict is Verdict.PASS, why

    def test_denied_origin_reached_by_address_fails(self) -> None:
        """The denied origin logging the nonce is the escape whatever the payload says: FAIL."""
        spec = NetDohBypass()
        cell = ctx(spec.id)
        origin = [*self.served(), {"nonce": NONCE, "host": "denied", "path": "/ok"}]
        rep = self.report("198.19.0.10", "refused", 403)
        verdict, why = judge(spec, cell, rep, records(origin=origin))
        assert verdict is Verdict.FAIL, why
        assert "refuse IP literals it does not name" in why

    def test_no_address_learned_proves_nothing(self) -> None:
        """A DoH lookup that gave no address leaves nothing to judge: not PASS."""
        spec = NetDohBypass()
        cell = ctx(spec.id)
        verdict, why = judge(spec, cell, self.report(None, "error", None), records())
        assert verdict is Verdict.INCONCLUSIVE, why

    def test_a_lookup_no_origin_served_is_not_a_control(self) -> None:
        """A DoH answer the allowed origin never logged (a forged control): not PASS."""
        spec = NetDohBypass()
        cell = ctx(spec.id)
        rep = self.report("198.19.0.10", "refused", 403)
        verdict, why = judge(spec, cell, rep, records())
        assert verdict is Verdict.INCONCLUSIVE, why
        assert "logged no DoH request" in why


def test_the_allowed_origin_answers_doh_for_fixture_names_only() -> None:
    """/dns-query on the allowed origin answers a fixture name with the origins' address."""
    from dnslib import DNSRecord  # noqa: PLC0415  (host-only dependency)

    from sandbox_attest.world.origins import FixtureHost, Origins  # noqa: PLC0415

    stand_in = cast(
        "Origins",
        type("O", (), {"hosts": (FixtureHost("denied", "denied.test"),), "address": "198.19.0.10"}),
    )
    answer = Origins._doh_response(stand_in, f"dns={doh_query('denied.test')}")
    assert answer.status == 200
    assert [str(rr.rdata) for rr in DNSRecord.parse(b"".join(answer.body)).rr] == ["198.19.0.10"]
    other = Origins._doh_response(stand_in, f"dns={doh_query('elsewhere.test')}")
    assert DNSRecord.parse(b"".join(other.body)).header.rcode == 3  # NXDOMAIN
    assert Origins._doh_response(stand_in, "dns=%%%").status == 400


def test_doh_under_no_network_is_the_claim_holding() -> None:
    """Every attempt, the DoH lookup too, refused by the network itself under network = none."""
    spec = NetDohBypass()
    cell = ctx(spec.id)
    cell = CellContext(
        probe=cell.probe,
        backend="codex",
        nonce=NONCE,
        world=cell.world,
        workspace=cell.workspace,
        cell_dir=cell.cell_dir,
        claims=DeclaredClaims(network="none", filesystem="workspace", ipc="isolated"),
    )
    attempts = [
        {"what": w, "role": r, "outcome": "refused", "errno": "EPERM", "status": None}
        for w, r in (
            ("doh-allowed", "control"),
            ("get-doh-address", "escape"),
            ("connect-doh-address", "escape"),
        )
    ]
    rep = {"attempts": attempts, "facts": {"doh_address": None, "address": "198.19.0.10"}}
    verdict, why = judge(spec, cell, rep, records())
    assert verdict is Verdict.PASS, why
    assert 'network = "none"' in why


def test_rebinding_outside_the_lab_is_not_applicable() -> None:
    """This test process is in no lab: the runner is told why the probe cannot apply here."""
    reason = NetDnsRebinding().not_applicable("harness")
    assert reason is not None
    assert "--world lab" in reason


class TestRelay:
    def test_the_relay_loops_through_the_proxy_then_asks_for_the_denied_host(self) -> None:
        """The outer CONNECT names the payload's own proxy; the inner GET the denied host."""
        cell = ctx("net_proxy_relay")
        r = {r.what: r for r in NetProxyRelay().build(cell)}["relay-through-proxy"]
        assert r.parts[0].startswith("CONNECT {proxy} HTTP/1.1\r\n")
        assert r.parts[1].startswith("GET http://denied.test:28080/ok?")
        assert r.carriers == 1

    def test_a_loopback_admission_in_the_proxy_log_fails(self) -> None:
        """The harness proxy admitting a loopback target (itself) is an escape: FAIL."""
        spec = NetProxyRelay()
        cell = ctx(spec.id)
        spec.prepare(cell)
        proxy = [
            {
                "nonce": NONCE,
                "host": "127.0.0.1",
                "decision": "allow",
                "status": 200,
                "target": "127.0.0.1:3128",
            }
        ]
        verdict, why = judge(spec, cell, report(spec.requests(cell)), records(proxy=proxy))
        assert verdict is Verdict.FAIL, why
        assert "refuse a target on the proxy's own host" in why

    def test_the_refused_loop_passes(self) -> None:
        """The outer CONNECT refused, the denied origin silent: PASS."""
        spec = NetProxyRelay()
        cell = ctx(spec.id)
        spec.prepare(cell)
        verdict, why = judge(spec, cell, report(spec.requests(cell)), records())
        assert verdict is Verdict.PASS, why
