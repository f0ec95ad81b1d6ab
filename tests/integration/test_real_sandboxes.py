"""Real third-party sandboxes, end to end: the whole matrix on srt, Codex and firejail, in the lab.

`matrix/backends/srt.toml`, `matrix/backends/codex.toml` and `matrix/backends/firejail.toml`
are run as a user runs them (`sandbox-attest run --backend NAME --world lab -j 2`), each in
about a minute here. The verdicts
asserted are the findings written up in README.md ("Real sandboxes, measured"): every FAIL is a
true finding about that sandbox, and the INCONCLUSIVE cells allowed are named with why. A
change in either sandbox, spec or assessor that moves a cell shows up here.

`./run test` installs srt and Codex (scripts/real-sandboxes.sh); this module installs them too
when missing and skips, naming the install command, only if that install fails. firejail is
Debian's package: without it its run skips, naming `apt-get install firejail`.

A probe this host cannot judge (tests/here.py: dev_access where no device beyond the harmless
set opens for the payload user) is NOT_APPLICABLE with the host's reason on every sandbox, as
in any run here; its recorded verdict below holds where the host can judge it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.catalog import PROBES
from tests.here import not_judgeable_here
from tests.integration.real_runs import ROOT, run_full_matrix, show, skip_without_lab

INSTALL = ROOT / "scripts" / "real-sandboxes.sh"

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
# firejail, no profile, --read-only=/ (README.md): host unix sockets, /dev/shm, every read and
# the host's /dev stay in its view; it passes the environment through though the spec claims a
# scrubbed one; children outlive the payload; its default filter leaves io_uring, TIOCSTI,
# vsock and netlink sockets reachable. Issue 28: its 64-bit filter has no ioctl rule
# (TIOCLINUX) and its i386 filter no socketcall (int 0x80 makes a netlink socket); the
# open_by_handle canary is read by its plain path (open_by_handle_at itself gives EPERM).
FAILS["firejail"] = {
    "ipc_unix_socket_escape",
    "fs_write_outside",
    "fs_read_secrets",
    "fs_link_escape",
    "dev_access",
    "env_inheritance",
    "lifecycle_orphans",
    "proc_syscall_surface",
    "proc_syscall_surface_extended",
    "fs_open_by_handle",
    # its --read-only=/ leaves the host's /tmp readable: the descriptor probe's canary is read
    # by its host path under a reads claim that puts it out of view (issue 27)
    "fs_leaked_dirfd",
}


def tmp_is_its_own_mount() -> bool:
    """Whether /tmp is a filesystem of its own (a tmpfs), not a directory of the root's."""
    return Path("/tmp").stat().st_dev != Path("/").stat().st_dev


# firejail 0.9.72's --read-only=/ leaves /tmp writable when /tmp is a mount of its own (as it
# leaves /dev/shm and /run): measured, `touch /tmp/x` succeeds inside where /tmp is a tmpfs
# (the CI's fresh-state namespace, Debian 13's default), while a tmpfs on /var/lib is made
# read-only. The cells' machinery, decoys and sockets live under /tmp, so there the payload
# overwrites the machinery, removes the proxy's decoy socket and leaves its own socket behind.
# Where /tmp is the root's directory (this VM's host view), --read-only=/ covers it.
if tmp_is_its_own_mount():
    FAILS["firejail"] |= {"fs_machinery_overwrite", "ipc_proxy_socket_tamper", "fs_setup_race"}
# Cells allowed to be INCONCLUSIVE: none. Each one measured so far was the harness's own
# artefact (a probe bug, a missing host reading) and was fixed; a new one fails this test.
INCONCLUSIVE_ALLOWED: dict[str, set[str]] = {"srt": set(), "codex": set(), "firejail": set()}
# srt's and firejail's proc_new_mount_api were INCONCLUSIVE until the kernel witness: each
# refuses clone3, unshare and the new mount API, and only the payload's report said so. The
# kernel's errno for each call in the payload's own process now backs the refusal (PASS).
# Cells that do not apply, each for a claim the sandbox does not make or a route it does not
# have: the reason is the runner's, decided before the cell runs.
NOT_APPLICABLE: dict[str, set[str]] = {
    # egress "own": no harness route inside; srt sets no resource limits
    "srt": {"ipc_proxy_socket_tamper", "resource_limits"},
    # network = "none": no egress route to tamper with; Codex sets no resource limits
    "codex": {"ipc_proxy_socket_tamper", "resource_limits"},
    # no protected paths claimed; firejail sets no resource limits as configured
    "firejail": {"fs_protected_in_workspace", "resource_limits"},
}


def expected(backend: str) -> tuple[dict[str, set[str]], dict[str, str]]:
    """The recorded verdict sets for `backend` as a run on this host gives them.

    Returns the FAIL, INCONCLUSIVE and NOT_APPLICABLE sets (keyed by verdict) less the probes
    this host cannot judge, and those probes with the host's reason (their cells must be
    NOT_APPLICABLE with exactly that reason, whatever the sandbox).
    """
    unjudged = {p: r for p in PROBES if (r := not_judgeable_here(p)) is not None}
    sets = {
        "FAIL": FAILS[backend] - set(unjudged),
        "INCONCLUSIVE": INCONCLUSIVE_ALLOWED[backend] - set(unjudged),
        "NOT_APPLICABLE": NOT_APPLICABLE[backend] - set(unjudged),
    }
    return sets, unjudged


def _installed(backend: str) -> str | None:
    """Install srt and Codex if missing; the reason `backend` cannot be used here, or None."""
    if backend == "firejail":
        found = shutil.which("firejail")
        return None if found else "firejail missing: run `apt-get install firejail`"
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


@pytest.fixture(scope="module", params=["srt", "codex", "firejail"])
def grid(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, dict[str, Any]]]:
    """One full-matrix run per real sandbox (skipped, naming the fix, where it cannot run)."""
    # The run is a subprocess of its own: whether *it* can make the lab is the question, not
    # whether this pytest process (xdist's threads, a fixture's server) could enter one.
    skip_without_lab()
    backend = str(request.param)
    why = _installed(backend)
    if why is not None:
        pytest.skip(why)
    return backend, run_full_matrix(backend, tmp_path_factory.mktemp(f"run-{backend}")).cells


@pytest.mark.slow
class TestRealSandboxes:
    def test_fails_are_the_true_findings(self, grid: tuple[str, dict[str, Any]]) -> None:
        """Exactly the recorded true findings FAIL, each saying what its escape rests on.

        A host witness ("escape observed by the host"), or the payload's own report against
        the sandbox where the host has none (a handler a seccomp filter let through: "escape
        reported by the payload (not seen by the host)", issue 27).
        """
        backend, cells = grid
        want = expected(backend)[0]["FAIL"]
        failed = {p for p, c in cells.items() if c["verdict"] == "FAIL"}
        assert failed == want, show(cells, failed ^ want)
        said = ("escape observed by the host", "escape reported by the payload (not seen by")
        assert all(c["reason"].startswith(said) for p, c in cells.items() if p in failed)

    def test_no_cell_is_an_error_and_inconclusives_are_named(
        self, grid: tuple[str, dict[str, Any]]
    ) -> None:
        """No ERROR or UNAVAILABLE cell; INCONCLUSIVE only where the reason is recorded here."""
        backend, cells = grid
        want, unjudged = expected(backend)
        broken = {p for p, c in cells.items() if c["verdict"] in ("ERROR", "UNAVAILABLE")}
        assert not broken, show(cells, broken)
        unsure = {p for p, c in cells.items() if c["verdict"] == "INCONCLUSIVE"}
        assert unsure <= want["INCONCLUSIVE"], show(cells, unsure)
        skipped = {p for p, c in cells.items() if c["verdict"] == "NOT_APPLICABLE"}
        assert skipped == want["NOT_APPLICABLE"] | set(unjudged), show(cells, skipped)
        assert {p: cells[p]["reason"] for p in unjudged} == unjudged

    def test_every_other_cell_passes(self, grid: tuple[str, dict[str, Any]]) -> None:
        """Every cell not listed above PASSes, the network probes among them."""
        backend, cells = grid
        want, unjudged = expected(backend)
        listed = set().union(*want.values(), unjudged)
        others = {p for p in cells if p not in listed}
        assert {p for p in others if cells[p]["verdict"] != "PASS"} == set()
        assert {"net_denied_host", "net_proxy_confusion", "dns_resolution"} <= others

    def test_pip_install_goes_where_the_claim_says(self, grid: tuple[str, dict[str, Any]]) -> None:
        """Through a proxy that 403s the denied index srt and firejail pip-install; Codex cannot."""
        backend, cells = grid
        pip = cells["pkg_pip_install"]
        assert pip["verdict"] == "PASS", pip["reason"]
        if backend in ("srt", "firejail"):
            assert "pip-install succeeded" in pip["reason"]
            assert "install from the denied host failed with the proxy's 403" in pip["reason"]
        else:
            assert "pip-install succeeded" not in pip["reason"]

    def test_passthrough_environment_is_recorded(self, grid: tuple[str, dict[str, Any]]) -> None:
        """The environment passes through: as claimed on srt and Codex, a FAIL on firejail.

        firejail's spec claims a scrubbed environment. Either way the planted credentials are
        named in the reason.
        """
        backend, cells = grid
        env = cells["env_inheritance"]
        if backend == "firejail":
            assert env["verdict"] == "FAIL", env["reason"]
            assert "claims a scrubbed environment" in env["reason"]
        else:
            assert env["verdict"] == "PASS", env["reason"]
            assert "claims environment passthrough" in env["reason"]
        assert "AWS_SECRET_ACCESS_KEY" in env["reason"]
        assert "GITHUB_TOKEN" in env["reason"]
