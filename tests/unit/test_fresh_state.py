"""scripts/fresh-state.sh: a command sees the harness's host state as a fresh machine has it.

.ci/run runs `./run test` through it, so that a leftover of an earlier run (an
/run/sandbox-attest, a payload home, a temp root) cannot stand in for a step the code forgot.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox_attest.host.disguise import SANDBOX_RUN_DIR

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fresh-state.sh"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a private mount namespace needs root and util-linux's unshare",
)


def inside(script: str) -> subprocess.CompletedProcess[str]:
    """Run a shell script in the fresh-state namespace; its output."""
    return subprocess.run(
        [str(SCRIPT), "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_harness_state_is_absent_and_the_rest_stays() -> None:
    """The harness's own entries are hidden, another program's are not; no outside engine."""
    tag = secrets.token_hex(6)
    harness_own = Path("/var/tmp") / f".sandbox-attest-fresh-{tag}"
    someone_elses = Path("/var/tmp") / f"fresh-state-test-{tag}"
    harness_own.mkdir()
    someone_elses.mkdir()
    try:
        done = inside(
            f"test ! -e {harness_own} && echo own-absent; "
            f"test -d {someone_elses} && echo other-present; "
            "test -e /run/docker.sock -o -e /var/lib/docker || echo no-outside-engine; "
            f"test -e {SANDBOX_RUN_DIR} || echo run-dir-absent; "
            'test -z "$(ls -A /tmp)" && echo tmp-empty'
        )
    finally:
        harness_own.rmdir()
        someone_elses.rmdir()
    assert done.returncode == 0, done.stderr
    said = done.stdout.split()
    assert "own-absent" in said
    assert "other-present" in said
    assert "run-dir-absent" in said
    assert "tmp-empty" in said
    # The run starts its own engine inside: one outside would not see this namespace's files.
    assert "no-outside-engine" in said


def test_what_the_command_writes_there_never_reaches_the_host() -> None:
    """A run dir and a state dir made inside are gone with the namespace; the host's unchanged."""
    tag = secrets.token_hex(6)
    places = [Path(SANDBOX_RUN_DIR) / tag, Path("/var/lib/sandbox-attest") / tag]
    before = {p.parent: p.parent.exists() for p in places}
    done = inside(" && ".join(f"mkdir -p {p} && test -d {p}" for p in places) + " && echo made")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["made"]
    assert not any(p.exists() for p in places)
    assert {p.parent: p.parent.exists() for p in places} == before


def state_tops() -> list[Path]:
    """The host directories the harness keeps state in between runs, named by its own code."""
    from sandbox_attest.backends.base import SANDBOX_RUN_DIR  # noqa: PLC0415
    from sandbox_attest.host import journal as sweep  # noqa: PLC0415  (the code's own constants)
    from sandbox_attest.host import trust  # noqa: PLC0415  (the code's own constants)

    home = trust.PAYLOAD_HOME
    # The home's top directory under /var/lib: what a fresh machine lacks until useradd.
    home_top = Path("/var/lib") / home.relative_to("/var/lib").parts[0]
    return [Path(SANDBOX_RUN_DIR), sweep.ROOT_STATE_DIR, home_top]


def test_every_state_place_the_code_names_is_hidden() -> None:
    """The run dir, the journal and the payload home are absent inside, present or not outside.

    Each is made on the host for the test where absent (and removed after), so the test
    shows the hiding whatever an earlier run left.
    """
    made = []
    for top in state_tops():
        if not top.exists():
            top.mkdir(mode=0o755)
            made.append(top)
    try:
        done = inside("; ".join(f"test -e {top} && echo {top}" for top in state_tops()) + "; :")
    finally:
        for top in made:
            with contextlib.suppress(OSError):  # a concurrent run may have used it meanwhile
                top.rmdir()
    assert done.returncode == 0, done.stderr
    assert not done.stdout.split(), f"visible inside the namespace: {done.stdout.split()}"


def naming_the_harness(mountinfo: str) -> set[str]:
    """The mount points in a mountinfo text whose path names the harness."""
    return {line.split()[4] for line in mountinfo.splitlines() if "sandbox-attest" in line}


def test_it_adds_no_mount_naming_the_harness() -> None:
    """The suite's own leak check (no mount naming the harness) still holds inside.

    tests/catalog/test_proc.py looks for "sandbox-attest" in /proc/self/mountinfo; a cover
    under /opt/sandbox-attest or a checkout called sandbox-attest would trip it.
    """
    done = inside("cat /proc/self/mountinfo")
    assert done.returncode == 0, done.stderr
    host = naming_the_harness(Path("/proc/self/mountinfo").read_text())
    assert naming_the_harness(done.stdout) <= host


def test_the_docker_engine_record_is_the_namespaces_own() -> None:
    """docker-engine.sh keeps its record in the fresh /run, never in the shared checkout."""
    mark = f"record-{secrets.token_hex(6)}"
    done = inside(
        'echo "$DOCKER_ENGINE_STATE_DIR"; test -d "$DOCKER_ENGINE_STATE_DIR" && echo made; '
        f'touch "$DOCKER_ENGINE_STATE_DIR/{mark}"'
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["/run/fresh-state/docker-engine", "made"]
    # The namespace's /run, not the caller's: what it wrote there is not in the caller's view.
    # By the file it wrote, not by the directory's absence: CI runs this suite inside an outer
    # fresh-state namespace, whose own /run/fresh-state the caller does see.
    assert not (Path("/run/fresh-state/docker-engine") / mark).exists()


def test_a_command_that_fails_fails_the_wrapper() -> None:
    """The command's exit status is the wrapper's: CI sees a failing suite as failing."""
    assert inside("exit 3").returncode == 3


def test_its_inner_step_refuses_the_hosts_own_namespace() -> None:
    """`--inside` run directly would cover the host's /run and /tmp: it refuses, naming why."""
    before = covers(Path("/proc/self/mountinfo").read_text())
    done = subprocess.run(
        [str(SCRIPT), "--inside", "true"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "run only in the mount namespace it makes" in done.stderr
    # Nothing covered: the caller's mounts are as before (CI's caller already sits in an outer
    # fresh-state namespace, so its covers are there from the start and must stay the same).
    assert covers(Path("/proc/self/mountinfo").read_text()) == before


def covers(mountinfo: str) -> list[str]:
    """The mount ids and points of fresh-state's tmpfs covers in a mountinfo text."""
    return [
        f"{line.split()[0]} {line.split()[4]}"
        for line in mountinfo.splitlines()
        if " fresh-state " in line
    ]
