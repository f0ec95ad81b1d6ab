"""verify: the round trip, and every tamper or downgrade failing with its own message."""

from __future__ import annotations

import argparse
import base64
import json
from typing import TYPE_CHECKING

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest import dsse
from sandbox_attest.attest.keys import (
    SigningKey,
    TrustedKey,
    load_signing_key,
    public_key_pem,
    read_untrusted_keyids,
    untrusted_registry_path,
)
from sandbox_attest.attest.statement import STATEMENT_TYPE, statement_bytes
from sandbox_attest.attest.subjects import FILE_SUBJECTS
from sandbox_attest.attest.verification import Checks
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.cli.release import register
from tests.attest.builder import build_report, make_cells, sign, write_policy

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.report.policy import Policy

ATT = "attestation.intoto.jsonl"


def flip_byte(path: Path, offset: int) -> None:
    """Flip the low bit of one byte of a file."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def rewrite_envelope(path: Path, line: int, edit: str) -> None:
    """Flip one byte of an envelope's decoded payload or signature, keeping valid base64."""
    lines = path.read_text().splitlines()
    env = json.loads(lines[line])
    field_bytes = bytearray(
        base64.b64decode(env["payload"] if edit == "payload" else env["signatures"][0]["sig"])
    )
    field_bytes[5] ^= 0x01
    encoded = base64.b64encode(bytes(field_bytes)).decode()
    if edit == "payload":
        env["payload"] = encoded
    else:
        env["signatures"][0]["sig"] = encoded
    lines[line] = json.dumps(env)
    path.write_text("\n".join(lines) + "\n")


def reasons(
    report: Path,
    trusted: TrustedKey,
    policy: Policy,
    *,
    allow_untrusted_local: bool = False,
    checks: Checks | None = None,
) -> list[str]:
    """The verification reasons (empty when it verifies)."""
    return verify_report(
        report, trusted, policy, allow_untrusted_local=allow_untrusted_local, checks=checks
    ).reasons


def registry_checks(config_home: Path) -> Checks:
    """Checks that read the untrusted-keys registry under `config_home`."""
    env = {"XDG_CONFIG_HOME": str(config_home)}
    return Checks(untrusted_keyids=read_untrusted_keyids(untrusted_registry_path(env)))


def one_reason_matching(found: list[str], needle: str) -> None:
    """Assert the reasons are non-empty and one of them contains `needle`."""
    assert found, "expected verify to fail"
    assert any(needle in r for r in found), found


class TestRoundTrip:
    def test_signed_report_verifies(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """A report signed with the trusted key verifies, with gate PASSED and both legs."""
        v = verify_report(signed_report, trusted, policy)
        assert v.reasons == []
        assert v.ok
        assert v.gate is not None
        assert v.gate.result == "PASSED"
        assert v.legs == {("linux", "none"), ("linux", "bubblewrap")}
        assert v.signer["keyid"] == trusted.keyid

    def test_sidecar_repeats_the_signed_signer(self, signed_report: Path) -> None:
        """signing.json names the signer (keyid, trust, source) the evidence predicate signs."""
        second = (signed_report / ATT).read_text().splitlines()[-1]
        signed = json.loads(base64.b64decode(json.loads(second)["payload"]))["predicate"]["signer"]
        sidecar = json.loads((signed_report / "signing.json").read_text())
        assert {k: sidecar[k] for k in signed} == signed
        assert set(signed) == {"keyid", "trust", "source"}

    def test_statements_carry_the_documented_fields(self, signed_report: Path) -> None:
        """One test-result statement per backend (about its sandbox), then the evidence one."""
        stmts = [
            json.loads(base64.b64decode(json.loads(line)["payload"]))
            for line in (signed_report / ATT).read_text().splitlines()
        ]
        assert [s["predicateType"] for s in stmts] == [
            "https://in-toto.io/attestation/test-result/v0.1",
            "https://in-toto.io/attestation/test-result/v0.1",
            "https://sandbox-attest.dev/attestation/evidence/v1",
        ]
        report_files = [*FILE_SUBJECTS, "allure-results/"]
        assert [s["name"] for s in stmts[-1]["subject"]] == report_files
        for stmt in stmts[:-1]:
            config = stmt["predicate"]["configuration"]
            sandbox = next(c for c in config if c["name"] == "sandbox")["annotations"]
            backend = sandbox["backend"]
            assert sandbox["role"] == ("control leg" if backend == "none" else "sandbox under test")
            # The subject is the executable the backend ran (the builder's /usr/bin/<name>).
            assert [s["name"] for s in stmt["subject"]] == [f"/usr/bin/{backend}"]
            reports = [
                c["name"] for c in config if c.get("annotations", {}).get("role") == "report file"
            ]
            assert reports == report_files


class TestTamper:
    def test_evidence_byte_flipped(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """One flipped byte of evidence.json fails on its digest."""
        flip_byte(signed_report / "evidence.json", 200)
        one_reason_matching(
            reasons(signed_report, trusted, policy),
            "evidence.json does not match its signed digest",
        )

    def test_junit_byte_flipped(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """One flipped byte of junit.xml fails on its digest."""
        flip_byte(signed_report / "junit.xml", 60)
        one_reason_matching(
            reasons(signed_report, trusted, policy), "junit.xml does not match its signed digest"
        )

    def test_envelope_payload_byte_flipped(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """One flipped byte of a signed payload fails the signature check."""
        rewrite_envelope(signed_report / ATT, 0, "payload")
        one_reason_matching(
            reasons(signed_report, trusted, policy),
            "line 1: signature check failed: the signature by trusted key",
        )

    def test_signature_byte_flipped(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """One flipped byte of a signature fails the signature check."""
        rewrite_envelope(signed_report / ATT, 1, "signature")
        one_reason_matching(
            reasons(signed_report, trusted, policy), "line 2: signature check failed"
        )

    def test_envelope_file_byte_flipped(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """Flipping a raw byte of the envelope file fails verification (format or signature)."""
        flip_byte(signed_report / ATT, 2)
        assert reasons(signed_report, trusted, policy)

    def test_wrong_key(self, signed_report: Path, policy: Policy) -> None:
        """A different trusted key fails every envelope, naming the signer's keyid."""
        other = Ed25519PrivateKey.generate().public_key()
        from sandbox_attest.attest.keys import keyid_of  # noqa: PLC0415

        found = reasons(signed_report, TrustedKey(other, keyid_of(other), "x"), policy)
        one_reason_matching(found, "not by the trusted key")
        # Two sandbox statements (none, bubblewrap) and the evidence statement.
        assert sum("signature check failed" in r for r in found) == 3


class TestPolicy:
    def test_missing_required_cell(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A required cell absent from the evidence fails, naming the cell."""
        cells = [c for c in make_cells() if c["cell_id"] != "bubblewrap-dns_resolution"]
        report = build_report(tmp_path / "r", policy_file, cells)
        sign(report, signing_key)
        one_reason_matching(
            reasons(report, trusted, policy),
            "missing required cell bubblewrap-dns_resolution on linux",
        )

    def test_required_probe_not_pass(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A required probe that FAILs (an escape) fails verification with its reason."""
        cells = make_cells(verdicts={"bubblewrap-fs_write_outside": "FAIL"})
        report = build_report(tmp_path / "r", policy_file, cells)
        sign(report, signing_key)
        one_reason_matching(reasons(report, trusted, policy), "bubblewrap-fs_write_outside is FAIL")

    def test_policy_downgrade(
        self, tmp_path: Path, signing_key: SigningKey, trusted: TrustedKey, policy: Policy
    ) -> None:
        """A report signed under a weaker policy fails against the release policy (digest)."""
        weak = write_policy(tmp_path / "weak.toml", probes=("net_denied_host",))
        cells = make_cells(verdicts={"bubblewrap-dns_resolution": "INCONCLUSIVE"})
        report = build_report(tmp_path / "r", weak, cells)
        sign(report, signing_key)
        found = reasons(report, trusted, policy)
        one_reason_matching(found, "policy mismatch")
        one_reason_matching(
            found, "required probe dns_resolution on linux/bubblewrap is INCONCLUSIVE"
        )

    def test_missing_leg(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A report without a leg the policy requires fails, naming the leg."""
        report = build_report(tmp_path / "r", policy_file, make_cells(backends=("none",)))
        sign(report, signing_key)
        one_reason_matching(reasons(report, trusted, policy), "missing leg linux/bubblewrap")


class TestUntrustedLocal:
    def test_local_key_refused_then_allowed_explicitly(
        self, tmp_path: Path, policy_file: Path, policy: Policy
    ) -> None:
        """A local-key report fails even with that key trusted, unless --allow-untrusted-local."""
        key = load_signing_key(None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
        report = build_report(tmp_path / "r", policy_file)
        sign(report, key)
        as_trusted = TrustedKey(key.public_key, key.keyid, "local")
        checks = registry_checks(tmp_path / "cfg")
        one_reason_matching(
            reasons(report, as_trusted, policy, checks=checks), "signed by an untrusted local key"
        )
        assert reasons(report, as_trusted, policy, allow_untrusted_local=True, checks=checks) == []

    def test_allow_flag_does_not_replace_the_trusted_key(
        self, tmp_path: Path, policy_file: Path, policy: Policy, trusted: TrustedKey
    ) -> None:
        """--allow-untrusted-local with another trusted key still fails the signature check."""
        key = load_signing_key(None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
        report = build_report(tmp_path / "r", policy_file)
        sign(report, key)
        one_reason_matching(
            reasons(report, trusted, policy, allow_untrusted_local=True), "not by the trusted key"
        )


class TestBadInput:
    def test_truncated_envelope(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """A truncated attestation file fails as truncated JSON."""
        path = signed_report / ATT
        path.write_bytes(path.read_bytes()[:100])
        one_reason_matching(reasons(signed_report, trusted, policy), "truncated")

    def test_truncated_evidence(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """A truncated evidence.json fails on its digest and as malformed JSON."""
        path = signed_report / "evidence.json"
        path.write_bytes(path.read_bytes()[:100])
        found = reasons(signed_report, trusted, policy)
        one_reason_matching(found, "evidence.json: not valid JSON")

    def test_unknown_predicate(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy, signing_key: SigningKey
    ) -> None:
        """A correctly signed statement of an unknown predicate type is rejected by name."""
        stmt = {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": "x", "digest": {"sha256": "00"}}],
            "predicateType": "https://example.invalid/other/v1",
            "predicate": {},
        }
        env = dsse.sign(statement_bytes(stmt), signing_key.private_key, signing_key.keyid)
        with (signed_report / ATT).open("a") as handle:
            handle.write(env.to_json() + "\n")
        one_reason_matching(reasons(signed_report, trusted, policy), "unknown predicateType")

    def test_wrong_payload_type(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy, signing_key: SigningKey
    ) -> None:
        """An envelope with a payloadType other than in-toto is rejected by name."""
        env = dsse.sign(b"{}", signing_key.private_key, signing_key.keyid, "application/json")
        (signed_report / ATT).write_text(env.to_json() + "\n")
        one_reason_matching(
            reasons(signed_report, trusted, policy), "payloadType is 'application/json'"
        )

    def test_zero_cells_never_verify(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A signed run with zero cells does not verify."""
        report = build_report(tmp_path / "r", policy_file, [])
        sign(report, signing_key)
        one_reason_matching(reasons(report, trusted, policy), "zero cells")

    def test_incomplete_run(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """An interrupted run (complete=false) does not verify even if every cell passed."""
        report = build_report(tmp_path / "r", policy_file, complete=False)
        sign(report, signing_key)
        one_reason_matching(reasons(report, trusted, policy), "incomplete")

    def test_unsigned_report(
        self, tmp_path: Path, policy_file: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """A report with no attestation fails, naming `sandbox-attest run` (it signs)."""
        report = build_report(tmp_path / "r", policy_file)
        found = reasons(report, trusted, policy)
        one_reason_matching(found, "attestation.intoto.jsonl is missing")
        one_reason_matching(found, "`sandbox-attest run` signs a report")

    def test_empty_attestation(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """An empty attestation file fails: never signed."""
        (signed_report / ATT).write_text("")
        one_reason_matching(reasons(signed_report, trusted, policy), "never signed")


class TestCli:
    @staticmethod
    def run(argv: list[str]) -> int:
        """Parse argv with the registered subcommands and run the chosen one."""
        parser = argparse.ArgumentParser(prog="sandbox-attest")
        register(parser.add_subparsers())
        args = parser.parse_args(argv)
        code: int = args.func(args)
        return code

    def test_verify_exit_codes(
        self,
        signed_report: Path,
        signing_key: SigningKey,
        policy_file: Path,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Verify exits 0 when good, 1 with every reason when tampered, 2 on bad input."""
        pub = tmp_path / "k.pub"
        pub.write_bytes(public_key_pem(signing_key.public_key))
        base = [
            "verify",
            str(signed_report),
            "--trusted-key",
            str(pub),
            "--policy",
            str(policy_file),
        ]
        assert self.run(base) == 0
        assert "OK:" in capsys.readouterr().out
        flip_byte(signed_report / "junit.xml", 60)
        assert self.run(base) == 1
        assert "junit.xml does not match" in capsys.readouterr().err
        bad = tmp_path / "bad.toml"
        bad.write_text("[policy]\n")
        assert self.run([*base[:-1], str(bad)]) == 2
        assert "requires nothing" in capsys.readouterr().err
