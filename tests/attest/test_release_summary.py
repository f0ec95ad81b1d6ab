"""merge signs the release decision as a SLSA verification summary over the sandboxes (issue 30).

The summary is checked by the in-toto attestation bindings' VSA v1 message (a field the
specification does not name is refused), and `verify` of the merged directory re-derives it:
a summary re-signed to claim more than the legs show is refused.

in-toto-attestation 0.9.3's VSA message declares `verified_levels` as one string, while the
SLSA v1 specification (and its own spec/predicates/vsa.md) makes `verifiedLevels` an array of
strings, and it predates VSA 1.1's `verifier.version` (the predicateType did not change);
the bindings therefore parse every other field, and those two are checked against the
specification here.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import TYPE_CHECKING, Any

import pytest
from google.protobuf import json_format
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2

from sandbox_attest.attest import dsse
from sandbox_attest.attest.merge import load_expected_legs, merge_legs
from sandbox_attest.attest.statement import VSA_PREDICATE, statement_bytes
from sandbox_attest.attest.subject_query import answer
from sandbox_attest.attest.verify import verify_report
from tests.attest.builder import build_report, make_cells, sign

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.attest.keys import SigningKey, TrustedKey
    from sandbox_attest.report.policy import Policy

EXPECT = '[[leg]]\nplatform = "linux"\nbackend = "bubblewrap"\n'


def merged(tmp_path: Path, policy_file: Path, key: SigningKey, trusted: TrustedKey,
           policy: Policy) -> Path:  # fmt: skip
    """A written merge of one bubblewrap leg (with its control), signed with `key`."""
    (tmp_path / "legs.toml").write_text(EXPECT)
    cells = make_cells(required=("bubblewrap",))
    leg = build_report(tmp_path / "leg-bwrap", policy_file, cells)
    sign(leg, key)
    result = merge_legs(
        [leg],
        expected=load_expected_legs(tmp_path / "legs.toml"),
        trusted=trusted,
        policy=policy,
        key=key,
        out_dir=tmp_path / "out",
        env={},
    )
    assert result.reasons == []
    return tmp_path / "out"


def statements(out: Path) -> list[dict[str, Any]]:
    """The merged directory's statements, in line order."""
    lines = (out / "attestation.intoto.jsonl").read_text().splitlines()
    return [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in lines]


class TestReleaseSummary:
    def test_summary_names_the_sandboxes_policy_legs_and_claims(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey, trusted: TrustedKey,
        policy: Policy,
    ) -> None:  # fmt: skip
        """The VSA's subject is bwrap's executable; policy, inputs, result and claims are set."""
        out = merged(tmp_path, policy_file, signing_key, trusted, policy)
        _, summary = statements(out)
        assert summary["predicateType"] == VSA_PREDICATE
        exe = hashlib.sha256(b"exe bubblewrap").hexdigest()
        assert summary["subject"] == [{"name": "/usr/bin/bubblewrap", "digest": {"sha256": exe}}]
        predicate = summary["predicate"]
        assert predicate["verificationResult"] == "PASSED"
        assert predicate["policy"]["digest"]["sha256"] == policy.sha256
        leg_att = out / "legs" / "01-leg-bwrap" / "attestation.intoto.jsonl"
        assert predicate["inputAttestations"] == [
            {
                "uri": "legs/01-leg-bwrap/attestation.intoto.jsonl",
                "digest": {"sha256": hashlib.sha256(leg_att.read_bytes()).hexdigest()},
            }
        ]
        levels = predicate["verifiedLevels"]
        assert "sandbox-attest/linux/bubblewrap/policy=PASSED" in levels
        assert "sandbox-attest/linux/bubblewrap/network=proxy" in levels
        assert not any(level.startswith("SLSA_") for level in levels)
        assert predicate["verifier"]["version"] == {"sandbox-attest": "0.1.0"}
        assert predicate["timeVerified"]

    def test_in_toto_bindings_accept_the_summary(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey, trusted: TrustedKey,
        policy: Policy,
    ) -> None:  # fmt: skip
        """The VSA v1 message parses the predicate strictly; a misnamed field is refused."""
        out = merged(tmp_path, policy_file, signing_key, trusted, policy)
        predicate = statements(out)[1]["predicate"]
        levels = predicate.pop("verifiedLevels")  # an array in the spec, a string in 0.9.3
        assert levels
        assert all(isinstance(level, str) for level in levels)
        # verifier.version came with VSA 1.1 (same predicateType); the bindings model 1.0.
        assert predicate["verifier"].pop("version") == {"sandbox-attest": "0.1.0"}
        parsed = json_format.ParseDict(predicate, vsa_pb2.VerificationSummary())
        assert parsed.verification_result == "PASSED"
        assert parsed.policy.digest["sha256"] == policy.sha256
        assert parsed.time_verified.seconds > 0
        predicate["verificationResults"] = predicate.pop("verificationResult")
        with pytest.raises(json_format.ParseError, match="verificationResults"):
            json_format.ParseDict(predicate, vsa_pb2.VerificationSummary())

    def test_verify_reads_the_summary_and_refuses_an_inflated_one(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey, trusted: TrustedKey,
        policy: Policy,
    ) -> None:  # fmt: skip
        """The merged directory verifies; a summary re-signed with an extra claim does not."""
        out = merged(tmp_path, policy_file, signing_key, trusted, policy)
        assert verify_report(out, trusted, policy).reasons == []
        stmts = statements(out)
        stmts[1]["predicate"]["verifiedLevels"].append("sandbox-attest/linux/bubblewrap/x=y")
        lines = [
            dsse.sign(statement_bytes(s), signing_key.private_key, signing_key.keyid).to_json()
            for s in stmts
        ]
        (out / "attestation.intoto.jsonl").write_text("".join(line + "\n" for line in lines))
        reasons = verify_report(out, trusted, policy).reasons
        assert any("verifiedLevels differs" in r for r in reasons), reasons

    def test_verify_refuses_a_summary_naming_another_subject_or_version(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey, trusted: TrustedKey,
        policy: Policy,
    ) -> None:  # fmt: skip
        """A summary re-signed for another binary, or by another verifier version, is refused."""
        out = merged(tmp_path, policy_file, signing_key, trusted, policy)
        stmts = statements(out)
        stmts[1]["subject"][0]["digest"]["sha256"] = hashlib.sha256(b"other").hexdigest()
        stmts[1]["predicate"]["verifier"]["version"] = {"sandbox-attest": "9.9.9"}
        lines = [
            dsse.sign(statement_bytes(s), signing_key.private_key, signing_key.keyid).to_json()
            for s in stmts
        ]
        (out / "attestation.intoto.jsonl").write_text("".join(line + "\n" for line in lines))
        reasons = verify_report(out, trusted, policy).reasons
        assert any("subjects are not the sandboxes the verified legs ran" in r for r in reasons)
        assert any("verifier differs" in r for r in reasons), reasons

    def test_subject_query_reads_a_merged_release(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey, trusted: TrustedKey,
        policy: Policy,
    ) -> None:  # fmt: skip
        """Verify --subject on a release finds the bwrap build in its leg, PASSED."""
        out = merged(tmp_path, policy_file, signing_key, trusted, policy)
        found = answer(
            verify_report(out, trusted, policy),
            hashlib.sha256(b"exe bubblewrap").hexdigest(),
            None,
        )
        assert found.reasons == []
        (match,) = found.matches
        assert (match.backend, match.leg, match.result) == ("bubblewrap", "01-leg-bwrap", "PASSED")
