"""Which cells the kernel witness records: only those a rule will read (issue 27's cost).

Recording a cell costs the witness's reader one parsed line per event, beside the judging
threads. A gVisor cell made 12,000 events that no rule reads (its host syscalls are the
Sentry's, not the payload's), and the probes that never judge by the kernel made 87% of a
filter sandbox's run's events. Neither is registered; the cell's reading says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.host import cellgroup
from sandbox_attest.run import runner
from sandbox_attest.run.runner import OWN_KERNEL_UNRECORDED, PROBE_UNRECORDED, KernelCell

# The probes whose judging reads the kernel's events (catalog/witness/kernel.py's rule).
KERNEL_JUDGED = {
    "fs_read_secrets",
    "dev_access",
    "net_ipv6_udp_icmp",
    "proc_syscall_surface",
    "proc_syscall_surface_extended",
    "proc_new_mount_api",
    "proc_visibility",
    "proc_cross_process",
}


@dataclass
class _Witness:
    """A run witness that is attached and records what it is asked to register."""

    registered: list[int] = field(default_factory=list)
    status: str = "attached"
    why: str = ""

    def wait_attached(self) -> bool:
        return True

    def register(self, cgroup: int) -> bool:
        self.registered.append(cgroup)
        return True


def _ctx(**claims: str) -> CellContext:
    return cast("CellContext", SimpleNamespace(claims={"filesystem": "workspace", **claims}))


def _group(tmp: Any) -> cellgroup.CellGroup:
    return cast("cellgroup.CellGroup", SimpleNamespace(mechanism=cellgroup.CGROUP, path=tmp))


def test_the_specs_that_read_the_kernel_say_so() -> None:
    """Exactly the probes whose judging applies the kernel rule ask for their cells' events."""
    assert {pid for pid, spec in PROBES.items() if spec.kernel_witness} == KERNEL_JUDGED


@pytest.mark.parametrize("probe", sorted(KERNEL_JUDGED))
def test_a_judged_probe_on_the_hosts_kernel_is_recorded(probe: str) -> None:
    """On the host's kernel, a probe that judges by the witness has nothing against it."""
    assert runner.kernel_unread(PROBES[probe], _ctx()) == ""


def test_a_kernel_of_its_own_is_never_recorded() -> None:
    """Under kernel = "own" even a judged probe is not: the host sees only the Sentry."""
    spec = PROBES["fs_read_secrets"]
    assert runner.kernel_unread(spec, _ctx(kernel="own")) == OWN_KERNEL_UNRECORDED


def test_a_probe_that_does_not_judge_by_it_is_not_recorded() -> None:
    """net_transfer_18mib reads no kernel event: its cells are not registered."""
    spec = PROBES["net_transfer_18mib"]
    assert runner.kernel_unread(spec, _ctx()) == PROBE_UNRECORDED


def test_an_unread_cell_is_not_registered_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The witness is never told the cell's cgroup; the reading names the reason."""
    witness = _Witness()
    monkeypatch.setattr(runner, "run_witness", lambda: witness)
    monkeypatch.setattr(runner, "cgroup_id", lambda _path: 4242)
    cell = KernelCell.register(_group(tmp_path), unread=PROBE_UNRECORDED)
    assert witness.registered == []
    assert cell.drain() == {"status": "attached", "why": PROBE_UNRECORDED}


def test_a_read_cell_is_registered(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """With nothing against it, the cell's cgroup is registered before its payload runs."""
    witness = _Witness()
    monkeypatch.setattr(runner, "run_witness", lambda: witness)
    monkeypatch.setattr(runner, "cgroup_id", lambda _path: 4242)
    cell = KernelCell.register(_group(tmp_path))
    assert witness.registered == [4242]
    assert cell.cgroup == 4242
