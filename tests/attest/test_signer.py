"""The signer process: it alone holds the key, and it signs the bytes judged, from memory.

Every test starts the real signer (`python -m sandbox_attest.attest.signer`) with a real key and
checks what the kernel and the files show; the attacks are the ones of issue 12.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import sandbox_attest
from sandbox_attest.attest import ATTESTATION_NAME
from sandbox_attest.attest.keys import ENV_VAR, SigningKey, TrustedKey, keyid_of, private_key_pem
from sandbox_attest.attest.signer import SIGN_TIMEOUT, Signer
from sandbox_attest.attest.subjects import (
    ALL_SUBJECTS,
    EVIDENCE,
    FILE_SUBJECTS,
    HTML,
    JUNIT,
    SARIF,
    SUMMARY,
)
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.errors import ConfigError, ReportError
from sandbox_attest.report.files import make_report_dir
from sandbox_attest.report.policy import gate_for
from sandbox_attest.report.sarif import render_sarif
from sandbox_attest.report.signature import SignerFacts
from sandbox_attest.report.views import render_html, render_summary
from tests.attest.builder import build_report, make_cells

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sandbox_attest.report.policy import Policy

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl and /proc are Linux")
ROOT = os.geteuid() == 0
NOBODY = 65534


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """A fresh Ed25519 key in a 0600 file of the harness's."""
    path = tmp_path / "keys" / "signing.pem"
    path.parent.mkdir(mode=0o700)
    path.write_bytes(private_key_pem(Ed25519PrivateKey.generate()))
    path.chmod(0o600)
    return path


@pytest.fixture
def signer(key_file: Path) -> Iterator[Signer]:
    """A running signer holding `key_file` (no payload user to keep it from)."""
    with Signer.start(key_file, {}, payload=None) as running:
        yield running


def judged(
    tmp_path: Path, policy_file: Path, verdicts: dict[str, str] | None = None
) -> dict[str, bytes]:
    """evidence.json and junit.xml of a run, as bytes the session holds (built elsewhere)."""
    source = build_report(tmp_path / "built", policy_file, make_cells(verdicts=verdicts))
    return {EVIDENCE: (source / EVIDENCE).read_bytes(), JUNIT: (source / JUNIT).read_bytes()}


def with_views(files: dict[str, bytes], facts: SignerFacts, policy: Policy) -> dict[str, bytes]:
    """Add report.html, summary.md and results.sarif rendered in memory, as the session does."""
    evidence = json.loads(files[EVIDENCE])
    return {
        **files,
        HTML: render_html(evidence, facts, policy).encode(),
        SUMMARY: render_summary(evidence, facts, policy).encode(),
        SARIF: render_sarif(evidence),
    }


def report_dir(tmp_path: Path) -> Path:
    """A report directory as a run makes it, with allure-pytest's results in it."""
    out = make_report_dir(tmp_path / "report")
    (out / "allure-results").mkdir()
    (out / "allure-results" / "1-result.json").write_text('{"status": "passed"}')
    return out


def trusted_of(signer: Signer) -> TrustedKey:
    """The signer's public key as `--trusted-key` would load it."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key  # noqa: PLC0415

    public: Any = load_pem_public_key(signer.public_key_pem)
    return TrustedKey(public, keyid_of(public), "test")


def sign(signer: Signer, out: Path, files: dict[str, bytes], policy: Policy, gate: str) -> Path:
    """Hand the judged bytes to the signer, as the session does."""
    return signer.sign_report(
        out,
        files,
        policy_bytes=open_bytes(policy.path),
        policy_path=policy.path,
        gate=gate,
    ).attestation


def open_bytes(path: str) -> bytes:
    """A file's bytes."""
    return Path(path).read_bytes()


def statements(out: Path) -> list[dict[str, Any]]:
    """The statements in a report's attestation (signatures are checked by verify)."""
    lines = (out / ATTESTATION_NAME).read_text().splitlines()
    return [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in lines]


class TestSignsWhatWasJudged:
    def test_planted_links_and_fifos_are_not_what_gets_signed(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signer: Signer
    ) -> None:
        """The issue 12 (b) attack: planted `<name>.tmp` FIFO links and final-name links.

        The old path wrote evidence.json.tmp by name (through the planted link into the FIFO),
        renamed the link over evidence.json, and signed what a re-read of it returned: the
        helper's all-PASS copy. This test fails there: evidence.json ends up a symlink to the
        forged file and the signed gate is PASSED. Here the signer writes the judged bytes
        itself, every name is a regular file holding them, and the signed gate is FAILED.
        """
        out = report_dir(tmp_path)
        fifo = tmp_path / "helper.fifo"
        os.mkfifo(fifo)
        forged = tmp_path / "forged"
        forged.mkdir()
        all_pass = judged(tmp_path / "forgery", policy_file)
        for name in (*FILE_SUBJECTS, ATTESTATION_NAME, "signing.json"):
            (out / f"{name}.tmp").symlink_to(fifo)
            (forged / name).write_bytes(all_pass.get(name, b"forged"))
            (out / name).symlink_to(forged / name)
        files = with_views(
            judged(tmp_path, policy_file, {"bubblewrap-fs_write_outside": "FAIL"}),
            signer.facts,
            policy,
        )
        assert gate_for(json.loads(files[EVIDENCE]), policy).result == "FAILED"

        sign(signer, out, files, policy, "FAILED")

        for name in FILE_SUBJECTS:
            assert stat.S_ISREG((out / name).lstat().st_mode), name
            assert (out / name).read_bytes() == files[name], name
            assert (forged / name).read_bytes() == all_pass.get(name, b"forged"), name
        assert stat.S_ISFIFO(fifo.lstat().st_mode)
        *results, evidence = statements(out)
        assert {r["predicate"]["result"] for r in results} == {"FAILED"}
        assert [s["name"] for s in evidence["subject"]] == list(ALL_SUBJECTS)
        for result in results:
            reports = [
                c["name"]
                for c in result["predicate"]["configuration"]
                if c.get("annotations", {}).get("role") == "report file"
            ]
            assert reports == list(ALL_SUBJECTS)

    def test_verify_accepts_only_the_bytes_the_signer_wrote(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signer: Signer
    ) -> None:
        """A passing report verifies; swapping evidence.json for other bytes makes it fail."""
        out = report_dir(tmp_path)
        (out / "evidence.json.tmp").symlink_to(tmp_path / "nowhere")
        files = with_views(judged(tmp_path, policy_file), signer.facts, policy)
        sign(signer, out, files, policy, "PASSED")
        ok = verify_report(out, trusted_of(signer), policy, require_all_legs=False)
        assert ok.ok, ok.reasons
        assert ok.files[EVIDENCE] == files[EVIDENCE]

        other = judged(tmp_path / "other", policy_file, {"bubblewrap-dns_resolution": "FAIL"})
        (out / EVIDENCE).write_bytes(other[EVIDENCE])
        swapped = verify_report(out, trusted_of(signer), policy, require_all_legs=False)
        assert not swapped.ok
        assert any("evidence.json does not match its signed digest" in r for r in swapped.reasons)

    def test_allure_results_are_a_subject(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signer: Signer
    ) -> None:
        """A result file added to allure-results/ after signing fails verification."""
        out = report_dir(tmp_path)
        sign(
            signer,
            out,
            with_views(judged(tmp_path, policy_file), signer.facts, policy),
            policy,
            "PASSED",
        )
        (out / "allure-results" / "2-result.json").write_text('{"status": "passed"}')
        late = verify_report(out, trusted_of(signer), policy, require_all_legs=False)
        assert any("allure-results/" in r for r in late.reasons), late.reasons

    def test_a_gate_other_than_the_sessions_is_refused(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signer: Signer
    ) -> None:
        """The session said PASSED but the bytes give FAILED: nothing is signed, and it says so."""
        out = report_dir(tmp_path)
        files = with_views(
            judged(tmp_path, policy_file, {"bubblewrap-fs_write_outside": "FAIL"}),
            signer.facts,
            policy,
        )
        with pytest.raises(ReportError) as err:
            sign(signer, out, files, policy, "PASSED")
        message = str(err.value)
        assert "refusing to sign" in message
        assert "the session judged the gate PASSED" in message
        assert "gives FAILED" in message
        assert not (out / ATTESTATION_NAME).exists()
        assert not (out / EVIDENCE).exists()

    def test_policy_is_parsed_from_the_bytes_handed_over(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signer: Signer
    ) -> None:
        """The signer judges with the policy bytes it was given, not the file as it is now."""
        out = report_dir(tmp_path)
        files = with_views(judged(tmp_path, policy_file), signer.facts, policy)
        original = policy_file.read_bytes()
        policy_file.write_text("[[require]]\nnot valid for this run\n")
        signer.sign_report(
            out, files, policy_bytes=original, policy_path=policy.path, gate="PASSED"
        )
        *results, _ = statements(out)
        assert results
        for result in results:
            config = result["predicate"]["configuration"]
            signed = next(c for c in config if c["name"] == "policy")
            assert signed["digest"]["sha256"] == policy.sha256

    def test_the_ci_run_reaches_the_statements_url(
        self, tmp_path: Path, policy_file: Path, policy: Policy, key_file: Path
    ) -> None:
        """GitHub's run variables reach the signer process, so each statement names the run."""
        env = {
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "o/r",
            "GITHUB_RUN_ID": "9",
        }
        with Signer.start(key_file, env, payload=None) as signer:
            out = report_dir(tmp_path)
            files = with_views(judged(tmp_path, policy_file), signer.facts, policy)
            signer.sign_report(
                out, files, policy_bytes=policy_file.read_bytes(), policy_path=policy.path,
                gate="PASSED",
            )  # fmt: skip
        *results, _ = statements(out)
        assert results
        assert {r["predicate"]["url"] for r in results} == {"https://github.com/o/r/actions/runs/9"}


class TestKey:
    def test_key_variable_is_removed_and_never_reaches_the_signer(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """After start, os.environ lacks the variable; the signer's environ and argv hold no key."""
        pem = private_key_pem(Ed25519PrivateKey.generate())
        monkeypatch.setenv(ENV_VAR, pem.decode())
        with Signer.start(None, os.environ, payload=None) as running:
            assert ENV_VAR not in os.environ
            assert running.source == f"env:{ENV_VAR}"
            body = b"".join(pem.splitlines()[1:-1])
            for part in ("environ", "cmdline"):
                shown = open_bytes(f"/proc/{running.pid}/{part}")
                assert ENV_VAR.encode() not in shown, part
                assert b"SANDBOX_ATTEST_" not in shown, part
                assert body[:40] not in shown, part
                assert b"PRIVATE KEY" not in shown, part

    def test_the_key_is_the_one_given(self, key_file: Path) -> None:
        """The signer answers with the keyid of the key file it loaded."""
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        loaded: Any = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        with Signer.start(key_file, {}, payload=None) as running:
            assert running.keyid == SigningKey.from_private_key(loaded, "t").keyid
            assert running.trust == "provided"
            assert running.hardening == {"dumpable": "0", "pdeathsig": "SIGKILL"}

    def test_world_readable_key_file_is_refused(self, key_file: Path) -> None:
        """A key file everyone can read is refused, naming chmod 600."""
        key_file.chmod(0o644)
        with pytest.raises(ConfigError, match=r"accessible to everyone.*chmod 600"):
            Signer.start(key_file, {}, payload=None)

    @pytest.mark.skipif(not ROOT, reason="only root separates the payload uid")
    def test_key_file_of_the_payload_uid_is_refused(self, key_file: Path) -> None:
        """A key file owned by the payload user is refused, whatever its mode."""
        from sandbox_attest.host.trust import payload_user  # noqa: PLC0415

        user = payload_user()
        assert user is not None
        os.chown(key_file, user.uid, user.gid)
        with pytest.raises(ConfigError, match=f"owned by the payload uid {user.uid}"):
            Signer.start(key_file, {}, payload=user)

    def test_bad_key_is_a_config_error_naming_the_fix(self, tmp_path: Path) -> None:
        """A PEM in the variable that is not a key comes back as the loader's message."""
        env = {ENV_VAR: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}
        with pytest.raises(ConfigError, match=r"not a PEM private key.*openssl genpkey"):
            Signer.start(None, env, payload=None)
        assert ENV_VAR not in env


class TestProcess:
    def test_signer_is_not_dumpable(self, tmp_path: Path) -> None:
        """The kernel shows the signer's /proc files as root's: it is not dumpable.

        A dumpable process's /proc/<pid>/environ belongs to its own uid; PR_SET_DUMPABLE 0
        hands it to root. As root both would be root's, so the harness is then run as nobody:
        its own environ (the control) is nobody's, its signer's is root's.
        """
        if not ROOT:
            with Signer.start(None, {}, payload=None) as running:
                assert Path(f"/proc/{running.pid}/environ").stat().st_uid == 0
                assert Path("/proc/self/environ").stat().st_uid == os.geteuid()
            return
        child = start_as_nobody()
        try:
            line = child.stdout.readline() if child.stdout else ""
            assert line, child.stderr.read() if child.stderr else ""
            started = json.loads(line)
            assert started["left"] is False  # the stand-in's os.environ lost the variable
            pid = int(started["pid"])
            status = open_bytes(f"/proc/{pid}/status").decode()
            assert f"Uid:\t{NOBODY}\t{NOBODY}" in status  # it really runs as nobody ...
            assert Path(f"/proc/{pid}/environ").stat().st_uid == 0  # ... yet its files are root's
            assert Path(f"/proc/{child.pid}/environ").stat().st_uid == NOBODY  # control: dumpable
        finally:
            child.kill()
            child.communicate(timeout=30)

    def test_dead_signer_is_a_clear_error_not_a_hang(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signer: Signer
    ) -> None:
        """A signer killed mid-run makes sign_report fail at once, naming the exit status."""
        os.kill(signer.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ReportError, match=r"signer process \(pid \d+\) exited with status -9"):
            sign(signer, report_dir(tmp_path), judged(tmp_path, policy_file), policy, "PASSED")
        # Not a speed budget: a harness that missed the death would wait out SIGN_TIMEOUT.
        assert time.monotonic() - started < SIGN_TIMEOUT, "sign_report waited for a dead signer"

    def test_signer_dies_with_the_harness(self, tmp_path: Path) -> None:
        """PR_SET_PDEATHSIG: when the process that started the signer dies, the signer dies."""
        child = start_as_nobody(as_root=True)
        line = child.stdout.readline() if child.stdout else ""
        assert line, child.stderr.read() if child.stderr else ""
        pid = int(json.loads(line)["pid"])
        child.kill()
        child.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
        assert not alive(pid)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = open_bytes(f"/proc/{pid}/stat").decode().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


STANDIN = """
import json, os, sys
from sandbox_attest.attest.signer import Signer
s = Signer.start(None, os.environ, payload=None)
print(json.dumps({"pid": s.pid, "left": "SANDBOX_ATTEST_SIGNING_KEY" in os.environ}), flush=True)
sys.stdin.read()
"""


def start_as_nobody(*, as_root: bool = False) -> subprocess.Popen[str]:
    """A harness stand-in (as nobody, unless `as_root`) that starts a signer and prints its pid.

    The key travels in the variable, as in CI; the stand-in waits on stdin until killed.
    """
    env = {
        "PATH": os.defpath,
        "PYTHONPATH": str(repo_root()),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/nonexistent",
        ENV_VAR: private_key_pem(Ed25519PrivateKey.generate()).decode(),
    }
    who: dict[str, Any] = {} if as_root or not ROOT else {"user": NOBODY, "group": NOBODY}
    return subprocess.Popen(
        [sys.executable, "-c", STANDIN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
        extra_groups=[] if who else None,
        **who,
    )


def repo_root() -> Path:
    """The directory holding the harness package."""
    return Path(sandbox_attest.__file__).resolve().parents[1]


# What signing through the signer process costs over signing in-process is measured side by
# side in bench/bench_signer.py: a time budget asserted here measured the machine's load.
