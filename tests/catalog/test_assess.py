"""The assessors' decision tables, fed hand-made reports and witness records."""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import PROBES, CellContext, FsWriteOutside, probe_path, records
from sandbox_attest.catalog.fs import CANARY_NAME
from sandbox_attest.catalog.fs.write_outside import CORE_CLASSES, HOME_CLASSES
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.paths import matrix_dir
from sandbox_attest.run.matrix import load_matrix
from sandbox_attest.run.runner import inside_route
from sandbox_attest.verdict import Verdict, decide
from sandbox_attest.world.info import (
    PROBE_NAME_SUFFIX,
    BlobInfo,
    DaemonInfo,
    DirectEgressInfo,
    DnsInfo,
    HostInfo,
    IndexInfo,
    ProxyInfo,
    WorldInfo,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

OPEN = DeclaredClaims(network="open", filesystem="open", ipc="open")
CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
NO_NET = DeclaredClaims(network="none", filesystem="workspace", ipc="isolated")
HOST_NETNS = str(Path("/proc/self/ns/net").readlink())
HOST_MNTNS = str(Path("/proc/self/ns/mnt").readlink())
OK_CONTROL: dict[str, Any] = {"ok": True, "nonce": "hcontrol", "checks": []}
FAILED_CONTROL: dict[str, Any] = {"ok": False, "nonce": "hcontrol", "checks": []}
BLOB_SIZE = 18_874_368


@dataclass
class Records:
    """A hand-made stand-in for sandbox_attest.world.WitnessRecords."""

    origin: list[dict[str, Any]] = field(default_factory=list)
    dns: list[dict[str, Any]] = field(default_factory=list)
    proxy: list[dict[str, Any]] = field(default_factory=list)
    direct_tcp: list[dict[str, Any]] = field(default_factory=list)
    direct_udp: list[dict[str, Any]] = field(default_factory=list)
    daemon: list[dict[str, Any]] = field(default_factory=list)


def _info() -> WorldInfo:
    hosts = {
        key: HostInfo(name=f"{key}.test", address="127.0.0.1", https_port=1443, http_port=1080)
        for key in ("allowed", "denied", "index", "files")
    }
    return WorldInfo(
        proxy=ProxyInfo(url="http://u:s@127.0.0.1:9", socket="/nonexistent", port=9),
        ca_bundle="/nonexistent/ca.pem",
        dns=DnsInfo(host="127.0.0.1", port=9),
        hosts=hosts,
        blob=BlobInfo(url="https://allowed.test:1443/blob", size=BLOB_SIZE, sha256="0" * 64),
        index=IndexInfo(
            url_template="https://index.test:1443/c/{nonce}/simple/",
            denied_url_template="https://denied.test:1443/c/{nonce}/simple/",
            package="kiln-helpers",
            module="kiln_helpers",
            version="1.0.0",
            wheel_nonce="wheel",
        ),
        direct_egress=DirectEgressInfo(tcp="127.0.0.1:9", udp="127.0.0.1:9"),
        daemon=DaemonInfo(unix="/nonexistent/daemon.sock", abstract="sa-daemon"),
        run_dir="/nonexistent",
    )


@dataclass
class FakeWorld:
    """Only the `info` and `records` the assessors read; no fixture runs."""

    info: WorldInfo = field(default_factory=_info)
    witness: Records = field(default_factory=Records)

    def records(self, nonce: str) -> Records:
        """The hand-made records (already 'filtered')."""
        del nonce
        return self.witness


@dataclass
class LateWorld(FakeWorld):
    """A world whose witness hears the payload only from `due` on (a relay's late dial)."""

    due: float = 0.0

    def records(self, nonce: str) -> Records:
        """Nothing before `due`, the hand-made records after."""
        del nonce
        return self.witness if time.monotonic() >= self.due else Records()


def _ctx(probe: str, declared: DeclaredClaims, base: Path) -> CellContext:
    cell_dir = base / "cell"
    (cell_dir / "workspace").mkdir(parents=True)
    return CellContext(
        probe=probe,
        backend="test",
        nonce="n" + secrets.token_hex(8),
        world=FakeWorld(),
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=declared,
        route=inside_route(),
    )


def _a(
    what: str, role: str, outcome: str, err: str | None = None, status: int | None = None
) -> dict[str, Any]:
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status}


def _verdict(
    ctx: CellContext, report: dict[str, Any], witness: Records, control: dict[str, Any]
) -> tuple[str, Verdict]:
    spec = PROBES[ctx.probe]
    assessment = spec.assess(ctx, report, witness, control)
    assert assessment.reasons, "every assessment names its reasons"
    return assessment.escape, decide(spec.expectation(ctx.claims), assessment).verdict


def _payload(probe: str) -> ModuleType:
    """Load a payload script as a module (it runs nothing on import) to test its readings."""
    spec = importlib.util.spec_from_file_location(f"payload_{probe}", probe_path(probe))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestExpectation:
    """Which claims make which probe a denial or a must-succeed."""

    @pytest.mark.parametrize(
        ("probe", "declared", "expected"),
        [
            ("net_denied_host", OPEN, "denied"),
            ("net_denied_host", CONFINED, "denied"),
            ("net_direct_egress", OPEN, "allowed"),
            ("net_direct_egress", CONFINED, "denied"),
            ("dns_resolution", NO_NET, "denied"),
            ("ipc_unix_socket_escape", OPEN, "allowed"),
            ("ipc_unix_socket_escape", CONFINED, "denied"),
            ("fs_write_outside", OPEN, "allowed"),
            ("fs_write_outside", CONFINED, "denied"),
            ("net_transfer_18mib", CONFINED, "allowed"),
            ("net_transfer_18mib", NO_NET, "denied"),
            ("pkg_pip_install", OPEN, "allowed"),
            ("pkg_pip_install", NO_NET, "denied"),
        ],
        ids=lambda v: v if isinstance(v, str) else getattr(v, "network", ""),
    )
    def test_expectation(self, probe: str, declared: DeclaredClaims, expected: str) -> None:
        """The declared claim area decides between denied and allowed."""
        assert PROBES[probe].expectation(declared) == expected

    def test_catalog_holds_the_release_core(self) -> None:
        """The catalog holds the release core, each spec under its own id."""
        core = {
            "net_denied_host",
            "net_direct_egress",
            "dns_resolution",
            "ipc_unix_socket_escape",
            "fs_write_outside",
            "net_transfer_18mib",
            "pkg_pip_install",
        }
        assert core <= set(PROBES)
        assert all(spec.id == key for key, spec in PROBES.items())

    def test_catalog_matrix_and_payloads_agree(self) -> None:
        """Every matrix probe has a spec and a payload; every spec is in the matrix."""
        matrix = load_matrix(matrix_dir() / "matrix.toml")
        assert {row.id for row in matrix.probes} == set(PROBES)
        for probe_id in PROBES:
            assert probe_path(probe_id).is_file(), probe_id


class TestNetDeniedHost:
    """Proxy 403s versus the denied origin's log."""

    @staticmethod
    def report(outcome: str = "refused", status: int | None = 403) -> dict[str, Any]:
        """A report with both escape forms answered alike and a working control."""
        return {
            "attempts": [
                _a("get-denied-absolute", "escape", outcome, status=status),
                _a("connect-denied", "escape", outcome, status=status),
                _a("get-allowed", "control", "succeeded", status=200),
            ]
        }

    def test_refused_is_pass(self, tmp_path: Path) -> None:
        """Two 403s, a logged deny and a silent denied origin give PASS."""
        ctx = _ctx("net_denied_host", CONFINED, tmp_path)
        deny = {"decision": "deny", "host": "denied.test", "nonce": ctx.nonce, "status": 403}
        assert _verdict(ctx, self.report(), Records(proxy=[deny]), OK_CONTROL) == (
            "refused",
            Verdict.PASS,
        )

    def test_forged_refusal_with_origin_hit_is_fail(self, tmp_path: Path) -> None:
        """A 'refused' report while the denied origin logged the nonce is FAIL."""
        ctx = _ctx("net_denied_host", CONFINED, tmp_path)
        hit = {"host": "denied", "nonce": ctx.nonce, "status": 200, "path": "/ok"}
        assert _verdict(ctx, self.report(), Records(origin=[hit]), OK_CONTROL) == (
            "escaped",
            Verdict.FAIL,
        )

    def test_failed_host_control_is_inconclusive(self, tmp_path: Path) -> None:
        """A refusal whose host control failed proves nothing."""
        ctx = _ctx("net_denied_host", CONFINED, tmp_path)
        assert _verdict(ctx, self.report(), Records(), FAILED_CONTROL)[1] is Verdict.INCONCLUSIVE

    def test_refusal_without_403_disagrees(self, tmp_path: Path) -> None:
        """A refusal that is not the proxy's 403 (e.g. 502) is not the expected observation."""
        ctx = _ctx("net_denied_host", CONFINED, tmp_path)
        assert _verdict(ctx, self.report(status=502), Records(), OK_CONTROL) == (
            "disagree",
            Verdict.INCONCLUSIVE,
        )


class TestNetDirectEgress:
    """Listener log versus the payload's connects, and the sandbox's own loopback."""

    @staticmethod
    def report(outcome: str, netns: str | None, err: str | None = None) -> dict[str, Any]:
        """A TCP and a UDP attempt with one outcome, from network namespace `netns`."""
        return {
            "attempts": [
                _a("tcp-direct", "escape", outcome, err),
                _a("udp-direct", "escape", outcome, err),
            ],
            "facts": {"netns": netns},
        }

    def test_refused_with_silent_listener_is_pass(self, tmp_path: Path) -> None:
        """ENETUNREACH with nothing logged and a working host control is PASS."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        report = self.report("refused", "net:[1]", "ENETUNREACH")
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("refused", Verdict.PASS)

    def test_connect_in_own_namespace_is_contained(self, tmp_path: Path) -> None:
        """A connect answered inside another network namespace never reached the host."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        report = self.report("succeeded", "net:[4026530000]")
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("contained", Verdict.PASS)

    def test_a_relayed_connection_logged_late_is_still_fail(self, tmp_path: Path) -> None:
        """A gateway's relay reaches the listener after the cell: waited for, and FAIL."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        heard = Records(direct_tcp=[{"nonce": ctx.nonce, "local": "127.0.0.1:9"}])
        ctx = dataclasses.replace(ctx, world=LateWorld(witness=heard, due=time.monotonic() + 0.5))
        report = self.report("succeeded", "net:[4026530000]")
        # What the runner read right after the run: nothing yet.
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("escaped", Verdict.FAIL)

    def test_host_sees_the_payload_in_its_network_namespace_is_fail(self, tmp_path: Path) -> None:
        """The host read the payload in the harness's netns: FAIL, whatever it reported."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        ctx.host_view.update(
            {"seen": True, "shared_with_harness": ["net"], "namespaces": {"net": HOST_NETNS}}
        )
        report = self.report("refused", "net:[1]", "ENETUNREACH")
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("escaped", Verdict.FAIL)

    def test_host_sees_a_default_route_in_the_payloads_netns_is_fail(self, tmp_path: Path) -> None:
        """A default route in the payload's own netns is a path out, seen without a packet."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        route = {
            "dev": "tap0",
            "destination": "0.0.0.0",
            "gateway": "198.18.9.2",
            "mask": "0.0.0.0",
        }
        ctx.host_view.update({"seen": True, "shared_with_harness": [], "default_routes": [route]})
        report = self.report("refused", "net:[1]", "ENETUNREACH")
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("escaped", Verdict.FAIL)

    def test_a_confined_decoy_does_not_hide_the_real_payload(self, tmp_path: Path) -> None:
        """Two processes carried the launcher; the second shared the harness's netns: FAIL."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        decoy = {"pid": 10, "shared_with_harness": [], "default_routes": []}
        real = {"pid": 11, "shared_with_harness": ["net"], "namespaces": {"net": HOST_NETNS}}
        ctx.host_view.update({"seen": True, **decoy, "others": [real]})
        report = self.report("refused", "net:[1]", "ENETUNREACH")
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("escaped", Verdict.FAIL)

    def test_an_open_claim_is_not_held_to_the_host_view(self, tmp_path: Path) -> None:
        """Negative control: the open control leg shares the netns by design: no FAIL from it."""
        ctx = _ctx("net_direct_egress", OPEN, tmp_path)
        ctx.host_view.update({"seen": True, "shared_with_harness": ["net"]})
        report = self.report("refused", "net:[1]", "ENETUNREACH")
        assert _verdict(ctx, report, Records(), OK_CONTROL)[1] is not Verdict.FAIL

    def test_success_in_host_namespace_unseen_disagrees(self, tmp_path: Path) -> None:
        """A success in the host's own namespace that the listener never saw is INCONCLUSIVE."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        report = self.report("succeeded", HOST_NETNS)
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("disagree", Verdict.INCONCLUSIVE)

    def test_listener_hit_is_fail_whatever_the_payload_says(self, tmp_path: Path) -> None:
        """A datagram carrying the nonce at the listener is FAIL even if the payload 'refused'."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        report = self.report("refused", "net:[1]", "ECONNREFUSED")
        hit = {"peer": "127.0.0.1:5", "data": f"nonce={ctx.nonce}\n"}
        assert _verdict(ctx, report, Records(direct_udp=[hit]), OK_CONTROL)[1] is Verdict.FAIL

    def test_no_attempt_is_undecided(self, tmp_path: Path) -> None:
        """A payload that errored before its attempt gives INCONCLUSIVE."""
        ctx = _ctx("net_direct_egress", CONFINED, tmp_path)
        report = {"attempts": [_a("probe", "escape", "error")]}
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("undecided", Verdict.INCONCLUSIVE)

    def test_open_leg_unseen_is_inconclusive(self, tmp_path: Path) -> None:
        """On the open control leg a refusal means the probe cannot see its escape."""
        ctx = _ctx("net_direct_egress", OPEN, tmp_path)
        report = self.report("refused", HOST_NETNS, "ECONNREFUSED")
        assert _verdict(ctx, report, Records(), OK_CONTROL)[1] is Verdict.INCONCLUSIVE


class TestDnsResolution:
    """The DNS fixture's query log versus the raw queries."""

    def test_query_logged_is_fail(self, tmp_path: Path) -> None:
        """A logged query carrying the nonce is FAIL under confining claims."""
        ctx = _ctx("dns_resolution", CONFINED, tmp_path)
        report = {"attempts": [_a("udp-query", "escape", "refused", "ETIMEDOUT")]}
        query = {"name": f"{ctx.nonce}.{PROBE_NAME_SUFFIX}.", "qtype": "A", "transport": "udp"}
        assert _verdict(ctx, report, Records(dns=[query]), OK_CONTROL)[1] is Verdict.FAIL

    def test_timeout_and_silence_is_pass(self, tmp_path: Path) -> None:
        """Timeouts with an empty query log and a logged host control give PASS."""
        ctx = _ctx("dns_resolution", NO_NET, tmp_path)
        report = {
            "attempts": [
                _a("udp-query", "escape", "refused", "ETIMEDOUT"),
                _a("tcp-query", "escape", "refused", "ECONNREFUSED"),
            ]
        }
        other = {"name": f"nsomeoneelse.{PROBE_NAME_SUFFIX}.", "qtype": "A", "transport": "udp"}
        assert _verdict(ctx, report, Records(dns=[other]), OK_CONTROL) == ("refused", Verdict.PASS)


class TestIpcUnixSocketEscape:
    """Fake daemon log, the real Docker socket and the socketpair control."""

    @staticmethod
    def report(daemon: str, docker: str, pair: str = "succeeded") -> dict[str, Any]:
        """Fake daemon attempts, one real Docker attempt and the socketpair control."""
        docker_attempt = _a("docker:/run/docker.sock", "escape", docker, status=200)
        docker_attempt["real_docker"] = True
        return {
            "attempts": [
                _a("socketpair", "control", pair),
                _a("daemon-unix", "escape", daemon, "ENOENT"),
                _a("daemon-abstract", "escape", daemon, "ECONNREFUSED"),
                docker_attempt,
            ],
            "facts": {"netns": "net:[1]", "mntns": "mnt:[1]"},
        }

    def test_real_docker_answer_is_fail(self, tmp_path: Path) -> None:
        """A real Docker /_ping answer inside is an escape though no harness witness saw it."""
        ctx = _ctx("ipc_unix_socket_escape", CONFINED, tmp_path)
        escape, verdict = _verdict(ctx, self.report("refused", "succeeded"), Records(), OK_CONTROL)
        assert (escape, verdict) == ("escaped", Verdict.FAIL)

    def test_refused_everywhere_is_pass(self, tmp_path: Path) -> None:
        """ENOENT/ECONNREFUSED on every socket with a silent daemon gives PASS."""
        ctx = _ctx("ipc_unix_socket_escape", CONFINED, tmp_path)
        report = self.report("refused", "refused")
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("refused", Verdict.PASS)

    def test_broken_socketpair_is_inconclusive(self, tmp_path: Path) -> None:
        """Without working unix sockets inside, a refusal proves nothing."""
        ctx = _ctx("ipc_unix_socket_escape", CONFINED, tmp_path)
        report = self.report("refused", "refused", pair="error")
        assert _verdict(ctx, report, Records(), OK_CONTROL)[1] is Verdict.INCONCLUSIVE


@pytest.fixture
def fs_ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CellContext]:
    """A confined fs cell with canaries planted; home is redirected into tmp_path."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    ctx = _ctx("fs_write_outside", CONFINED, tmp_path)
    targets = PROBES["fs_write_outside"].prepare(ctx)
    try:
        # Every named class, plus only the optional ones and what the scan found on this host.
        keys = set(targets["dirs"])
        assert {*CORE_CLASSES, *HOME_CLASSES} <= keys
        extra = keys - {*CORE_CLASSES, *HOME_CLASSES}
        assert all(k in {"var_tmp", "shm", "run_dir"} or k.startswith("found-") for k in extra)
        yield ctx
    finally:
        PROBES["fs_write_outside"].cleanup(ctx)
    assert not FsWriteOutside.canary_dirs(ctx)["tmp"].exists()


def _fs_workspace_done(ctx: CellContext) -> list[dict[str, Any]]:
    """Do on the host what a working payload does in its workspace control dir."""
    d = ctx.workspace / FsWriteOutside.control_name(ctx)
    d.mkdir()
    (d / f"{ctx.nonce}.txt").write_text(f"{ctx.nonce}\n")
    (d / f"{ctx.nonce}.link").symlink_to(ctx.workspace)
    (d / CANARY_NAME).write_text(f"renamed {ctx.nonce}\n")
    ops = ("create", "append", "chmod", "symlink-out", "rename-over")
    return [_a(f"workspace:{op}", "control", "succeeded") for op in ops]


def _fs_report(ctx: CellContext, outcome: str, mntns: str) -> dict[str, Any]:
    escapes = [
        _a(f"{key}:{op}", "escape", outcome, "EROFS" if outcome == "refused" else None)
        for key in ("sibling", "tmp", "home")
        for op in ("create", "append")
    ]
    return {"attempts": _fs_workspace_done(ctx) + escapes, "facts": {"mntns": mntns}}


class TestFsWriteOutside:
    """Canary hashes on the host versus the payload's writes."""

    def test_refused_and_unchanged_is_pass(self, fs_ctx: CellContext) -> None:
        """EROFS everywhere, canaries intact and the workspace writes visible give PASS."""
        report = _fs_report(fs_ctx, "refused", "mnt:[1]")
        assert _verdict(fs_ctx, report, Records(), OK_CONTROL) == ("refused", Verdict.PASS)

    def test_changed_canary_is_fail(self, fs_ctx: CellContext) -> None:
        """An appended canary on the host is FAIL even when the payload says 'refused'."""
        canary = FsWriteOutside.canary_dirs(fs_ctx)["home"] / CANARY_NAME
        with canary.open("a") as fh:
            fh.write("x")
        report = _fs_report(fs_ctx, "refused", "mnt:[1]")
        assert _verdict(fs_ctx, report, Records(), OK_CONTROL) == ("escaped", Verdict.FAIL)

    def test_new_file_in_canary_dir_is_fail(self, fs_ctx: CellContext) -> None:
        """A nonce file appearing in a canary dir is FAIL."""
        (FsWriteOutside.canary_dirs(fs_ctx)["tmp"] / f"{fs_ctx.nonce}.txt").write_text("x")
        report = _fs_report(fs_ctx, "refused", "mnt:[1]")
        assert _verdict(fs_ctx, report, Records(), OK_CONTROL)[1] is Verdict.FAIL

    def test_private_tmpfs_write_is_contained(self, fs_ctx: CellContext) -> None:
        """Writes that succeeded in another mount namespace but left the host intact: PASS."""
        report = _fs_report(fs_ctx, "succeeded", "mnt:[4026530000]")
        assert _verdict(fs_ctx, report, Records(), OK_CONTROL) == ("contained", Verdict.PASS)

    def test_unseen_write_in_host_namespace_disagrees(self, fs_ctx: CellContext) -> None:
        """'Succeeded' in the host's own mount namespace with nothing changed is INCONCLUSIVE."""
        report = _fs_report(fs_ctx, "succeeded", HOST_MNTNS)
        assert _verdict(fs_ctx, report, Records(), OK_CONTROL) == ("disagree", Verdict.INCONCLUSIVE)

    def test_workspace_not_visible_is_inconclusive(self, fs_ctx: CellContext) -> None:
        """A workspace control the host cannot see makes the refusal INCONCLUSIVE."""
        report = _fs_report(fs_ctx, "refused", "mnt:[1]")
        (fs_ctx.workspace / FsWriteOutside.control_name(fs_ctx) / f"{fs_ctx.nonce}.txt").unlink()
        assert _verdict(fs_ctx, report, Records(), OK_CONTROL)[1] is Verdict.INCONCLUSIVE


class TestCapabilities:
    """The transfer and pip install need the payload and the origin logs to agree."""

    @staticmethod
    def blob_entry(nonce: str, sent: int = BLOB_SIZE) -> dict[str, Any]:
        """The allowed origin's log entry for a blob response of `sent` bytes."""
        return {
            "host": "allowed",
            "path": f"/c/{nonce}/blob",
            "status": 200,
            "bytes_sent": sent,
            "complete": sent == BLOB_SIZE,
            "nonce": nonce,
        }

    def test_transfer_seen_is_pass(self, tmp_path: Path) -> None:
        """A matching hash and one complete full-size response give PASS."""
        ctx = _ctx("net_transfer_18mib", CONFINED, tmp_path)
        report = {"attempts": [_a("blob-https", "capability", "succeeded", status=200)]}
        witness = Records(origin=[self.blob_entry(ctx.nonce)])
        assert _verdict(ctx, report, witness, OK_CONTROL) == ("escaped", Verdict.PASS)

    def test_transfer_truncated_on_host_disagrees(self, tmp_path: Path) -> None:
        """A payload 'success' the origin logged as truncated is INCONCLUSIVE."""
        ctx = _ctx("net_transfer_18mib", CONFINED, tmp_path)
        report = {"attempts": [_a("blob-https", "capability", "succeeded", status=200)]}
        witness = Records(origin=[self.blob_entry(ctx.nonce, sent=1024)])
        assert _verdict(ctx, report, witness, OK_CONTROL) == ("disagree", Verdict.INCONCLUSIVE)

    def test_transfer_without_network_refused_is_pass(self, tmp_path: Path) -> None:
        """With network 'none' declared, a refused transfer and silent origin give PASS."""
        ctx = _ctx("net_transfer_18mib", NO_NET, tmp_path)
        report = {"attempts": [_a("blob-https", "capability", "refused", "ECONNREFUSED")]}
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("refused", Verdict.PASS)

    @staticmethod
    def pip_report(denied_status: int | None = 403) -> dict[str, Any]:
        """A successful install + import and the denied-index control."""
        return {
            "attempts": [
                _a("pip-install", "capability", "succeeded"),
                _a("import", "capability", "succeeded"),
                _a("pip-install-denied", "control", "refused", status=denied_status),
            ]
        }

    def test_pip_cross_host_is_pass(self, tmp_path: Path) -> None:
        """Install + import, both hosts logged and the denied index's 403 give PASS."""
        ctx = _ctx("pkg_pip_install", CONFINED, tmp_path)
        hits = [{"host": h, "status": 200, "nonce": ctx.nonce} for h in ("index", "files")]
        witness = Records(origin=hits)
        assert _verdict(ctx, self.pip_report(), witness, OK_CONTROL) == ("escaped", Verdict.PASS)

    def test_pip_without_files_host_disagrees(self, tmp_path: Path) -> None:
        """An install the files host never served (no cross-host hop seen) is INCONCLUSIVE."""
        ctx = _ctx("pkg_pip_install", CONFINED, tmp_path)
        witness = Records(origin=[{"host": "index", "status": 200, "nonce": ctx.nonce}])
        assert _verdict(ctx, self.pip_report(), witness, OK_CONTROL) == (
            "disagree",
            Verdict.INCONCLUSIVE,
        )

    def test_pip_denied_index_not_403_is_inconclusive(self, tmp_path: Path) -> None:
        """When the denied index fails for another reason than 403, the control failed."""
        ctx = _ctx("pkg_pip_install", CONFINED, tmp_path)
        hits = [{"host": h, "status": 200, "nonce": ctx.nonce} for h in ("index", "files")]
        verdict = _verdict(ctx, self.pip_report(None), Records(origin=hits), OK_CONTROL)[1]
        assert verdict is Verdict.INCONCLUSIVE


class TestPipUnderNoNetwork:
    """Where no network is declared, only a network refusal counts, and any fetch escapes."""

    @staticmethod
    def failed(stderr: str) -> dict[str, Any]:
        """The payload's attempt for a pip run that exited 1 with `stderr`."""
        proc = subprocess.CompletedProcess(["pip"], 1, stdout="", stderr=stderr)
        attempt: dict[str, Any] = _payload("pkg_pip_install").failed_install(
            "pip-install", "capability", proc
        )
        return attempt

    def test_pip_missing_is_an_error_not_a_refusal(self) -> None:
        """'No module named pip' opened no socket: it says nothing about the sandbox."""
        attempt = self.failed("/usr/bin/python3: No module named pip\n")
        assert attempt["outcome"] == "error"
        assert "No module named pip" in attempt["detail"]

    def test_missing_ca_bundle_is_an_error(self) -> None:
        """A bad --cert path is the harness's problem, not a refusal."""
        attempt = self.failed("ERROR: Could not find a suitable TLS CA certificate bundle\n")
        assert attempt["outcome"] == "error"

    @pytest.mark.parametrize(
        ("stderr", "status"),
        [
            ("WARNING: Retrying ... 'Tunnel connection failed: 403 Forbidden'", 403),
            (
                "ProxyError: NewConnectionError: [Errno 101] Network is unreachable",
                None,
            ),
            ("Failed to establish a new connection: [Errno 111] Connection refused", None),
        ],
    )
    def test_network_refusal_is_refused(self, stderr: str, status: int | None) -> None:
        """The proxy's 403 or a socket the network refused is a refusal."""
        attempt = self.failed(stderr)
        assert (attempt["outcome"], attempt["status"]) == ("refused", status)

    def test_index_fetched_without_files_is_fail(self, tmp_path: Path) -> None:
        """A fetched index page is traffic that must not exist, whatever became of pip."""
        ctx = _ctx("pkg_pip_install", NO_NET, tmp_path)
        report = {"attempts": [_a("pip-install", "capability", "refused")]}
        hit = {"host": "index", "status": 200, "nonce": ctx.nonce, "path": "/c/x/simple/p/"}
        assert _verdict(ctx, report, Records(origin=[hit]), OK_CONTROL) == (
            "escaped",
            Verdict.FAIL,
        )

    def test_any_tagged_entry_is_fail(self, tmp_path: Path) -> None:
        """Even a failed (non-200) fetch with the nonce reached an origin."""
        ctx = _ctx("pkg_pip_install", NO_NET, tmp_path)
        report = {"attempts": [_a("pip-install", "capability", "refused")]}
        hit = {"host": "files", "status": 404, "nonce": ctx.nonce, "path": "/x.whl"}
        assert _verdict(ctx, report, Records(origin=[hit]), OK_CONTROL)[1] is Verdict.FAIL

    def test_refused_and_silent_is_pass(self, tmp_path: Path) -> None:
        """A network refusal with silent origins is PASS where no network is declared."""
        ctx = _ctx("pkg_pip_install", NO_NET, tmp_path)
        report = {"attempts": [_a("pip-install", "capability", "refused")]}
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("refused", Verdict.PASS)

    def test_pip_error_is_inconclusive(self, tmp_path: Path) -> None:
        """A pip that never tried the network proves nothing."""
        ctx = _ctx("pkg_pip_install", NO_NET, tmp_path)
        report = {"attempts": [_a("pip-install", "capability", "error")]}
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("undecided", Verdict.INCONCLUSIVE)

    def test_import_mismatch_says_why(self, tmp_path: Path) -> None:
        """The rewrite of 'succeeded' to 'refused' names its reason."""
        ctx = _ctx("pkg_pip_install", CONFINED, tmp_path)
        report = {
            "attempts": [
                _a("pip-install", "capability", "succeeded"),
                _a("import", "capability", "refused"),
            ]
        }
        assessment = PROBES["pkg_pip_install"].assess(ctx, report, Records(), OK_CONTROL)
        assert any("import did not print" in r for r in assessment.reasons)


class TestTransferUnderNoNetwork:
    """Where no network is declared, the origin's log decides, never the payload's word."""

    @staticmethod
    def entry(nonce: str, sent: int, *, complete: bool) -> dict[str, Any]:
        """The allowed origin's log entry for a blob response."""
        return {
            "host": "allowed",
            "path": f"/c/{nonce}/blob",
            "bytes_sent": sent,
            "complete": complete,
            "nonce": nonce,
        }

    @pytest.mark.parametrize(("sent", "complete"), [(1000, False), (BLOB_SIZE, True)])
    def test_any_transfer_logged_is_fail(self, tmp_path: Path, sent: int, complete: bool) -> None:
        """A partial or complete logged transfer is FAIL, though the payload 'refused'."""
        ctx = _ctx("net_transfer_18mib", NO_NET, tmp_path)
        report = {"attempts": [_a("blob-https", "capability", "refused", status=200)]}
        witness = Records(origin=[self.entry(ctx.nonce, sent, complete=complete)])
        assert _verdict(ctx, report, witness, OK_CONTROL) == ("escaped", Verdict.FAIL)

    def test_no_proxy_is_an_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """'from-env' with no proxy in the environment dialled nothing: not a refusal."""
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        task = {"nonce": "n1", "proxy_url": "from-env", "targets": {"host": "a", "port": 1}}
        attempt = _payload("net_transfer_18mib").transfer(task, {"facts": {}})
        assert attempt["outcome"] == "error"

    def test_payload_error_is_inconclusive(self, tmp_path: Path) -> None:
        """A hash mismatch or missing route (an error) with silent origins proves nothing."""
        ctx = _ctx("net_transfer_18mib", NO_NET, tmp_path)
        report = {"attempts": [_a("blob-https", "capability", "error", status=200)]}
        assert _verdict(ctx, report, Records(), OK_CONTROL) == ("undecided", Verdict.INCONCLUSIVE)


@pytest.mark.parametrize(
    ("probe", "function", "args"),
    [
        ("net_direct_egress", "tcp", ("tcp-direct", "127.0.0.1:9", "n1")),
        ("net_direct_egress", "udp", ("udp-direct", "127.0.0.1:9", "n1")),
        ("net_loopback_services", "tcp_service", ("127.0.0.1:9", "n1")),
        (
            "net_loopback_services",
            "http_origin",
            ({"address": "127.0.0.1", "port": 9, "host": "allowed.test"}, "n1"),
        ),
        ("net_proxy_env_override", "http_get", ("direct", "127.0.0.1:9", "/ok", "h", "n1")),
        ("net_ipv6_udp_icmp", "tcp", ("tcp6", "[::1]:9", "n1")),
        ("dns_resolution", "query", ("udp-query", "udp", "127.0.0.1:9", f"n1.{PROBE_NAME_SUFFIX}")),
    ],
)
def test_socket_refused_by_seccomp_is_a_refusal(
    monkeypatch: pytest.MonkeyPatch, probe: str, function: str, args: tuple[Any, ...]
) -> None:
    """EPERM from socket() itself is the sandbox refusing that attempt, reported with errno."""
    payload = _payload(probe)

    def refuse(*_: Any, **__: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(payload.socket, "socket", refuse)
    result = getattr(payload, function)(*args)
    assert (result["outcome"], result["errno"]) == ("refused", "EPERM")


DEAD_CONTROL: dict[str, Any] = {
    "ok": False,
    "nonce": "hcontrol",
    "checks": [{"what": "host tcp connect", "ok": False, "detail": "ECONNREFUSED"}],
}


class TestReasons:
    """A verdict's reason names what failed and why, once."""

    @pytest.mark.parametrize(
        ("probe", "declared", "what"),
        [
            ("net_direct_egress", CONFINED, "tcp-direct"),
            ("dns_resolution", CONFINED, "udp-query"),
            ("net_transfer_18mib", NO_NET, "blob-https"),
            ("pkg_pip_install", NO_NET, "pip-install"),
        ],
    )
    def test_failed_host_control_names_its_check(
        self, tmp_path: Path, probe: str, declared: DeclaredClaims, what: str
    ) -> None:
        """'host control failed' alone sends the reader to the logs; the check says why."""
        ctx = _ctx(probe, declared, tmp_path)
        role = "capability" if probe in {"net_transfer_18mib", "pkg_pip_install"} else "escape"
        report = {"attempts": [_a(what, role, "refused")], "facts": {}}
        reasons = PROBES[probe].assess(ctx, report, Records(), DEAD_CONTROL).reasons
        assert "host control failed: host tcp connect (ECONNREFUSED)" in reasons

    def test_failed_attempt_carries_its_detail(self, tmp_path: Path) -> None:
        """An error's own words (here a missing pip) reach the verdict, once."""
        ctx = _ctx("pkg_pip_install", NO_NET, tmp_path)
        attempt = _a("pip-install", "capability", "error")
        attempt["detail"] = "/usr/bin/python3: No module named pip"
        assessment = PROBES["pkg_pip_install"].assess(
            ctx, {"attempts": [attempt]}, Records(), OK_CONTROL
        )
        reason = decide("denied", assessment).reason
        assert "pip-install error: /usr/bin/python3: No module named pip" in reason
        assert "could not make its attempt" not in reason


class TestConclude:
    """The one place both controls are combined, in its short and its old keyword form."""

    def test_host_only_form(self) -> None:
        """Without `inside`, only the host control counts and its failed check is named."""
        assessment = conclude("refused", "refused", [], host_control=DEAD_CONTROL, witness={})
        assert not assessment.controls_ok
        assert assessment.control == {"host": DEAD_CONTROL}
        assert assessment.reasons == ["host control failed: host tcp connect (ECONNREFUSED)"]

    def test_inside_form_derives_its_message(self) -> None:
        """A failed in-sandbox control is summarised from its attempts."""
        inside = [_a("get-allowed", "control", "refused", status=502)]
        assessment = conclude(
            "refused",
            "refused",
            [],
            inside=inside,
            inside_ok=False,
            host_control=OK_CONTROL,
            witness={},
        )
        assert not assessment.controls_ok
        assert assessment.control == {"inside": inside, "host": OK_CONTROL}
        assert assessment.reasons == ["in-sandbox control failed: get-allowed refused (502)"]

    def test_inside_without_its_verdict_is_refused(self) -> None:
        """Controls with no word on whether they held must not default to 'held'."""
        with pytest.raises(TypeError, match="inside_ok"):
            conclude("refused", "refused", [], inside=[], host_control=OK_CONTROL, witness={})

    def test_old_keyword_form_still_works(self) -> None:
        """The other assessors' call shape gives the same assessment as before."""
        assessment = conclude(
            "refused",
            "refused",
            [],
            inside_ok=False,
            inside_failed="workspace control failed",
            host_control=DEAD_CONTROL,
            host_failed="host could not read back its canaries",
            witness={"w": 1},
            controls={"inside": [], "host": DEAD_CONTROL},
        )
        assert not assessment.controls_ok
        assert assessment.reasons == [
            "workspace control failed",
            "host could not read back its canaries: host tcp connect (ECONNREFUSED)",
        ]
        assert assessment.control == {"inside": [], "host": DEAD_CONTROL}


def test_poll_waits_for_a_lagging_witness(monkeypatch: pytest.MonkeyPatch) -> None:
    """_poll re-reads until the entry shows, and gives the last read when it never does."""
    reads = iter([[], [], ["entry"]])
    assert records.poll_until(lambda: next(reads), bool) == ["entry"]
    monkeypatch.setattr(records, "WITNESS_WAIT_S", 0.1)
    assert records.poll_until(list, bool) == []
