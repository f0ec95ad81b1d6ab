"""The kernel witness's answers judge a filter sandbox's refusals (issue 27, item 1).

The events here are the ones a live sandlock cell recorded (/tmp/kw-r2, 2026-12-02): the
payload (pid 19680, python) opening each canary and Landlock answering EACCES, beside the
sandlock supervisor's own openat2 of the same path (pid 19600), which is not the payload.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.controls import load_state
from sandbox_attest.catalog.dev import CONTROL_DEVICES, device_nodes
from sandbox_attest.catalog.fs import FsReadSecrets
from sandbox_attest.catalog.witness.kernel import (
    OPENS,
    ReportedAttempt,
    corroborate,
    kernel_answer,
    path_match,
    reads_bytes,
)
from sandbox_attest.errors import FixtureError
from sandbox_attest.run.runner import inside_route, kernel_unseen
from sandbox_attest.verdict import Verdict, believe, decide
from tests.catalog.test_host import CONFINED, Records, StubWorld, stub_cell, stub_info

if TYPE_CHECKING:
    from collections.abc import Iterator

PAYLOAD_PID = 19680
SUPERVISOR_PID = 19600
O_RDONLY_CLOEXEC = 0o2000000
O_PATH = 0o10000000


def event(
    path: str, ret: int, *, pid: int = PAYLOAD_PID, flags: int = O_RDONLY_CLOEXEC, **over: Any
) -> dict[str, Any]:
    """An openat event as the witness records it."""
    error = {-13: "EACCES", -2: "ENOENT", -1: "EPERM"}.get(ret, "")
    base = {
        "syscall": "openat",
        "pid": pid,
        "comm": "python",
        "ret": ret,
        "error": error,
        "entered": True,
        "args": [4294967196, 140473405470672, flags, 0],
        "text": path,
    }
    return {**base, **over}


def view(
    events: list[dict[str, Any]], *, shared: tuple[str, ...] = ("mnt", "net")
) -> dict[str, Any]:
    """A host view: the payload seen at the rendezvous, and the kernel's reading of the cell."""
    return {
        "seen": True,
        "pid": PAYLOAD_PID,
        "shared_with_harness": list(shared),
        "kernel": {"status": "attached", "recorded": True, "dropped": 0, "events": events},
    }


def attempt(path: str, outcome: str = "refused") -> ReportedAttempt:
    """A reported read of `path`."""
    return ReportedAttempt(path, outcome, OPENS, path_match(path), reads_bytes)


class TestCorroborate:
    """`corroborate` applies issue 27's rule to reported attempts."""

    def test_a_refusal_the_kernel_returned_is_corroborated(self) -> None:
        """The kernel's EACCES for that path backs the payload's refusal."""
        ctx: Any = SimpleNamespace(host_view=view([event("/h/.ssh/id", -13)]))
        judged = corroborate(ctx, [attempt("/h/.ssh/id")], "mnt")
        assert judged is not None
        assert judged.all_corroborated
        assert judged.corroborated == ["/h/.ssh/id: the kernel saw openat(/h/.ssh/id) -> EACCES"]

    def test_an_attempt_the_kernel_never_saw_does_not_match(self) -> None:
        """A refusal with no syscall behind it is a report that does not match the probe."""
        ctx: Any = SimpleNamespace(host_view=view([event("/h/other", 3)]))
        judged = corroborate(ctx, [attempt("/h/.ssh/id")], "mnt")
        assert judged is not None
        assert judged.unseen
        assert "the kernel saw no open/openat/openat2 of it" in judged.unseen[0]

    def test_unseen_after_dropped_events_is_only_uncertain(self) -> None:
        """Past the cell's cap the kernel kept less than it saw: not seen is not an error."""
        host_view = view([event("/h/other", 3)])
        host_view["kernel"]["dropped"] = 12
        ctx: Any = SimpleNamespace(host_view=host_view)
        judged = corroborate(ctx, [attempt("/h/.ssh/id")], "mnt")
        assert judged is not None
        assert not judged.unseen
        assert "dropped 12" in judged.uncertain[0]

    def test_a_success_in_the_payload_is_an_escape(self) -> None:
        """An open that read the file in the payload's own process outweighs its refusal."""
        ctx: Any = SimpleNamespace(host_view=view([event("/h/.ssh/id", 3)]))
        judged = corroborate(ctx, [attempt("/h/.ssh/id")], "mnt")
        assert judged is not None
        assert judged.escapes == ["/h/.ssh/id: the kernel saw openat(/h/.ssh/id) -> 3"]

    @pytest.mark.parametrize(
        ("over", "why"),
        [
            ({"pid": SUPERVISOR_PID}, "the supervisor's open is not the payload's"),
            ({"args": [0, 0, O_PATH, 0]}, "an O_PATH open reads no byte"),
            ({"syscall": "openat2"}, "openat2's flags are not seen"),
        ],
        ids=["supervisor", "o_path", "openat2"],
    )
    def test_a_success_that_reads_nothing_of_the_payloads_is_no_escape(
        self, over: dict[str, Any], why: str
    ) -> None:
        """Successes that are not the payload reading the file do not count against it."""
        events = [event("/h/.ssh/id", 3, **over), event("/h/.ssh/id", -13)]
        ctx: Any = SimpleNamespace(host_view=view(events))
        judged = corroborate(ctx, [attempt("/h/.ssh/id")], "mnt")
        assert judged is not None
        assert judged.escapes == [], why
        assert judged.all_corroborated

    def test_seccomp_refusals_without_arguments_are_said_as_such(self) -> None:
        """A syscall refused before sys_enter has no argument; it corroborates, and says so."""
        unseen = {"syscall": "openat", "pid": PAYLOAD_PID, "entered": False, "error": "EPERM"}
        ctx: Any = SimpleNamespace(host_view=view([event("/x", 3), {**unseen, "ret": -1}]))
        judged = corroborate(ctx, [attempt("/h/.ssh/id")], "mnt")
        assert judged is not None
        assert "before it began -> EPERM (seccomp" in judged.corroborated[0]

    @pytest.mark.parametrize(
        ("host_view", "why"),
        [
            ({"kernel": {"status": "unavailable", "why": "not root"}}, "no witness"),
            ({**view([event("/h/.ssh/id", -13)], shared=("net",))}, "own mount namespace"),
            ({**view([event("/h/.ssh/id", -13, pid=4)])}, "payload outside the cgroup"),
            ({**view([event("/h/.ssh/id", -13)]), "seen": False}, "payload never seen"),
        ],
        ids=["no-witness", "namespace-sandbox", "other-cgroup", "unseen-payload"],
    )
    def test_today_s_readings_stand_where_the_rule_does_not_apply(
        self, host_view: dict[str, Any], why: str
    ) -> None:
        """No witness, a namespace sandbox or a payload outside the cell's cgroup: None."""
        ctx: Any = SimpleNamespace(host_view=host_view)
        assert corroborate(ctx, [attempt("/h/.ssh/id")], "mnt") is None, why

    def test_kernel_answer_prefers_the_refusal(self) -> None:
        """One attempt's answer: its refusal, and the reading names syscall, path and errno."""
        ctx: Any = SimpleNamespace(host_view=view([event("/p", 3), event("/p", -13)]))
        answer = kernel_answer(ctx, "openat", path_match("/p"))
        assert answer is not None
        assert answer.reading() == "the kernel saw openat(/p) -> EACCES"


# ---------------------------------------------------------------------------------------------
# fs_read_secrets on a filter sandbox: the cell the sandlock run showed (INCONCLUSIVE before).


@pytest.fixture
def make_ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CellContext]:
    """One fs_read_secrets context with its canaries planted under a home of the test's own."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("planting canaries with their owner needs root")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    nonce = "n" + secrets.token_hex(8)
    (tmp_path / nonce / "workspace").mkdir(parents=True)
    (tmp_path / "real.sock").touch()
    spec = FsReadSecrets()
    ctx = CellContext(
        probe=spec.id,
        backend="unit",
        nonce=nonce,
        world=StubWorld(stub_info(tmp_path / "real.sock")),
        workspace=tmp_path / nonce / "workspace",
        cell_dir=tmp_path / nonce,
        claims=CONFINED,
        route=inside_route(),
    )
    spec.prepare(ctx)
    yield ctx
    with contextlib.suppress(FixtureError):
        spec.cleanup(ctx)


def filter_cell(ctx: CellContext, kernel: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What the sandlock run's host saw: every canary visible as the host's own file."""
    spec = FsReadSecrets()
    paths = spec.secret_paths(ctx)
    looked = [{"path": str(p), "visible": True, "same_inode_as_host": True} for p in paths.values()]
    host_view = view(kernel or [])
    host_view["looked"] = looked
    if kernel is None:
        host_view["kernel"] = {"status": "unavailable", "why": "not root"}
    hashes = load_state(ctx)["hashes"]
    attempts = [
        {"what": "workspace", "role": "control", "outcome": "succeeded"},
        *({"what": k, "role": "escape", "outcome": "refused", "errno": "EACCES"} for k in paths),
    ]
    attempts[0]["sha256"] = hashes["workspace"]
    ctx.host_view.update(host_view)
    return {"probe": spec.id, "nonce": ctx.nonce, "attempts": attempts, "facts": {}}


OK_CONTROL: dict[str, Any] = {"ok": True, "nonce": "hcontrol", "checks": []}


class TestFsReadSecretsOnAFilter:
    """fs_read_secrets judged on a filter sandbox whose canaries are visible in its view."""

    def test_without_the_kernel_the_refusal_rests_on_the_report(self, make_ctx: Any) -> None:
        """The artifact: the host's view backs nothing, so a wrapper's PASS is INCONCLUSIVE."""
        spec = FsReadSecrets()
        report = filter_cell(make_ctx, None)
        assessment = spec.assess(make_ctx, report, Records(), OK_CONTROL)
        decision = believe(decide("denied", assessment), assessment, crossed_wrapper=True)
        assert decision.verdict is Verdict.INCONCLUSIVE

    def test_the_kernels_eacces_for_each_canary_makes_it_a_pass(self, make_ctx: Any) -> None:
        """Landlock's EACCES for each canary open, seen by the kernel witness, backs the PASS."""
        spec = FsReadSecrets()
        paths = spec.secret_paths(make_ctx)
        kernel = [event(str(p), -13) for p in paths.values()]
        kernel.append(event(str(paths["ssh"]), 9, pid=SUPERVISOR_PID, syscall="openat2"))
        report = filter_cell(make_ctx, kernel)
        assessment = spec.assess(make_ctx, report, Records(), OK_CONTROL)
        decision = believe(decide("denied", assessment), assessment, crossed_wrapper=True)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert f"the kernel saw openat({paths['ssh']}) -> EACCES" in decision.reason
        kernel_witness: Any = assessment.witness["kernel"]
        assert len(kernel_witness["events"]) == len(paths)

    def test_a_canary_open_the_kernel_never_saw_is_an_error(self, make_ctx: Any) -> None:
        """A refusal reported for a canary the payload never opened does not match the probe."""
        spec = FsReadSecrets()
        paths = spec.secret_paths(make_ctx)
        kernel = [event(str(p), -13) for k, p in paths.items() if k != "aws"]
        report = filter_cell(make_ctx, kernel)
        assessment = spec.assess(make_ctx, report, Records(), OK_CONTROL)
        unseen = kernel_unseen(assessment)
        assert len(unseen) == 1
        assert unseen[0].startswith(f"aws ({paths['aws']}): the payload reports refused")

    def test_a_canary_the_kernel_opened_for_the_payload_is_a_fail(self, make_ctx: Any) -> None:
        """The payload says refused, the kernel returned it a descriptor: FAIL naming the open."""
        spec = FsReadSecrets()
        paths = spec.secret_paths(make_ctx)
        kernel = [event(str(p), -13 if k != "ssh" else 5) for k, p in paths.items()]
        report = filter_cell(make_ctx, kernel)
        assessment = spec.assess(make_ctx, report, Records(), OK_CONTROL)
        decision = decide("denied", assessment)
        assert decision.verdict is Verdict.FAIL
        assert f"openat({paths['ssh']}) -> 5" in decision.reason


# ---------------------------------------------------------------------------------------------
# net_ipv6_udp_icmp on a filter sandbox: the sandlock cell of /tmp/kw-r5 (INCONCLUSIVE before:
# the payload shares the harness's network namespace, and no listener hears a refusal).


def unseen_connect(ret: int = -111, error: str = "ECONNREFUSED") -> dict[str, Any]:
    """A connect sandlock's supervisor answered before sys_enter: no argument is seen."""
    return {
        "syscall": "connect",
        "pid": PAYLOAD_PID,
        "comm": "python",
        "ret": ret,
        "error": error,
        "entered": False,
        "args": [0, 0, 0, 0],
    }


@pytest.fixture
def net_ctx(tmp_path: Path) -> Iterator[tuple[CellContext, dict[str, Any]]]:
    """One net_ipv6_udp_icmp context with its loopback listeners started, and its targets."""
    spec = PROBES["net_ipv6_udp_icmp"]
    nonce = "n" + secrets.token_hex(8)
    (tmp_path / nonce / "workspace").mkdir(parents=True)
    (tmp_path / "real.sock").touch()
    ctx = CellContext(
        probe=spec.id,
        backend="unit",
        nonce=nonce,
        world=StubWorld(stub_info(tmp_path / "real.sock")),
        workspace=tmp_path / nonce / "workspace",
        cell_dir=tmp_path / nonce,
        claims=CONFINED,
        route=inside_route(),
    )
    targets = spec.prepare(ctx)
    yield ctx, targets
    spec.cleanup(ctx)


NET_ATTEMPTS = [
    {"what": "tcp6-connect", "role": "escape", "outcome": "refused", "errno": "ECONNREFUSED"},
    {"what": "udp6-datagram", "role": "escape", "outcome": "refused", "errno": "ECONNREFUSED"},
    {"what": "udp4-datagram", "role": "escape", "outcome": "refused", "errno": "ECONNREFUSED"},
    {"what": "icmp-echo", "role": "escape", "outcome": "refused", "errno": "EACCES"},
    {"what": "raw-socket", "role": "escape", "outcome": "refused", "errno": "EPERM"},
    {"what": "packet-socket", "role": "escape", "outcome": "refused", "errno": "EAFNOSUPPORT"},
]
# The host itself lacks the three local capabilities here (as on this machine).
NET_CONTROL: dict[str, Any] = {
    "ok": True,
    "nonce": "hcontrol",
    "checks": [],
    "capabilities": {"icmp-echo": "EACCES", "raw-socket": "EPERM", "packet-socket": "EPERM"},
}


def net_verdict(cell: Any, kernel: list[dict[str, Any]] | None) -> tuple[Any, Any]:
    """The cell's decision on a command wrapper, and its assessment."""
    ctx: CellContext = cell[0]
    ctx.host_view.update(view(kernel or [], shared=("mnt", "net")))
    if kernel is None:
        ctx.host_view["kernel"] = {"status": "unavailable", "why": "not root"}
    report = {"probe": ctx.probe, "nonce": ctx.nonce, "attempts": NET_ATTEMPTS, "facts": {}}
    assessment = PROBES[ctx.probe].assess(ctx, report, Records(), NET_CONTROL)
    if not assessment.corroborated_by:
        assessment.corroborated_by = PROBES[ctx.probe].corroboration(ctx, report)
    return believe(decide("denied", assessment), assessment, crossed_wrapper=True), assessment


class TestNetIpv6UdpIcmpOnAFilter:
    """net_ipv6_udp_icmp judged on a filter sandbox in the harness's network namespace."""

    def test_without_the_kernel_nothing_backs_the_refusals(self, net_ctx: Any) -> None:
        """The artifact: no listener hears a refusal, so the wrapper's PASS is INCONCLUSIVE."""
        decision, _ = net_verdict(net_ctx, None)
        assert decision.verdict is Verdict.INCONCLUSIVE

    def test_the_kernels_refusal_of_each_attempt_makes_it_a_pass(self, net_ctx: Any) -> None:
        """Three connects refused (by sandlock's supervisor, before sys_enter): PASS, said so."""
        decision, assessment = net_verdict(net_ctx, [unseen_connect() for _ in range(3)])
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "tcp6-connect: the kernel refused connect before it began" in decision.reason
        assert len(assessment.witness["kernel"]["events"]) == 3

    def test_one_refusal_does_not_answer_two_attempts(self, net_ctx: Any) -> None:
        """A refusal with no argument answers one attempt: the others were never seen."""
        decision, assessment = net_verdict(net_ctx, [unseen_connect(), event("/x", 3)])
        assert decision.verdict is not Verdict.PASS
        assert len(kernel_unseen(assessment)) == 2

    def test_a_refused_socket_of_another_protocol_answers_nothing(self, net_ctx: Any) -> None:
        """The ping socket's EACCES (IPPROTO_ICMP) is not the UDP attempt's socket()."""
        ping = {**unseen_connect(-13, "EACCES"), "syscall": "socket", "entered": True}
        ping["args"] = [2, 524290, 1, 0]
        _, assessment = net_verdict(net_ctx, [unseen_connect(), unseen_connect(), ping])
        assert [u.split(":")[0] for u in kernel_unseen(assessment)] == ["udp4-datagram"]

    def test_a_tcp_connect_the_kernel_completed_is_a_fail(self, net_ctx: Any) -> None:
        """The payload says refused; the kernel connected it to the listener: FAIL."""
        tcp6 = net_ctx[1]["tcp6"]
        port = int(tcp6.rpartition(":")[2])
        done = {**unseen_connect(0, ""), "entered": True}
        done["address"] = {"family": "AF_INET6", "ip": "::1", "port": port, "address": tcp6}
        decision, _ = net_verdict(net_ctx, [done, unseen_connect(), unseen_connect()])
        assert decision.verdict is Verdict.FAIL
        assert f"tcp6-connect: the kernel saw connect({tcp6}) -> 0" in decision.reason


# ---------------------------------------------------------------------------------------------
# dev_access on a filter sandbox: /dev/fuse is in the payload's view (the host's own /dev), and
# Landlock refuses its open (INCONCLUSIVE before: the listing shows a node it could open).


def dev_cell(tmp_path: Path, kernel: list[dict[str, Any]] | None) -> tuple[Any, Any]:
    """The decision on a command wrapper for a refused /dev/fuse open, and the assessment."""
    spec = PROBES["dev_access"]
    nodes = device_nodes()
    harmless: dict[str, Any] = {n: nodes[n] for n in CONTROL_DEVICES if n in nodes}
    fuse: dict[str, Any] = {"rdev": "10:229", "kind": "char"}
    host_view = view(kernel or [])
    if kernel is None:
        host_view["kernel"] = {"status": "unavailable", "why": "not root"}
    ctx = stub_cell(spec.id, tmp_path, host_view)
    payload_view: dict[str, Any] = {
        "seen": True,
        "pid": PAYLOAD_PID,
        "nodes": {**harmless, "fuse": fuse},
    }
    control: dict[str, Any] = {
        "ok": True,
        "nonce": "hcontrol",
        "checks": [],
        "devices": {**harmless, "fuse": {**fuse, "opens": True}},
        "payload_view": payload_view,
    }
    inside = [
        {
            "what": f"control:{n}",
            "role": "control",
            "outcome": "succeeded",
            "path": f"/dev/{n}",
            "rdev": d["rdev"],
            "kind": "char",
        }
        for n, d in harmless.items()
    ]
    fuse_attempt = {
        "what": "dev:fuse",
        "role": "escape",
        "outcome": "refused",
        "errno": "EACCES",
        "path": "/dev/fuse",
    }
    report = {"probe": spec.id, "nonce": ctx.nonce, "attempts": [*inside, fuse_attempt]}
    assessment = spec.assess(ctx, report, Records(), control)
    return believe(decide("denied", assessment), assessment, crossed_wrapper=True), assessment


class TestDevAccessOnAFilter:
    """dev_access judged where the host's device nodes are in the payload's view."""

    def test_without_the_kernel_the_refusal_rests_on_the_report(self, tmp_path: Path) -> None:
        """The artifact: a node in the view backs no refusal, so the PASS is INCONCLUSIVE."""
        decision, _ = dev_cell(tmp_path, None)
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason

    def test_the_kernels_eacces_for_the_open_makes_it_a_pass(self, tmp_path: Path) -> None:
        """Landlock's EACCES for openat(/dev/fuse), seen by the kernel, backs the PASS."""
        decision, _ = dev_cell(tmp_path, [event("/dev/fuse", -13, flags=0o4400)])
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "the kernel saw openat(/dev/fuse) -> EACCES" in decision.reason

    def test_a_device_the_kernel_opened_for_the_payload_is_a_fail(self, tmp_path: Path) -> None:
        """The payload says refused; the kernel gave it /dev/fuse read-only: FAIL."""
        decision, _ = dev_cell(tmp_path, [event("/dev/fuse", 3, flags=0o4400)])
        assert decision.verdict is Verdict.FAIL
        assert "openat(/dev/fuse) -> 3" in decision.reason


# ---------------------------------------------------------------------------------------------
# proc_new_mount_api (issue 28) on bwrap-generic: its own namespaces, no user namespace left
# (--disable-userns); the calls refused by the kernel's own checks (/tmp/kw-r9, 2026-12-02).

MOUNT_CALLS = ("open_tree", "move_mount", "mount_setattr", "fsopen")


def mount_api_cell(tmp_path: Path, kernel: list[dict[str, Any]] | None) -> tuple[Any, Any]:
    """The decision on a command wrapper for the bwrap-generic report, and the assessment."""
    spec = PROBES["proc_new_mount_api"]
    host_view = view(kernel or [], shared=())
    if kernel is None:
        host_view["kernel"] = {"status": "unavailable", "why": "not root"}
    ctx = stub_cell(spec.id, tmp_path, host_view)
    calls = ("clone3-newns", *MOUNT_CALLS)
    baseline = {"attempts": [{"what": w, "role": "escape", "outcome": "succeeded"} for w in calls]}
    control = {"ok": True, "nonce": "hcontrol", "checks": [], "baseline": baseline}
    attempts = [
        {"what": "getpid", "role": "control", "outcome": "succeeded"},
        {"what": "clone3-newns", "role": "escape", "outcome": "refused", "errno": "ENOSPC"},
        *(
            {"what": w, "role": "escape", "outcome": "refused", "errno": "EPERM"}
            for w in MOUNT_CALLS
        ),
    ]
    report = {"probe": spec.id, "nonce": ctx.nonce, "attempts": attempts, "facts": {}}
    assessment = spec.assess(ctx, report, Records(), control)
    if not assessment.corroborated_by:
        assessment.corroborated_by = spec.corroboration(ctx, report)
    return believe(decide("denied", assessment), assessment, crossed_wrapper=True), assessment


def call(syscall: str, ret: int, error: str) -> dict[str, Any]:
    """A syscall event of the payload, entered, without a path."""
    return {**event("", ret, syscall=syscall, error=error), "text": ""}


class TestNewMountApiByTheKernel:
    """proc_new_mount_api's refusals backed by the kernel's errno for each call."""

    def test_without_the_kernel_the_refusals_rest_on_the_report(self, tmp_path: Path) -> None:
        """The artifact (issue 28): nothing on the host reads a refused syscall: INCONCLUSIVE."""
        decision, _ = mount_api_cell(tmp_path, None)
        assert decision.verdict is Verdict.INCONCLUSIVE

    def test_the_kernels_errno_for_each_call_makes_it_a_pass(self, tmp_path: Path) -> None:
        """clone3 -> ENOSPC and EPERM for each mount call, beside clone3's own threads: PASS."""
        kernel = [call("clone3", 3, ""), call("clone3", -28, "ENOSPC")]
        kernel += [call(name, -1, "EPERM") for name in MOUNT_CALLS]
        decision, _ = mount_api_cell(tmp_path, kernel)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "clone3-newns: the kernel saw clone3() -> ENOSPC" in decision.reason

    def test_another_errno_does_not_answer_the_attempt(self, tmp_path: Path) -> None:
        """The kernel said EFAULT (the handler ran), the payload says EPERM: no match, ERROR."""
        kernel = [call("clone3", -28, "ENOSPC"), call("open_tree", -14, "EFAULT")]
        kernel += [call(name, -1, "EPERM") for name in MOUNT_CALLS[1:]]
        _, assessment = mount_api_cell(tmp_path, kernel)
        assert [u.split(":")[0] for u in kernel_unseen(assessment)] == ["open_tree"]
