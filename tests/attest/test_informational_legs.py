"""Informational legs (matrix/legs.toml `informational = true`): merged and shown, never deciding.

macOS and Windows legs cannot separate trust domains, so they sign with their run's per-machine
key, which the release key's verification refuses. Before, that made every release fail; now
such a leg is a note, its cells stay out of the merged gate, and the Linux legs decide.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest.keys import SigningKey, keyid_of
from sandbox_attest.attest.merge import load_expected_legs, merge_legs
from sandbox_attest.attest.subject_query import answer
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.errors import ConfigError
from tests.attest.builder import build_report, make_cells, sign

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.attest.keys import TrustedKey
    from sandbox_attest.attest.merge import ExpectedLegs, MergeResult
    from sandbox_attest.report.policy import Policy

EXPECT = """
[[leg]]
platform = "linux"
backend = "bubblewrap"

[[leg]]
platform = "darwin"
backend = "seatbelt"
informational = true
"""


@pytest.fixture
def expected(tmp_path: Path) -> ExpectedLegs:
    """linux/bubblewrap decides; darwin/seatbelt is informational."""
    path = tmp_path / "legs.toml"
    path.write_text(EXPECT)
    return load_expected_legs(path)


def per_run_key() -> SigningKey:
    """Another Ed25519 key, as an unseparated leg's per-machine key is."""
    private = Ed25519PrivateKey.generate()
    return SigningKey(private, keyid_of(private.public_key()), "file:per-run", "provided")


def leg(tmp_path: Path, policy_file: Path, name: str, backends: tuple[str, ...], platform: str,
        key: SigningKey, verdicts: dict[str, str] | None = None) -> Path:  # fmt: skip
    """A signed leg report of `backends` on `platform`."""
    cells = make_cells(backends=backends, platform=platform, required=backends[-1:],
                       verdicts=verdicts)  # fmt: skip
    report = build_report(tmp_path / name, policy_file, cells, platform=platform)
    sign(report, key)
    return report


def merge(dirs: list[Path], expected: ExpectedLegs, trusted: TrustedKey, policy: Policy,
          key: SigningKey, out: Path) -> MergeResult:  # fmt: skip
    """Merge with no Sigstore."""
    return merge_legs(
        dirs, expected=expected, trusted=trusted, policy=policy, key=key, out_dir=out, env={}
    )


def merged_config(out: Path) -> list[dict[str, Any]]:
    """The merged test-result statement's configuration."""
    line = (out / "attestation.intoto.jsonl").read_text().splitlines()[0]
    stmt: dict[str, Any] = json.loads(base64.b64decode(json.loads(line)["payload"]))
    return list(stmt["predicate"]["configuration"])


class TestLegsFile:
    def test_informational_legs_are_read_apart(self, expected: ExpectedLegs) -> None:
        """`informational = true` puts a leg in `informational`, not in the deciding legs."""
        assert expected.legs == (("linux", "bubblewrap"),)
        assert expected.informational == (("darwin", "seatbelt"),)

    def test_a_file_of_informational_legs_only_is_refused(self, tmp_path: Path) -> None:
        """A release needs a deciding leg: every leg informational is a config error."""
        path = tmp_path / "legs.toml"
        path.write_text(
            '[[leg]]\nplatform = "darwin"\nbackend = "seatbelt"\ninformational = true\n'
        )
        with pytest.raises(ConfigError, match="every leg is informational"):
            load_expected_legs(path)

    def test_informational_must_be_a_boolean(self, tmp_path: Path) -> None:
        """`informational = "yes"` is refused, naming the key."""
        path = tmp_path / "legs.toml"
        path.write_text('[[leg]]\nplatform = "linux"\nbackend = "bwrap"\ninformational = "yes"\n')
        with pytest.raises(ConfigError, match="informational must be true or false"):
            load_expected_legs(path)


class TestMerge:
    def test_a_leg_signed_with_a_per_run_key_is_shown_not_refused(
        self, tmp_path: Path, policy_file: Path, expected: ExpectedLegs, trusted: TrustedKey,
        policy: Policy, signing_key: SigningKey,
    ) -> None:  # fmt: skip
        """The release passes on the Linux leg; the macOS leg is a note, recorded as unverified."""
        linux = leg(tmp_path, policy_file, "leg-linux", ("none", "bubblewrap"), "linux",
                    signing_key)  # fmt: skip
        mac = leg(tmp_path, policy_file, "leg-mac", ("seatbelt",), "darwin", per_run_key())
        out = tmp_path / "out"
        result = merge([linux, mac], expected, trusted, policy, signing_key, out)
        assert result.reasons == []
        assert result.result == "PASSED"
        assert any("informational leg 02-leg-mac (does NOT verify" in n for n in result.notes)
        (entry,) = [c for c in merged_config(out) if c["name"].startswith("informational-leg:")]
        assert entry["name"] == "informational-leg:darwin/seatbelt"
        assert entry["annotations"]["verified"] is False
        assert entry["annotations"]["copy"] == "legs/02-leg-mac"
        v = verify_report(out, trusted, policy)
        assert v.reasons == []
        assert any("informational leg 02-leg-mac" in n for n in v.notes)

    def test_a_failing_informational_leg_does_not_decide(
        self, tmp_path: Path, policy_file: Path, expected: ExpectedLegs, trusted: TrustedKey,
        policy: Policy, signing_key: SigningKey,
    ) -> None:  # fmt: skip
        """A verified macOS leg with a FAIL is shown with its own gate; the release still passes."""
        linux = leg(tmp_path, policy_file, "leg-linux", ("none", "bubblewrap"), "linux",
                    signing_key)  # fmt: skip
        mac = leg(tmp_path, policy_file, "leg-mac", ("seatbelt",), "darwin", signing_key,
                  {"seatbelt-net_denied_host": "FAIL"})  # fmt: skip
        result = merge([linux, mac], expected, trusted, policy, signing_key, tmp_path / "out")
        assert result.reasons == []
        assert result.result == "PASSED"
        (entry,) = [
            c for c in merged_config(tmp_path / "out") if c["name"].startswith("informational")
        ]
        assert entry["annotations"]["gate"] == "FAILED"

    def test_a_missing_informational_leg_is_a_note(
        self, tmp_path: Path, policy_file: Path, expected: ExpectedLegs, trusted: TrustedKey,
        policy: Policy, signing_key: SigningKey,
    ) -> None:  # fmt: skip
        """No macOS leg at all: merged, with a note that it is missing."""
        linux = leg(tmp_path, policy_file, "leg-linux", ("none", "bubblewrap"), "linux",
                    signing_key)  # fmt: skip
        result = merge([linux], expected, trusted, policy, signing_key, tmp_path / "out")
        assert result.reasons == []
        assert "informational leg darwin/seatbelt is missing" in " ".join(result.notes)

    def test_an_informational_leg_cannot_stand_in_for_a_deciding_one(
        self, tmp_path: Path, policy_file: Path, expected: ExpectedLegs, trusted: TrustedKey,
        policy: Policy, signing_key: SigningKey,
    ) -> None:  # fmt: skip
        """Only the macOS leg: refused, the deciding Linux leg is missing; nothing written."""
        mac = leg(tmp_path, policy_file, "leg-mac", ("seatbelt",), "darwin", signing_key)
        result = merge([mac], expected, trusted, policy, signing_key, tmp_path / "out")
        assert result.attestation is None
        assert any("only informational legs were given" in r for r in result.reasons)

    def test_subject_of_an_informational_build_is_not_the_releases(
        self, tmp_path: Path, policy_file: Path, expected: ExpectedLegs, trusted: TrustedKey,
        policy: Policy, signing_key: SigningKey,
    ) -> None:  # fmt: skip
        """Verify --subject on a release: bwrap's build PASSED; seatbelt's is only shown."""
        linux = leg(tmp_path, policy_file, "leg-linux", ("none", "bubblewrap"), "linux",
                    signing_key)  # fmt: skip
        mac = leg(tmp_path, policy_file, "leg-mac", ("seatbelt",), "darwin", signing_key)
        out = tmp_path / "out"
        assert merge([linux, mac], expected, trusted, policy, signing_key, out).reasons == []
        v = verify_report(out, trusted, policy)
        assert v.reasons == []
        bwrap = answer(v, hashlib.sha256(b"exe bubblewrap").hexdigest(), None)
        assert bwrap.reasons == []
        seatbelt = answer(v, hashlib.sha256(b"exe seatbelt").hexdigest(), None)
        (reason,) = seatbelt.reasons
        assert reason.startswith("only informational leg(s) 02-leg-mac tested this file")
