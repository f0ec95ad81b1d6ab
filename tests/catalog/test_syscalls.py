"""The syscall-surface probes of issue 28 (sandbox_attest/catalog/syscalls.py), judged.

Hand-made reports against a hand-made host baseline test the reading; the payloads run for
real on this host as the payload user, whose own rights are what a sandbox is judged against.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.backends.base import Backend, DeclaredClaims
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog import PROBES, CellContext, probe_path
from sandbox_attest.catalog.controls import control_record
from sandbox_attest.catalog.syscalls import SPECS
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.verdict import Verdict
from sandbox_attest.world.core import start_world
from tests.catalog.test_proc import CONFINED, att, make_ctx, verdict_of
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

EXTENDED = "proc_syscall_surface_extended"
MOUNT_API = "proc_new_mount_api"
EXTENDED_CALLS = ("add_key", "request_key", "userfaultfd", "perf_event_open", "ioctl-tioclinux")
MOUNT_CALLS = ("clone3-newns", "open_tree", "move_mount", "mount_setattr", "fsopen")


def report(*attempts: dict[str, Any], seccomp: str = "2") -> dict[str, Any]:
    """A payload report: the getpid control first, then `attempts`."""
    return {
        "attempts": [att("getpid", "succeeded", "control"), *attempts],
        "facts": {"seccomp": seccomp},
    }


def baseline(calls: tuple[str, ...], **outcomes: str) -> dict[str, Any]:
    """A host control whose baseline reached every call but those given other outcomes."""
    attempts = [
        att(what, outcomes.get(what.replace("-", "_"), "succeeded"), errno="EFAULT")
        for what in calls
    ]
    control = control_record("hbase", [{"what": "host baseline ran", "ok": True, "detail": ""}])
    control["baseline"] = report(*attempts, seccomp="0")
    return control


def with_seccomp(ctx: CellContext, mode: str) -> CellContext:
    """`ctx` with a host reading of one payload process in seccomp mode `mode`."""
    view = {"seen": True, "pid": 4242, "status": {"Seccomp": mode, "Seccomp_filters": "1"}}
    return CellContext(**{**ctx.__dict__, "host_view": view})


class TestExtendedReading:
    def test_every_call_refused_under_a_filter_passes(self, tmp_path: Path) -> None:
        """EPERM for every call the baseline reached, with a filter on the payload, is PASS."""
        ctx = with_seccomp(make_ctx(tmp_path, EXTENDED), "2")
        refused = [att(w, "refused", errno="EPERM") for w in (*EXTENDED_CALLS, "socketcall-i386")]
        control = baseline((*EXTENDED_CALLS, "socketcall-i386"))
        assert verdict_of(ctx, report(*refused), control) == Verdict.PASS

    def test_one_call_reached_fails_naming_it(self, tmp_path: Path) -> None:
        """TIOCLINUX reaching its handler under a filtered-syscall claim is FAIL naming it."""
        ctx = with_seccomp(make_ctx(tmp_path, EXTENDED), "2")
        attempts = [att(w, "refused", errno="EPERM") for w in EXTENDED_CALLS[:-1]]
        attempts.append(att("ioctl-tioclinux", "succeeded", errno="EBADF"))
        spec = PROBES[EXTENDED]
        assessment = spec.assess(ctx, report(*attempts), None, baseline(EXTENDED_CALLS))  # type: ignore[arg-type]
        assert assessment.escape == "escaped"
        assert assessment.reasons[0] == (
            'claims a filtered syscall surface (implied by ipc = "isolated"); '
            "the payload reached ioctl-tioclinux"
        )

    def test_a_refusal_without_any_filter_is_a_forged_report(self, tmp_path: Path) -> None:
        """add_key refused while the host sees Seccomp 0 on the payload: the report lies, FAIL."""
        ctx = with_seccomp(make_ctx(tmp_path, EXTENDED), "0")
        refused = [att(w, "refused", errno="EPERM") for w in EXTENDED_CALLS]
        assert verdict_of(ctx, report(*refused), baseline(EXTENDED_CALLS)) == Verdict.FAIL

    def test_a_door_the_host_lacks_is_not_judged(self, tmp_path: Path) -> None:
        """socketcall-i386 the baseline cannot reach (no IA32 emulation) counts for nothing."""
        ctx = with_seccomp(make_ctx(tmp_path, EXTENDED), "2")
        attempts = [att(w, "refused", errno="EPERM") for w in EXTENDED_CALLS]
        attempts.append(att("socketcall-i386", "unsupported"))
        control = baseline((*EXTENDED_CALLS, "socketcall-i386"), socketcall_i386="unsupported")
        spec = PROBES[EXTENDED]
        assessment = spec.assess(ctx, report(*attempts), None, control)  # type: ignore[arg-type]
        assert assessment.escape == "refused"
        assert "not judged (the host baseline does not reach them): socketcall-i386" in (
            assessment.reasons
        )

    def test_a_crashed_call_is_never_a_pass(self, tmp_path: Path) -> None:
        """A call the payload could not make leaves its door unknown: INCONCLUSIVE, not PASS."""
        ctx = with_seccomp(make_ctx(tmp_path, EXTENDED), "2")
        attempts = [att(w, "refused", errno="EPERM") for w in EXTENDED_CALLS[:-1]]
        attempts.append(att("ioctl-tioclinux", "error", errno="EXDEV"))
        assert verdict_of(ctx, report(*attempts), baseline(EXTENDED_CALLS)) == (
            Verdict.INCONCLUSIVE
        )

    def test_an_observation_never_decides(self, tmp_path: Path) -> None:
        """A fileless exec that worked is recorded in the witness, and the cell still PASSes."""
        ctx = with_seccomp(make_ctx(tmp_path, EXTENDED), "2")
        attempts = [att(w, "refused", errno="EPERM") for w in EXTENDED_CALLS]
        attempts.append(att("memfd-execveat", "succeeded", "observation"))
        spec = PROBES[EXTENDED]
        control = baseline(EXTENDED_CALLS)
        assessment = spec.assess(ctx, report(*attempts), None, control)  # type: ignore[arg-type]
        witness: dict[str, Any] = assessment.witness
        assert [o["what"] for o in witness["observations"]] == ["memfd-execveat"]
        assert verdict_of(ctx, report(*attempts), control) == Verdict.PASS

    def test_an_open_surface_claim_is_not_applicable(self) -> None:
        """Under syscalls = "open" (ipc open) both probes test no claim of the backend."""
        unfiltered = DeclaredClaims(network="proxy", filesystem="workspace", ipc="open")
        for spec in SPECS:
            assert spec.not_claimed(unfiltered) == "the backend claims an open syscall surface"
            assert spec.not_claimed(CONFINED) is None


class TestMountApiReading:
    def test_refused_namespaces_pass(self, tmp_path: Path) -> None:
        """ENOSPC from clone3 and EPERM from the mount API (no namespace of its own) is PASS."""
        ctx = make_ctx(tmp_path, MOUNT_API)
        attempts = [att("clone3-newns", "refused", errno="ENOSPC")]
        attempts += [att(w, "refused", errno="EPERM") for w in MOUNT_CALLS[1:]]
        assert verdict_of(ctx, report(*attempts), baseline(MOUNT_CALLS)) == Verdict.PASS

    def test_a_reached_mount_api_fails(self, tmp_path: Path) -> None:
        """A fsopen past its permission check (EFAULT) in a nested namespace is FAIL."""
        ctx = make_ctx(tmp_path, MOUNT_API)
        attempts = [att("clone3-newns", "refused", errno="ENOSYS")]
        attempts += [att(w, "refused", errno="EPERM") for w in MOUNT_CALLS[1:-1]]
        attempts.append(att("fsopen", "succeeded", errno="EFAULT"))
        assert verdict_of(ctx, report(*attempts), baseline(MOUNT_CALLS)) == Verdict.FAIL


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the payload as the payload user (root only)")
@pytest.mark.parametrize("probe", [EXTENDED, MOUNT_API])
def test_the_payload_reaches_every_door_unconfined(tmp_path: Path, probe: str) -> None:
    """Run unconfined as an unprivileged user, the payload reports each door it tried reached."""
    from sandbox_attest.host.trust import payload_user  # noqa: PLC0415

    user = payload_user()
    assert user is not None, "no payload user on this host: run as root (it makes one)"
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"probe": probe, "nonce": "n1", "targets": {}}))
    task.chmod(0o644)
    tmp_path.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(probe_path(probe)), str(task)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        **user.popen_kwargs(),
    )
    line = done.stdout.strip().splitlines()[-1]
    attempts = {a["what"]: a for a in json.loads(line)["attempts"]}
    assert attempts["getpid"]["outcome"] == "succeeded", attempts
    unreached = {
        w: a for w, a in attempts.items() if a["outcome"] not in {"succeeded", "unsupported"}
    }
    assert unreached == {}, unreached


@pytest.fixture(scope="module")
def native() -> Iterator[CellRunner]:
    """A runner over the native bubblewrap backend and two variants, each one protection less."""
    backends: dict[str, Backend] = {
        "none": NoneBackend(),
        "bubblewrap": BubblewrapBackend(),
        "no-seccomp": BubblewrapBackend(weaken=frozenset({"no-seccomp"})),
        "allow-userns": BubblewrapBackend(weaken=frozenset({"allow-userns"})),
    }
    with reachable_tempdir("sa-syscalls-") as base, start_world(base / "w") as world:
        (base / "cells").mkdir()
        runner = CellRunner(
            world=world,
            scratch=base / "cells",
            backends=backends,
            availability={name: b.availability() for name, b in backends.items()},
            platform="linux",
        )
        # The control leg first: a PASS counts only once the open host showed the escape.
        for probe in (EXTENDED, MOUNT_API):
            verdict_on(runner, "none", probe)
        yield runner


def verdict_on(runner: CellRunner, backend: str, probe: str) -> tuple[str, str]:
    """One live cell's verdict and reason."""
    entry = runner.run_cell(Cell(backend, ProbeRow(probe, 30), None))
    if entry["verdict"] == "UNAVAILABLE":
        pytest.skip(f"{backend} cannot run here: {entry['reason']}")
    return str(entry["verdict"]), str(entry["reason"])


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
class TestNativeProtections:
    """Each of the native backend's protections closes its own class, and only that one."""

    @pytest.mark.parametrize("probe", [EXTENDED, MOUNT_API])
    def test_the_native_backend_passes(self, native: CellRunner, probe: str) -> None:
        """The shipped bubblewrap backend PASSes both probes."""
        verdict, reason = verdict_on(native, "bubblewrap", probe)
        assert verdict == "PASS", reason

    def test_without_the_filter_the_surface_is_open(self, native: CellRunner) -> None:
        """Without its seccomp filter, the extended surface FAILs naming TIOCLINUX and the rest."""
        verdict, reason = verdict_on(native, "no-seccomp", EXTENDED)
        assert verdict == "FAIL", reason
        assert "the payload reached add_key, request_key, userfaultfd, perf_event_open" in reason
        held, why = verdict_on(native, "no-seccomp", MOUNT_API)
        assert held == "PASS", why

    def test_with_nested_namespaces_the_mount_api_is_open(self, native: CellRunner) -> None:
        """Without --disable-userns, clone3 and the mount API FAIL; the filter still holds."""
        verdict, reason = verdict_on(native, "allow-userns", MOUNT_API)
        assert verdict == "FAIL", reason
        assert "the payload reached clone3-newns, open_tree" in reason
        held, why = verdict_on(native, "allow-userns", EXTENDED)
        assert held == "PASS", why
