"""`sandbox-attest run` as a user runs it: real backends, a real world, a signed report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.catalog import PROBES
from sandbox_attest.paths import default_policy, matrix_dir
from sandbox_attest.run.matrix import load_matrix
from tests.here import not_judgeable_here, policy_judged_here

CLI = [sys.executable, "-m", "sandbox_attest.cli"]
CORE = [
    "net_denied_host",
    "net_direct_egress",
    "dns_resolution",
    "ipc_unix_socket_escape",
    "fs_write_outside",
    "net_transfer_18mib",
    "pkg_pip_install",
]


def keypair(directory: Path) -> tuple[Path, Path]:
    """A fresh Ed25519 signing key and its public key, as PEM files."""
    key = Ed25519PrivateKey.generate()
    private = directory / "signing.pem"
    public = directory / "signing.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    private.chmod(0o600)
    return private, public


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a subprocess from the repo root."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=Path(__file__).parent.parent.parent,
    )


@pytest.mark.slow
class TestRun:
    def test_required_legs_pass_signed_and_verified(self, tmp_path: Path) -> None:
        """The Linux legs the policy requires PASS every cell, exit 0, and the report verifies."""
        private, public = keypair(tmp_path)
        out = tmp_path / "report"
        legs = ("none", "bubblewrap", "docker")
        # The shipped policy less what this machine cannot judge, each excluded with the host's
        # reason (dev_access where no device opens for the payload user): those cells are
        # NOT_APPLICABLE on every leg, and the release path is still exercised here.
        policy = policy_judged_here(default_policy(), tmp_path / "policy.toml")
        unjudged = {p for p in PROBES if not_judgeable_here(p) is not None}
        proc = run_cli(
            "run",
            *(f"--backend={b}" for b in legs),
            "--policy",
            str(policy),
            "--out",
            str(out),
            "--key",
            str(private),
            "-j",
            "2",
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert "gate: PASSED" in proc.stdout
        evidence = json.loads((out / "evidence.json").read_text())
        assert evidence["complete"] is True
        probes = [row.id for row in load_matrix(matrix_dir() / "matrix.toml").probes]
        cells = {c["cell_id"]: c for c in evidence["cells"]}
        assert set(cells) == {f"{b}-{p}" for b in legs for p in probes}
        required = {cid: c["verdict"] for cid, c in cells.items() if c["required"]}
        assert CORE[0] in {c["probe"] for c in cells.values() if c["required"]}
        assert set(required.values()) == {"PASS"}, required
        # Every cell ran but the ones the backend's claims make NOT_APPLICABLE before they run
        # (neither sandbox claims protected paths inside the workspace).
        skipped = {c["cell_id"] for c in evidence["cells"] if c["verdict"] == "NOT_APPLICABLE"}
        assert skipped == {f"{b}-fs_protected_in_workspace" for b in ("bubblewrap", "docker")} | {
            f"{b}-{p}" for b in legs for p in unjudged
        }
        for cell in evidence["cells"]:
            assert cell["reason"]
            if cell["cell_id"] in skipped:
                assert "run" not in cell
                assert cell["required"] is False
            else:
                assert cell["run"]["started"] is True
        for name in ("junit.xml", "attestation.intoto.jsonl", "report.html", "summary.md"):
            assert (out / name).is_file(), name
        assert any((out / "allure-results").glob("*-result.json"))
        environment = (out / "allure-results" / "environment.properties").read_text()
        assert "backend.bubblewrap=bubblewrap" in environment
        assert (out / "allure-results" / "categories.json").is_file()
        assert "sandbox-attest verdicts" in proc.stdout
        verify = run_cli(
            "verify", str(out), "--trusted-key", str(public), "--partial", "--policy", str(policy)
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        # The release requires only the separated Linux legs (macOS and Windows are
        # informational: they cannot switch uid), so this one report is the whole release.
        full = run_cli("verify", str(out), "--trusted-key", str(public), "--policy", str(policy))
        assert full.returncode == 0, full.stdout + full.stderr
        assert "(gate PASSED)" in full.stdout

    def test_default_run_is_the_main_job(self, tmp_path: Path) -> None:
        """With no options every backend here runs; wrapper escapes warn, the gate holds."""
        # Held to the shipped policy less what this machine cannot judge (dev_access where no
        # device opens for the payload user), so the default run is still exercised here.
        policy = policy_judged_here(default_policy(), tmp_path / "policy.toml")
        out = tmp_path / "r"
        proc = run_cli("run", "--out", str(out), "-j", "2", "--policy", str(policy))
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        cells = json.loads((out / "evidence.json").read_text())["cells"]
        firejail_fail = [c for c in cells if c["backend"] == "firejail" and c["verdict"] == "FAIL"]
        assert firejail_fail  # firejail's default spec lets the payload reach host sockets
        assert not any(c["required"] for c in firejail_fail)
        # Unrequired FAILs: the run passes the gate, and its word is the signed one, WARNED.
        assert "gate: WARNED" in proc.stdout
        assert "gate: PASSED" not in proc.stdout
        assert json.loads((out / "signing.json").read_text())["gate"] == "WARNED"
        assert "gate: warning: firejail-ipc_unix_socket_escape is FAIL" in proc.stdout

    def test_escape_in_a_named_backend_fails_the_run(self, tmp_path: Path) -> None:
        """Naming a backend requires its cells: firejail's escapes then fail the run."""
        proc = run_cli("run", "--backend", "firejail", "--out", str(tmp_path / "r"), "-j", "2")
        assert proc.returncode == 1
        assert "gate: required cell firejail-ipc_unix_socket_escape is FAIL" in proc.stdout

    def test_missing_required_leg_fails_the_run(self, tmp_path: Path) -> None:
        """Attesting only the control leg cannot satisfy a policy that requires bubblewrap."""
        proc = run_cli("run", "--backend", "none", "--out", str(tmp_path / "r"))
        assert proc.returncode != 0
        assert "gate: no sandbox backend the policy requires ran" in proc.stdout
        assert "not attested in this run: backend bubblewrap" in proc.stdout

    def test_interrupted_run_keeps_its_evidence(self, tmp_path: Path) -> None:
        """SIGINT midway leaves evidence.jsonl and an evidence.json marked incomplete."""
        out = tmp_path / "r"
        proc = subprocess.Popen(
            [*CLI, "run", "--backend", "none", "--backend", "bubblewrap", "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent.parent,
        )
        journal = out / "evidence.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if journal.exists() and len(journal.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
        evidence = json.loads((out / "evidence.json").read_text())
        assert evidence["complete"] is False
        assert len(evidence["cells"]) >= 2
        probes = load_matrix(matrix_dir() / "matrix.toml").probes
        assert len(evidence["cells"]) < 2 * len(probes)
        assert [json.loads(line)["cell_id"] for line in journal.read_text().splitlines()] == [
            c["cell_id"] for c in evidence["cells"]
        ]


def small_matrix(
    directory: Path, name: str = "small.toml", probe: str = "fs_write_outside"
) -> Path:
    """A one-probe matrix under any file name: the control leg, bubblewrap and seatbelt."""
    path = directory / name
    path.write_text(
        f'[[probe]]\nid = "{probe}"\ntimeout = 30\n'
        '[[backend]]\nname = "none"\nplatforms = ["linux", "darwin"]\n'
        '[[backend]]\nname = "bubblewrap"\nplatforms = ["linux"]\nreason = "namespaces"\n'
        '[[backend]]\nname = "seatbelt"\nplatforms = ["darwin"]\nreason = "macOS only"\n'
    )
    return path


def small_policy(directory: Path, backend: str = "bubblewrap") -> Path:
    """A policy requiring fs_write_outside of the control leg and of `backend` on Linux."""
    path = directory / "policy.toml"
    path.write_text(
        "".join(
            f'[[require]]\nplatform = "linux"\nbackend = "{b}"\nprobes = ["fs_write_outside"]\n'
            for b in ("none", backend)
        )
    )
    return path


class TestSmallMatrix:
    """One-probe runs: a matrix of any name, and what a run that attests nothing does."""

    def test_matrix_of_any_name_runs_and_passes(self, tmp_path: Path) -> None:
        """--matrix small.toml is collected (not only files named matrix.toml)."""
        out = tmp_path / "r"
        proc = run_cli(
            "run",
            "--matrix",
            str(small_matrix(tmp_path)),
            "--policy",
            str(small_policy(tmp_path)),
            "--backend",
            "bubblewrap",
            "--out",
            str(out),
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        cells = json.loads((out / "evidence.json").read_text())["cells"]
        assert {c["cell_id"]: c["verdict"] for c in cells} == {
            "none-fs_write_outside": "PASS",
            "bubblewrap-fs_write_outside": "PASS",
        }

    def test_a_reader_that_goes_away_does_not_take_the_report(self, tmp_path: Path) -> None:
        """`run | head -1`: the pipe closes after one line, and the run still writes it all."""
        out = tmp_path / "r"
        argv = [*CLI, "run", "--matrix", str(small_matrix(tmp_path)), "--policy"]
        argv += [str(small_policy(tmp_path)), "--backend", "bubblewrap", "--out", str(out)]
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).parent.parent.parent,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # what head does after its line: the next write meets EPIPE
        assert proc.wait(timeout=300) == 0
        assert first.startswith("sandbox-attest ")
        evidence = json.loads((out / "evidence.json").read_text())
        assert evidence["complete"] is True
        assert {c["verdict"] for c in evidence["cells"]} == {"PASS"}
        assert (out / "attestation.intoto.jsonl").is_file()
        assert (out / "report.html").is_file()

    def test_named_backend_of_another_platform_fails_the_gate(self, tmp_path: Path) -> None:
        """--backend seatbelt on Linux attests nothing: exit 1, saying where it runs."""
        out = tmp_path / "r"
        proc = run_cli(
            "run",
            "--matrix",
            str(small_matrix(tmp_path)),
            "--policy",
            str(small_policy(tmp_path)),
            "--backend",
            "seatbelt",
            "--out",
            str(out),
            timeout=300,
        )
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "backend seatbelt runs on darwin only; run it on a macOS runner" in proc.stdout
        assert "the control leg alone attests nothing" in proc.stdout
        assert json.loads((out / "signing.json").read_text())["gate"] == "FAILED"

    def test_plain_pytest_deselecting_a_required_cell_fails(self, tmp_path: Path) -> None:
        """`pytest -k "not <cell>"`: the evidence is incomplete and pytest exits non-zero."""
        matrix = small_matrix(tmp_path)
        out = tmp_path / "r"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(matrix),
                f"--sandbox-attest={matrix}",
                f"--rootdir={tmp_path}",
                "-c",
                str(matrix_dir() / "pytest.ini"),
                f"--sandbox-attest-policy={small_policy(tmp_path)}",
                f"--sandbox-attest-report-dir={out}",
                f"--junitxml={out / 'junit.xml'}",
                "--sandbox-attest-backend=bubblewrap",
                "-k",
                "not bubblewrap-fs_write_outside",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=Path(__file__).parent.parent.parent,
        )
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        evidence = json.loads((out / "evidence.json").read_text())
        assert evidence["complete"] is False
        assert json.loads((out / "signing.json").read_text())["gate"] == "FAILED"

    def test_plain_pytest_gets_the_rendered_junit(self, tmp_path: Path) -> None:
        """Plain `pytest matrix/` without --junitxml gets a signed junit.xml from the evidence.

        It used to sign nothing without pytest's --junitxml; junit.xml is now rendered from
        the judged evidence by the same renderer `sandbox-attest run` uses, and signed.
        """
        matrix = small_matrix(tmp_path)
        out = tmp_path / "r"
        env = {k: v for k, v in os.environ.items() if k != "SANDBOX_ATTEST_SIGNING_KEY"}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(matrix),
                f"--sandbox-attest={matrix}",
                f"--rootdir={tmp_path}",
                "-c",
                str(matrix_dir() / "pytest.ini"),
                f"--sandbox-attest-policy={small_policy(tmp_path)}",
                f"--sandbox-attest-report-dir={out}",
                "--sandbox-attest-backend=bubblewrap",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**env, "XDG_CONFIG_HOME": str(tmp_path / "config")},
            cwd=Path(__file__).parent.parent.parent,
        )
        assert (out / "attestation.intoto.jsonl").is_file(), proc.stdout[-3000:]
        evidence = json.loads((out / "evidence.json").read_text())
        # Our own renderer wrote it (S314 is about hostile XML).
        suites = ET.fromstring((out / "junit.xml").read_bytes()).findall("testsuite")  # noqa: S314
        names = [s.get("name") for s in suites]
        assert names == ["linux/none", "linux/bubblewrap", "release-gate"]
        props = {p.get("name"): p.get("value") for p in suites[1].iter("property")}
        assert props["run_id"] == evidence["run_id"]
        gate = json.loads((out / "signing.json").read_text())["gate"]
        failing = sum(int(s.get("failures", "0")) + int(s.get("errors", "0")) for s in suites)
        assert (failing > 0) == (gate == "FAILED")
        assert (proc.returncode == 0) == (gate != "FAILED"), proc.stdout[-3000:]

    def test_plain_pytest_bad_key_stops_before_any_cell(self, tmp_path: Path) -> None:
        """--sandbox-attest-key that is not a key: one line at collection, no cell runs."""
        matrix = small_matrix(tmp_path)
        out = tmp_path / "r"
        hostname = tmp_path / "hostname"  # private, so only "not a key" is wrong with it
        hostname.write_text("box\n")
        hostname.chmod(0o600)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(matrix),
                f"--sandbox-attest={matrix}",
                f"--rootdir={tmp_path}",
                "-c",
                str(matrix_dir() / "pytest.ini"),
                f"--sandbox-attest-policy={small_policy(tmp_path)}",
                f"--sandbox-attest-report-dir={out}",
                f"--sandbox-attest-key={hostname}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=Path(__file__).parent.parent.parent,
        )
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, proc.stdout + proc.stderr
        assert f"sandbox-attest: error: --key {hostname}: not a PEM private key" in proc.stdout
        assert "Traceback" not in proc.stdout
        assert "sandbox_attest/plugin/__init__.py" not in proc.stdout
        assert not (out / "evidence.jsonl").exists()


# The error for an unknown backend lists the spec files a user could have meant.
SHIPPED_SPECS = f"({', '.join(sorted(p.stem for p in (matrix_dir() / 'backends').glob('*.toml')))})"


class TestBadInput:
    @pytest.mark.parametrize(
        ("args", "needle"),
        [
            (["--backend", "nosuch"], "unknown backend 'nosuch'"),
            # Every shipped spec is named, whichever are in matrix/backends/ today.
            (["--backend", "fierjail"], SHIPPED_SPECS),
            (["--policy", "/nonexistent/policy.toml"], "pass the release policy with --policy"),
            (["--matrix", "/nonexistent/matrix.toml"], "matrix file not found"),
            (["--key", "/etc/hostname"], "--key /etc/hostname: not a PEM private key"),
        ],
    )
    def test_bad_input_is_one_clear_line(
        self, tmp_path: Path, args: list[str], needle: str
    ) -> None:
        """A typo stops the run before any fixture starts: exit 2, the fix, no traceback."""
        proc = run_cli("run", *args, "--out", str(tmp_path / "r"))
        assert proc.returncode == 2
        assert needle in proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout
        assert not (tmp_path / "r").exists()

    def test_non_empty_out_is_refused(self, tmp_path: Path) -> None:
        """--out naming a directory that holds files: exit 2, naming the fix, nothing written."""
        out = tmp_path / "r"
        out.mkdir()
        (out / "evidence.json").write_text('{"forged": true}')
        proc = run_cli("run", "--backend", "none", "--out", str(out))
        assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert f"--out {out} is not empty (it holds evidence.json)" in proc.stderr
        assert "pass a new or empty directory" in proc.stderr
        assert sorted(p.name for p in out.iterdir()) == ["evidence.json"]

    def test_key_readable_by_everyone_is_refused(self, tmp_path: Path) -> None:
        """A --key file others can read is refused before the run, naming chmod 600."""
        private, _ = keypair(tmp_path)
        private.chmod(0o644)
        out = tmp_path / "r"
        proc = run_cli("run", "--backend", "none", "--key", str(private), "--out", str(out))
        assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert f"signing key {private} is accessible to everyone (mode 644)" in proc.stderr
        assert "chmod 600" in proc.stderr
        assert not out.exists()

    def test_out_that_is_a_file_is_one_clear_line(self) -> None:
        """--out naming an existing file: exit 2 before anything runs, no traceback."""
        proc = run_cli("run", "--backend", "none", "--out", "/etc/passwd")
        assert proc.returncode == 2
        assert "--out /etc/passwd: cannot create the report directory" in proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout

    def test_policy_naming_an_unknown_backend_is_rejected(self, tmp_path: Path) -> None:
        """A policy requiring `dockr` stops the run, naming the name and the policy file."""
        policy = tmp_path / "policy.toml"
        text = (matrix_dir() / "policy.toml").read_text()
        policy.write_text(text.replace('backend = "docker"', 'backend = "dockr"', 1))
        proc = run_cli("run", "--policy", str(policy), "--out", str(tmp_path / "r"))
        assert proc.returncode == 2
        assert "'dockr'" in proc.stderr
        assert str(policy) in proc.stderr
        assert not (tmp_path / "r").exists()

    def test_matrix_probe_outside_the_catalogue_is_rejected(self, tmp_path: Path) -> None:
        """An unknown probe id in the matrix is a preflight error listing the known probes."""
        matrix = small_matrix(tmp_path, probe="fs_writ_outside")
        proc = run_cli("run", "--matrix", str(matrix), "--out", str(tmp_path / "r"))
        assert proc.returncode == 2
        assert "probe 'fs_writ_outside' is not in the probe catalogue" in proc.stderr
        assert "fs_write_outside" in proc.stderr
        assert not (tmp_path / "r").exists()

    @pytest.mark.slow
    def test_bad_signing_key_in_env_stops_before_the_run(self, tmp_path: Path) -> None:
        """A key that cannot sign is found before any cell runs: exit 2, one line, no report.

        (It used to surface only after the whole run as 'attestation was not written'; that
        late path is still covered by test_plain_pytest_unsigned_report_does_not_exit_0.)
        """
        env = {**os.environ, "SANDBOX_ATTEST_SIGNING_KEY": "not a key"}
        out = tmp_path / "r"
        proc = subprocess.run(
            [*CLI, "run", "--backend", "bubblewrap", "--out", str(out), "-j", "2"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=env,
            cwd=Path(__file__).parent.parent.parent,
        )
        assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "SANDBOX_ATTEST_SIGNING_KEY" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not out.exists()


class TestBackendsCommand:
    def test_lists_availability_with_reason(self) -> None:
        """`backends` lists each backend; bubblewrap is available here with its version."""
        proc = run_cli("backends")
        assert proc.returncode == 0, proc.stderr
        lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
        assert "available" in lines["bubblewrap"]
        assert "bubblewrap 0." in lines["bubblewrap"]
        assert "NOT_APPLICABLE" in lines["seatbelt"]
        assert os.uname().sysname == "Linux"
