"""Issue 28's host-reach probes, judged on hand-made cells: the rules a live run cannot vary.

proc_kernel_tunables, proc_cross_process and fs_open_by_handle each believe a report against
the sandbox and credit a refusal only with a host reading behind it. These cells fix the host
readings (host view, target log, canary token) and check each rule's verdict and wording.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.verdict import Verdict, decide
from tests.catalog.test_proc import FakeWorld, Records, att

if TYPE_CHECKING:
    from collections.abc import Iterator

CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
OPEN = DeclaredClaims(network="open", filesystem="open", ipc="open")
HOMES_DENIED = DeclaredClaims(
    network="none", filesystem="workspace", ipc="isolated", reads="deny", read_deny=("/home",)
)
CONTROL_OK = {"ok": True, "nonce": "h1", "checks": [{"what": "c", "ok": True, "detail": ""}]}
EXPOSURES = (
    "cgroup-procs-open",
    "release-agent-open",
    "core-pattern-open",
    "sysrq-trigger-open",
    "sysctl-open",
)


@dataclass
class Cell:
    """One hand-made cell: its context and the payload's report."""

    ctx: CellContext
    attempts: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def judge(self) -> tuple[Verdict, str, dict[str, Any]]:
        """The cell's verdict, its reason and the assessment's witness."""
        spec = PROBES[self.ctx.probe]
        report = {"attempts": self.attempts, "facts": self.facts}
        assessment = spec.assess(self.ctx, report, Records(), CONTROL_OK)
        decision = decide(spec.expectation(self.ctx.claims), assessment)
        return decision.verdict, decision.reason, assessment.witness


def cell(
    tmp_path: Path, probe: str, declared: DeclaredClaims, view: dict[str, Any] | None = None
) -> Cell:
    """A cell of `probe` whose host view is `view` (default: one unprivileged process)."""
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    seen = {"seen": True, "pid": 4242, "status": {"Uid": "994 994 994 994", "CapEff": "0"}}
    ctx = CellContext(
        probe=probe,
        backend="bubblewrap",
        nonce=nonce,
        world=FakeWorld(),
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=declared,
        host_view=view if view is not None else seen,
    )
    return Cell(ctx)


def state(ctx: CellContext, data: dict[str, Any]) -> None:
    """What `prepare` would have kept in the cell dir."""
    (ctx.cell_dir / "host-state.json").write_text(json.dumps(data))


class TestKernelTunables:
    def tunables(self, tmp_path: Path, view: dict[str, Any] | None = None) -> Cell:
        """A tunables cell whose delegated group is a plain directory under tmp_path."""
        made = cell(tmp_path, "proc_kernel_tunables", CONFINED, view)
        group = tmp_path / "group"
        group.mkdir()
        state(made.ctx, {"group": str(group)})
        made.attempts = [att("cgroup-mkdir", "refused", errno="ENOENT")]
        made.attempts += [att(what, "refused", errno="EACCES") for what in EXPOSURES]
        return made

    def test_refusals_of_an_unprivileged_payload_pass(self, tmp_path: Path) -> None:
        """No group on the host and every open refused, as host uid 994: PASS."""
        verdict, reason, _ = self.tunables(tmp_path).judge()
        assert verdict is Verdict.PASS, reason

    def test_refusals_of_host_root_are_only_its_word(self, tmp_path: Path) -> None:
        """A process of the cell running as host uid 0: its refusals are INCONCLUSIVE."""
        root = {"seen": True, "pid": 7, "status": {"Uid": "0 0 0 0", "CapEff": "0"}}
        verdict, reason, witness = self.tunables(tmp_path, root).judge()
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert "host pid 7 runs as host uid 0" in reason
        assert witness["host_root"] == "host pid 7"

    def test_a_group_on_the_host_fails_naming_the_bind(self, tmp_path: Path) -> None:
        """The nonce-named group in the host's cgroupfs: FAIL naming it and the fix."""
        made = self.tunables(tmp_path)
        (tmp_path / "group" / f"escape-{made.ctx.nonce}").mkdir()
        made.attempts[0] = att("cgroup-mkdir", "succeeded")
        verdict, reason, _ = made.judge()
        assert verdict is Verdict.FAIL, reason
        assert f"escape-{made.ctx.nonce} in the host's cgroupfs" in reason
        assert "fix: do not bind the host's /sys/fs/cgroup" in reason

    def test_an_open_control_file_is_believed(self, tmp_path: Path) -> None:
        """core_pattern opened for writing is reported against the sandbox: FAIL with the fix."""
        made = self.tunables(tmp_path)
        made.attempts[4] = att("core-pattern-open", "succeeded")
        verdict, reason, witness = made.judge()
        assert verdict is Verdict.FAIL, reason
        assert "opened for writing: core-pattern-open" in reason
        assert "mount /proc/sys read-only" in reason
        assert witness["opened"] == ["core-pattern-open"]

    def test_a_claimed_mkdir_nobody_saw_is_inconclusive(self, tmp_path: Path) -> None:
        """The payload says it made the group, the host's cgroupfs has none: not a PASS."""
        made = self.tunables(tmp_path)
        made.attempts[0] = att("cgroup-mkdir", "succeeded")
        verdict, reason, _ = made.judge()
        assert verdict is Verdict.INCONCLUSIVE, reason


class TestCrossProcess:
    def refused(self, tmp_path: Path, view: dict[str, Any] | None = None) -> Cell:
        """A cross-process cell whose payload found no target and attempted nothing."""
        made = cell(tmp_path, "proc_cross_process", CONFINED, view)
        made.attempts = [att("find-self", "succeeded", "control")]
        made.attempts += [att("signal-self", "succeeded", "control")]
        made.attempts += [att(w, "refused", errno="ESRCH") for w in ("vm-readv", "signal-usr1")]
        made.facts = {"found_pid": None}
        return made

    def test_not_found_in_a_pid_namespace_of_its_own_passes(self, tmp_path: Path) -> None:
        """Nothing to address from a private pid namespace: the refusal stands."""
        verdict, reason, _ = self.refused(tmp_path).judge()
        assert verdict is Verdict.PASS, reason

    def test_not_found_in_the_hosts_pid_namespace_proves_nothing(self, tmp_path: Path) -> None:
        """Sharing the harness's pid namespace, "not found" is no refusal: INCONCLUSIVE."""
        view = {
            "seen": True,
            "pid": 9,
            "shared_with_harness": ["pid"],
            "status": {"Uid": "994 994 994 994", "CapEff": "0"},
        }
        verdict, reason, _ = self.refused(tmp_path, view).judge()
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert "host pid 9 in the harness's pid namespace" in reason

    SHARED = {  # noqa: RUF012  (read only)
        "seen": True,
        "pid": 9,
        "shared_with_harness": ["pid"],
        "status": {"Uid": "994 994 994 994", "CapEff": "0"},
    }

    def at_the_given_pid(self, tmp_path: Path, errno: str) -> Cell:
        """Not listed in its /proc, so attempted at the host pid it was given: all refused."""
        made = cell(tmp_path, "proc_cross_process", CONFINED, dict(self.SHARED))
        made.attempts = [att("find-self", "succeeded", "control")]
        made.attempts += [att("signal-self", "succeeded", "control")]
        made.attempts += [
            att(w, "refused", errno=errno)
            for w in ("vm-readv", "vm-writev", "mem-read", "mem-write", "signal-usr1")
        ]
        made.facts = {"found_pid": None, "attempted_pid": 777, "verified": False}
        return made

    def test_refused_at_the_given_pid_in_the_hosts_pid_namespace_passes(
        self, tmp_path: Path
    ) -> None:
        """Every attempt made at the host pid and refused, the target's log empty: PASS."""
        verdict, reason, _ = self.at_the_given_pid(tmp_path, "EPERM").judge()
        assert verdict is Verdict.PASS, reason
        assert "made at the host pid it was given (777" in reason

    @staticmethod
    def vm_read(pid: int, ret: int, *, entered: bool) -> dict[str, Any]:
        """process_vm_readv of `pid` by the payload (host pid 9), as the witness saw it."""
        return {
            "syscall": "process_vm_readv",
            "pid": 9,
            "comm": "python",
            "ret": ret,
            "error": "EPERM" if ret < 0 else "",
            "entered": entered,
            "args": [pid, 0, 1, 0] if entered else [0, 0, 0, 0],
        }

    @staticmethod
    def mem_refused(pid: int) -> dict[str, Any]:
        """The payload's open of /proc/<pid>/mem, refused by Landlock (entered, EACCES)."""
        return {
            "syscall": "openat",
            "pid": 9,
            "comm": "python",
            "ret": -13,
            "error": "EACCES",
            "entered": True,
            "args": [4294967196, 0, 0o2000000, 0],
            "text": f"/proc/{pid}/mem",
        }

    @contextlib.contextmanager
    def with_target(self, tmp_path: Path) -> Iterator[tuple[Cell, int]]:
        """A cell attempted at the given pid, with its real target (prepare), and that pid."""
        made = self.at_the_given_pid(tmp_path, "EPERM")
        spec = PROBES["proc_cross_process"]
        pid = int(spec.prepare(made.ctx)["target_pid"])
        made.facts["attempted_pid"] = pid
        try:
            yield made, pid
        finally:
            spec.cleanup(made.ctx)

    def test_the_kernel_backs_the_reads_no_log_can_witness(self, tmp_path: Path) -> None:
        """Refused reads, the kernel's errors behind them: PASS, the kernel named as witness."""
        with self.with_target(tmp_path) as (made, pid):
            events = [self.vm_read(pid, -1, entered=False), self.mem_refused(pid)]
            made.ctx.host_view["kernel"] = {"recorded": True, "dropped": 0, "events": events}
            verdict, reason, witness = made.judge()
        assert verdict is Verdict.PASS, reason
        assert "vm-readv: the kernel refused process_vm_readv before it began -> EPERM" in reason
        assert f"mem-read: the kernel saw openat(/proc/{pid}/mem) -> EACCES" in reason
        assert witness["kernel"]["corroborated"]

    def test_a_read_the_kernel_allowed_fails(self, tmp_path: Path) -> None:
        """The report says EPERM; the kernel returned the bytes: FAIL naming the kernel's answer."""
        with self.with_target(tmp_path) as (made, pid):
            events = [self.vm_read(pid, 32, entered=True), self.mem_refused(pid)]
            made.ctx.host_view["kernel"] = {"recorded": True, "dropped": 0, "events": events}
            verdict, reason, _ = made.judge()
        assert verdict is Verdict.FAIL, reason
        assert "the kernel let the payload through: vm-readv" in reason

    def test_no_such_process_in_the_hosts_pid_namespace_is_no_refusal(self, tmp_path: Path) -> None:
        """ESRCH for a live pid of a shared pid namespace is no kernel's answer: INCONCLUSIVE."""
        verdict, reason, _ = self.at_the_given_pid(tmp_path, "ESRCH").judge()
        assert verdict is Verdict.INCONCLUSIVE, reason
        assert "no such process" in reason


class TestOpenByHandle:
    def handle(
        self, tmp_path: Path, declared: DeclaredClaims, view: dict[str, Any] | None = None
    ) -> Cell:
        """A handle cell with its canary token kept, both attempts refused."""
        made = cell(tmp_path, "fs_open_by_handle", declared, view)
        state(made.ctx, {"token": "t0ken"})
        made.attempts = [
            att("read-by-path", "refused", errno="ENOENT"),
            att("open-by-handle", "refused", errno="EPERM"),
        ]
        return made

    def test_the_token_by_handle_fails_with_the_fix(self, tmp_path: Path) -> None:
        """The canary's token read through its handle: FAIL naming CAP_DAC_READ_SEARCH."""
        made = self.handle(tmp_path, CONFINED)
        made.attempts[1] = att("open-by-handle", "succeeded")
        made.facts = {"by_handle": "t0ken"}
        verdict, reason, _ = made.judge()
        assert verdict is Verdict.FAIL, reason
        assert "by its file handle; fix: drop CAP_DAC_READ_SEARCH" in reason

    def test_the_capability_in_the_hosts_namespace_fails(self, tmp_path: Path) -> None:
        """The host sees CAP_DAC_READ_SEARCH (bit 2) in its own user namespace: FAIL."""
        view = {
            "seen": True,
            "pid": 11,
            "shared_with_harness": ["user"],
            "status": {"Uid": "0 0 0 0", "CapEff": "0000000000000004"},
        }
        verdict, reason, _ = self.handle(tmp_path, CONFINED, view).judge()
        assert verdict is Verdict.FAIL, reason
        assert "holds CAP_DAC_READ_SEARCH in the host's user namespace (host pid 11)" in reason

    def test_the_capability_in_a_namespace_of_its_own_is_harmless(self, tmp_path: Path) -> None:
        """Every capability, but in a user namespace of its own (bwrap): PASS."""
        view = {"seen": True, "pid": 12, "status": {"Uid": "0 0 0 0", "CapEff": "1ffffffffff"}}
        verdict, reason, _ = self.handle(tmp_path, CONFINED, view).judge()
        assert verdict is Verdict.PASS, reason

    def test_a_deny_list_does_not_judge_the_path_read(self, tmp_path: Path) -> None:
        """Reads deny-listed to /home: the scratch canary read by path breaks no claim."""
        made = self.handle(tmp_path, HOMES_DENIED)
        made.attempts[0] = att("read-by-path", "succeeded")
        made.facts = {"read_by_path": "t0ken"}
        verdict, reason, _ = made.judge()
        assert verdict is Verdict.PASS, reason
        assert "by path is not judged" in reason

    def test_the_open_leg_sees_the_path_read(self, tmp_path: Path) -> None:
        """Unconfined, the token read by path is the escape the control leg must see."""
        made = self.handle(tmp_path, OPEN)
        made.attempts[0] = att("read-by-path", "succeeded")
        made.facts = {"read_by_path": "t0ken"}
        verdict, reason, witness = made.judge()
        assert verdict is Verdict.PASS, reason
        assert witness["read_via"] == ["read_by_path"]
