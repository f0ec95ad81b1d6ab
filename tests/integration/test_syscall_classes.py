"""Issue 28, live: the syscalls not yet probed, each probe with the one hole that opens it.

One real `sandbox-attest run` over the strong backends (bubblewrap, docker), the control leg
`none` and two deliberately broken wrappers (tests/data/newclasses/<probe>_hole.toml, copies
of matrix/backends/bwrap-generic.toml):

- proc_syscall_surface_extended_hole.toml is bwrap-generic as it ships, with no seccomp
  filter: add_key, request_key, userfaultfd, perf_event_open, ioctl TIOCLINUX and the i386
  socketcall reach their handlers, so that probe FAILs naming them and the fix. Its
  --disable-userns still closes proc_new_mount_api, which PASSes there.
- proc_new_mount_api_hole.toml drops --disable-userns: clone3 makes namespaces and the new
  mount API passes its permission check, so that probe FAILs naming each call and the fix.

The strong backends PASS both (their filters refuse every call, or the namespace is not
theirs to make); the control leg sees every escape (its job). Real bubblewrap, docker and
uids; root only (the payload user exists only as root).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.report.evidence import EVIDENCE_NAME
from tests.integration.hole_runs import HoleRun, hole_run

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.timeout(400),
]

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "newclasses"
# Each probe, the [backend] name of its hole wrapper and the attempts that hole must open.
HOLES = {
    "proc_syscall_surface_extended": (
        "hole-syscall-surface",
        ("add_key", "request_key", "userfaultfd", "perf_event_open", "ioctl-tioclinux"),
    ),
    "proc_new_mount_api": (
        "hole-nested-userns",
        ("clone3-newns", "open_tree", "move_mount", "mount_setattr", "fsopen"),
    ),
}
STRONG = ("bubblewrap", "docker")
LEGS = ("none", *STRONG)
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """The run, shared by the checks below."""
    specs = [DATA / f"{p}_hole.toml" for p in HOLES]
    with hole_run(
        "sa-syscalls-",
        probes=tuple(HOLES),
        legs=LEGS,
        required=("none",),
        specs=specs,
        named=STRONG,
        probe_timeout=30,
        run_timeout=RUN_TIMEOUT_S,
    ) as done:
        yield done


def _strong_or_skip(run: HoleRun, backend: str, probe: str) -> dict[str, Any]:
    cell = run.cell(backend, probe)
    if cell["verdict"] == "UNAVAILABLE":
        pytest.skip(f"{backend} is unavailable here: {cell['reason']}")
    return cell


@pytest.mark.parametrize("probe", sorted(HOLES))
class TestEachProbe:
    def test_the_control_leg_sees_the_escape(self, run: HoleRun, probe: str) -> None:
        """Unconfined, the payload user reaches every door: PASS because the escape was seen."""
        cell = run.cell("none", probe)
        assert (cell["verdict"], cell["escape"]) == ("PASS", "escaped"), cell["reason"]
        for what in HOLES[probe][1]:
            assert f"{what} succeeded" in cell["reason"], (what, cell["reason"])

    @pytest.mark.parametrize("backend", STRONG)
    def test_the_strong_backends_hold(self, run: HoleRun, probe: str, backend: str) -> None:
        """The bubblewrap and docker backends refuse every call the host baseline reaches."""
        cell = _strong_or_skip(run, backend, probe)
        assert (cell["verdict"], cell["escape"]) == ("PASS", "refused"), cell["reason"]
        assert "reached the kernel handler: none" in cell["reason"] or cell["reason"].startswith(
            "reached (clone3 made namespaces, or the mount API passed its permission check): none"
        ), cell["reason"]

    def test_the_hole_fails_naming_each_call_and_the_fix(self, run: HoleRun, probe: str) -> None:
        """The wrapper with exactly this hole FAILs, naming what it let through and the fix."""
        backend, opened = HOLES[probe]
        cell = run.cell(backend, probe)
        assert (cell["verdict"], cell["escape"]) == ("FAIL", "escaped"), cell["reason"]
        assert "claims a filtered syscall surface" in cell["reason"], cell["reason"]
        reached = cell["reason"].split("the payload reached ", 1)[1].split(";", 1)[0].split(", ")
        assert set(opened) <= set(reached), cell["reason"]
        assert "fix: " in cell["reason"], cell["reason"]


class TestExactlyThatHole:
    def test_the_seccomp_hole_leaves_namespaces_closed(self, run: HoleRun) -> None:
        """Without a filter but with --disable-userns, the mount API stays out of reach.

        The refusal crossed a wrapper: it is a PASS only on the kernel witness's errno for each
        call in the payload's own process (never FAIL: nothing was reached). Where no witness
        ran (not root, no bpftrace), nothing corroborates it and the cell is INCONCLUSIVE.
        """
        cell = run.cell("hole-syscall-surface", "proc_new_mount_api")
        evidence = json.loads((run.out / EVIDENCE_NAME).read_text())
        if evidence["kernel_witness"].get("status") == "attached":
            assert (cell["verdict"], cell["escape"]) == ("PASS", "refused"), cell["reason"]
            for call in ("clone3", "open_tree", "move_mount", "mount_setattr", "fsopen"):
                assert f"the kernel saw {call}() -> E" in cell["reason"], cell["reason"]
        else:
            assert (cell["verdict"], cell["escape"]) == ("INCONCLUSIVE", "refused"), cell["reason"]
            assert "no host reading corroborates it" in cell["reason"], cell["reason"]

    def test_the_compat_entry_is_refused_by_the_filters(self, run: HoleRun) -> None:
        """The i386 socketcall reaches the kernel without a filter and never under one."""
        hole = run.cell("hole-syscall-surface", "proc_syscall_surface_extended")
        _, _, unjudged = hole["reason"].partition("not judged")
        if "socketcall-i386" in unjudged:
            pytest.skip(f"this kernel has no i386 entry to reach: {hole['reason']}")
        assert "socketcall-i386 succeeded" in hole["reason"], hole["reason"]
        for backend in STRONG:
            cell = _strong_or_skip(run, backend, "proc_syscall_surface_extended")
            assert "socketcall-i386 refused" in cell["reason"], cell["reason"]

    def test_fileless_exec_is_recorded_not_judged(self, run: HoleRun) -> None:
        """memfd_create + execveat is an observation on every leg, never the reason for FAIL."""
        for backend in (*LEGS, "hole-syscall-surface"):
            cell = run.cell(backend, "proc_syscall_surface_extended")
            if cell["verdict"] == "UNAVAILABLE":
                continue
            observations = cell["witness"]["observations"]
            assert [o["what"] for o in observations] == ["memfd-execveat"], observations
            assert "memfd-execveat" not in cell["reason"], cell["reason"]
