"""Issue 26, row 3, live: a host directory mounted at another path is found by identity.

Two wrappers under tests/data/identity/, each matrix/backends/bwrap-generic.toml with one
mistake:

- mnt_home.toml binds the payload user's home writable at `/home/agent`: the canaries of
  `fs_read_secrets` (~/.ssh, ~/.aws, ~/.docker) and of `fs_write_outside` (the home and its
  config dirs) are not at their host paths inside, only under `/home/agent`;
- mnt_host_tmp.toml binds the host's `/var/tmp` and `/dev/shm` writable at `/host/var-tmp`
  and `/host/dev-shm`;
- mnt_shared_dir.toml binds a host directory the payload user writes (`SHARED`, made here for
  that user) writable at `/data`: no canary class covers it, so the host plants one there at
  the rendezvous.

At the rendezvous the host maps the payload's mounts to its own directories by (device,
inode) (sandbox_attest/host/mountview.py), finds each canary at its inside path and has the
payload try it there (sandbox_attest/catalog/fs/exposure.py). Each hole FAILs naming the
inside path, the host directory and the fix, and the gate is FAILED; the control leg and the
strong legs (bubblewrap, bwrap-generic) stay PASS in the same run.

Real bubblewrap, real uids; root only (the payload user exists only as root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.host.trust import PAYLOAD_HOME, payload_user
from tests.integration.hole_runs import LIVE_HOLE_MARKS, HoleRun, hole_run

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [*LIVE_HOLE_MARKS, pytest.mark.timeout(400)]

DATA = Path(__file__).parent.parent / "data" / "identity"
WRITE, READ = "fs_write_outside", "fs_read_secrets"
HOME_HOLE, TMP_HOLE = "hole-mnt-home", "hole-mnt-host-tmp"
SHARED_HOLE = "hole-mnt-shared-dir"
HOLES = {
    HOME_HOLE: "mnt_home.toml",
    TMP_HOLE: "mnt_host_tmp.toml",
    SHARED_HOLE: "mnt_shared_dir.toml",
}
# The host directory mnt_shared_dir.toml binds at /data (the spec names it literally).
SHARED = Path("/var/tmp/kiln-shared-data")
CLEAN = ("none", "bubblewrap", "bwrap-generic")
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """One run of both fs probes on the clean legs and the hole wrappers."""
    user = payload_user()
    assert user is not None
    if SHARED.is_symlink() or SHARED.exists():
        shutil.rmtree(SHARED)
    SHARED.mkdir(mode=0o755)
    os.chown(SHARED, user.uid, user.gid)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, SHARED, ignore_errors=True)
        yield stack.enter_context(_run())


@contextlib.contextmanager
def _run() -> Iterator[HoleRun]:
    with hole_run(
        "sa-identity-mnt-",
        probes=(WRITE, READ),
        legs=CLEAN,
        required=(*CLEAN, *HOLES),
        specs=[DATA / spec for spec in HOLES.values()],
        probe_timeout=40,
        run_timeout=RUN_TIMEOUT_S,
    ) as done:
        yield done


class TestCleanLegs:
    @pytest.mark.parametrize("probe", [WRITE, READ])
    @pytest.mark.parametrize("backend", CLEAN)
    def test_pass(self, run: HoleRun, backend: str, probe: str) -> None:
        """A view with no host directory at another path: PASS, nothing added, nothing unmapped."""
        cell = run.cell(backend, probe)
        assert cell["verdict"] == "PASS", cell["reason"]
        mounts = cell["witness"]["mounts"]
        assert not mounts.get("added"), mounts
        assert not mounts.get("unmapped"), mounts

    @pytest.mark.parametrize("backend", ["bubblewrap", "bwrap-generic"])
    def test_every_mount_was_examined(self, run: HoleRun, backend: str) -> None:
        """The evidence lists the sandbox's mounts, each as the host's, its own or covered."""
        mounts = run.cell(backend, WRITE)["witness"]["mounts"]
        kinds = {m["kind"] for m in mounts["mounts"]}
        assert kinds <= {"host", "own", "covered"}, mounts
        assert any(m["inside"] == "/usr" and m["host"] == "/usr" for m in mounts["mounts"])
        assert mounts["exposed"] == [], mounts["exposed"]
        assert "the host mapped the payload's" in run.cell(backend, WRITE)["reason"]


class TestHomeAtAnotherPath:
    def test_read_secrets_fails_naming_the_inside_path(self, run: HoleRun) -> None:
        """The canaries read at /home/agent/...: FAIL naming the mount, the home and the fix."""
        cell = run.cell(HOME_HOLE, READ)
        assert cell["verdict"] == "FAIL", cell["reason"]
        reason = cell["reason"]
        assert f"the sandbox mounts the host's {PAYLOAD_HOME} at /home/agent (writable)" in reason
        assert "/home/agent/.ssh/" in reason
        assert f"fix: do not mount the host's {PAYLOAD_HOME} into the sandbox" in reason
        leaked = cell["witness"]["leaked"]
        assert "ssh@/home/agent" in leaked, leaked

    def test_write_outside_fails_naming_the_inside_path(self, run: HoleRun) -> None:
        """The home's canary dirs written at /home/agent/...: FAIL naming the mount and the fix."""
        cell = run.cell(HOME_HOLE, WRITE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        reason = cell["reason"]
        assert f"the sandbox mounts the host's {PAYLOAD_HOME} at /home/agent (writable)" in reason
        assert "home@/home/agent" in cell["witness"]["mounts"]["added"]
        exposed = {e["inside"]: e for e in cell["witness"]["mounts"]["exposed"]}
        assert exposed["/home/agent"]["host"] == str(PAYLOAD_HOME), exposed
        assert exposed["/home/agent"]["canary_tried"], exposed
        assert "home" in cell["witness"]["changed"], cell["witness"]["changed"]
        assert f"fix: do not mount the host's {PAYLOAD_HOME} into the sandbox" in reason


class TestHostTempDirsUnderHost:
    @pytest.mark.parametrize(
        ("key", "host", "inside"),
        [("var_tmp", "/var/tmp", "/host/var-tmp"), ("shm", "/dev/shm", "/host/dev-shm")],
        ids=["var-tmp", "dev-shm"],
    )
    def test_write_outside_fails_naming_the_inside_path(
        self, run: HoleRun, key: str, host: str, inside: str
    ) -> None:
        """The canary dir written at /host/...: FAIL naming the inside path, the dir and the fix."""
        cell = run.cell(TMP_HOLE, WRITE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        reason = cell["reason"]
        assert f"the sandbox mounts the host's {host} at {inside} (writable)" in reason
        assert f"fix: do not mount the host's {host} into the sandbox" in reason
        assert key in cell["witness"]["changed"], cell["witness"]["changed"]
        assert f"{key}@{inside}" in cell["witness"]["mounts"]["added"]

    def test_read_secrets_has_nothing_there(self, run: HoleRun) -> None:
        """No secret lives in the temp dirs: fs_read_secrets is not FAIL under this hole."""
        cell = run.cell(TMP_HOLE, READ)
        assert cell["verdict"] == "PASS", cell["reason"]


class TestHostDirWithNoCanary:
    def test_write_outside_fails_naming_the_inside_path(self, run: HoleRun) -> None:
        """A canary planted at the rendezvous in the bound dir, written at /data: FAIL."""
        cell = run.cell(SHARED_HOLE, WRITE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        reason = cell["reason"]
        assert f"the sandbox mounts the host's {SHARED} at /data (writable)" in reason
        assert f"fix: do not mount the host's {SHARED} into the sandbox" in reason
        mounts = cell["witness"]["mounts"]
        key = "mounted-var-tmp-kiln-shared-data"
        assert set(mounts["planted_at_rendezvous"]) == {key}, mounts
        assert f"{key}@/data" in mounts["added"], mounts
        assert key in cell["witness"]["changed"], cell["witness"]["changed"]

    def test_the_canary_planted_there_is_removed(self, run: HoleRun) -> None:
        """After the run nothing of the cell's is left in the bound host dir."""
        nonce = run.cell(SHARED_HOLE, WRITE)["nonce"]
        assert [p.name for p in SHARED.iterdir() if nonce in p.name] == []

    def test_read_secrets_has_nothing_there(self, run: HoleRun) -> None:
        """No secret lives in the bound dir: fs_read_secrets is PASS under this hole."""
        cell = run.cell(SHARED_HOLE, READ)
        assert cell["verdict"] == "PASS", cell["reason"]


class TestGate:
    def test_no_hole_earns_a_pass_gate(self, run: HoleRun) -> None:
        """Exit 1 and gate FAILED, naming each hole's FAIL cell."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
        failing = ((HOME_HOLE, READ), (HOME_HOLE, WRITE), (TMP_HOLE, WRITE), (SHARED_HOLE, WRITE))
        for backend, probe in failing:
            assert f"gate: required cell {backend}-{probe} is FAIL" in run.stdout, gate
