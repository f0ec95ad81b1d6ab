"""The proc probes live (control leg, real bubblewrap, weakened bubblewrap) and their tables.

Live cells go through the real `CellRunner` with one module-scoped world. Weakened
sandboxes are `BubblewrapBackend(weaken=...)`: each named hole removes exactly one protection
of the shipped configuration.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from sandbox_attest.backends.base import Backend, DeclaredClaims
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog import controls as catalog_controls
from sandbox_attest.catalog import proc as proc_module
from sandbox_attest.catalog.proc import BOUNDS
from sandbox_attest.catalog.proc import baseline as proc_baseline
from sandbox_attest.catalog.records import poll_until
from sandbox_attest.host import disguise
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.hostview import read_process
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.verdict import Verdict, believe, decide
from sandbox_attest.world.core import World, start_world
from tests.reachable import reachable_tempdir
from tests.unit.test_hostview import SLEEPER

if TYPE_CHECKING:
    from collections.abc import Iterator

PROC_PROBES = (
    "proc_visibility",
    "proc_privileges",
    "proc_namespace_escape",
    "proc_syscall_surface",
    "resource_limits",
)
OPEN = DeclaredClaims(network="open", filesystem="open", ipc="open")
CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
OK_CONTROL: dict[str, Any] = {"ok": True, "nonce": "hcontrol", "checks": []}
FAILED_CONTROL: dict[str, Any] = {"ok": False, "nonce": "hcontrol", "checks": []}
MIB = 1024 * 1024

# The limits of the unit tables: confining claims that declare fsize and nofile caps.
LIMITED = DeclaredClaims(
    network="proxy",
    filesystem="workspace",
    ipc="isolated",
    limits=(("fsize_mib", 8), ("nofile", 64)),
)


@dataclass
class Live:
    """A runner over the control leg, bubblewrap and the weakened variants."""

    runner: CellRunner
    entries: dict[str, CellEntry] = field(default_factory=dict)

    def run(self, backend: str, probe: str) -> CellEntry:
        """Run one cell once; later calls return the same entry."""
        key = f"{backend}-{probe}"
        if key not in self.entries:
            self.entries[key] = self.runner.run_cell(Cell(backend, ProbeRow(probe, 60), None))
        return self.entries[key]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One world for the module, under a short /tmp path (unix socket limits)."""
    with (
        reachable_tempdir("sa-proc-") as base,
        start_world(base / "w") as running,
    ):
        yield running


@pytest.fixture(scope="module")
def live(world: World, tmp_path_factory: pytest.TempPathFactory) -> Live:
    """The runner, with the control leg already run for every proc probe."""
    # Each weakened variant removes exactly one protection of the shipped configuration.
    backends: dict[str, Backend] = {
        "none": NoneBackend(),
        "bubblewrap": BubblewrapBackend(),
        "keep-caps": BubblewrapBackend(weaken=frozenset({"keep-caps"})),
        # Capabilities alone no longer reach the host: --disable-userns nests the payload one
        # user namespace below the mounts' owner, which locks them. Both holes are needed.
        "keep-caps+userns": BubblewrapBackend(weaken=frozenset({"keep-caps", "allow-userns"})),
        "share-pid": BubblewrapBackend(weaken=frozenset({"share-pid"})),
        "no-seccomp": BubblewrapBackend(weaken=frozenset({"no-seccomp"})),
        "allow-userns": BubblewrapBackend(weaken=frozenset({"allow-userns"})),
        "unenforced": BubblewrapBackend(weaken=frozenset({"no-limits"})),
    }
    runner = CellRunner(
        world=world,
        scratch=tmp_path_factory.mktemp("proc"),
        backends=backends,
        availability={name: b.availability() for name, b in backends.items()},
        platform="linux",
    )
    state = Live(runner)
    for probe in PROC_PROBES:
        state.run("none", probe)
    return state


def why(entry: Mapping[str, Any]) -> str:
    """The verdict and its reason, for assertion messages."""
    return f"{entry['verdict']}: {entry['reason']}"


class TestLive:
    @pytest.mark.parametrize("probe", PROC_PROBES)
    def test_control_leg_sees_the_escape(self, live: Live, probe: str) -> None:
        """Unconfined on this host, every proc probe's escape is seen: PASS."""
        entry = live.run("none", probe)
        assert entry["verdict"] == "PASS", why(entry)
        assert entry["escape"] == "escaped"

    @pytest.mark.parametrize("probe", PROC_PROBES)
    def test_bubblewrap_passes(self, live: Live, probe: str) -> None:
        """Under the shipped bubblewrap every proc probe PASSes with its controls working."""
        entry = live.run("bubblewrap", probe)
        assert entry["verdict"] == "PASS", why(entry)

    def test_seccomp_filter_refuses_the_surface(self, live: Live) -> None:
        """The filter answers EPERM where the host baseline reaches the kernel handler."""
        entry = live.run("bubblewrap", "proc_syscall_surface")
        by_what = {a["what"]: a for a in entry["attempts"]}
        for call in ("keyctl", "io_uring_setup", "ioctl-tiocsti"):
            assert by_what[call]["errno"] == "EPERM", by_what[call]
        assert entry["probe_facts"]["seccomp"] == "2"  # SECCOMP_MODE_FILTER

    def test_nested_user_namespaces_are_disabled(self, live: Live) -> None:
        """--disable-userns: the payload cannot create a user namespace of its own."""
        entry = live.run("bubblewrap", "proc_namespace_escape")
        by_what = {a["what"]: a for a in entry["attempts"]}
        userns = [a for w, a in by_what.items() if "userns" in w]
        assert userns
        assert all(a["outcome"] != "succeeded" for a in userns), userns

    def test_declared_limits_are_applied(self, live: Live) -> None:
        """Bubblewrap holds the fsize and nofile limits it declares (prlimit around bwrap)."""
        entry = live.run("bubblewrap", "resource_limits")
        assert entry["verdict"] == "PASS", why(entry)
        loops = {a["what"]: a for a in entry["attempts"] if a["role"] == "escape"}
        assert loops["fsize"]["errno"] == "EFBIG"
        assert loops["nofile"]["errno"] == "EMFILE"
        assert entry["witness"]["host_counted"]["fsize_mib"] <= 16
        # Every judged process of the cell whose limits the host read at the rendezvous (the
        # launcher's first, then the shim's): each must hold the declared limits.
        view = entry["host_view"]
        pid = ", ".join(str(p["pid"]) for p in [view, *view.get("others", [])] if p.get("limits"))
        # The host's count of the fsize file backs fsize_mib; the reading backs both.
        counts, limits = entry["corroborated_by"]
        assert counts.startswith(f"{proc_module.HOST_COUNTS}: fsize_mib=")
        assert counts.endswith("against the declared 16")
        assert limits == (
            f"the payload's rlimits and cgroup caps, read by the host (/proc/{pid}/limits): "
            "fsize_mib=16, nofile=256 applied"
        )

    def test_unapplied_limits_are_named_by_the_host(self, live: Live) -> None:
        """Declared but not applied (no prlimit): the host's reading of the limits names each."""
        entry = live.run("unenforced", "resource_limits")
        assert entry["verdict"] == "FAIL", why(entry)
        assert "the resource limits claim (fsize_mib=16, nofile=256) is not applied" in why(entry)
        assert "fsize_mib=16 (Max file size unlimited)" in why(entry)

    @pytest.mark.parametrize(
        ("backend", "probe"),
        [
            ("share-pid", "proc_visibility"),
            ("keep-caps", "proc_privileges"),
            ("keep-caps+userns", "proc_namespace_escape"),
            ("no-seccomp", "proc_syscall_surface"),
            ("unenforced", "resource_limits"),
        ],
    )
    def test_hole_fails_the_matching_probe(self, live: Live, backend: str, probe: str) -> None:
        """One protection removed (or a limit declared, not applied) FAILs the matching probe."""
        entry = live.run(backend, probe)
        assert entry["verdict"] == "FAIL", why(entry)

    def test_keep_caps_remount_reached_the_host(self, live: Live) -> None:
        """With capabilities kept, the read-only task dir was remounted rw and written.

        The host found the nonce file, so the FAIL rests on a host witness.
        """
        entry = live.run("keep-caps+userns", "proc_namespace_escape")
        assert entry["witness"]["remount_files"], why(entry)

    def test_keep_caps_alone_is_held_by_the_nested_userns(self, live: Live) -> None:
        """With only the capabilities kept, the remount of the read-only bind is refused."""
        entry = live.run("keep-caps", "proc_namespace_escape")
        assert entry["verdict"] == "PASS", why(entry)
        assert entry["witness"]["remount_files"] == []

    def test_visibility_witnesses_on_the_control_leg(self, live: Live) -> None:
        """Unconfined, the anchor logged the payload's ptrace and the payload echoed its secret."""
        witness = live.run("none", "proc_visibility")["witness"]
        assert witness["tracers"]
        assert witness["secret_echoed"] is True

    def test_anchor_is_gone_after_the_cell(self, live: Live) -> None:
        """cleanup() killed the cell's anchor: no process carries its marker any more.

        The cell's own marker, not any anchor's: another worker's cell may be running one.
        """
        nonce = live.run("none", "proc_visibility")["nonce"]
        spec = PROBES["proc_visibility"]
        assert isinstance(spec, proc_module.ProcVisibility)
        assert spec._anchors == {}
        markers = []
        marker = disguise.ANCHOR_MARKER.encode()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                markers += [a for a in cmdline.read_bytes().split(b"\0") if a.startswith(marker)]
            except OSError:
                continue
        assert f"{disguise.ANCHOR_MARKER}{nonce}".encode() not in markers

    def test_no_mount_leaked_to_the_host(self, live: Live) -> None:
        """The control leg's tmpfs and pivot_root stayed in the child's private namespace."""
        live.run("none", "proc_namespace_escape")
        # The probe names its tmpfs `kiln-scratch` (probes/proc_namespace_escape.py).
        assert "kiln-scratch" not in Path("/proc/self/mountinfo").read_text()


# ---------------------------------------------------------------------------------------------
# Decision tables with hand-made reports.


@dataclass
class Records:
    """A hand-made stand-in for sandbox_attest.world.WitnessRecords."""

    origin: list[dict[str, Any]] = field(default_factory=list)
    dns: list[dict[str, Any]] = field(default_factory=list)
    proxy: list[dict[str, Any]] = field(default_factory=list)
    direct_tcp: list[dict[str, Any]] = field(default_factory=list)
    direct_udp: list[dict[str, Any]] = field(default_factory=list)
    daemon: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FakeWorld:
    """Only `records` is used by the assessors under test."""

    info: Any = None

    def records(self, nonce: str) -> Records:
        """No fixture saw anything."""
        del nonce
        return Records()


PTRACE_SEIZE = 0x4206
PTRACE_DETACH = 17
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def seize_briefly(pid: int) -> None:
    """PTRACE_SEIZE `pid` for 0.3 s, then detach: a real tracer the anchor must notice."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0, os.strerror(ctypes.get_errno())
    time.sleep(0.3)
    libc.ptrace(PTRACE_DETACH, pid, None, None)


def send_from_netns_of(pid: int, hostport: str, line: str) -> None:
    """In a forked child: join `pid`'s user and network namespaces, connect, send `line`."""
    host, _, port = hostport.rpartition(":")
    child = os.fork()
    if child == 0:  # pragma: no cover  (runs in the child; its exit status is the result)
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
                fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
                if libc.setns(fd, flag) != 0:
                    os._exit(2)
            with socket.create_connection((host, int(port)), timeout=3) as sock:
                sock.sendall(line.encode() + b"\n")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def make_ctx(
    tmp_path: Path, probe: str, declared: DeclaredClaims = CONFINED, backend: str = "bubblewrap"
) -> CellContext:
    """A context whose cell_dir exists (assessors look for witness files there)."""
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    return CellContext(
        probe=probe,
        backend=backend,
        nonce=nonce,
        world=FakeWorld(),
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=declared,
    )


def att(
    what: str, outcome: str, role: str = "escape", errno: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One attempt line."""
    return {
        "what": what,
        "role": role,
        "outcome": outcome,
        "errno": errno,
        "status": None,
        "detail": "",
        **extra,
    }


def verdict_of(
    ctx: CellContext,
    report: dict[str, Any],
    control: dict[str, Any],
    witness: Records | None = None,
) -> Verdict:
    """Assess and decide one hand-made cell."""
    spec = PROBES[ctx.probe]
    assessment = spec.assess(ctx, report, witness or Records(), control)
    return decide(spec.expectation(ctx.claims), assessment).verdict


class TestVisibilityTable:
    @pytest.fixture
    def ctx(self, tmp_path: Path) -> Iterator[CellContext]:
        """A cell with a real anchor (prepare) that cleanup removes."""
        ctx = make_ctx(tmp_path, "proc_visibility")
        spec = PROBES["proc_visibility"]
        spec.prepare(ctx)
        yield ctx
        spec.cleanup(ctx)

    def refused(self) -> dict[str, Any]:
        """Every escape refused, controls fine."""
        return {
            "attempts": [
                att("scan-own", "succeeded", "control"),
                att("scan-proc", "refused", errno="ENOENT"),
                att("ptrace-seize", "refused", errno="ENOENT"),
            ],
            "facts": {},
        }

    def test_refused_is_pass(self, ctx: CellContext) -> None:
        """Refused everywhere, nothing traced the anchor, controls ok: PASS."""
        assert verdict_of(ctx, self.refused(), OK_CONTROL) is Verdict.PASS

    def test_forged_refusal_with_tracer_logged_is_fail(self, ctx: CellContext) -> None:
        """The anchor reported a real tracer while the payload said refused: FAIL."""
        anchor = PROBES["proc_visibility"]._anchor(ctx)  # type: ignore[attr-defined]
        seize_briefly(anchor.pid)
        assert poll_until(anchor.tracers, bool)
        assert verdict_of(ctx, self.refused(), OK_CONTROL) is Verdict.FAIL

    def test_secret_echoed_is_fail(self, ctx: CellContext) -> None:
        """A report carrying the anchor's environ secret proves the read: FAIL."""
        anchor = PROBES["proc_visibility"]._anchor(ctx)  # type: ignore[attr-defined]
        report = self.refused() | {"facts": {"environ_secret": anchor.secret}}
        assert verdict_of(ctx, report, OK_CONTROL) is Verdict.FAIL

    def test_dead_host_control_is_inconclusive(self, ctx: CellContext) -> None:
        """The host could not see its own anchor: a refusal proves nothing."""
        assert verdict_of(ctx, self.refused(), FAILED_CONTROL) is Verdict.INCONCLUSIVE

    def test_unwitnessed_success_is_inconclusive(self, ctx: CellContext) -> None:
        """A claimed find of some other pid, with no witness, is a disagreement."""
        report = self.refused()
        report["attempts"][1] = att("scan-proc", "succeeded")
        report["facts"] = {"found_pids": [1]}
        assert verdict_of(ctx, report, OK_CONTROL) is Verdict.INCONCLUSIVE


class TestNamespaceTable:
    def report(self, outcome: str = "refused") -> dict[str, Any]:
        """The setns and remount attempts with `outcome`, plus an inner exposure."""
        return {
            "attempts": [
                att("read-own-ns", "succeeded", "control"),
                att("setns-mnt", outcome, errno="ENOENT"),
                att("remount-rw:userns", outcome, errno="EPERM"),
                att("inner:unshare-userns", "succeeded"),
            ],
            "facts": {},
        }

    def test_refused_with_inner_exposure_is_pass(self, tmp_path: Path) -> None:
        """Host namespaces unreachable; a private nested namespace is exposure only: PASS."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        assert verdict_of(ctx, self.report(), OK_CONTROL) is Verdict.PASS

    def test_forged_refusal_with_canary_file_is_fail(self, tmp_path: Path) -> None:
        """The setns-mnt canary appeared on the host while the payload said refused: FAIL."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        canary = PROBES["proc_namespace_escape"].canary_dir(ctx)  # type: ignore[attr-defined]
        canary.mkdir()
        (canary / f"{ctx.nonce}.setns-mnt").write_text("x")
        assert verdict_of(ctx, self.report(), OK_CONTROL) is Verdict.FAIL

    def test_remount_file_is_fail(self, tmp_path: Path) -> None:
        """A nonce file in the read-only task dir is a host-seen remount escape: FAIL."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        (ctx.cell_dir / "input").mkdir()
        (ctx.cell_dir / "input" / f"{ctx.nonce}.remount").write_text("x")
        assert verdict_of(ctx, self.report(), OK_CONTROL) is Verdict.FAIL

    def test_remount_file_in_the_workspace_is_not_a_witness(self, tmp_path: Path) -> None:
        """The payload may write its workspace: a nonce file there is no remount escape."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        (ctx.workspace / f"{ctx.nonce}.remount").write_text("x")
        assert verdict_of(ctx, self.report(), OK_CONTROL) is Verdict.PASS

    def test_unwitnessed_setns_success_is_believed_where_denied(self, tmp_path: Path) -> None:
        """A joined host namespace reported without a file is believed against the sandbox."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        assert verdict_of(ctx, self.report("succeeded"), OK_CONTROL) is Verdict.FAIL
        open_leg = make_ctx(tmp_path, "proc_namespace_escape", OPEN, "none")
        assert verdict_of(open_leg, self.report("succeeded"), OK_CONTROL) is Verdict.INCONCLUSIVE

    def test_setns_net_connection_is_fail(self, tmp_path: Path) -> None:
        """The anchor's own listener heard a via=setns-net line with the nonce: FAIL."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        spec = PROBES["proc_namespace_escape"]
        targets = spec.prepare(ctx)
        try:
            anchor = spec._anchor(ctx)  # type: ignore[attr-defined]
            send_from_netns_of(anchor.pid, targets["listener"], f"nonce={ctx.nonce} via=setns-net")
            assert len(poll_until(lambda: anchor.reported("conn"), lambda got: len(got) >= 2)) == 2
            assert verdict_of(ctx, self.report(), OK_CONTROL) is Verdict.FAIL
        finally:
            spec.cleanup(ctx)

    def test_an_empty_listener_is_no_escape(self, tmp_path: Path) -> None:
        """Negative control: the anchor heard only its self-test, so refusal stands: PASS."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        spec = PROBES["proc_namespace_escape"]
        spec.prepare(ctx)
        try:
            anchor = spec._anchor(ctx)  # type: ignore[attr-defined]
            assert anchor.reported("conn") == ["self-test"]
            assert verdict_of(ctx, self.report(), OK_CONTROL) is Verdict.PASS
        finally:
            spec.cleanup(ctx)

    def test_dead_control_is_inconclusive(self, tmp_path: Path) -> None:
        """A refusal whose host control failed proves nothing."""
        ctx = make_ctx(tmp_path, "proc_namespace_escape")
        assert verdict_of(ctx, self.report(), FAILED_CONTROL) is Verdict.INCONCLUSIVE


class TestSelfReportedTables:
    BASELINE: ClassVar[dict[str, Any]] = {
        "attempts": [
            att("getpid", "succeeded", "control"),
            att("keyctl", "succeeded", errno="EOPNOTSUPP"),
            att("socket-vsock", "refused", errno="EAFNOSUPPORT"),
        ]
    }

    def control(self, ok: bool = True) -> dict[str, Any]:
        """A host control carrying the unfiltered baseline."""
        return {"ok": ok, "nonce": "h", "checks": [], "baseline": self.BASELINE}

    @pytest.mark.parametrize(
        ("keyctl", "vsock", "expected"),
        [
            ("refused", "refused", Verdict.PASS),
            ("succeeded", "refused", Verdict.FAIL),
            # vsock is refused on the host too: its success inside is not judged.
            ("refused", "succeeded", Verdict.PASS),
            ("error", "refused", Verdict.INCONCLUSIVE),
        ],
        ids=["filtered", "keyctl-reached", "host-lacks-vsock", "attempt-broken"],
    )
    def test_syscall_surface(
        self, tmp_path: Path, keyctl: str, vsock: str, expected: Verdict
    ) -> None:
        """Only calls the host baseline reaches are judged; any reached inside FAILs."""
        ctx = make_ctx(tmp_path, "proc_syscall_surface")
        report = {
            "attempts": [
                att("getpid", "succeeded", "control"),
                att("keyctl", keyctl),
                att("socket-vsock", vsock),
            ],
            "facts": {"seccomp": "2"},
        }
        assert verdict_of(ctx, report, self.control()) is expected

    def test_syscall_surface_crash_is_inconclusive(self, tmp_path: Path) -> None:
        """A payload that crashed after one refusal never tried the rest: not a PASS."""
        ctx = make_ctx(tmp_path, "proc_syscall_surface")
        report = {
            "attempts": [
                att("getpid", "succeeded", "control"),
                att("keyctl", "refused", errno="EPERM"),
                att("probe", "error", detail="RuntimeError('boom')"),
            ]
        }
        assert verdict_of(ctx, report, self.control()) is Verdict.INCONCLUSIVE

    def test_syscall_surface_missing_call_is_inconclusive(self, tmp_path: Path) -> None:
        """A call the host reaches that the report never mentions leaves it unknown."""
        ctx = make_ctx(tmp_path, "proc_syscall_surface")
        control = self.control()
        control["baseline"] = {
            "attempts": [*self.BASELINE["attempts"], att("bpf", "succeeded", errno="EINVAL")]
        }
        report = {
            "attempts": [
                att("getpid", "succeeded", "control"),
                att("keyctl", "refused", errno="EPERM"),
            ]
        }
        spec = PROBES[ctx.probe]
        assessment = spec.assess(ctx, report, Records(), control)
        assert decide("denied", assessment).verdict is Verdict.INCONCLUSIVE
        assert "never tried, though the host reaches them: bpf" in assessment.reasons

    def test_syscall_surface_without_baseline_is_inconclusive(self, tmp_path: Path) -> None:
        """A filtered report with no unfiltered baseline proves nothing."""
        ctx = make_ctx(tmp_path, "proc_syscall_surface")
        report = {"attempts": [att("getpid", "succeeded", "control"), att("keyctl", "refused")]}
        control = {"ok": False, "nonce": "h", "checks": [], "baseline": None}
        assert verdict_of(ctx, report, control) is Verdict.INCONCLUSIVE

    @pytest.mark.parametrize(
        ("caps", "control_ok", "declared", "expected"),
        [
            ("refused", True, CONFINED, Verdict.PASS),
            ("succeeded", True, CONFINED, Verdict.FAIL),
            ("refused", False, CONFINED, Verdict.INCONCLUSIVE),
            ("succeeded", True, OPEN, Verdict.PASS),
            ("refused", True, OPEN, Verdict.INCONCLUSIVE),
        ],
    )
    def test_privileges(
        self,
        tmp_path: Path,
        caps: str,
        control_ok: bool,
        declared: DeclaredClaims,
        expected: Verdict,
    ) -> None:
        """Capabilities held inside a confining sandbox FAIL; the open leg must see them."""
        ctx = make_ctx(tmp_path, "proc_privileges", declared)
        report = {
            "attempts": [
                att("read-status", "succeeded", "control"),
                att("effective-capabilities", caps),
                att("setuid-elevation", "refused", errno="EPERM"),
            ]
        }
        assert verdict_of(ctx, report, self.control(control_ok)) is expected


def test_broken_baseline_says_how_to_rerun_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cell dir is gone by the time anyone reads it: the message carries argv and task."""
    silent = tmp_path / "silent.py"
    silent.write_text("print('no report')\n")
    monkeypatch.setattr(catalog_controls, "probe_path", lambda _: silent)
    ctx = make_ctx(tmp_path, "proc_privileges")
    with pytest.raises(ValueError, match="printed 0 reports") as raised:
        catalog_controls.run_payload_on_host(ctx, {"k": 1})
    assert str(silent) in str(raised.value)
    assert '"targets": {"k": 1}' in str(raised.value)


class TestPrivilegesBaseline:
    def test_host_baseline_reads_its_credentials(self, tmp_path: Path) -> None:
        """The unsandboxed baseline run reads CapEff on this host: the control holds."""
        ctx = make_ctx(tmp_path, "proc_privileges")
        control = PROBES[ctx.probe].host_control(ctx)
        assert control["ok"], control["checks"]
        assert "host baseline read its credentials" in {c["what"] for c in control["checks"]}

    def test_baseline_without_credentials_fails_the_control(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A baseline that ran but read no CapEff cannot vouch for a 'no capability' inside."""
        ran = {"ok": True, "nonce": "h", "checks": [], "baseline": {"attempts": [], "facts": {}}}
        monkeypatch.setattr(proc_baseline, "_baseline_control", lambda *_: dict(ran))
        ctx = make_ctx(tmp_path, "proc_privileges")
        control = PROBES[ctx.probe].host_control(ctx)
        assert not control["ok"]
        report = {
            "attempts": [
                att("read-status", "succeeded", "control"),
                att("effective-capabilities", "refused"),
            ]
        }
        assert verdict_of(ctx, report, control) is Verdict.INCONCLUSIVE


def limits_report(reached: dict[str, int], errnos: dict[str, str] | None = None) -> dict[str, Any]:
    """Loops that reached `reached` (the rest their bound), stopped by their limit's errno.

    `errnos` overrides the errno a stopped loop reports, by limit key.
    """
    attempts = [att("write-and-fork-once", "succeeded", "control")]
    for what, key in (
        ("forks", "forks"),
        ("memory", "memory_mib"),
        ("fsize", "fsize_mib"),
        ("nofile", "nofile"),
    ):
        value = reached.get(key, BOUNDS[key])
        stopped = value < BOUNDS[key]
        errno = (errnos or {}).get(key, proc_module.LIMIT_ERRNOS[key]) if stopped else None
        attempts.append(
            att(
                what,
                "refused" if stopped else "succeeded",
                errno=errno,
                reached=value,
                bound=BOUNDS[key],
            )
        )
    return {"attempts": attempts, "facts": {}}


class TestResourceLimitsTable:
    def report(self, errnos: dict[str, str] | None = None, **reached: int) -> dict[str, Any]:
        """`limits_report`: loops that reached `reached`, stopped by `errnos` or their own."""
        return limits_report(reached, errnos)

    def witness_files(self, ctx: CellContext, forks: int, fsize_mib: int) -> None:
        """What the payload's loops would have left in the workspace."""
        spec = proc_module.ResourceLimitsSpec
        fork_dir = ctx.workspace / spec.fork_dir(ctx)
        fork_dir.mkdir()
        for i in range(forks):
            (fork_dir / f"fork-{i}").write_text("1")
        with (ctx.workspace / spec.fsize_file(ctx)).open("wb") as fh:
            fh.truncate(fsize_mib * 1024 * 1024)

    def test_held_limits_pass(self, tmp_path: Path) -> None:
        """Loops stopped at the declared fsize and nofile limits: PASS."""
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.witness_files(ctx, BOUNDS["forks"], 8)
        report = self.report(fsize_mib=8, nofile=60)
        assert verdict_of(ctx, report, OK_CONTROL) is Verdict.PASS

    @pytest.mark.parametrize(
        ("errnos", "reached", "why"),
        [
            ({"fsize_mib": "ENOSPC"}, {"fsize_mib": 3, "nofile": 60}, "not the limit's EFBIG"),
            ({"nofile": "ENFILE"}, {"fsize_mib": 8, "nofile": 60}, "not the limit's EMFILE"),
            ({}, {"fsize_mib": 8, "nofile": 10}, "far below the declared 64"),
        ],
        ids=["disk-full", "system-table-full", "far-below"],
    )
    def test_other_walls_are_inconclusive(
        self, tmp_path: Path, errnos: dict[str, str], reached: dict[str, int], why: str
    ) -> None:
        """A stop with another errno, or far below the declared value, is not the limit."""
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.witness_files(ctx, BOUNDS["forks"], reached["fsize_mib"])
        spec = PROBES[ctx.probe]
        assessment = spec.assess(ctx, self.report(errnos, **reached), Records(), OK_CONTROL)
        decision = decide("denied", assessment)
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert why in decision.reason

    def test_reasons_read_as_pairs(self, tmp_path: Path) -> None:
        """The reason names each limit as key=value, not as a Python dict."""
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.witness_files(ctx, BOUNDS["forks"], 8)
        spec = PROBES[ctx.probe]
        assessment = spec.assess(ctx, self.report(fsize_mib=8, nofile=60), Records(), OK_CONTROL)
        reason = decide("denied", assessment).reason
        assert "every declared limit held: fsize_mib=8, nofile=64" in reason
        assert "{" not in reason

    def test_forged_stop_with_grown_file_is_fail(self, tmp_path: Path) -> None:
        """The payload claims it stopped at 8 MiB but the host finds 32 MiB: FAIL."""
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.witness_files(ctx, BOUNDS["forks"], 32)
        report = self.report(fsize_mib=8, nofile=60)
        assert verdict_of(ctx, report, OK_CONTROL) is Verdict.FAIL

    def test_no_declaration_is_inconclusive(self, tmp_path: Path) -> None:
        """A confining backend that declares no limit cannot PASS this probe."""
        ctx = make_ctx(tmp_path, "resource_limits")
        self.witness_files(ctx, BOUNDS["forks"], 32)
        assert verdict_of(ctx, self.report(), OK_CONTROL) is Verdict.INCONCLUSIVE

    def test_dead_control_is_inconclusive(self, tmp_path: Path) -> None:
        """Held limits with a failed host control prove nothing."""
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.witness_files(ctx, BOUNDS["forks"], 8)
        report = self.report(fsize_mib=8, nofile=60)
        assert verdict_of(ctx, report, FAILED_CONTROL) is Verdict.INCONCLUSIVE

    def test_control_leg_short_of_bound_is_inconclusive(self, tmp_path: Path) -> None:
        """Unconfined loops that stop before their bound cannot show an unenforced limit."""
        ctx = make_ctx(tmp_path, "resource_limits", OPEN, "none")
        self.witness_files(ctx, BOUNDS["forks"], 32)
        report = self.report(nofile=10)
        assert verdict_of(ctx, report, OK_CONTROL) is Verdict.INCONCLUSIVE


class TestResourceLimitsClaim:
    """The limits claim read on real processes by the host, at its rendezvous reading."""

    def host_read(self, ctx: CellContext, argv: list[str]) -> None:
        """Start `argv`, read it as the rendezvous does once its rlimits settle, record it."""
        proc = subprocess.Popen(argv)
        try:
            # prlimit sets the limits on itself, then execs the interpreter: read after that.
            poll_until(
                lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes(),
                lambda cmdline: cmdline.startswith(sys.executable.encode()),
            )
            view = read_process(proc.pid)
            ctx.host_view.update({"seen": True, **view})
        finally:
            proc.kill()
            proc.wait()

    def loops_held(self, ctx: CellContext) -> dict[str, Any]:
        """The loops of a payload held at LIMITED's fsize and nofile, with the host's files."""
        TestResourceLimitsTable().witness_files(ctx, BOUNDS["forks"], 8)
        return TestResourceLimitsTable().report(fsize_mib=8, nofile=60)

    def test_a_confining_backend_without_limits_is_not_applicable(self) -> None:
        """Confining, no limit declared: NOT_APPLICABLE; a declared limit or the open leg runs."""
        spec = proc_module.ResourceLimitsSpec()
        assert spec.not_claimed(CONFINED) == "the backend declares no resource limits"
        assert spec.not_claimed(LIMITED) is None
        assert spec.not_claimed(OPEN) is None

    def test_prlimit_applied_limits_back_the_pass(self, tmp_path: Path) -> None:
        """The host sees LIMITED's fsize and nofile on the payload: PASS, naming both readings."""
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.host_read(
            ctx, ["prlimit", f"--fsize={8 * MIB}", "--nofile=64", sys.executable, "-c", SLEEPER]
        )
        spec = PROBES[ctx.probe]
        assessment = spec.assess(ctx, self.loops_held(ctx), Records(), OK_CONTROL)
        decision = believe(decide("denied", assessment), assessment, crossed_wrapper=True)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert assessment.corroborated_by[0] == (
            f"{proc_module.HOST_COUNTS}: fsize_mib=8 against the declared 8"
        )
        assert "fsize_mib=8, nofile=64 applied" in assessment.corroborated_by[1]

    def test_a_limit_the_host_counted_holding_needs_no_rlimit(self, tmp_path: Path) -> None:
        """No fsize rlimit, but the host measured the file stopped at the declared 8 MiB: PASS.

        Issue 27: the effect the host counted decides; the reading still backs nofile.
        """
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.host_read(ctx, ["prlimit", "--nofile=64", sys.executable, "-c", SLEEPER])
        spec = PROBES[ctx.probe]
        assessment = spec.assess(ctx, self.loops_held(ctx), Records(), OK_CONTROL)
        decision = believe(decide("denied", assessment), assessment, crossed_wrapper=True)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "fsize_mib=8 (Max file size unlimited) on pid" in decision.reason
        assert assessment.corroborated_by[0].endswith("fsize_mib=8 against the declared 8")
        assert assessment.corroborated_by[1].endswith("nofile=64 applied")

    def test_a_declared_limit_the_host_sees_unset_is_fail(self, tmp_path: Path) -> None:
        """Loops reported held, but the payload has no nofile rlimit: FAIL naming limit and claim.

        The nofile loop's count is the payload's word, so only the reading can back it.
        """
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.host_read(ctx, ["prlimit", f"--fsize={8 * MIB}", sys.executable, "-c", SLEEPER])
        spec = PROBES[ctx.probe]
        assessment = spec.assess(ctx, self.loops_held(ctx), Records(), OK_CONTROL)
        decision = decide("denied", assessment)
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert (
            "the resource limits claim (fsize_mib=8, nofile=64) is not applied" in decision.reason
        )
        assert "nofile=64 (Max open files" in decision.reason
        assert "fsize" not in decision.reason.split("is not applied")[1].split("on pid")[0]
        assert assessment.corroborated_by == []

    def test_a_looser_rlimit_than_declared_is_not_applied(self, tmp_path: Path) -> None:
        """An open-files rlimit above the declared 64 is not the declared limit: FAIL."""
        ctx = make_ctx(tmp_path, "resource_limits", LIMITED)
        self.host_read(
            ctx, ["prlimit", f"--fsize={8 * MIB}", "--nofile=1024", sys.executable, "-c", SLEEPER]
        )
        assessment = PROBES[ctx.probe].assess(ctx, self.loops_held(ctx), Records(), OK_CONTROL)
        decision = decide("denied", assessment)
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "nofile=64 (Max open files 1024)" in decision.reason

    def test_a_pids_cgroup_cap_applies_the_forks_limit(self) -> None:
        """The forks limit is applied by a pids.max at or below it, whatever RLIMIT_NPROC says."""
        process = {
            "limits": {"Max processes": {"soft": 96364, "hard": 96364}},
            "cgroup_limits": {"cgroup": "/docker/x", "pids.max": 32, "memory.max": None},
        }
        assert proc_module.unapplied_limits({"forks": 32}, process) == ([], [])
        assert proc_module.unapplied_limits({"forks": 16}, process) == (
            ["forks=16 (Max processes 96364, pids.max 32)"],
            [],
        )

    def test_a_cgroup_the_host_cannot_read_is_unknown_not_unset(self) -> None:
        """A pids cap in a cgroup outside the host's view is not seen unset: no FAIL on it."""
        process = {
            "limits": {"Max processes": {"soft": 96364, "hard": 96364}},
            "cgroup_limits": {"pids.max": "unreadable: cgroup /../docker/x is outside"},
        }
        unset, unknown = proc_module.unapplied_limits({"forks": 32}, process)
        assert unset == []
        assert unknown == [
            "forks=32 (Max processes 96364, pids.max unreadable: cgroup /../docker/x is outside)"
        ]
