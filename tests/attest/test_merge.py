"""merge: legs verified one by one, duplicates and missing legs refused, one signed decision."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

import pytest

from harness.attest.merge import load_expected_legs, merge_legs
from harness.errors import ConfigError
from tests.attest.builder import COMMIT, build_report, make_cells, sign

if TYPE_CHECKING:
    from pathlib import Path

    from harness.attest.keys import SigningKey, TrustedKey
    from harness.attest.merge import ExpectedLegs, MergeResult
    from harness.attest.policy import Policy

EXPECT = """
[[leg]]
platform = "linux"
backend = "none"

[[leg]]
platform = "linux"
backend = "bubblewrap"

[[leg]]
platform = "macos"
backend = "seatbelt"
"""


@pytest.fixture
def expected(tmp_path: Path) -> ExpectedLegs:
    """Three expected legs: linux/none, linux/bubblewrap, macos/seatbelt."""
    path = tmp_path / "legs.toml"
    path.write_text(EXPECT)
    return load_expected_legs(path)


@pytest.fixture
def legs(tmp_path: Path, policy_file: Path, signing_key: SigningKey) -> dict[str, Path]:
    """Two signed leg reports covering the three expected legs, every cell PASS.

    The control leg linux/none is run by the bubblewrap leg: a report of `none` alone is
    FAILED when signed (the control leg alone attests nothing), so it is never a leg.
    """
    out = {}
    for name, backends, platform in (
        ("leg-bwrap", ("none", "bubblewrap"), "linux"),
        ("leg-mac", ("seatbelt",), "macos"),
    ):
        cells = make_cells(backends=backends, platform=platform, required=backends[-1:])
        report = build_report(tmp_path / name, policy_file, cells, platform=platform)
        sign(report, signing_key)
        out[name] = report
    return out


def do_merge(
    dirs: list[Path],
    expected: ExpectedLegs,
    trusted: TrustedKey,
    policy: Policy,
    key: SigningKey,
    out: Path,
) -> MergeResult:
    """Merge with the ambient environment ignored (no Sigstore)."""
    return merge_legs(
        dirs, expected=expected, trusted=trusted, policy=policy, key=key, out_dir=out, env={}
    )


class TestMerge:
    def test_happy_path_writes_one_signed_statement(
        self,
        legs: dict[str, Path],
        expected: ExpectedLegs,
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
        tmp_path: Path,
    ) -> None:
        """Good legs merge into one test-result statement naming every leg's files."""
        result = do_merge(
            list(legs.values()), expected, trusted, policy, signing_key, tmp_path / "out"
        )
        assert result.reasons == []
        assert result.result == "PASSED"
        assert result.attestation is not None
        (line,) = result.attestation.read_text().splitlines()
        stmt = json.loads(base64.b64decode(json.loads(line)["payload"]))
        assert stmt["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
        # Two legs x every subject (five plus the leg's attestation).
        assert len(stmt["subject"]) == 12
        assert "legs/01-leg-bwrap/allure-results/" in {s["name"] for s in stmt["subject"]}
        assert "macos:seatbelt-net_denied_host" in stmt["predicate"]["passedTests"]
        names = {c["name"] for c in stmt["predicate"]["configuration"]}
        assert {"policy", "expect-legs", "harness", "leg:macos/seatbelt", "leg:linux/none"} <= names
        (harness,) = [c for c in stmt["predicate"]["configuration"] if c["name"] == "harness"]
        assert harness["annotations"]["commit"] == COMMIT

    def test_duplicate_leg_refused(
        self,
        legs: dict[str, Path],
        expected: ExpectedLegs,
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
        tmp_path: Path,
        policy_file: Path,
    ) -> None:
        """Two directories holding the same leg refuse the merge and write nothing."""
        twin = build_report(tmp_path / "twin", policy_file, make_cells(backends=("none",)))
        sign(twin, signing_key)
        result = do_merge(
            [*legs.values(), twin], expected, trusted, policy, signing_key, tmp_path / "out"
        )
        assert any("duplicate leg linux/none" in r for r in result.reasons), result.reasons
        assert not (tmp_path / "out").exists()

    def test_missing_leg_refused(
        self,
        legs: dict[str, Path],
        expected: ExpectedLegs,
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
        tmp_path: Path,
    ) -> None:
        """An expected leg that no directory holds refuses the merge."""
        result = do_merge(
            [legs["leg-bwrap"]],
            expected,
            trusted,
            policy,
            signing_key,
            tmp_path / "out",
        )
        assert any("missing leg macos/seatbelt" in r for r in result.reasons), result.reasons
        assert result.attestation is None

    def test_failing_leg_refused(
        self,
        legs: dict[str, Path],
        expected: ExpectedLegs,
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
        tmp_path: Path,
    ) -> None:
        """A leg whose evidence was altered after signing refuses the merge, naming the leg."""
        evidence = legs["leg-mac"] / "evidence.json"
        evidence.write_text(evidence.read_text().replace('"PASS"', '"FAIL"', 1))
        result = do_merge(
            list(legs.values()), expected, trusted, policy, signing_key, tmp_path / "out"
        )
        assert any(
            "leg-mac does not verify: evidence.json does not match" in r for r in result.reasons
        )
        assert result.attestation is None


class TestExpectLegsFile:
    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("", "no legs"),
            ('[[leg]]\nplatform = "linux"\n', "platform and backend"),
            ('[[leg]]\nplatform = "linux"\nbackend = "none"\nos = "x"\n', "unknown key 'os'"),
            (
                '[[leg]]\nplatform="linux"\nbackend="none"\n[[leg]]\nplatform="linux"\nbackend="none"\n',
                "listed twice",
            ),
        ],
        ids=["empty", "no-backend", "unknown-key", "duplicate"],
    )
    def test_bad_files_refused(self, tmp_path: Path, text: str, message: str) -> None:
        """Bad --expect-legs files are ConfigErrors naming the problem."""
        path = tmp_path / "legs.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_expected_legs(path)


class TestControlCarriedByLegs:
    """The CI layout: every leg runs `none` first, and legs.toml does not list `none`."""

    def test_two_linux_legs_each_with_control_merge(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """Two Linux legs both carrying linux/none merge; the control cells are kept per leg."""
        path = tmp_path / "legs.toml"
        path.write_text(
            '[[leg]]\nplatform = "linux"\nbackend = "bubblewrap"\n'
            '[[leg]]\nplatform = "linux"\nbackend = "docker"\n'
        )
        expected = load_expected_legs(path)
        dirs = []
        for backend in ("bubblewrap", "docker"):
            report = build_report(
                tmp_path / backend,
                policy_file,
                make_cells(backends=("none", backend), required=(backend,)),
            )
            sign(report, signing_key)
            dirs.append(report)
        result = do_merge(dirs, expected, trusted, policy, signing_key, tmp_path / "out")
        assert result.reasons == []
        assert set(result.legs) == {("linux", "bubblewrap"), ("linux", "docker")}
        assert result.attestation is not None
        line = result.attestation.read_text()
        stmt = json.loads(base64.b64decode(json.loads(line)["payload"]))
        passed = stmt["predicate"]["passedTests"]
        assert "linux:none-net_denied_host@01-bubblewrap" in passed
        assert "linux:none-net_denied_host@02-docker" in passed

    def test_unexpected_leg_refused(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A leg the expect-legs file does not list refuses the merge, naming the fix."""
        path = tmp_path / "legs.toml"
        path.write_text('[[leg]]\nplatform = "linux"\nbackend = "bubblewrap"\n')
        report = build_report(
            tmp_path / "r", policy_file, make_cells(backends=("none", "bubblewrap", "docker"))
        )
        sign(report, signing_key)
        result = do_merge(
            [report], load_expected_legs(path), trusted, policy, signing_key, tmp_path / "out"
        )
        assert any("unexpected leg linux/docker" in r for r in result.reasons), result.reasons
        assert result.attestation is None
