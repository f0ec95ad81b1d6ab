"""Rootful podman, end to end: the whole matrix on `matrix/backends/podman.toml`, in the lab.

The spec runs Debian 12's podman 4.3.1 in its strictest documented configuration (its header
says which flag comes from where) on a read-only rootfs built from this host by
`scripts/podman-rootfs.sh`. The verdicts asserted are the findings written up for the
README's "Real sandboxes, measured": every FAIL is a true finding about podman's default
seccomp profile (/usr/share/containers/seccomp.json), each reproduced by hand outside the
harness with the spec's own flags (`podman run` with the argv a cell records, running a
ctypes script and `unshare -U -m id`), and no cell is INCONCLUSIVE or ERROR. The run is also
held to the honest trust record: rootful podman needs root, so the spec's `[run] user =
"root"` makes the backend "shared", while every judged process of the payload ran as the
payload uid.

`scripts/real-sandboxes.sh` installs podman (Debian's package); without it, or without root
and the lab, the tests skip naming the fix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.world.lab import lab_supported
from tests.here import not_judgeable_here
from tests.integration.real_runs import ROOT, run_full_matrix, show

INSTALL = ROOT / "scripts" / "real-sandboxes.sh"
ROOTFS_SCRIPT = ROOT / "scripts" / "podman-rootfs.sh"
BACKEND = "podman"
CGROUP_ROOT = Path("/sys/fs/cgroup")
UNIFIED = CGROUP_ROOT / "unified"

# The true findings: the spec claims a filtered syscall surface (ipc = "isolated"), and
# podman's default profile lets through keyctl, ioctl TIOCSTI and TIOCLINUX, AF_VSOCK and
# AF_NETLINK sockets, the i386 entry (its archMap adds SCMP_ARCH_X86, socketcall allowed), and
# unshare/clone3 with CLONE_NEWUSER plus the new mount API (open_tree, move_mount,
# mount_setattr, fsopen all SCMP_ACT_ALLOW): by hand, `unshare -U -m id` succeeds inside.
FAILS = {"proc_syscall_surface", "proc_syscall_surface_extended", "proc_new_mount_api"}
# The spec claims no protected paths inside the workspace.
NOT_APPLICABLE = {"fs_protected_in_workspace"}


def _why_not_here() -> str | None:
    """Why the podman matrix cannot run here (naming the fix), or None."""
    if shutil.which("podman") is None:
        return f"podman missing: run `sudo {INSTALL}` (it installs Debian's podman)"
    if os.geteuid() != 0:
        return "rootful podman needs root: run the tests as root"
    supported, why_not = lab_supported()
    if not supported:
        return f"the lab world needs root and network namespaces: {why_not}"
    return None


def expected() -> tuple[dict[str, set[str]], dict[str, str]]:
    """The FAIL and NOT_APPLICABLE sets as a run here gives them, and the unjudgeable probes."""
    unjudged = {p: r for p in PROBES if (r := not_judgeable_here(p)) is not None}
    sets = {"FAIL": FAILS - set(unjudged), "NOT_APPLICABLE": NOT_APPLICABLE - set(unjudged)}
    return sets, unjudged


def _v1_leftovers() -> list[Path]:
    """v1 cgroup trees named for a run group the unified hierarchy no longer holds."""
    if not UNIFIED.is_dir():
        return []
    return [
        top
        for top in CGROUP_ROOT.glob("*/kiln-worker-*")
        if top.parent != UNIFIED and top.is_dir() and not (UNIFIED / top.name).exists()
    ]


@pytest.fixture(scope="module")
def podman_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One full-matrix run on podman (`--backend podman --world lab -j 2`), timed."""
    why = _why_not_here()
    if why is not None:
        pytest.skip(why)
    run = run_full_matrix(BACKEND, tmp_path_factory.mktemp("run-podman"))
    return {"cells": run.cells, "evidence": run.evidence, "wall_s": run.wall_s}


class TestPodmanMatrix:
    def test_fails_are_the_true_findings(self, podman_run: dict[str, Any]) -> None:
        """Exactly the default seccomp profile's gaps FAIL, each saying what it rests on."""
        cells = podman_run["cells"]
        want = expected()[0]["FAIL"]
        failed = {p for p, c in cells.items() if c["verdict"] == "FAIL"}
        assert failed == want, show(cells, failed ^ want)
        said = ("escape observed by the host", "escape reported by the payload (not seen by")
        assert all(cells[p]["reason"].startswith(said) for p in failed)

    def test_no_cell_is_inconclusive_or_an_error(self, podman_run: dict[str, Any]) -> None:
        """No INCONCLUSIVE, ERROR or UNAVAILABLE cell; NOT_APPLICABLE only where recorded."""
        cells = podman_run["cells"]
        want, unjudged = expected()
        assert set(cells) == set(PROBES)
        broken = {
            p for p, c in cells.items() if c["verdict"] in ("INCONCLUSIVE", "ERROR", "UNAVAILABLE")
        }
        assert not broken, show(cells, broken)
        skipped = {p for p, c in cells.items() if c["verdict"] == "NOT_APPLICABLE"}
        assert skipped == want["NOT_APPLICABLE"] | set(unjudged), show(cells, skipped)
        assert {p: cells[p]["reason"] for p in unjudged} == unjudged

    def test_every_other_cell_passes(self, podman_run: dict[str, Any]) -> None:
        """Every cell not listed above PASSes, the network and limit probes among them."""
        cells = podman_run["cells"]
        want, unjudged = expected()
        listed = set().union(*want.values(), unjudged)
        others = {p for p in cells if p not in listed}
        assert {p for p in others if cells[p]["verdict"] != "PASS"} == set()
        assert {"net_direct_egress", "resource_limits", "lifecycle_orphans"} <= others

    def test_the_host_read_the_container_in_the_cells_group(
        self, podman_run: dict[str, Any]
    ) -> None:
        """--cgroups=split keeps the container in the cell's group: the host read every cell.

        podman, conmon and runc are the sandbox's supervisors; every judged process (the
        payload and its children) ran as the payload uid, never root.
        """
        cells = podman_run["cells"]
        ran = {p: c for p, c in cells.items() if c["verdict"] != "NOT_APPLICABLE"}
        unseen = {p for p, c in ran.items() if not (c.get("host_view") or {}).get("seen")}
        assert not unseen, show(cells, unseen)
        payload_uid = podman_run["evidence"]["trust_domains"]["payload_uid"]
        for probe, cell in ran.items():
            for proc in cell["host_view"].get("processes", []):
                if proc.get("role") == "payload" and proc.get("uids"):
                    assert set(proc["uids"]) == {payload_uid}, (probe, proc)

    def test_the_trust_record_says_root_launched_it(self, podman_run: dict[str, Any]) -> None:
        """Rootful podman is launched as root ([run] user): the backend is shared, not separated."""
        domain = podman_run["evidence"]["trust_domains"]["backends"][BACKEND]
        assert domain["status"] == "shared"
        assert '[run] user = "root"' in domain["reason"]

    def test_a_finished_run_leaves_no_v1_cgroups_after_the_check(
        self, podman_run: dict[str, Any]
    ) -> None:
        """The spec's check (scripts/podman-rootfs.sh) removes what --cgroups=split left in v1.

        podman mirrors the cell's group into every v1 hierarchy of a hybrid host and leaves the
        empty parents; the next check removes those of runs that are over.
        """
        assert podman_run["cells"]
        subprocess.run([str(ROOTFS_SCRIPT)], check=True, capture_output=True, timeout=60)
        assert _v1_leftovers() == []


class TestRootfsScript:
    def test_builds_once_and_is_idempotent(self, tmp_path: Path) -> None:
        """The rootfs is built with no programs in it, owned by the container's root, once."""
        if os.geteuid() != 0:
            pytest.skip("scripts/podman-rootfs.sh chowns the rootfs: run as root")
        env = {**os.environ, "PODMAN_ROOTFS_PREFIX": str(tmp_path / "podman")}
        first = subprocess.run(
            [str(ROOTFS_SCRIPT)], env=env, capture_output=True, text=True, check=True
        )
        rootfs = Path(first.stdout.strip())
        assert rootfs == tmp_path / "podman" / "rootfs"
        stamp = rootfs / ".sandbox-attest-rootfs"
        built = stamp.stat().st_mtime_ns
        assert (rootfs / "bin").is_symlink()
        assert not any((rootfs / "usr").iterdir())
        assert (rootfs / "run" / "kiln").is_dir()
        assert rootfs.stat().st_uid == 2147483647
        assert not (rootfs / "tmp").stat().st_mode & 0o022
        again = subprocess.run(
            [str(ROOTFS_SCRIPT)], env=env, capture_output=True, text=True, check=True
        )
        assert again.stdout.strip() == str(rootfs)
        assert stamp.stat().st_mtime_ns == built
        assert sorted(p.name for p in (tmp_path / "podman").iterdir()) == ["rootfs"]
