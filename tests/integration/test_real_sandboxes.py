"""Real third-party sandboxes, end to end: the whole matrix on srt and on Codex, in the lab.

`matrix/backends/srt.toml` and `matrix/backends/codex.toml` are run as a user runs them
(`sandbox-attest run --backend NAME --world lab -j 2`), each in about 20 s here. The verdicts
asserted are the findings written up in README.md ("Real sandboxes, measured"): every FAIL is a
true finding about that sandbox, and the INCONCLUSIVE cells allowed are named with why. A
change in either sandbox, spec or assessor that moves a cell shows up here.

`./run test` installs both (scripts/real-sandboxes.sh); this module installs them too when
missing and skips, naming the install command, only if that install fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.world.lab import lab_supported

ROOT = Path(__file__).parent.parent.parent
INSTALL = ROOT / "scripts" / "real-sandboxes.sh"
CLI = [sys.executable, "-m", "sandbox_attest.cli"]
RUN_TIMEOUT_S = 180.0

# The true findings (README.md, "Real sandboxes, measured"), per sandbox: each FAILs against a
# claim the spec declares from the sandbox's own docs. Neither filter covers keyctl, bpf or
# the TIOCSTI ioctl, though both claim a filtered syscall surface.
FAILS: dict[str, set[str]] = {
    "srt": {"proc_syscall_surface"},
    "codex": {"proc_syscall_surface"},
}
# Issue 28: neither filter covers add_key/request_key, userfaultfd, perf_event_open or ioctl
# TIOCLINUX (both kill the i386 entry); Codex also lets the payload make user namespaces
# (clone3, unshare) and reach the new mount API in them.
FAILS["srt"] |= {"proc_syscall_surface_extended"}
FAILS["codex"] |= {"proc_syscall_surface_extended", "proc_new_mount_api"}
# Cells allowed to be INCONCLUSIVE: none. Each one measured so far was the harness's own
# artefact (a probe bug, a missing host reading) and was fixed; a new one fails this test.
INCONCLUSIVE_ALLOWED: dict[str, set[str]] = {"srt": set(), "codex": set()}
# But one, a missing host reading not fixed yet: srt refuses clone3 (ENOSYS), unshare and the
# new mount API (EPERM), and only its report says so; the host reads that a filter exists,
# not what it refuses (PTRACE_SECCOMP_GET_FILTER at the rendezvous would, issue 28).
INCONCLUSIVE_ALLOWED["srt"] |= {"proc_new_mount_api"}
# Cells that do not apply, each for a claim the sandbox does not make or a route it does not
# have: the reason is the runner's, decided before the cell runs.
NOT_APPLICABLE: dict[str, set[str]] = {
    # egress "own": no harness route inside; srt sets no resource limits
    "srt": {"ipc_proxy_socket_tamper", "resource_limits"},
    # network = "none": no egress route to tamper with; Codex sets no resource limits
    "codex": {"ipc_proxy_socket_tamper", "resource_limits"},
}


def _installed() -> str | None:
    """Install srt and Codex if missing; the reason they cannot be used here, or None."""
    check = subprocess.run([str(INSTALL), "--check"], capture_output=True, text=True, check=False)
    if check.returncode == 0:
        return None
    if os.geteuid() != 0:
        return f"srt/Codex missing and not root: run `sudo {INSTALL}` ({check.stderr.strip()})"
    done = subprocess.run([str(INSTALL)], capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        return (
            f"`{INSTALL}` failed (exit {done.returncode}): {done.stderr.strip()[-400:]}; "
            "run it by hand to see why"
        )
    return None


def run_matrix(backend: str, out: Path) -> dict[str, dict[str, Any]]:
    """Run the full matrix on `backend` in the lab; cell probe -> evidence entry."""
    proc = subprocess.run(
        [*CLI, "run", "--backend", backend, "--world", "lab", "-j", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        cwd=ROOT,
    )
    evidence = out / "evidence.json"
    assert evidence.is_file(), f"no evidence (exit {proc.returncode}): {proc.stderr[-2000:]}"
    cells = json.loads(evidence.read_text())["cells"]
    return {c["probe"]: c for c in cells if c["backend"] == backend}


@pytest.fixture(scope="module", params=["srt", "codex"])
def grid(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, dict[str, Any]]]:
    """One full-matrix run per real sandbox (skipped, naming the fix, where it cannot run)."""
    # The run is a subprocess of its own: whether *it* can make the lab is the question, not
    # whether this pytest process (xdist's threads, a fixture's server) could enter one.
    supported, why_not = lab_supported()
    if not supported:
        pytest.skip(f"the lab world needs root and network namespaces: {why_not}")
    why = _installed()
    if why is not None:
        pytest.skip(why)
    backend = str(request.param)
    return backend, run_matrix(backend, tmp_path_factory.mktemp(f"run-{backend}"))


def _show(cells: dict[str, dict[str, Any]], probes: set[str]) -> str:
    return "; ".join(f"{p}: {cells[p]['verdict']} {cells[p]['reason'][:160]}" for p in probes)


@pytest.mark.slow
class TestRealSandboxes:
    def test_fails_are_the_true_findings(self, grid: tuple[str, dict[str, Any]]) -> None:
        """Exactly the recorded true findings FAIL, each with the host's evidence."""
        backend, cells = grid
        failed = {p for p, c in cells.items() if c["verdict"] == "FAIL"}
        assert failed == FAILS[backend], _show(cells, failed ^ FAILS[backend])
        assert all(
            c["reason"].startswith("escape observed by the host")
            for p, c in cells.items()
            if p in failed
        )

    def test_no_cell_is_an_error_and_inconclusives_are_named(
        self, grid: tuple[str, dict[str, Any]]
    ) -> None:
        """No ERROR or UNAVAILABLE cell; INCONCLUSIVE only where the reason is recorded here."""
        backend, cells = grid
        broken = {p for p, c in cells.items() if c["verdict"] in ("ERROR", "UNAVAILABLE")}
        assert not broken, _show(cells, broken)
        unsure = {p for p, c in cells.items() if c["verdict"] == "INCONCLUSIVE"}
        assert unsure <= INCONCLUSIVE_ALLOWED[backend], _show(cells, unsure)
        skipped = {p for p, c in cells.items() if c["verdict"] == "NOT_APPLICABLE"}
        assert skipped == NOT_APPLICABLE[backend], _show(cells, skipped)

    def test_every_other_cell_passes(self, grid: tuple[str, dict[str, Any]]) -> None:
        """Every cell not listed above PASSes, the network probes among them."""
        backend, cells = grid
        listed = FAILS[backend] | INCONCLUSIVE_ALLOWED[backend] | NOT_APPLICABLE[backend]
        others = {p for p in cells if p not in listed}
        assert {p for p in others if cells[p]["verdict"] != "PASS"} == set()
        assert {"net_denied_host", "net_proxy_confusion", "dns_resolution"} <= others

    def test_pip_install_goes_where_the_claim_says(self, grid: tuple[str, dict[str, Any]]) -> None:
        """The pip install goes through srt's own proxy (denied index: 403); Codex has none."""
        backend, cells = grid
        pip = cells["pkg_pip_install"]
        assert pip["verdict"] == "PASS", pip["reason"]
        if backend == "srt":
            assert "pip-install succeeded" in pip["reason"]
            assert "install from the denied host failed with the proxy's 403" in pip["reason"]
        else:
            assert "pip-install succeeded" not in pip["reason"]

    def test_passthrough_environment_is_recorded(self, grid: tuple[str, dict[str, Any]]) -> None:
        """Both pass the environment through, as claimed: the planted credentials are named."""
        _, cells = grid
        env = cells["env_inheritance"]
        assert env["verdict"] == "PASS", env["reason"]
        assert "claims environment passthrough" in env["reason"]
        assert "AWS_SECRET_ACCESS_KEY" in env["reason"]
        assert "GITHUB_TOKEN" in env["reason"]
