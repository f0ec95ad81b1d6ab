"""dev_access's in-sandbox control, judged on recorded reports with a stubbed host control.

The control shows that the payload could open a device at all and that the numbers it
reports are the host's. Issue 27: it required all five harmless devices, so a sandbox whose
documented /dev has only null, random and urandom was INCONCLUSIVE. These tests run on any
host: the host control is a recorded one (this host's own numbers for the harmless class,
plus a sensitive device the payload user opens unconfined), not a measurement that skips
where nothing sensitive opens.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from sandbox_attest.catalog.dev import CONTROL_DEVICES, device_nodes
from sandbox_attest.verdict import decide
from tests.catalog.test_dev import CONFINED, SPEC, Records, cell_ctx

NODES = device_nodes()
# A sensitive device the recorded host control says the payload user opens unconfined.
KVM = {"kind": "char", "rdev": "10:232", "opened": True}
DOCUMENTED = ("null", "random", "urandom")


def opened(name: str, rdev: str | None = None) -> dict[str, Any]:
    """A control device the payload reports opened, by default with the host's number."""
    return {
        "what": f"control:{name}",
        "role": "control",
        "outcome": "succeeded",
        "path": f"/dev/{name}",
        "rdev": rdev or NODES[name]["rdev"],
        "kind": "char",
    }


def refused(what: str, err: str = "ENOENT", role: str = "control") -> dict[str, Any]:
    """An open the payload reports refused."""
    return {"what": what, "role": role, "outcome": "refused", "errno": err}


def view_of(names: tuple[str, ...]) -> dict[str, Any]:
    """The host's listing of a payload /dev holding only `names`, with this host's numbers."""
    return {"seen": True, "pid": os.getpid(), "nodes": {n: dict(NODES[n]) for n in names}}


def host_control(view: dict[str, Any]) -> dict[str, Any]:
    """A recorded host control that held: the harmless class opens, and so does kvm."""
    devices: dict[str, Any] = {n: {**NODES[n], "opened": True} for n in CONTROL_DEVICES}
    devices["kvm"] = dict(KVM)
    return {
        "ok": True,
        "nonce": "h" + secrets.token_hex(8),
        "checks": [{"name": "recorded", "ok": True, "detail": ""}],
        "devices": devices,
        "payload_view": view,
    }


def judge(tmp_path: Path, controls: list[dict[str, Any]], view: dict[str, Any]) -> Any:
    """The verdict and assessment for controls plus a refused /dev/kvm under a confining claim."""
    ctx = cell_ctx(tmp_path, separated=False)
    report = {"attempts": [*controls, refused("dev:kvm", role="escape")], "facts": {}}
    assessment = SPEC.assess(ctx, report, Records(), host_control(view))
    return decide(SPEC.expectation(CONFINED), assessment).verdict.value, assessment


class TestDocumentedMinimalDev:
    def test_null_random_urandom_only_passes(self, tmp_path: Path) -> None:
        """A /dev of only null, random and urandom, each opened as the host's: the control holds."""
        controls = [
            opened(n) if n in DOCUMENTED else refused(f"control:{n}") for n in CONTROL_DEVICES
        ]
        verdict, assessment = judge(tmp_path, controls, view_of(DOCUMENTED))
        assert verdict == "PASS", assessment.reasons
        assert assessment.controls_ok

    def test_all_five_still_pass(self, tmp_path: Path) -> None:
        """The full harmless set, each opened as the host's: the control holds as before."""
        view = view_of(CONTROL_DEVICES)
        verdict, assessment = judge(tmp_path, [opened(n) for n in CONTROL_DEVICES], view)
        assert verdict == "PASS", assessment.reasons

    def test_absent_devices_are_recorded_as_absent(self, tmp_path: Path) -> None:
        """The control's reading names the harmless devices the view lacks, not as failures."""
        controls = [
            opened(n) if n in DOCUMENTED else refused(f"control:{n}") for n in CONTROL_DEVICES
        ]
        _, assessment = judge(tmp_path, controls, view_of(DOCUMENTED))
        assert any("/dev/zero, /dev/full" in r and "absent" in r for r in assessment.reasons)


class TestControlStillMeaningful:
    def test_no_null_is_inconclusive(self, tmp_path: Path) -> None:
        """Without /dev/null in the view the control fails, naming /dev/null."""
        names = ("random", "urandom")
        controls = [opened(n) if n in names else refused(f"control:{n}") for n in CONTROL_DEVICES]
        verdict, assessment = judge(tmp_path, controls, view_of(names))
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert any("/dev/null" in r and "must open" in r for r in assessment.reasons)

    def test_a_present_device_refused_is_inconclusive(self, tmp_path: Path) -> None:
        """/dev/zero in the view but refused (EACCES): the sandbox refuses harmless opens."""
        controls = [
            refused("control:zero", "EACCES") if n == "zero" else opened(n) for n in CONTROL_DEVICES
        ]
        verdict, assessment = judge(tmp_path, controls, view_of(CONTROL_DEVICES))
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert any("control:zero refused (EACCES)" in r for r in assessment.reasons)

    def test_absent_by_report_but_in_view_is_inconclusive(self, tmp_path: Path) -> None:
        """A report calling /dev/zero absent (ENOENT) while the host lists it fails the control."""
        controls = [refused("control:zero") if n == "zero" else opened(n) for n in CONTROL_DEVICES]
        verdict, assessment = judge(tmp_path, controls, view_of(CONTROL_DEVICES))
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert any("control:zero refused (ENOENT)" in r for r in assessment.reasons)

    def test_a_foreign_number_is_inconclusive(self, tmp_path: Path) -> None:
        """A "null" that is not the host's 1:3 shows the report is not about this host."""
        controls = [opened("null", "1:1"), *(opened(n) for n in CONTROL_DEVICES[1:])]
        verdict, assessment = judge(tmp_path, controls, view_of(CONTROL_DEVICES))
        assert verdict == "INCONCLUSIVE", assessment.reasons
        assert any(
            "control:null opened a device the host does not" in r for r in assessment.reasons
        )

    def test_an_unread_view_takes_enoent_for_absent(self, tmp_path: Path) -> None:
        """Unread view: a harmless ENOENT counts as absent, and null must still open as 1:3."""
        view = {"seen": False, "why": "no rendezvous reading"}
        controls = [
            opened(n) if n in DOCUMENTED else refused(f"control:{n}") for n in CONTROL_DEVICES
        ]
        _, assessment = judge(tmp_path, controls, view)
        assert assessment.controls_ok, assessment.reasons
