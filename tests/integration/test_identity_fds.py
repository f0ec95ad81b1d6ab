"""Issue 26, row 1, live: a sandbox that keeps inherited descriptors FAILs env_inheritance.

tests/data/identity/fds_inherited.toml is matrix/backends/bwrap-generic.toml started from a
shell that opens the host's `/` as fd 7 and the payload user's home as fd 8: bwrap hands
inherited descriptors on, so the payload holds the host's tree whatever the mounts hide.
It runs once with the harness's shim between bwrap and the payload (egress "harness-unix")
and once without (fds_inherited_own.toml, egress "own"): the shim passes on what it
inherited, so both FAIL env_inheritance naming each descriptor, its target and the fix, and
the gate is FAILED. The control leg and the strong legs (bubblewrap, bwrap-generic) stay PASS
on the same probe in the same run.

Real bubblewrap, real uids; root only (the payload user exists only as root).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.host.trust import payload_user
from tests.integration.hole_runs import LIVE_HOLE_MARKS, HoleRun, hole_run

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [*LIVE_HOLE_MARKS, pytest.mark.timeout(400)]

DATA = Path(__file__).parent.parent / "data" / "identity"
PROBE = "env_inheritance"
# Each hole wrapper (its [backend] name) and its spec: the shim leg and the "own" leg.
HOLES = {
    "hole-inherited-fds": "fds_inherited.toml",
    "hole-inherited-fds-own": "fds_inherited_own.toml",
}
CLEAN = ("none", "bubblewrap", "bwrap-generic")
FIX = "fix: close every descriptor above 2 before the sandbox starts the payload"
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """One run of env_inheritance on the clean legs and both hole wrappers."""
    with hole_run(
        "sa-identity-fds-",
        probes=(PROBE,),
        legs=CLEAN,
        required=(*CLEAN, *HOLES),
        specs=[DATA / spec for spec in HOLES.values()],
        run_timeout=RUN_TIMEOUT_S,
    ) as done:
        yield done


class TestCleanLegs:
    @pytest.mark.parametrize("backend", CLEAN)
    def test_pass(self, run: HoleRun, backend: str) -> None:
        """A sandbox started with nothing but 0-2 hands the payload no host object: PASS."""
        cell = run.cell(backend, PROBE)
        assert cell["verdict"] == "PASS", cell["reason"]
        assert cell["witness"]["held_host_objects"] == [], cell["witness"]
        assert cell["witness"]["unidentified_fds"] == [], cell["witness"]


class TestInheritedDescriptors:
    @pytest.mark.parametrize("backend", HOLES)
    def test_fails_naming_each_descriptor_its_target_and_the_fix(
        self, run: HoleRun, backend: str
    ) -> None:
        """Descriptors 7 (the host's /) and 8 (the user's home): FAIL naming both and the fix."""
        cell = run.cell(backend, PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        reason = cell["reason"]
        assert "fd 7 -> / (the host's /: a host directory outside the workspace" in reason
        user = payload_user()
        assert user is not None, "root runs the payload as its own user"
        home = user.home
        assert f"fd 8 -> {home} (the payload user's home: a host directory outside" in reason
        assert FIX in reason
        held = cell["witness"]["held_host_objects"]
        assert {entry.split(" ", 2)[1] for entry in held} == {"7", "8"}, held

    def test_the_shim_changes_nothing(self, run: HoleRun) -> None:
        """With and without the shim between bwrap and the payload, the same descriptors FAIL."""
        shim, own = (run.cell(backend, PROBE) for backend in HOLES)
        assert (shim["verdict"], own["verdict"]) == ("FAIL", "FAIL")

        def named(cell: dict[str, object]) -> set[str]:
            witness = cell["witness"]
            assert isinstance(witness, dict)
            return {e.split(" in host pid")[0] for e in witness["held_host_objects"]}

        assert named(shim) == named(own)


class TestGate:
    def test_no_hole_earns_a_pass_gate(self, run: HoleRun) -> None:
        """Exit 1 and gate FAILED, naming each hole's FAIL cell."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
        for backend in HOLES:
            assert f"gate: required cell {backend}-{PROBE} is FAIL" in run.stdout, gate
