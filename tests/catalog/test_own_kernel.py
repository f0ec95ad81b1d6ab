"""Cells of a sandbox with its own kernel (`kernel = "own"`): judged by effects outside it.

The host view here is shaped as sandbox_attest/run/hostview.py writes it for gVisor's `runsc
do` (measured: every member of the cell's group is runsc's own, the payload's ready file
landed in the workspace). Before issue 27, `SpecBase.corroboration` threw every witness away
when no host process was seen, and 19 of 23 gVisor cells were INCONCLUSIVE.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.backends.command.spec_claims import OwnKernelClaims
from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.proc.namespace import _without_own_ns_control
from sandbox_attest.catalog.spec import own_kernel_ran
from sandbox_attest.run.runner import inside_route

SHARED = DeclaredClaims("none", "open", "isolated", environment="passthrough")
OWN = OwnKernelClaims("none", "open", "isolated", environment="passthrough")


def supervisor(pid: int) -> dict[str, Any]:
    """One of runsc's own processes as `summarize` records it."""
    return {"pid": pid, "comm": "exe", "role": "supervisor", "when": "rendezvous"}


def gvisor_view(*, landed: bool = True, uid: int = 994) -> dict[str, Any]:
    """What the host saw of a runsc do cell: supervisors only, and (maybe) the ready file."""
    view: dict[str, Any] = {
        "seen": False,
        "why": "every process of the cell's group at the rendezvous is the wrapper's own or "
        "gone: the payload ran somewhere the host cannot read",
        "processes": [supervisor(p) for p in (31993, 32008, 32023, 32027)],
        "mechanism": "cgroup",
    }
    if landed:
        view["workspace_rendezvous"] = {
            "seen": True,
            "file": ".kiln-lock-x",
            "pid": "1",
            "uid": uid,
        }
    return view


def ctx(tmp_path: Path, probe: str, claims: Any, host_view: dict[str, Any]) -> CellContext:
    """A cell of `probe` with these claims and host view."""
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    return CellContext(
        probe=probe,
        backend="gvisor",
        nonce=nonce,
        world=None,  # type: ignore[arg-type]  # corroboration reads no fixture
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=claims,
        route=inside_route(),
        host_view=host_view,
    )


def witnessed() -> list[str]:
    """Probes whose verdict rests on a witness outside the sandbox (`host_readings`)."""
    return sorted(p for p, spec in PROBES.items() if getattr(spec, "host_readings", ()))


class TestCorroboration:
    def test_the_artifact_without_the_claim(self, tmp_path: Path) -> None:
        """Without kernel = "own", no witness backs a cell whose payload no host process ran."""
        dropped = [
            p
            for p in witnessed()
            if not PROBES[p].corroboration(ctx(tmp_path, p, SHARED, gvisor_view()), {})
        ]
        assert len(dropped) >= 19, dropped  # the artifact, kept where no claim says why

    @pytest.mark.parametrize("probe", witnessed())
    def test_own_kernel_keeps_the_witnesses(self, tmp_path: Path, probe: str) -> None:
        """Under kernel = "own" the ready file in the workspace lets the witnesses back it."""
        cell = ctx(tmp_path, probe, OWN, gvisor_view())
        assert own_kernel_ran(cell)
        found = PROBES[probe].corroboration(cell, {"attempts": [], "facts": {}})
        assert found, probe

    def test_no_ready_file_no_witness(self, tmp_path: Path) -> None:
        """A wrapper that never ran the payload (no ready file) is credited with no silence."""
        for probe in witnessed():
            cell = ctx(tmp_path, probe, OWN, gvisor_view(landed=False))
            assert not own_kernel_ran(cell)
            assert PROBES[probe].corroboration(cell, {}) == [], probe


def privileges_report(missing: str = "NoNewPrivs") -> dict[str, Any]:
    """proc_privileges' report under gVisor: the status read stops at the missing line."""
    return {
        "probe": "proc_privileges",
        "observed": "error",
        "attempts": [
            {"what": "read-status", "role": "control", "outcome": "error",
             "detail": f"missing: {missing}"},
        ],
        "facts": {},
    }  # fmt: skip


class TestPrivilegesByEffect:
    CONTROL: dict[str, Any] = {"ok": True, "nonce": "c", "checks": []}  # noqa: RUF012

    def judge(self, tmp_path: Path, claims: Any, uid: int) -> Any:
        """proc_privileges' assessment of a gVisor-shaped cell whose writes land as `uid`."""
        spec = PROBES["proc_privileges"]
        cell = ctx(tmp_path, "proc_privileges", claims, gvisor_view(uid=uid))
        return spec.assess(cell, privileges_report(), None, self.CONTROL)  # type: ignore[arg-type]

    def test_unprivileged_host_uid_holds(self, tmp_path: Path) -> None:
        """Writes landing as the payload user: refused, controls held, backed by that reading."""
        found = self.judge(tmp_path, OWN, 994)
        assert found.escape == "refused"
        assert found.controls_ok
        assert "uid 994" in "; ".join(found.reasons)
        cell = ctx(tmp_path, "proc_privileges", OWN, gvisor_view(uid=994))
        assert PROBES["proc_privileges"].corroboration(cell, {}) == [
            "host view: the payload's workspace file, uid 994"
        ]

    def test_root_on_the_host_is_an_escape(self, tmp_path: Path) -> None:
        """Writes landing as root: its kernel acts on the host with root's power (FAIL)."""
        found = self.judge(tmp_path, OWN, 0)
        assert found.escape == "escaped"
        assert "as root (uid 0)" in found.reasons[0]

    def test_runs_as_is_held_to_the_host_uid(self, tmp_path: Path) -> None:
        """A runs_as uid the writes do not land as breaks the claim."""
        claims = OwnKernelClaims("none", "open", "isolated", runs_as="1234")
        found = self.judge(tmp_path, claims, 994)
        assert found.escape == "escaped"
        assert 'runs_as = "1234"' in found.reasons[0]

    def test_shared_kernel_keeps_the_old_rule(self, tmp_path: Path) -> None:
        """On the host's kernel a missing NoNewPrivs still leaves the cell undecided."""
        found = self.judge(tmp_path, SHARED, 994)
        assert not found.controls_ok


class TestNamespaceControl:
    def test_only_the_own_ns_control_goes(self) -> None:
        """Under kernel own the read-own-ns control is dropped; every other attempt stays."""
        report = {
            "attempts": [
                {"what": "read-own-ns", "role": "control", "outcome": "error"},
                {"what": "fork-child", "role": "control", "outcome": "succeeded"},
                {"what": "setns-mnt", "role": "escape", "outcome": "refused"},
            ]
        }
        kept = [a["what"] for a in _without_own_ns_control(report)["attempts"]]
        assert kept == ["fork-child", "setns-mnt"]
