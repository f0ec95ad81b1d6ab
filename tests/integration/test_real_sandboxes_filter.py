"""A real filter sandbox, end to end: the whole matrix on sandlock 0.9.0, in the lab.

`matrix/backends/sandlock.toml` (Landlock + seccomp in the harness's own namespaces, started
by `matrix/backends/sandlock_launch.py`) is run as a user runs it (`sandbox-attest run
--backend sandlock --world lab -j 2`). The verdicts asserted are the findings of the helper
note /work/helpers/out/sandlock.md, each checked by hand outside the harness:

- true findings (FAIL): Landlock has no access right for metadata changes, so the payload
  chmods, chowns and touches host paths its user owns outside every write grant;
- INCONCLUSIVE only where a refusal has no host reading until the kernel witness (issue 27,
  item 1) records the syscall and its errno (the two syscall-surface cells join them once
  the supervisor artifact is fixed: measured with the fix applied in a scratch copy);
- harness artifacts still open (each with its proposed fix in the note): sandlock's
  supervisor is the launcher's own Python process, above the payload and unconfined by
  design, and the harness judges every Python member of a cell as a payload; and the proc
  probes judge a shared pid namespace instead of what the payload could reach in it. Each is
  held to its exact signature here (so a real hole in those cells still fails), and
  `test_no_harness_artifact_is_left` (strict xfail) starts passing, and so fails, the day
  the fixes land: then move those cells to PASS (or to the kernel witness's list).

Skips, naming `scripts/real-sandboxes.sh`, where sandlock is not installed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.world.lab import lab_supported
from tests.here import not_judgeable_here

ROOT = Path(__file__).parent.parent.parent
INSTALL = ROOT / "scripts" / "real-sandboxes.sh"
LAUNCHER = ROOT / "matrix" / "backends" / "sandlock_launch.py"
CLI = [sys.executable, "-m", "sandbox_attest.cli"]
RUN_TIMEOUT_S = 180.0
BACKEND = "sandlock"

# True findings, shown by hand (helper note, "fs_write_outside"): chmod/chown/utime of a
# payload-owned directory outside the grants succeed inside; writing a file there is EACCES.
# The proxy-socket decoy and shim are such paths too.
TRUE_FAILS = {"fs_write_outside", "ipc_proxy_socket_tamper"}
# Refusals the host cannot corroborate until the kernel witness records the syscall and its
# errno: the payload shares the host's mount and network namespaces, so a filter's "no" leaves
# nothing else the host reads (fs_read_secrets: the canaries' openat, EACCES from Landlock;
# net_ipv6_udp_icmp: socket/connect refused by the seccomp layer and Landlock;
# proc_new_mount_api: clone3 ENOSYS, unshare/fsopen/open_tree EPERM from the filter).
WAITING_FOR_KERNEL_WITNESS = {"fs_read_secrets", "net_ipv6_udp_icmp", "proc_new_mount_api"}
# No claim: sandlock's spec sets no resource limits and claims no protected paths.
NOT_APPLICABLE = {"fs_protected_in_workspace", "resource_limits"}
# Harness artifacts still open, by verdict (helper note, "Artifacts").
SUPERVISOR_FAILS = {"proc_privileges", "proc_syscall_surface", "proc_syscall_surface_extended"}
PIDNS_FAILS = {"proc_visibility"}
PIDNS_INCONCLUSIVE = {"proc_cross_process"}
ARTIFACTS = SUPERVISOR_FAILS | PIDNS_FAILS | PIDNS_INCONCLUSIVE


def _installed() -> str | None:
    """Why sandlock cannot run here, or None (the launcher's own check, as detection runs it)."""
    check = subprocess.run(
        ["/usr/bin/python3", "-I", str(LAUNCHER), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode == 0:
        return None
    return f"sandlock missing: run `sudo {INSTALL}` ({check.stderr.strip()[-300:]})"


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One full-matrix run on sandlock in the lab: probe -> evidence entry."""
    supported, why_not = lab_supported()
    if not supported:
        pytest.skip(f"the lab world needs root and network namespaces: {why_not}")
    why = _installed()
    if why is not None:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("run-sandlock")
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "run", "--backend", BACKEND, "--world", "lab", "-j", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        cwd=ROOT,
    )
    # The budget is 30 s with -j 2; printed, not asserted: this machine is shared.
    print(f"sandlock full matrix: {time.monotonic() - started:.1f} s")
    evidence = out / "evidence.json"
    assert evidence.is_file(), f"no evidence (exit {proc.returncode}): {proc.stderr[-2000:]}"
    cells = json.loads(evidence.read_text())["cells"]
    return {c["probe"]: c for c in cells if c["backend"] == BACKEND}


def _unjudged() -> dict[str, str]:
    return {p: r for p in PROBES if (r := not_judgeable_here(p)) is not None}


def _show(cells: dict[str, dict[str, Any]], probes: set[str]) -> str:
    return "; ".join(f"{p}: {cells[p]['verdict']} {cells[p]['reason'][:200]}" for p in probes)


def _supervisors(cell: dict[str, Any]) -> set[int]:
    """The cell's members that are sandlock's supervisor: the launcher's unconfined Python.

    Not the process carrying the probe's launcher, running Python, with no seccomp filter and
    no NoNewPrivs; while the process that does carry it has both (it is sandlock's child).
    """
    members = cell["host_view"].get("processes", [])
    payload = [m for m in members if m.get("launcher")]
    assert payload, f"no member carries the launcher: {members}"
    assert all(m["seccomp"] == "2" and m["no_new_privs"] == "1" for m in payload), payload
    return {
        int(m["pid"])
        for m in members
        if not m.get("launcher") and m.get("comm") == "python3" and m.get("seccomp") == "0"
    }


def _after_supervisor_fix(probe: str, cell: dict[str, Any]) -> bool:
    """A syscall cell as it is once the supervisor is not judged: refused, waiting for kw.

    Measured with the proposed `is_supervisor` change applied in a scratch copy: both cells
    are then INCONCLUSIVE ("PASS rests on the payload's report alone"), every call refused,
    like proc_new_mount_api: only the kernel witness corroborates a filter's refusal.
    """
    return (
        probe in SUPERVISOR_FAILS - {"proc_privileges"}
        and cell["verdict"] == "INCONCLUSIVE"
        and cell["reason"].startswith("PASS rests on the payload's report alone")
        and "reached the kernel handler: none" in cell["reason"]
    )


def _artifact_signature(probe: str, cell: dict[str, Any]) -> bool:
    """Whether a non-PASS artifact cell is exactly the open artifact, and nothing more."""
    reason = cell["reason"]
    if probe in SUPERVISOR_FAILS:
        if cell["verdict"] != "FAIL":
            return False
        named = {int(p) for p in re.findall(r"host pid (\d+) \(python3\)", reason)}
        named |= {int(p) for p in re.findall(r"host pid (\d+) \(Seccomp 0\)", reason)}
        nothing_reached = probe == "proc_privileges" or "reached the kernel handler: none" in reason
        return bool(named) and named <= _supervisors(cell) and nothing_reached
    if probe in PIDNS_FAILS:
        return "traced by nobody, secret echoed: False, host pid found: False" in reason
    return (
        "secret read via nothing; mailboxes written: 0; signals received: none" in reason
        and "so it attempted nothing" in reason
    )


@pytest.mark.slow
class TestSandlock:
    def test_fails_are_the_true_findings(self, grid: dict[str, dict[str, Any]]) -> None:
        """Exactly the metadata-change holes FAIL, beside the artifacts' own signatures."""
        cells = grid
        failed = {p for p, c in cells.items() if c["verdict"] == "FAIL"}
        want = TRUE_FAILS - set(_unjudged())
        assert failed - ARTIFACTS == want, _show(cells, (failed - ARTIFACTS) ^ want)
        assert all("mode changed" in cells[p]["reason"] for p in want)

    def test_no_error_and_inconclusives_wait_for_the_kernel_witness(
        self, grid: dict[str, dict[str, Any]]
    ) -> None:
        """No ERROR or UNAVAILABLE; INCONCLUSIVE only where the kernel witness will decide."""
        cells = grid
        broken = {p for p, c in cells.items() if c["verdict"] in ("ERROR", "UNAVAILABLE")}
        assert not broken, _show(cells, broken)
        unsure = {p for p, c in cells.items() if c["verdict"] == "INCONCLUSIVE"}
        assert unsure - ARTIFACTS <= WAITING_FOR_KERNEL_WITNESS, _show(cells, unsure)
        unjudged = _unjudged()
        skipped = {p for p, c in cells.items() if c["verdict"] == "NOT_APPLICABLE"}
        assert skipped == NOT_APPLICABLE | set(unjudged), _show(cells, skipped)

    def test_artifact_cells_are_only_the_artifact(self, grid: dict[str, dict[str, Any]]) -> None:
        """Each open artifact cell is PASS, or non-PASS for exactly the artifact's reason."""
        cells = grid
        off = {
            p
            for p in ARTIFACTS
            if cells[p]["verdict"] != "PASS"
            and not _artifact_signature(p, cells[p])
            and not _after_supervisor_fix(p, cells[p])
        }
        assert not off, _show(cells, off)

    def test_every_other_cell_passes(self, grid: dict[str, dict[str, Any]]) -> None:
        """Every cell not listed above PASSes, the network probes among them."""
        cells = grid
        listed = TRUE_FAILS | WAITING_FOR_KERNEL_WITNESS | NOT_APPLICABLE | ARTIFACTS
        others = {p for p in cells if p not in listed | set(_unjudged())}
        assert {p for p in others if cells[p]["verdict"] != "PASS"} == set()
        assert {"net_direct_egress", "ipc_unix_socket_escape", "env_inheritance"} <= others

    @pytest.mark.xfail(
        strict=True,
        reason="harness artifacts open (helper note sandlock.md): cellgroup.is_supervisor "
        "judges sandlock's Python supervisor as a payload; proc_visibility/proc_cross_process "
        "judge the shared pid namespace, not what the payload reached",
    )
    def test_no_harness_artifact_is_left(self, grid: dict[str, dict[str, Any]]) -> None:
        """Once the artifacts are fixed, no cell shows one (this xfail then fails: drop it)."""
        left = {p for p in ARTIFACTS if grid[p]["verdict"] != "PASS"}
        assert {p for p in left if _artifact_signature(p, grid[p])} == set()
