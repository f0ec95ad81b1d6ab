"""The probes about the host around the sandbox (fs, env, ipc route, lifecycle), live and unit.

Live tests drive the real runner with the real running world and real backends: the control
leg (`none`), bubblewrap as configured, and bubblewrap with one deliberate hole each, plus a
test-only backend that forwards the host's environment. Unit tests feed each assessor
hand-made reports against real planted files (no world needed: a tiny stand-in carries the
paths the specs read).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import (
    Availability,
    Backend,
    DeclaredClaims,
    ProbeRequest,
    ProbeRun,
)
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.backends.process import run_process
from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.canary import dir_canary_diff, dir_canary_state
from sandbox_attest.catalog.env import ENV_PREFIX, EnvInheritance, salted_hash
from sandbox_attest.catalog.fs import FsLinkEscape, FsProtectedInWorkspace, FsReadSecrets
from sandbox_attest.catalog.ipc.proxy_socket import IpcProxySocketTamper
from sandbox_attest.catalog.lifecycle import ORPHAN_MARKER, LifecycleOrphans, find_orphans
from sandbox_attest.errors import FixtureError
from sandbox_attest.host.trust import payload_user
from sandbox_attest.payload import payload_env
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner, inside_route
from sandbox_attest.verdict import Verdict, decide
from sandbox_attest.world.core import World, start_world
from sandbox_attest.world.info import (
    BlobInfo,
    DaemonInfo,
    DirectEgressInfo,
    DnsInfo,
    HostInfo,
    IndexInfo,
    ProxyInfo,
    WorldInfo,
)

HOST_PROBES = (
    "fs_read_secrets",
    "fs_protected_in_workspace",
    "fs_link_escape",
    "env_inheritance",
    "ipc_proxy_socket_tamper",
    "lifecycle_orphans",
)
OPEN = DeclaredClaims(network="open", filesystem="open", ipc="open")
CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
OK_CONTROL: dict[str, Any] = {"ok": True, "nonce": "hcontrol", "checks": []}
FAILED_CONTROL: dict[str, Any] = {"ok": False, "nonce": "hcontrol", "checks": []}


# ---------------------------------------------------------------------------------------------
# Live: one world for the module, the real runner.


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


class ForwardsHostEnv(NoneBackend):
    """A careless wrapper: runs the payload with the host's environment under the declared one."""

    name = "leaky-env"

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run like the control leg, but with os.environ merged in."""
        env = {**os.environ, **request.env}
        return run_process(
            request.cell_id, list(request.argv), env, request.workspace, request.timeout
        )


def make_runner(world: World, tmp_path: Path, backends: dict[str, Backend]) -> CellRunner:
    """A runner over `backends` (the control leg always included); all must be available."""
    everything: dict[str, Backend] = {"none": NoneBackend(), **backends}
    availability: dict[str, Availability] = {n: b.availability() for n, b in everything.items()}
    for name, avail in availability.items():
        assert avail.ok, f"{name} must be available for these tests: {avail.reason}"
    return CellRunner(
        world=world,
        scratch=tmp_path,
        backends=everything,
        availability=availability,
        platform="linux",
    )


def cell(backend: str, probe: str, timeout: float = 30) -> Cell:
    """A matrix cell."""
    return Cell(backend, ProbeRow(probe, timeout), None)


def verdict(entry: Mapping[str, Any]) -> str:
    """The verdict with its reason, for assertion messages."""
    return f"{entry['verdict']}: {entry['reason']}"


@pytest.fixture(scope="module")
def live(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CellEntry]:
    """Every host probe on the control leg, then under bubblewrap, in one runner (as a run)."""
    runner = make_runner(
        world, tmp_path_factory.mktemp("live"), {"bubblewrap": BubblewrapBackend()}
    )
    entries: dict[str, CellEntry] = {}
    for probe in HOST_PROBES:
        entries[f"none-{probe}"] = runner.run_cell(cell("none", probe))
        entries[f"bubblewrap-{probe}"] = runner.run_cell(cell("bubblewrap", probe))
    return entries


class TestControlLeg:
    @pytest.mark.parametrize("probe", HOST_PROBES)
    def test_passes_unconfined(self, live: dict[str, dict[str, Any]], probe: str) -> None:
        """On the open control leg every host probe PASSes: its escape (or leak check) works."""
        entry = live[f"none-{probe}"]
        assert entry["verdict"] == "PASS", verdict(entry)

    @pytest.mark.parametrize(
        "probe",
        ["fs_read_secrets", "fs_link_escape", "ipc_proxy_socket_tamper", "lifecycle_orphans"],
    )
    def test_escape_is_seen_unconfined(self, live: dict[str, dict[str, Any]], probe: str) -> None:
        """Unconfined, the host witness sees the escape itself, not just a payload's claim."""
        assert live[f"none-{probe}"]["escape"] == "escaped", verdict(live[f"none-{probe}"])

    def test_setsid_children_escape_the_runners_group_kill(
        self, live: dict[str, dict[str, Any]]
    ) -> None:
        """The runner's process-group kill stops the background child, not setsid or daemon."""
        witness = live["none-lifecycle_orphans"]["witness"]
        assert witness["survivors"] == ["daemon", "setsid"], witness

    def test_env_is_scrubbed_by_the_runner(self, live: dict[str, dict[str, Any]]) -> None:
        """The runner gives the payload none of the harness's canary variables on any leg."""
        entry = live["none-env_inheritance"]
        assert entry["escape"] == "refused", verdict(entry)
        assert not any(n.startswith(ENV_PREFIX) for n in entry["witness"]["payload_env_names"])
        os.environ[f"{ENV_PREFIX}UNIT"] = "x"
        try:
            assert f"{ENV_PREFIX}UNIT" not in payload_env("http://127.0.0.1:1", Path("/w"))
        finally:
            del os.environ[f"{ENV_PREFIX}UNIT"]


class TestBubblewrap:
    @pytest.mark.parametrize("probe", [p for p in HOST_PROBES if p != "fs_protected_in_workspace"])
    def test_passes_under_bubblewrap(self, live: dict[str, dict[str, Any]], probe: str) -> None:
        """Under bubblewrap as configured every host probe PASSes, with its controls working."""
        entry = live[f"bubblewrap-{probe}"]
        assert entry["verdict"] == "PASS", verdict(entry)

    def test_protected_paths_are_not_applicable_without_the_claim(
        self, live: dict[str, dict[str, Any]]
    ) -> None:
        """The bubblewrap backend claims no protected paths: the probe of that claim never runs."""
        entry = live["bubblewrap-fs_protected_in_workspace"]
        assert entry["verdict"] == "NOT_APPLICABLE", verdict(entry)
        assert entry["reason"] == "the backend claims no protected paths inside the workspace"
        assert "nonce" not in entry  # decided before anything was planted or run

    @pytest.mark.parametrize(
        ("probe", "escape"),
        [
            ("fs_read_secrets", "refused"),
            ("fs_link_escape", "refused"),
            ("env_inheritance", "refused"),
            ("ipc_proxy_socket_tamper", "refused"),
            ("lifecycle_orphans", "contained"),
        ],
    )
    def test_reading(self, live: dict[str, dict[str, Any]], probe: str, escape: str) -> None:
        """Each probe's reading under bubblewrap is the one its declared claim calls for."""
        assert live[f"bubblewrap-{probe}"]["escape"] == escape, verdict(live[f"bubblewrap-{probe}"])

    def test_protected_paths_are_reported_as_exposure_on_the_control_leg(
        self, live: dict[str, dict[str, Any]]
    ) -> None:
        """On the open leg the hook and rc writes are shown, as the exposure a claim would close."""
        entry = live["none-fs_protected_in_workspace"]
        assert entry["verdict"] == "PASS", verdict(entry)
        assert "exposure: the payload planted bashrc, git-config, git-hook" in entry["reason"]

    def test_route_attacked_inside_is_refused_read_only(
        self, live: dict[str, dict[str, Any]]
    ) -> None:
        """Inside bwrap the mounted socket and shim are attacked and refused (EROFS/EBUSY)."""
        entry = live["bubblewrap-ipc_proxy_socket_tamper"]
        assert entry["probe_facts"]["sandbox_route_tried"] is True
        inside = [a for a in entry["attempts"] if str(a["what"]).startswith("sandbox:")]
        assert len(inside) == 6
        assert {a["outcome"] for a in inside} == {"refused"}
        assert {a["errno"] for a in inside} <= {"EROFS", "EBUSY", "EPERM", "EACCES"}

    def test_control_leg_never_touches_the_real_route(
        self, live: dict[str, dict[str, Any]]
    ) -> None:
        """On the control leg only the decoy is attacked; the real socket and shim are intact."""
        entry = live["none-ipc_proxy_socket_tamper"]
        assert entry["probe_facts"]["sandbox_route_tried"] is False
        assert set(entry["witness"]["changed"]) <= {"decoy-socket", "decoy-shim", "decoy-dir"}

    def test_nothing_is_left_behind(self, live: dict[str, dict[str, Any]]) -> None:
        """After every cell: no orphan alive, no canary in $HOME, no canary variable set."""
        nonces = [e["nonce"] for e in live.values() if "nonce" in e]
        assert len(nonces) >= len(live) - 1  # only the NOT_APPLICABLE cell ran nothing
        assert all(find_orphans(n) == [] for n in nonces)
        user = payload_user()
        homes = {Path.home(), *([user.home] if user is not None else [])}
        left = [
            p
            for home in homes
            for d in (".ssh", ".aws", ".docker")
            for p in (home / d).glob("*")
            if any(n in p.name for n in nonces)
        ]
        assert left == []
        assert not any(k.startswith(ENV_PREFIX) for k in os.environ)


@pytest.fixture
def home_scratch() -> Iterator[Path]:
    """Cell scratch outside /tmp: bwrap mounts a fresh /tmp even over a writable host root.

    /var/tmp, not the harness user's home: the payload user must reach it, as it reaches a
    real run's scratch.
    """
    path = Path("/var/tmp") / f".sandbox-attest-test-{secrets.token_hex(6)}"
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class TestWeakened:
    @pytest.mark.parametrize(
        ("probe", "needle"),
        [
            ("fs_read_secrets", "the payload read the host's canary bytes"),
            ("fs_link_escape", "host sees the canary reached: sibling"),
            ("ipc_proxy_socket_tamper", "host sees: decoy-"),
        ],
    )
    def test_host_root_rw_fails(
        self, world: World, home_scratch: Path, probe: str, needle: str
    ) -> None:
        """With the host root bound writable, the probe's host witness sees the escape: FAIL."""
        runner = make_runner(
            world,
            home_scratch,
            {"bubblewrap": BubblewrapBackend(weaken=frozenset({"host-root-rw"}))},
        )
        entry = runner.run_cell(cell("bubblewrap", probe))
        assert verdict(entry).startswith("FAIL: escape observed by the host"), verdict(entry)
        assert needle in entry["reason"]

    def test_no_die_with_parent_lets_orphans_survive(self, world: World, tmp_path: Path) -> None:
        """Without --die-with-parent bwrap's init outlives the payload, and so do its children."""
        runner = make_runner(
            world,
            tmp_path,
            {"bubblewrap": BubblewrapBackend(weaken=frozenset({"no-die-with-parent"}))},
        )
        entry = runner.run_cell(cell("bubblewrap", "lifecycle_orphans"))
        assert verdict(entry).startswith("FAIL: escape observed by the host"), verdict(entry)
        assert "children outlived the payload" in entry["reason"]
        assert find_orphans(entry["nonce"]) == []  # cleanup (or their own lifetime) ended them

    def test_forwarded_host_env_fails(self, world: World, tmp_path: Path) -> None:
        """A backend that forwards the host's environment leaks the canaries: FAIL."""
        runner = make_runner(world, tmp_path, {"leaky-env": ForwardsHostEnv()})
        entry = runner.run_cell(cell("leaky-env", "env_inheritance"))
        assert verdict(entry).startswith("FAIL: escape observed by the host"), verdict(entry)
        assert "canary variables reached the payload" in entry["reason"]
        assert "undeclared host variables reached the payload" in entry["reason"]


# ---------------------------------------------------------------------------------------------
# Unit: each assessor's decision table with hand-made reports.


@dataclass
class Records:
    """Empty witness records (these probes' witnesses are files, env and processes)."""

    origin: list[dict[str, Any]] = field(default_factory=list)
    dns: list[dict[str, Any]] = field(default_factory=list)
    proxy: list[dict[str, Any]] = field(default_factory=list)
    direct_tcp: list[dict[str, Any]] = field(default_factory=list)
    direct_udp: list[dict[str, Any]] = field(default_factory=list)
    daemon: list[dict[str, Any]] = field(default_factory=list)


def stub_info(proxy_socket: Path) -> WorldInfo:
    """A WorldInfo whose only real path is the proxy socket; nothing listens anywhere."""
    hosts = {
        key: HostInfo(name=f"{key}.test", address="127.0.0.1", https_port=1443, http_port=1080)
        for key in ("allowed", "denied", "index", "files")
    }
    return WorldInfo(
        proxy=ProxyInfo(url="http://u:s@127.0.0.1:9", socket=str(proxy_socket), port=9),
        ca_bundle="/nonexistent/ca.pem",
        dns=DnsInfo(host="127.0.0.1", port=9),
        hosts=hosts,
        blob=BlobInfo(url="https://allowed.test:1443/blob", size=1, sha256="0" * 64),
        index=IndexInfo(
            url_template="",
            denied_url_template="",
            package="p",
            module="p",
            version="1",
            wheel_nonce="w",
        ),
        direct_egress=DirectEgressInfo(tcp="127.0.0.1:9", udp="127.0.0.1:9"),
        daemon=DaemonInfo(unix="/nonexistent.sock", abstract=None),
        run_dir="/nonexistent",
    )


@dataclass
class StubWorld:
    """Carries only the paths the host specs read; its records are always empty."""

    info: WorldInfo

    def records(self, nonce: str) -> Records:
        """No fixture logs: these probes do not use them."""
        del nonce
        return Records()


def stub_cell(probe: str, tmp: Path, host_view: dict[str, Any]) -> CellContext:
    """A confined command-wrapper cell of `probe` under `tmp`, with `host_view` as read."""
    return CellContext(
        probe=probe,
        backend="unit",
        nonce="n" + secrets.token_hex(8),
        world=StubWorld(stub_info(tmp / "real.sock")),
        workspace=tmp,
        cell_dir=tmp,
        claims=CONFINED,
        route=inside_route(),
        host_view=host_view,
    )


@pytest.fixture
def make_ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Build CellContexts under tmp_path; run each spec's cleanup afterwards.

    HOME is a fresh dir under tmp_path for the fixture's whole life (cleanups included): these
    contexts have no payload user, so fs_read_secrets plants in $HOME, which must never be the
    real one (it once left empty ~/.ssh, ~/.aws and ~/.docker in root's home).
    """
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    made: list[tuple[Any, CellContext]] = []

    def make(
        spec: Any, declared: DeclaredClaims = CONFINED, shim: Path | None = None
    ) -> CellContext:
        nonce = "n" + secrets.token_hex(8)
        cell_dir = tmp_path / nonce
        (cell_dir / "workspace").mkdir(parents=True)
        real_socket = tmp_path / "real.sock"
        real_socket.touch()
        world = StubWorld(stub_info(real_socket))
        ctx = CellContext(
            probe=spec.id,
            backend="unit",
            nonce=nonce,
            world=world,
            workspace=cell_dir / "workspace",
            cell_dir=cell_dir,
            claims=declared,
            route=dataclasses.replace(inside_route(), shim_source=shim) if shim else inside_route(),
        )
        made.append((spec, ctx))
        return ctx

    yield make
    for spec, ctx in made:
        spec.cleanup(ctx)


def att(what: str, role: str, outcome: str, **extra: Any) -> dict[str, Any]:
    """One attempt as a payload reports it."""
    return {
        "what": what,
        "role": role,
        "outcome": outcome,
        "errno": extra.pop("errno", None),
        "status": None,
        "detail": "",
        **extra,
    }


def report(*attempts: dict[str, Any], **facts: Any) -> dict[str, Any]:
    """A payload report."""
    return {"probe": "x", "nonce": "n", "attempts": list(attempts), "facts": facts}


class TestReadSecretsTable:
    def _hashes(self, ctx: CellContext) -> dict[str, str]:
        return dict(json.loads((ctx.cell_dir / "host-state.json").read_text())["hashes"])

    def test_matching_hash_is_fail_even_if_reported_refused(self, make_ctx: Any) -> None:
        """A report carrying a canary's hash proves the read, whatever its outcome says."""
        spec = FsReadSecrets()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        hashes = self._hashes(ctx)
        rep = report(
            att("workspace", "control", "succeeded", sha256=hashes["workspace"]),
            att("ssh", "escape", "succeeded", sha256=hashes["ssh"]),
            att("aws", "escape", "refused", errno="ENOENT"),
        )
        decision = decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.FAIL
        assert "ssh" in decision.reason

    def test_refusals_with_working_control_pass(self, make_ctx: Any) -> None:
        """Every read refused and the workspace read right: PASS."""
        spec = FsReadSecrets()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        hashes = self._hashes(ctx)
        escapes = [
            att(k, "escape", "refused", errno="ENOENT") for k in ("ssh", "aws", "docker", "dotenv")
        ]
        rep = report(att("workspace", "control", "succeeded", sha256=hashes["workspace"]), *escapes)
        control = spec.host_control(ctx)
        assert control["ok"]
        assert decide("denied", spec.assess(ctx, rep, Records(), control)).verdict is Verdict.PASS

    def test_wrong_workspace_hash_is_inconclusive(self, make_ctx: Any) -> None:
        """A payload whose own workspace read hashes wrong cannot vouch for its refusals."""
        spec = FsReadSecrets()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        rep = report(
            att("workspace", "control", "succeeded", sha256="0" * 64),
            att("ssh", "escape", "refused", errno="ENOENT"),
        )
        decision = decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.INCONCLUSIVE

    def test_other_bytes_in_a_private_view_are_contained(self, make_ctx: Any) -> None:
        """A read that got other bytes in another mount namespace is not the host's secret."""
        spec = FsReadSecrets()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        hashes = self._hashes(ctx)
        rep = report(
            att("workspace", "control", "succeeded", sha256=hashes["workspace"]),
            att("ssh", "escape", "succeeded", sha256="1" * 64),
            mntns="mnt:[1]",
        )
        assessment = spec.assess(ctx, rep, Records(), OK_CONTROL)
        assert assessment.escape == "contained"
        assert decide("denied", assessment).verdict is Verdict.PASS

    def test_failed_planting_names_the_probe_and_leaves_nothing(
        self, make_ctx: Any, tmp_path: Path
    ) -> None:
        """A canary that cannot be planted is a FixtureError; dirs made before it go away."""
        home = tmp_path / "home"  # make_ctx's HOME
        (home / ".docker").write_text("not a folder")  # the third canary cannot go here
        spec = FsReadSecrets()
        ctx = make_ctx(spec)
        with pytest.raises(FixtureError, match=r"fs_read_secrets: could not plant the canary"):
            spec.prepare(ctx)
        assert (home / ".ssh").is_dir()
        spec.cleanup(ctx)
        assert sorted(p.name for p in home.iterdir()) == [".docker"]

    def test_cleanup_removes_only_its_canaries(self, make_ctx: Any) -> None:
        """Cleanup removes the nonce-named canaries and leaves $HOME's other files alone."""
        spec = FsReadSecrets()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        paths = spec.secret_paths(ctx)
        assert all(p.exists() for p in paths.values())
        spec.cleanup(ctx)
        assert not any(p.exists() for p in paths.values())


class TestProtectedTable:
    def test_expectation_flips_with_a_protected_claim(self) -> None:
        """Allowed without a protected-paths claim; denied once the claims declare one."""
        spec = FsProtectedInWorkspace()
        protected = DeclaredClaims("proxy", "workspace", "isolated", protected=(".git/hooks",))
        assert spec.expectation(CONFINED) == "allowed"
        assert spec.expectation(protected) == "denied"

    def test_forged_refusal_with_planted_hook_is_fail_when_protected(self, make_ctx: Any) -> None:
        """A 'refused' report while the host finds the nonce in the hook is FAIL under a claim."""
        spec = FsProtectedInWorkspace()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        hook = ctx.workspace / ".git/hooks/pre-commit"
        hook.write_text(f"#!/bin/sh\n# {ctx.nonce}\n")
        hook.chmod(0o755)
        rep = report(
            att("workspace-file", "control", "succeeded"),
            att("git-hook", "escape", "refused", errno="EROFS"),
        )
        (ctx.workspace / spec.control_name(ctx)).write_text(ctx.nonce)
        assert (
            decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL)).verdict is Verdict.FAIL
        )

    def test_dead_control_is_inconclusive(self, make_ctx: Any) -> None:
        """Without the sibling-file control, a refusal proves nothing."""
        spec = FsProtectedInWorkspace()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        rep = report(
            att("workspace-file", "control", "refused", errno="EROFS"),
            att("git-hook", "escape", "refused", errno="EROFS"),
        )
        assert decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL)).verdict is (
            Verdict.INCONCLUSIVE
        )


class TestLinkEscapeTable:
    def test_forged_refusal_with_changed_canary_is_fail(self, make_ctx: Any) -> None:
        """A payload that says 'refused' while the canary got a hardlink is FAIL."""
        spec = FsLinkEscape()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        canary = spec.canaries(ctx)["sibling"]
        os.link(canary, ctx.workspace / "stolen")  # what the lying payload really did
        rep = report(att("sibling:hardlink", "escape", "refused", errno="EPERM"))
        decision = decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.FAIL
        assert "nlink" in decision.reason

    def test_dead_control_is_inconclusive(self, make_ctx: Any) -> None:
        """Refusals without the workspace link controls seen from the host: INCONCLUSIVE."""
        spec = FsLinkEscape()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        rep = report(att("sibling:hardlink", "escape", "refused", errno="ENOENT"))
        assert decide(
            "denied", spec.assess(ctx, rep, Records(), spec.host_control(ctx))
        ).verdict is (Verdict.INCONCLUSIVE)


class TestEnvTable:
    def _prepared(self, make_ctx: Any) -> tuple[EnvInheritance, CellContext, dict[str, Any]]:
        spec = EnvInheritance()
        ctx = make_ctx(spec)
        targets = spec.prepare(ctx)
        return spec, ctx, targets

    def _report(
        self, ctx: CellContext, salt: str, env: dict[str, str], fds: dict[str, str]
    ) -> dict[str, Any]:
        hashed = {n: salted_hash(salt, v) for n, v in env.items()}
        return report(
            att(
                "env-declared",
                "control",
                "succeeded",
                check_hash=salted_hash(salt, f"check-{ctx.nonce}"),
            ),
            att("env-canary", "escape", "refused"),
            att("env-undeclared", "escape", "refused"),
            att("fds-std", "control", "succeeded"),
            att("fds", "escape", "succeeded" if fds else "refused", targets=fds),
            env=hashed,
        )

    def test_forged_refusal_with_canary_hash_is_fail(self, make_ctx: Any) -> None:
        """Refusals with the canary's salted hash in the env facts are FAIL."""
        spec, ctx, targets = self._prepared(make_ctx)
        name = spec.names(ctx)[0]
        rep = self._report(ctx, targets["salt"], {name: os.environ[name]}, {})
        decision = decide("denied", spec.assess(ctx, rep, Records(), spec.host_control(ctx)))
        assert decision.verdict is Verdict.FAIL
        assert name in decision.reason

    def test_leaked_canary_fd_is_fail(self, make_ctx: Any) -> None:
        """The host's canary pipe showing up among the payload's fds is FAIL."""
        spec, ctx, targets = self._prepared(make_ctx)
        read_end = spec._pipes[ctx.nonce][0]
        label = f"pipe:[{os.fstat(read_end).st_ino}]"
        rep = self._report(ctx, targets["salt"], {"HOME": str(ctx.workspace)}, {"5": label})
        decision = decide("denied", spec.assess(ctx, rep, Records(), spec.host_control(ctx)))
        assert decision.verdict is Verdict.FAIL
        assert "canary pipe" in decision.reason

    def test_leaked_harness_socket_is_fail(self, make_ctx: Any) -> None:
        """Any socket the harness holds (not just the canary pipe) open in the payload: FAIL."""
        spec, ctx, targets = self._prepared(make_ctx)
        ours, theirs = socket.socketpair()
        with ours, theirs:
            label = f"socket:[{os.fstat(ours.fileno()).st_ino}]"
            rep = self._report(ctx, targets["salt"], {"HOME": str(ctx.workspace)}, {"7": label})
            decision = decide("denied", spec.assess(ctx, rep, Records(), spec.host_control(ctx)))
        assert decision.verdict is Verdict.FAIL
        assert f"harness holds are open in the payload: 7 {label}" in decision.reason

    def test_sandbox_made_fds_are_contained(self, make_ctx: Any) -> None:
        """The sandbox's own /dev/null and pipes are not the host's: PASS, named readably."""
        spec, ctx, targets = self._prepared(make_ctx)
        fds = {"3": "/dev/null", "4": "pipe:[4000000001]"}
        rep = self._report(ctx, targets["salt"], {"HOME": str(ctx.workspace)}, fds)
        decision = decide("denied", spec.assess(ctx, rep, Records(), spec.host_control(ctx)))
        assert decision.verdict is Verdict.PASS
        assert "fds 3 /dev/null, 4 pipe:[4000000001]" in decision.reason

    def test_clean_env_passes_and_wrong_hashing_is_inconclusive(self, make_ctx: Any) -> None:
        """Only declared vars: PASS; a payload whose check hash differs: INCONCLUSIVE."""
        spec, ctx, targets = self._prepared(make_ctx)
        rep = self._report(ctx, targets["salt"], {"HOME": str(ctx.workspace)}, {})
        control = spec.host_control(ctx)
        assert decide("denied", spec.assess(ctx, rep, Records(), control)).verdict is Verdict.PASS
        rep["attempts"][0]["check_hash"] = "0" * 32
        decision = decide("denied", spec.assess(ctx, rep, Records(), control))
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert "inside control failed: payload hashes like the host" in decision.reason

    def test_cleanup_removes_the_canaries(self, make_ctx: Any) -> None:
        """Cleanup unsets the canary variables and closes the pipe."""
        spec, ctx, _ = self._prepared(make_ctx)
        spec.cleanup(ctx)
        assert not any(n in os.environ for n in spec.names(ctx))
        assert ctx.nonce not in spec._pipes


TAMPER_OPS = (
    "socket-chmod",
    "socket-replace",
    "socket-unlink",
    "shim-chmod",
    "shim-append",
    "shim-replace",
)


class TestTamperTable:
    def test_forged_refusal_with_changed_decoy_is_fail(self, make_ctx: Any) -> None:
        """A 'refused' report while the decoy socket's mode changed on the host is FAIL."""
        spec = IpcProxySocketTamper()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        spec.decoy_paths(ctx)["socket"].chmod(0o777)
        rep = report(att("decoy:socket-chmod", "escape", "refused", errno="EROFS"))
        decision = decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.FAIL
        assert "decoy-socket mode changed" in decision.reason

    def test_dead_proxy_control_is_inconclusive(self, make_ctx: Any) -> None:
        """Refusals with the proxy no longer serving (control failed): INCONCLUSIVE."""
        spec = IpcProxySocketTamper()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        ops = (
            "socket-chmod",
            "socket-replace",
            "socket-unlink",
            "shim-chmod",
            "shim-append",
            "shim-replace",
        )
        rep = report(
            *(att(f"workspace:{o}", "control", "succeeded") for o in ops),
            att("decoy:socket-chmod", "escape", "refused", errno="ENOENT"),
        )
        assert decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL)).verdict is (
            Verdict.PASS
        )
        assert decide("denied", spec.assess(ctx, rep, Records(), FAILED_CONTROL)).verdict is (
            Verdict.INCONCLUSIVE
        )

    def _route_report(self, inside_errno: str, *, visible: bool) -> dict[str, Any]:
        """Workspace controls work, the decoy is refused, the in-sandbox route is tried."""
        return report(
            *(att(f"workspace:{o}", "control", "succeeded") for o in TAMPER_OPS),
            *(att(f"decoy:{o}", "escape", "refused", errno="EACCES") for o in TAMPER_OPS),
            *(att(f"sandbox:{o}", "escape", "refused", errno=inside_errno) for o in TAMPER_OPS),
            sandbox_route_tried=True,
            **{"visible:sandbox": visible},
        )

    def test_in_sandbox_route_not_found_is_inconclusive(self, make_ctx: Any) -> None:
        """Under a wrapper that shows the route elsewhere, ENOENT everywhere attacked nothing."""
        spec = IpcProxySocketTamper()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        rep = self._route_report("ENOENT", visible=False)
        decision = decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert "in-sandbox route was not attacked" in decision.reason

    def test_in_sandbox_route_refused_read_only_passes(self, make_ctx: Any) -> None:
        """The route found inside and every tamper refused (EROFS): PASS, attacked."""
        spec = IpcProxySocketTamper()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        rep = self._route_report("EROFS", visible=True)
        decision = decide("denied", spec.assess(ctx, rep, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.PASS
        assert "in-sandbox route attacked" in decision.reason

    def test_cleanup_restores_the_real_shim(self, make_ctx: Any, tmp_path: Path) -> None:
        """A shim a payload appended to, or swapped for a symlink, gets its bytes back."""
        shim = tmp_path / "shim.py"
        shim.write_text("# the shim the harness ships\n")
        shim.chmod(0o644)
        spec = IpcProxySocketTamper()
        for tamper in ("append", "symlink"):
            ctx = make_ctx(spec, shim=shim)
            spec.prepare(ctx)
            if tamper == "append":
                with shim.open("a") as fh:
                    fh.write("# sandbox-attest\n")
                shim.chmod(0o777)
            else:
                shim.unlink()
                shim.symlink_to(tmp_path / "elsewhere.py")
            spec.cleanup(ctx)
            assert not shim.is_symlink()
            assert shim.read_text() == "# the shim the harness ships\n"
            assert shim.stat().st_mode & 0o777 == 0o644
        assert not (tmp_path / "elsewhere.py").exists()

    def test_cleanup_restores_the_real_sockets_mode(self, make_ctx: Any) -> None:
        """If a payload chmodded the real socket, cleanup puts its recorded mode back."""
        spec = IpcProxySocketTamper()
        ctx = make_ctx(spec)
        real = Path(ctx.world.info.proxy.socket)
        real.chmod(0o600)
        spec.prepare(ctx)
        real.chmod(0o777)
        spec.cleanup(ctx)
        assert real.stat().st_mode & 0o777 == 0o600


class TestOrphansTable:
    def _watch(self, **kinds: tuple[int, int, int]) -> dict[str, Any]:
        return {
            "ok": True,
            "nonce": "h",
            "checks": [],
            "watch": {
                "payload_exit": 1.0,
                "alive": [],
                "kinds": {
                    k: {"ticks_before": b, "ticks_after": a, "late_ticks": late}
                    for k, (b, a, late) in kinds.items()
                },
            },
        }

    def _rep(self, outcome: str = "succeeded") -> dict[str, Any]:
        return report(
            att("setsid", "escape", outcome), att("ticks-while-running", "control", "succeeded")
        )

    def test_forged_refusal_with_growing_ticks_is_fail(self, make_ctx: Any) -> None:
        """A 'refused' report while a tick file keeps growing on the host is FAIL."""
        spec = LifecycleOrphans()
        ctx = make_ctx(spec)
        control = self._watch(setsid=(5, 11, 0))
        decision = decide("denied", spec.assess(ctx, self._rep("refused"), Records(), control))
        assert decision.verdict is Verdict.FAIL
        assert "children outlived the payload: setsid (alive pids none)" in decision.reason

    def test_late_ticks_alone_are_an_escape(self, make_ctx: Any) -> None:
        """Ticks stamped after the payload's exit show a survivor even once it has stopped."""
        spec = LifecycleOrphans()
        ctx = make_ctx(spec)
        assessment = spec.assess(ctx, self._rep(), Records(), self._watch(daemon=(9, 9, 30)))
        assert assessment.escape == "escaped"

    def test_stopped_children_pass_and_dead_control_is_inconclusive(self, make_ctx: Any) -> None:
        """No growth, no late tick: PASS; with the host's tick check failed: INCONCLUSIVE."""
        spec = LifecycleOrphans()
        ctx = make_ctx(spec)
        control = self._watch(setsid=(5, 5, 0))
        assert decide("denied", spec.assess(ctx, self._rep(), Records(), control)).verdict is (
            Verdict.PASS
        )
        control["ok"] = False
        assert decide("denied", spec.assess(ctx, self._rep(), Records(), control)).verdict is (
            Verdict.INCONCLUSIVE
        )

    def test_cleanup_kills_only_marked_processes(self, make_ctx: Any) -> None:
        """Cleanup kills processes carrying the marker and this nonce, and nothing else."""
        spec = LifecycleOrphans()
        ctx = make_ctx(spec)
        code = "import time; time.sleep(30)"
        mine = subprocess.Popen([sys.executable, "-c", code, ORPHAN_MARKER, ctx.nonce])
        other = subprocess.Popen([sys.executable, "-c", code, ORPHAN_MARKER, "n-other"])
        try:
            deadline = time.monotonic() + 5
            while find_orphans(ctx.nonce) != [mine.pid] and time.monotonic() < deadline:
                time.sleep(0.02)
            spec.cleanup(ctx)
            assert mine.wait(timeout=5) == -9
            assert other.poll() is None
        finally:
            other.kill()
            other.wait()


def test_specs_are_registered() -> None:
    """All six host specs are in the catalogue under their ids."""
    for probe in HOST_PROBES:
        assert PROBES[probe].id == probe


class TestCanaryReadings:
    """The shared canary readings (sandbox_attest.catalog.canary) the fs probes compare with."""

    def test_dir_canary_diff_names_what_moved(self, tmp_path: Path) -> None:
        """New and gone entries are named; a removed canary reads as gone, not a field list."""
        canary = tmp_path / "canary.txt"
        canary.write_text("planted\n")
        before = dir_canary_state(canary)
        assert dir_canary_diff(before, dir_canary_state(canary)) == ""
        (tmp_path / "n1.txt").write_text("x")
        canary.unlink()
        assert dir_canary_diff(before, dir_canary_state(canary)) == (
            "gone (FileNotFoundError), new n1.txt, gone canary.txt"
        )

    def test_failed_host_control_names_the_check(self, make_ctx: Any) -> None:
        """A failed host control's reason says which check failed and why."""
        spec = FsLinkEscape()
        ctx = make_ctx(spec)
        spec.prepare(ctx)
        failed = {
            "ok": False,
            "nonce": "h",
            "checks": [{"what": "host writes tmp", "ok": False, "detail": "EACCES"}],
        }
        rep = report(att("sibling:hardlink", "escape", "refused", errno="EPERM"))
        reason = decide("denied", spec.assess(ctx, rep, Records(), failed)).reason
        assert "host control failed: host writes tmp (EACCES)" in reason
