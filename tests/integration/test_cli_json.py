"""`--json` on run, backends and verify: stdout is one JSON object that says what the run said.

Real runs of the CLI on a two-probe matrix (none + bubblewrap), parsed as a script would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli_run import keypair

CLI = [sys.executable, "-m", "sandbox_attest.cli"]
PROBES = ("net_direct_egress", "fs_write_outside")


def write_inputs(root: Path) -> tuple[Path, Path]:
    """A matrix of two probes over none and bubblewrap, and a policy requiring both legs."""
    matrix = root / "matrix.toml"
    matrix.write_text(
        "".join(f'[[probe]]\nid = "{p}"\ntimeout = 30\n' for p in PROBES)
        + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        + '[[backend]]\nname = "bubblewrap"\nplatforms = ["linux"]\n'
    )
    policy = root / "policy.toml"
    probes = ", ".join(f'"{p}"' for p in PROBES)
    policy.write_text(
        "".join(
            f'[[require]]\nplatform = "linux"\nbackend = "{b}"\nprobes = [{probes}]\n'
            for b in ("none", "bubblewrap")
        )
    )
    return matrix, policy


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI; stdout and stderr apart."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One signed `run --json`, its parsed stdout, stderr, exit code and inputs."""
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required: apt-get install bubblewrap")
    root = tmp_path_factory.mktemp("json")
    matrix, policy = write_inputs(root)
    private, public = keypair(root)
    out = root / "report"
    done = cli(
        "run", "--matrix", str(matrix), "--policy", str(policy), "--key", str(private),
        "--out", str(out), "--json",
    )  # fmt: skip
    return {
        "done": done,
        "json": json.loads(done.stdout),
        "out": out,
        "public": public,
        "policy": policy,
    }


class TestRunJson:
    def test_stdout_is_exactly_one_json_object(self, run: dict[str, Any]) -> None:
        """Stdout parses whole; the human lines (cells, grid, gate) went to stderr."""
        assert isinstance(run["json"], dict)
        assert "bubblewrap-net_direct_egress" in run["done"].stderr
        assert "gate: " in run["done"].stderr

    def test_it_says_what_the_run_and_its_evidence_say(self, run: dict[str, Any]) -> None:
        """Exit code, gate, run id and every path agree with the process and the files."""
        got, done, out = run["json"], run["done"], run["out"]
        assert got["exit_code"] == done.returncode == 0, done.stderr[-2000:]
        assert got["gate"] == got["signed_gate"] == "PASSED"
        evidence = json.loads((out / "evidence.json").read_text())
        assert got["run_id"] == evidence["run_id"]
        assert Path(got["report_dir"]) == out
        assert all(Path(p).exists() for p in got["paths"].values())
        assert got["failures"] == []


class TestVerifyAndBackendsJson:
    def test_verify_json_is_one_object_with_the_outcome(self, run: dict[str, Any]) -> None:
        """`verify --json` of the signed run: parsable, and ok exactly when it exits 0."""
        done = cli(
            "verify", str(run["out"]), "--trusted-key", str(run["public"]),
            "--policy", str(run["policy"]), "--partial", "--json",
        )  # fmt: skip
        got = json.loads(done.stdout)
        assert done.returncode == 0, done.stdout + done.stderr
        assert got["ok"] is True
        assert got["reasons"] == []

    def test_a_missing_report_is_exit_2(self, tmp_path: Path) -> None:
        """`verify` on a directory that does not exist is bad input: exit 2, named."""
        done = cli("verify", str(tmp_path / "nope"), "--trusted-key", str(tmp_path / "k"))
        assert done.returncode == 2
        assert str(tmp_path / "nope") in done.stderr + done.stdout

    def test_backends_json_lists_each_backend_in_plain_data(self) -> None:
        """`backends --json`: every backend with its status in words, no Python reprs."""
        done = cli("backends", "--json")
        got = json.loads(done.stdout)
        names = {row["name"] for row in got["backends"]}
        assert {"none", "bubblewrap"} <= names
        statuses = {row["status"] for row in got["backends"]}
        assert statuses <= {"AVAILABLE", "UNAVAILABLE", "NOT_APPLICABLE"}
        assert next(r for r in got["backends"] if r["name"] == "none")["status"] == "AVAILABLE"
        # seatbelt and appcontainer are another platform's: said so, with the reason
        assert all(r.get("reason") for r in got["backends"] if r["status"] != "AVAILABLE")
        assert "DeclaredClaims(" not in done.stdout
