"""Issue 23's forgeries, live: a wrapper that shares a trust domain with the harness.

Two set-ups the harness supports hand the release key to the code under test:

(a) a non-root harness: every wrapper runs as the harness's own uid, so it reads `--key PATH`
    in an ancestor's `/proc/<pid>/cmdline` and then the key file itself;
(b) a spec with `[run] user = "root"`: the wrapper runs as root and reads anything: the key
    file named in the cmdline of whatever started the harness (`sudo sandbox-attest run --key
    K` leaves sudo above the harness, its cmdline world-readable, whatever title the harness
    shows itself), and `/proc/<harness>/environ`, which still shows
    `$SANDBOX_ATTEST_SIGNING_KEY` after the harness deleted it from its own `os.environ`.

The wrapper (tests/data/forger/wrapper.py) steals the key and keeps it; the test then forges
with that loot as the attacker would: the run's report with every verdict turned PASS and the
harness commit marked clean, re-signed with the stolen key by the harness's own `sign_report`.
Before issue 23 that forgery passed `verify --trusted-key RELEASE.pub --expect-commit`, and the
run's own statement said "trust domains: separated". Now the run measures who its sandboxed
processes ran as, signs with the per-machine key (exit 2 for `--key`), and `verify` refuses a
run that was not separated, the forgery included (it carries the run's measured fact).

What no test here can show: a forger holding the stolen key can also rewrite the measured fact
itself, and its signature is then as good as the harness's. A key that a non-separated run
could read is exposed; the run says so in its line ("rotate the key"), and reports/README.md's
trust model says why such a key must never be the release key.

Root only (the non-root case switches to a user of its own with runuser); real processes, real
uids, real keys; the run's per-machine key and registry live in this test's tmp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)

from sandbox_attest.attest import sign_report
from sandbox_attest.attest.keys import ENV_VAR, SigningKey
from sandbox_attest.report.policy import load_policy
from tests.integration.test_cli_run import keypair
from tests.integration.test_nonroot import ensure_user

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or sys.platform != "linux",
        reason="switching to a non-root user and to root wrappers needs a root harness on Linux",
    ),
    pytest.mark.timeout(300),
]

REPO = Path(__file__).resolve().parents[2]
FORGER = Path(__file__).parent.parent / "data" / "forger"
PROBE = "fs_write_outside"
BACKEND = "forger"
ROOT_USER = 'user = "root"\nuser_reason = "the wrapper needs root to set up its mounts"'
RUN_TIMEOUT_S = 180
NOT_SEPARATED = "trust domains were NOT separated"
NOT_USED = "was NOT used"
# What the forged evidence claims: a clean checkout of this commit (what --expect-commit wants).
FORGED_COMMIT = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0"


@dataclass(frozen=True)
class ForgeryRun:
    """One `sandbox-attest run` with the forger wrapper, and what it left."""

    root: Path
    drop: Path
    out: Path
    private: Path
    public: Path
    policy: Path
    config: Path  # XDG_CONFIG_HOME of the run: its per-machine key and registry
    returncode: int
    stdout: str
    stderr: str

    def log(self) -> str:
        """The run's output tail, for assertion messages."""
        return self.stdout[-4000:] + self.stderr[-2000:]

    def attempts(self) -> list[dict[str, Any]]:
        """The wrapper's records; fails when it left none (it never ran: nothing was attacked)."""
        path = self.drop / "attempts.jsonl"
        assert path.is_file(), f"the forger wrapper never ran: {self.log()}"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def loot(self) -> bytes:
        """The key the wrapper stole (fails when it stole none)."""
        results = [a for a in self.attempts() if a["source"] == "result"]
        assert results, f"the wrapper recorded no result: {self.attempts()}"
        assert all(r["stolen"] for r in results), results
        return (self.drop / "loot.pem").read_bytes()

    def evidence(self) -> dict[str, Any]:
        """The run's evidence.json."""
        data: dict[str, Any] = json.loads((self.out / "evidence.json").read_text())
        return data


def render_spec(root: Path, wrapper: Path, drop: Path, run_user: str) -> Path:
    """The forger spec for this test's paths."""
    text = (FORGER / "spec.toml.in").read_text()
    for token, value in (("@WRAPPER@", str(wrapper)), ("@DROP_DIR@", str(drop))):
        text = text.replace(token, value)
    spec = root / "forger.toml"
    spec.write_text(text.replace("@RUN_USER@", run_user))
    return spec


def write_inputs(root: Path) -> tuple[Path, Path]:
    """A one-probe matrix with the control leg, and a policy requiring the control leg's cell."""
    matrix = root / "matrix.toml"
    matrix.write_text(
        f'[[probe]]\nid = "{PROBE}"\ntimeout = 60\n[[backend]]\nname = "none"\n'
        'platforms = ["linux"]\n'
    )
    policy = root / "policy.toml"
    policy.write_text(f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = ["{PROBE}"]\n')
    return matrix, policy


def prepare(root: Path, run_user: str) -> tuple[Path, Path, Path, Path, Path]:
    """Drop dir, wrapper copy, spec, matrix and policy under `root`."""
    drop = root / "drop"
    drop.mkdir()
    drop.chmod(0o777)  # the wrapper records there, whoever it runs as
    wrapper = root / "wrapper.py"
    shutil.copyfile(FORGER / "wrapper.py", wrapper)
    wrapper.chmod(0o755)
    spec = render_spec(root, wrapper, drop, run_user)
    matrix, policy = write_inputs(root)
    return drop, wrapper, spec, matrix, policy


def run_argv(matrix: Path, policy: Path, spec: Path, out: Path) -> list[str]:
    """`sandbox-attest run` of the control leg and the forger, from this checkout."""
    return [
        sys.executable, "-m", "sandbox_attest.cli", "run", "--matrix", str(matrix),
        "--policy", str(policy), "--backend-spec", str(spec), "--out", str(out),
    ]  # fmt: skip


def nonroot_run(root: Path) -> ForgeryRun:
    """(a): the harness runs as an ordinary user, with `--key` naming that user's key file."""
    user = ensure_user()
    drop, _, spec, matrix, policy = prepare(root, "")
    private, public = keypair(root)
    config = root / "config"
    config.mkdir()
    out = root / "report"
    for path in (root, drop, config, private, public, *root.glob("*.toml"), root / "wrapper.py"):
        os.lchown(path, user.pw_uid, user.pw_gid)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": user.pw_dir,
        "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(config),
        # The checkout under test, whatever the venv's editable install points at.
        "PYTHONPATH": str(REPO),
    }
    argv = [*run_argv(matrix, policy, spec, out), "--key", str(private)]
    done = subprocess.run(
        ["runuser", "-u", user.pw_name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
         *argv],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=root,
    )  # fmt: skip
    return ForgeryRun(
        root, drop, out, private, public, policy, config, done.returncode, done.stdout, done.stderr
    )


def root_wrapper_run(root: Path, via: str) -> ForgeryRun:
    """(b): a root harness, a spec with `[run] user = "root"`, the key by --key or variable."""
    drop, _, spec, matrix, policy = prepare(root, ROOT_USER)
    private, public = keypair(root)
    config = root / "config"
    config.mkdir(mode=0o700)
    out = root / "report"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["XDG_CONFIG_HOME"] = str(config)
    env["PYTHONPATH"] = str(REPO)
    argv = run_argv(matrix, policy, spec, out)
    if via == "key-file":
        argv += ["--key", str(private)]
    else:
        env[ENV_VAR] = private.read_text()
    # A parent that stays above the harness with the argv it was given, as sudo does (this
    # machine may have no sudo; a shell that waits for its child is the same to the wrapper).
    parent = ["sh", "-c", '"$@"; exit $?', "sh"]
    done = subprocess.run(
        [*parent, *argv], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
        env=env, cwd=REPO,
    )  # fmt: skip
    return ForgeryRun(
        root, drop, out, private, public, policy, config, done.returncode, done.stdout, done.stderr
    )


@pytest.fixture(scope="module", params=["nonroot-key-file", "root-wrapper-key-file",
                                        "root-wrapper-key-env"])  # fmt: skip
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ForgeryRun:
    """One forger run per set-up, shared by the checks below."""
    case = str(request.param)
    root = tmp_path_factory.mktemp(case)
    if case.startswith("nonroot"):
        return nonroot_run(root)
    return root_wrapper_run(root, case.removeprefix("root-wrapper-"))


def verify(
    run: ForgeryRun, report: Path, trusted: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`sandbox-attest verify --partial` as root with the run's policy and an empty registry.

    The registry is this test's own, empty: the key given is then judged as a release key,
    so what refuses is the trust-domain check, not the per-machine key's listing.
    """
    config = run.root / "empty-registry"
    env = {**os.environ, "XDG_CONFIG_HOME": str(config), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "sandbox_attest.cli", "verify", str(report), "--trusted-key",
         str(trusted), "--partial", "--policy", str(run.policy), *extra],
        capture_output=True, text=True, timeout=120, check=False, env=env, cwd=REPO,
    )  # fmt: skip


def signer_public_key(report: Path, where: Path) -> Path:
    """The public key signing.json names, as a PEM file (the per-machine key's, here)."""
    raw = bytes.fromhex(json.loads((report / "signing.json").read_text())["public_key"]["keyval"]
                        ["public"])  # fmt: skip
    path = where / "signer.pub.pem"
    pem = Ed25519PublicKey.from_public_bytes(raw).public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
    )
    path.write_bytes(pem)
    return path


def forge(run: ForgeryRun, loot: bytes) -> Path:
    """The attacker's forgery: the run's report, every verdict PASS, re-signed with the loot."""
    forged = run.root / "forged"
    shutil.copytree(run.out, forged)
    os.chown(forged, 0, 0)
    forged.chmod(0o700)
    for path in forged.rglob("*"):
        os.lchown(path, 0, 0)
    evidence = json.loads((forged / "evidence.json").read_text())
    for cell in evidence["cells"]:
        cell["verdict"] = "PASS"
        cell["reason"] = "refused, as the claim says"
    evidence["harness"]["commit"] = FORGED_COMMIT
    evidence["harness"]["dirty"] = False
    (forged / "evidence.json").write_text(json.dumps(evidence, indent=2, sort_keys=True))
    for name in ("attestation.intoto.jsonl", "signing.json"):
        (forged / name).unlink()
    key: Any = load_pem_private_key(loot, password=None)
    stolen = SigningKey.from_private_key(key, "file:stolen")
    sign_report(forged, stolen, policy=load_policy(run.policy), env={})
    return forged


class TestTheWrapperSharesTheTrustDomain:
    """The premise: the wrapper really ran beside the harness and took the key."""

    def test_the_wrapper_stole_the_release_key(self, run: ForgeryRun) -> None:
        """The loot is the very key file the run was given (by path or by variable)."""
        assert run.loot() == run.private.read_bytes()

    def test_the_wrapper_ran_as_root_or_the_harness_uid(self, run: ForgeryRun) -> None:
        """Every attempt was made as uid 0 (root wrapper) or as the non-root harness's uid."""
        harness_uid = run.private.stat().st_uid
        assert {a["euid"] for a in run.attempts()} == {harness_uid}


class TestTheRunSaysNotSeparated:
    """The signed statement measures it, and the release key is not used."""

    def test_the_forger_backend_is_measured_shared(self, run: ForgeryRun) -> None:
        """The forger's processes and its launch are root's or the harness's uid: shared."""
        domains = run.evidence()["trust_domains"]
        assert domains["measured"] is True
        assert domains["separated"] is False, domains
        forger = domains["backends"][BACKEND]
        assert forger["status"] == "shared", forger
        harness_uid = run.private.stat().st_uid
        assert forger["launched_as"]["uid"] == harness_uid
        assert harness_uid in forger["uids"], forger
        assert forger["processes_read"] >= 1

    def test_the_release_key_was_refused_in_one_line(self, run: ForgeryRun) -> None:
        """One line says the release key was not used and why; --key makes the run exit 2."""
        lines = [ln for ln in run.stdout.splitlines() if NOT_USED in ln]
        assert len(lines) == 1, run.log()
        assert "trust domains were not separated" in lines[0]
        if "--key" in lines[0]:
            assert run.returncode == 2, run.log()
            assert "exits 2" in lines[0]
        else:
            assert f"${ENV_VAR}" in lines[0]
            assert run.returncode == 1, run.log()  # the forger's FAIL cells decide
        signing = json.loads((run.out / "signing.json").read_text())
        assert signing["trust"] == "untrusted-local"

    def test_a_harness_that_cannot_separate_warns_before_any_cell(self, run: ForgeryRun) -> None:
        """A non-root harness given a release key says so at start; a root one does not."""
        warned = "will not sign this run" in run.stderr
        assert warned == (run.private.stat().st_uid != 0), run.log()

    def test_the_report_does_not_verify_with_the_release_key(self, run: ForgeryRun) -> None:
        """The run did not sign with the release key: its public key finds no signature."""
        done = verify(run, run.out, run.public)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "signature check failed" in done.stderr

    def test_verify_refuses_the_shared_run_unless_allowed(self, run: ForgeryRun) -> None:
        """With the key that did sign, verify refuses the shared run; the flag lifts only that."""
        signer = signer_public_key(run.out, run.root)
        done = verify(run, run.out, signer)
        assert done.returncode == 1, done.stdout + done.stderr
        assert NOT_SEPARATED in done.stderr
        assert f"trust domain of {BACKEND}: shared: " in done.stdout
        allowed = verify(run, run.out, signer, "--allow-shared-trust-domain")
        assert NOT_SEPARATED not in allowed.stderr, allowed.stderr
        assert "accepted with --allow-shared-trust-domain" in allowed.stdout


class TestTheForgeryIsRefused:
    """The attacker's all-PASS copy, signed with the stolen key, fails the release check."""

    def test_forged_all_pass_report_is_refused(self, run: ForgeryRun) -> None:
        """`verify --trusted-key RELEASE.pub --expect-commit` refuses: the run was not separated.

        Before issue 23 this exact forgery exited 0 ("OK: ... verifies with key ...").
        """
        forged = forge(run, run.loot())
        done = verify(run, forged, run.public, "--expect-commit", FORGED_COMMIT)
        assert done.returncode == 1, done.stdout + done.stderr
        assert NOT_SEPARATED in done.stderr
        reasons = [ln for ln in done.stderr.splitlines() if ln.startswith("  - ")]
        assert len(reasons) == 1, done.stderr  # signature, digests, gate and commit all hold
