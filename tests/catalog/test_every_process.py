"""The worst judged process of a cell decides, not the one carrying the launcher's name.

Host views here are shaped as sandbox_attest/run/hostview.py writes them when it reads a cell's
group: the launcher's process at the top, every other judged member under `others`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox_attest.catalog import PROBES
from tests.catalog.test_corroboration import NO_CAPS, ctx, view

if TYPE_CHECKING:
    from pathlib import Path

FULL_CAPS = "000001ffffffffff"
CONTROL = {"ok": True, "nonce": "h", "checks": [], "baseline": {}}


def member(pid: int, comm: str, **status: str) -> dict[str, Any]:
    """Another judged process of the cell, in its own namespaces unless told otherwise."""
    reading = view(**status)
    reading.update(pid=pid, comm=comm)
    del reading["seen"]
    return reading


def privileges_report() -> dict[str, Any]:
    """The decoy's honest report: no capability, NoNewPrivs 1, every attempt refused."""
    escapes = ("effective-capabilities", "setuid-elevation", "writable-root-path")
    return {
        "attempts": [
            {"what": "read-status", "role": "control", "outcome": "succeeded"},
            *({"what": w, "role": "escape", "outcome": "refused"} for w in escapes),
        ],
        "facts": {"status": {"CapEff": NO_CAPS, "NoNewPrivs": "1"}},
    }


class TestPrivileges:
    def test_a_member_with_capabilities_fails_the_cell(self, tmp_path: Path) -> None:
        """The decoy reads clean; another member holds every capability: FAIL naming it."""
        spec = PROBES["proc_privileges"]
        decoy = view() | {"others": [member(5151, "python3", CapEff=FULL_CAPS)]}
        cell = ctx(tmp_path, spec.id, decoy)
        assert spec.corroboration(cell, {}) == []
        reading = spec.assess(cell, privileges_report(), None, CONTROL)  # type: ignore[arg-type]
        assert reading.escape == "escaped"
        assert f"host pid 5151 (python3) CapEff={FULL_CAPS}" in " ".join(reading.reasons)

    def test_a_member_free_to_gain_privileges_contradicts_the_report(self, tmp_path: Path) -> None:
        """The report says NoNewPrivs 1; the host reads 0 on another member: FAIL naming it."""
        spec = PROBES["proc_privileges"]
        cell = ctx(tmp_path, spec.id, view() | {"others": [member(5152, "sh", NoNewPrivs="0")]})
        reading = spec.assess(cell, privileges_report(), None, CONTROL)  # type: ignore[arg-type]
        assert reading.escape == "escaped"
        assert "host pid 5152 (sh) NoNewPrivs=0" in reading.reasons[0]

    def test_clean_members_keep_the_corroboration(self, tmp_path: Path) -> None:
        """Every judged member without capabilities and with NoNewPrivs: the reading backs it."""
        spec = PROBES["proc_privileges"]
        cell = ctx(tmp_path, spec.id, view() | {"others": [member(5153, "python3")]})
        assert spec.corroboration(cell, {}) == ["host view: CapEff 0", "host view: NoNewPrivs 1"]


class TestVisibility:
    def test_a_member_in_the_harness_pid_namespace_fails_isolated_ipc(self, tmp_path: Path) -> None:
        """Under ipc "isolated", the host's reading of the pid namespace beats the report."""
        spec = PROBES["proc_visibility"]
        shared = view() | {"shared_with_harness": ["pid"], "comm": "python3"}
        cell = ctx(tmp_path, spec.id, shared)
        reading = spec.assess(cell, visibility_report("ESRCH"), None, CONTROL)  # type: ignore[arg-type]
        assert reading.escape == "escaped"
        assert "host pid 4242 (python3)" in reading.reasons[0]
        assert "shared_with_harness: ['pid']" in reading.reasons[0]
        assert "no such process" in reading.reasons[0]

    def test_a_refusal_in_the_harness_pid_namespace_waits_for_a_witness(
        self, tmp_path: Path
    ) -> None:
        """Kernel-shaped refusals (EPERM, EACCES), nothing reached: refused on the report alone.

        No host reading backs it (the anchor logs no read and no signal 0), so a report that
        crossed a wrapper is INCONCLUSIVE (`believe`), never a hole.
        """
        spec = PROBES["proc_visibility"]
        cell = ctx(tmp_path, spec.id, view() | {"shared_with_harness": ["pid"], "comm": "python3"})
        reading = spec.assess(cell, visibility_report("EPERM"), None, CONTROL)  # type: ignore[arg-type]
        assert reading.escape == "refused"
        said = " ".join(reading.reasons)
        assert "host pid 4242 (python3) in the harness's pid namespace" in said
        assert "nothing corroborates them but the report" in said
        assert spec.corroboration(cell, {}) == []

    def test_a_signal_reaching_the_anchor_fails(self, tmp_path: Path) -> None:
        """kill(anchor, 0) answered in the harness's pid namespace: the anchor is reachable."""
        spec = PROBES["proc_visibility"]
        cell = ctx(tmp_path, spec.id, view() | {"shared_with_harness": ["pid"], "comm": "python3"})
        report = visibility_report("EPERM")
        report["attempts"][2] = {"what": "kill-0", "role": "escape", "outcome": "succeeded"}
        reading = spec.assess(cell, report, None, CONTROL)  # type: ignore[arg-type]
        assert reading.escape == "escaped"
        assert "shared_with_harness: ['pid']" in reading.reasons[0]


def visibility_report(kill_errno: str) -> dict[str, Any]:
    """Every escape of proc_visibility refused; kill(anchor, 0) with `kill_errno`."""
    errnos = {"scan-proc": "ENOENT", "read-environ": "EACCES", "kill-0": kill_errno}
    return {
        "attempts": [
            {"what": w, "role": "escape", "outcome": "refused", "errno": errnos.get(w, "ENOENT")}
            for w in ("scan-proc", "read-environ", "kill-0", "ptrace-seize")
        ],
        "facts": {"found_pids": []},
    }


class TestEnvironment:
    def test_an_unread_member_backs_nothing(self, tmp_path: Path) -> None:
        """A judged member whose environ the host could not read withholds the corroboration."""
        spec = PROBES["env_inheritance"]
        unread = {"pid": 5154, "comm": "python3", "status": {}, "unread": "unreadable: EACCES"}
        cell = ctx(tmp_path, spec.id, view() | {"others": [unread]})
        assert spec.corroboration(cell, {}) == []
