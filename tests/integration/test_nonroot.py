"""`./run attest` as a normal user: what it skips and why, and a gate that says what it attested.

A real unprivileged account (`sa-nonroot`, created here if absent) runs `./run attest` through
`runuser`, as GitHub's `runner` user or a developer would. The command runs from a copy of
the two files it is made of (`run`, `scripts/`) in a directory that user owns, sharing this
checkout's venv (its stamp is written so `./run` does not rebuild it): the user cannot write
the checkout itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_attest.paths import default_policy
from sandbox_attest.report.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
USER = "sa-nonroot"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="creating a user and switching to it needs root (CI runs as root)"
)


def ensure_user() -> pwd.struct_passwd:
    """The unprivileged account the tests run as, created on first use."""
    done = subprocess.run(
        [
            shutil.which("useradd") or "/usr/sbin/useradd",
            "--system",
            "--user-group",
            "--create-home",
            "--home-dir",
            f"/var/lib/{USER}",
            "--shell",
            "/bin/sh",
            USER,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode in (0, 9), done.stderr  # 9: it exists already
    user = pwd.getpwnam(USER)
    # An account that exists already may have lost its home (removed by hand, or made inside
    # .ci/run's fresh namespace, whose /var/lib is gone with it): useradd makes it only with
    # the account, so the test makes it here, as the user's own.
    home = Path(user.pw_dir)
    if not home.is_dir():
        home.mkdir(mode=0o700)
        os.chown(home, user.pw_uid, user.pw_gid)
    return user


@pytest.fixture
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the user owns with `run`, `scripts/` and this checkout's venv linked in."""
    user = ensure_user()
    base = tmp_path_factory.mktemp("nonroot")  # traversable by others (tests/conftest.py)
    copy = base / "checkout"
    copy.mkdir()
    shutil.copy2(ROOT / "run", copy / "run")
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    # The venv running these tests, wherever it is (a soak runs a clone with the main
    # checkout's venv): a link to a missing .venv would make ./run build one in the copy.
    (copy / ".venv").symlink_to(Path(sys.prefix))
    (copy / ".state").mkdir()
    stamp = hashlib.sha256((copy / "pyproject.toml").read_bytes()).hexdigest()
    (copy / ".state" / "venv.stamp").write_text(stamp + "\n")
    for path in (base, copy, *copy.rglob("*")):
        os.lchown(path, user.pw_uid, user.pw_gid)
    return copy


def as_user(
    checkout: Path, *argv: str, timeout: float = 600, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in `checkout` as the unprivileged user, with a plain user's environment."""
    env = {
        **(extra_env or {}),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": f"/var/lib/{USER}",
        "LANG": "C.UTF-8",
        # The checkout under test: the venv imports it (editable), unless a copy is named.
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    }
    return subprocess.run(
        ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@needs_root
class TestRunAttestAsNonRoot:
    def test_default_set_skips_docker_and_says_why(self, checkout: Path) -> None:
        """No --backend as a normal user without an engine: docker is skipped, with the reason."""
        # An engine this user cannot reach, whatever runs on the machine: the case of a
        # normal user without Docker.
        proc = as_user(
            checkout,
            "./run",
            "attest",
            "--help",
            extra_env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert (
            "skipping docker: no Docker engine answers and starting dockerd needs root"
            in proc.stderr
        )
        assert "not root: no lab" in proc.stderr
        assert "usage: sandbox-attest run" in proc.stdout

    @pytest.mark.needs_bwrap
    def test_bubblewrap_gate_says_what_was_and_was_not_attested(
        self, checkout: Path, tmp_path: Path
    ) -> None:
        """`./run attest --backend bubblewrap` as a normal user ends in a gate that names it all.

        Nothing about docker is installed or started; the report records that the payload ran
        as the harness's own user and that the fixture hosts were on loopback; a cell that
        needs root is NOT_APPLICABLE with "run as root" (never INCONCLUSIVE), and the gate
        holds exactly when every required cell PASSed.
        """
        out = checkout / "report"
        proc = as_user(checkout, "./run", "attest", "--backend", "bubblewrap", "--out", str(out))
        log = proc.stdout[-5000:] + proc.stderr[-3000:]
        assert "docker" not in proc.stderr, log  # nothing of docker was asked, started or said
        assert "gate: " in proc.stdout, log
        evidence = json.loads((out / "evidence.json").read_text())
        assert evidence["trust_domains"]["separated"] is False
        assert evidence["world"]["kind"] == "loopback"
        cells = {c["cell_id"]: c for c in evidence["cells"]}
        assert {c["backend"] for c in cells.values()} == {"none", "bubblewrap"}
        namespace = cells["none-proc_namespace_escape"]
        assert namespace["verdict"] in ("PASS", "NOT_APPLICABLE"), namespace["reason"]
        if namespace["verdict"] == "NOT_APPLICABLE":
            assert "run as root" in namespace["reason"]
            assert "run as root" in proc.stdout, log
        not_pass = sorted(i for i, c in cells.items() if c["required"] and c["verdict"] != "PASS")
        for cell_id in not_pass:
            assert cell_id in proc.stdout, f"the gate does not name {cell_id}: {log}"
        # Every other backend the package's policy requires here is named as not attested.
        policy = load_policy(default_policy())
        others = {r.backend for r in policy.requirements if r.platform == "linux"}
        for backend in sorted(others - {"none", "bubblewrap"}):
            assert f"not attested in this run: backend {backend}" in proc.stdout, log
        if not_pass:
            assert proc.returncode == 1, log
            assert proc.stdout.rstrip().endswith("gate: FAILED"), log
        else:
            assert proc.returncode == 0, log
            assert "gate: PASSED" in proc.stdout, log
        assert json.loads((out / "signing.json").read_text())["gate"] in ("PASSED", "FAILED")


# Loaded with `-p` into the run: this host lets an unprivileged user join the namespaces it
# made, so the kernel's refusal is stubbed at its one seam (the spec's own check), as on an
# Ubuntu 24.04 runner with AppArmor's user-namespace restriction on.
REFUSING_KERNEL = """
from sandbox_attest.catalog import proc

proc.setns_control_refused.cache_clear()
proc.ProcNamespaceEscape.not_applicable_here = (
    lambda self: proc.NEEDS_ROOT + " (here setns(user): EPERM)"
)
"""


class TestSetnsControlRefused:
    def test_cells_are_not_applicable_and_the_policy_fails_with_run_as_root(
        self, tmp_path: Path
    ) -> None:
        """Where setns is refused, its cells are NOT_APPLICABLE and the gate says run as root."""
        import sys  # noqa: PLC0415

        plugins = tmp_path / "plugins"
        plugins.mkdir()
        (plugins / "refusing_kernel.py").write_text(REFUSING_KERNEL)
        matrix = tmp_path / "matrix.toml"
        matrix.write_text(
            '[[probe]]\nid = "proc_namespace_escape"\ntimeout = 60\n'
            '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
            '[[backend]]\nname = "bubblewrap"\nplatforms = ["linux"]\nreason = "namespaces"\n'
        )
        policy = tmp_path / "policy.toml"
        policy.write_text(
            "".join(
                f'[[require]]\nplatform = "linux"\nbackend = "{b}"\n'
                'probes = ["proc_namespace_escape"]\n'
                for b in ("none", "bubblewrap")
            )
        )
        out = tmp_path / "r"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(ROOT)])}
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "sandbox_attest.cli", "run", "--matrix", str(matrix)),
                *("--policy", str(policy), "--backend", "bubblewrap", "--out", str(out)),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=tmp_path,
            env={**env, "PYTEST_ADDOPTS": "-p refusing_kernel"},
        )
        log = proc.stdout[-4000:] + proc.stderr[-2000:]
        cells = {c["cell_id"]: c for c in json.loads((out / "evidence.json").read_text())["cells"]}
        for cell_id in ("none-proc_namespace_escape", "bubblewrap-proc_namespace_escape"):
            assert cells[cell_id]["verdict"] == "NOT_APPLICABLE", log
            assert cells[cell_id]["reason"].startswith(
                "needs root for its setns control; run as root"
            )
        assert (
            "gate: required cell none-proc_namespace_escape is NOT_APPLICABLE: needs root for "
            "its setns control; run as root" in proc.stdout
        ), log
        assert proc.stdout.rstrip().endswith("gate: FAILED"), log
        assert proc.returncode == 1, log
