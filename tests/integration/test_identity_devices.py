"""Issue 26, row 4, live: a host device node outside /dev is found by the walk of the view.

tests/data/identity/dev_elsewhere.toml is matrix/backends/bwrap-generic.toml with bwrap's
minimal /dev, as it should be, and the host's whole /dev ALSO bound at /host/dev. The
payload's own scan of /dev finds nothing beyond the harmless class there; the host's walk of
the payload's view (sandbox_attest/host/viewwalk.py, at the rendezvous) finds the nodes under
/host/dev, adds the sensitive ones to the task, and the payload tries them:

- dev_access FAILs naming `/host/dev/<node>`, the host's device it is and the fix, where this
  machine has a device the payload user opens at all (elsewhere the run marks the probe
  NOT_APPLICABLE on every leg, and says why);
- the host's /dev/shm comes with the bind, at /host/dev/shm: fs_write_outside FAILs naming
  that inside path (the mount mapping of row 3), whatever devices this machine has.

The control leg and the strong legs (bubblewrap, bwrap-generic) stay PASS in the same run.
Real bubblewrap, real devices, real uids; root only (the payload user exists only as root).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.catalog.dev import payload_user_devices, sensitive
from sandbox_attest.host.trust import payload_user
from tests.here import not_judgeable_here
from tests.integration.hole_runs import LIVE_HOLE_MARKS, HoleRun, hole_run

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [*LIVE_HOLE_MARKS, pytest.mark.timeout(400)]

SPEC = Path(__file__).parent.parent / "data" / "identity" / "dev_elsewhere.toml"
HOLE = "hole-dev-elsewhere"
DEV, WRITE = "dev_access", "fs_write_outside"
CLEAN = ("none", "bubblewrap", "bwrap-generic")


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """One run of both probes on the clean legs and the hole."""
    with hole_run(
        "sa-identity-dev-",
        probes=(DEV, WRITE),
        legs=CLEAN,
        required=(*CLEAN, HOLE),
        specs=[SPEC],
        probe_timeout=40,
    ) as done:
        yield done


def judged_here(probe: str) -> None:
    """Skip, with the host's reason, where this machine cannot judge `probe`."""
    reason = not_judgeable_here(probe)
    if reason is not None:
        pytest.skip(f"{probe} is not judged on this machine: {reason}")


class TestCleanLegs:
    @pytest.mark.parametrize("probe", [DEV, WRITE])
    @pytest.mark.parametrize("backend", CLEAN)
    def test_pass_or_not_judged_here(self, run: HoleRun, backend: str, probe: str) -> None:
        """PASS, or NOT_APPLICABLE with the machine's own reason where it cannot judge."""
        cell = run.cell(backend, probe)
        unjudged = not_judgeable_here(probe)
        if unjudged is not None:
            assert (cell["verdict"], cell["reason"]) == ("NOT_APPLICABLE", unjudged)
            return
        assert cell["verdict"] == "PASS", cell["reason"]


class TestDevicesUnderHostDev:
    def test_dev_access_fails_naming_the_inside_path(self, run: HoleRun) -> None:
        """A host device opened at /host/dev/<node>: FAIL naming it, the host's node and the fix."""
        judged_here(DEV)
        here = sensitive(payload_user_devices(payload_user()))
        cell = run.cell(HOLE, DEV)
        assert cell["verdict"] == "FAIL", cell["reason"]
        reason = cell["reason"]
        assert any(f"/host/dev/{rel} (" in reason for rel in here), (here, reason)
        assert any(f"the host's /dev/{rel}" in reason for rel in here), (here, reason)
        assert "do not bind the host's /dev into the sandbox" in reason

    def test_the_walk_found_them_and_the_payload_tried_them(self, run: HoleRun) -> None:
        """The nodes came from the host's walk of the view, and were added to the task."""
        judged_here(DEV)
        cell = run.cell(HOLE, DEV)
        view = cell["witness"]["payload_view"]
        assert view["walk"]["seen"], view["walk"]
        elsewhere = set(view["elsewhere"])
        assert elsewhere, view
        assert all(p.startswith("/host/dev/") for p in elsewhere), elsewhere
        assert set(view["added"]) == {f"dev:{p}" for p in elsewhere}
        assert set(cell["witness"]["exposed"]) <= {f"dev:{p}" for p in elsewhere}

    def test_the_hosts_shm_is_found_at_host_dev_shm(self, run: HoleRun) -> None:
        """The bind brings the host's /dev/shm at /host/dev/shm: fs_write_outside FAILs there."""
        cell = run.cell(HOLE, WRITE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "shm" in cell["witness"]["changed"], cell["witness"]["changed"]
        assert (
            "the sandbox mounts the host's /dev/shm at /host/dev/shm (writable)" in (cell["reason"])
        ), cell["reason"]


class TestGate:
    def test_the_hole_never_earns_a_pass_gate(self, run: HoleRun) -> None:
        """Exit 1 and gate FAILED, naming the hole's FAIL cell."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
        assert f"gate: required cell {HOLE}-{WRITE} is FAIL" in run.stdout, gate
