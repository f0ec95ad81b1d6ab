"""merge: legs verified one by one, duplicates and missing legs refused, one signed decision."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.attest.merge import load_expected_legs, merge_legs
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.errors import ConfigError
from tests.attest.builder import COMMIT, build_report, make_cells, sign

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.attest.keys import SigningKey, TrustedKey
    from sandbox_attest.attest.merge import ExpectedLegs, MergeResult
    from sandbox_attest.report.policy import Policy

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
        # The test-result statement, then the release's verification summary (issue 30).
        line, _ = result.attestation.read_text().splitlines()
        stmt = json.loads(base64.b64decode(json.loads(line)["payload"]))
        assert stmt["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
        # Two legs x every subject (six plus the leg's attestation), and the release's pages.
        assert len(stmt["subject"]) == 16
        names = {s["name"] for s in stmt["subject"]}
        assert "legs/01-leg-bwrap/allure-results/" in names
        assert {"report.html", "summary.md"} <= names
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
        line = result.attestation.read_text().splitlines()[0]  # the test-result statement
        stmt = json.loads(base64.b64decode(json.loads(line)["payload"]))
        passed = stmt["predicate"]["passedTests"]
        assert "linux:none-net_denied_host@01-bubblewrap" in passed
        assert "linux:none-net_denied_host@02-docker" in passed
        # The release page names each carried control cell as the gate does, once per leg.
        cells = page_cells((tmp_path / "out" / "report.html").read_text())
        assert {name for name, _, _ in cells.values()} == set(passed)

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


def signed_statement(attestation: Path) -> dict[str, Any]:
    """The test-result statement of a merged release (line 1; line 2 is its summary)."""
    line, _ = attestation.read_text().splitlines()
    stmt: dict[str, Any] = json.loads(base64.b64decode(json.loads(line)["payload"]))
    return stmt


def page_cells(page: str) -> dict[str, tuple[str, str, str]]:
    """Each release-grid cell (`label/cell_id`) -> (gate name, status, link)."""
    found = re.findall(
        r"data-cell='([^']+)' data-gate-name='([^']+)' data-verdict='\w+' "
        r"data-status='(\w+)'><a href='([^']+)'",
        page,
    )
    return {cell: (name, status, link) for cell, name, status, link in found}


class TestReleasePages:
    """merge writes the release's own report.html and summary.md, and verify pins them."""

    OPTIONAL_FAIL = "seatbelt-fs_write_outside"

    @pytest.fixture
    def warned_legs(self, tmp_path: Path, policy_file: Path, signing_key: SigningKey) -> list[Path]:
        """Two real signed legs, the merged gate WARNED by one optional FAIL on macOS.

        The linux leg (none + bubblewrap) all PASS; the seatbelt leg marks its cells required,
        as `--backend seatbelt --require-backend` does, except the one that FAILs.
        """
        dirs = []
        for name, backends, platform, verdicts in (
            ("leg-bwrap", ("none", "bubblewrap"), "linux", {}),
            ("leg-mac", ("seatbelt",), "macos", {self.OPTIONAL_FAIL: "FAIL"}),
        ):
            cells = make_cells(backends=backends, platform=platform, verdicts=verdicts)
            for cell in cells:
                if cell["backend"] == "seatbelt" and cell["cell_id"] != self.OPTIONAL_FAIL:
                    cell["required"] = True
            report = build_report(tmp_path / name, policy_file, cells, platform=platform)
            sign(report, signing_key)
            dirs.append(report)
        return dirs

    @pytest.fixture
    def release(
        self,
        warned_legs: list[Path],
        expected: ExpectedLegs,
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
        tmp_path: Path,
    ) -> Path:
        """The WARNED release merged from `warned_legs`."""
        result = do_merge(warned_legs, expected, trusted, policy, signing_key, tmp_path / "out")
        assert result.reasons == []
        assert result.result == "WARNED"
        return tmp_path / "out"

    def test_pages_are_signed_subjects(self, release: Path) -> None:
        """The release's report.html and summary.md are subjects with their files' digests."""
        stmt = signed_statement(release / "attestation.intoto.jsonl")
        signed = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
        for name in ("report.html", "summary.md"):
            assert signed[name] == hashlib.sha256((release / name).read_bytes()).hexdigest()

    def test_grid_shows_every_leg_and_agrees_with_the_merged_gate(self, release: Path) -> None:
        """Every cell of both legs is in one grid, with the status the merged gate gives it."""
        predicate = signed_statement(release / "attestation.intoto.jsonl")["predicate"]
        cells = page_cells((release / "report.html").read_text())
        assert len(cells) == 3 * 7  # linux none + bubblewrap, macOS seatbelt
        assert {c.split("/")[0] for c in cells} == {"01-leg-bwrap", "02-leg-mac"}
        passed = {name for name, status, _ in cells.values() if status == "passed"}
        failing = {name for name, status, _ in cells.values() if status in ("failed", "error")}
        assert passed == set(predicate["passedTests"])
        assert failing == set(predicate["failedTests"]) == set()
        name, status, link = cells[f"02-leg-mac/{self.OPTIONAL_FAIL}"]
        assert status == "skipped"
        assert name in predicate["warnedTests"]
        assert link == f"legs/02-leg-mac/report.html#cell-{self.OPTIONAL_FAIL}"
        # legs.toml lists linux/none as a leg of its own here, so its cells are not carried.
        assert cells["01-leg-bwrap/none-dns_resolution"][0] == "linux:none-dns_resolution"

    def test_every_cell_links_to_its_section_in_the_copied_leg_page(self, release: Path) -> None:
        """Each grid link names a copied leg page that holds the linked cell's section."""
        for _, _, link in page_cells((release / "report.html").read_text()).values():
            path, _, fragment = link.partition("#")
            assert f"id='{fragment}'" in (release / path).read_text(), link

    def test_page_says_the_gate_and_links_the_legs(self, release: Path) -> None:
        """The page shows WARNED, links each leg's report and summary, and fetches nothing."""
        page = (release / "report.html").read_text()
        assert "Release gate: WARNED" in page
        for label in ("01-leg-bwrap", "02-leg-mac"):
            assert f"href='legs/{label}/report.html'" in page
            assert f"href='legs/{label}/summary.md'" in page
        assert "unconfined control" in page
        assert not re.search(r"(?:src|href)=['\"]?(?:https?:)?//", page)
        assert "<script" not in page

    def test_summary_lists_the_legs_and_what_did_not_pass(self, release: Path) -> None:
        """summary.md gives the merged gate, a link per leg, the grid and the optional FAIL."""
        text = (release / "summary.md").read_text()
        assert text.startswith("## sandbox-attest release: WARNED (2 legs merged)")
        assert "[01-leg-bwrap](legs/01-leg-bwrap/report.html)" in text
        assert "| 01-leg-bwrap: none (unconfined control) |" in text
        assert (
            f"- `02-leg-mac/{self.OPTIONAL_FAIL}` (optional, skipped): FAIL (optional, gate WARNED)"
        ) in text
        assert f"(legs/02-leg-mac/report.html#cell-{self.OPTIONAL_FAIL})" in text

    def test_release_verifies(self, release: Path, trusted: TrustedKey, policy: Policy) -> None:
        """Verify of the merged directory holds, the release pages included."""
        v = verify_report(release, trusted, policy)
        assert v.reasons == []
        assert {"report.html", "summary.md"} <= set(v.digests)

    @pytest.mark.parametrize("name", ["report.html", "summary.md"])
    def test_changed_page_fails_verify_naming_it(
        self, release: Path, trusted: TrustedKey, policy: Policy, name: str
    ) -> None:
        """A release page edited after the merge fails verify, naming the file."""
        page = release / name
        page.write_text(page.read_text().replace("WARNED", "PASSED"))
        v = verify_report(release, trusted, policy)
        assert any(
            r.startswith(f"the release page {name} does not match its signed digest")
            for r in v.reasons
        ), v.reasons

    @pytest.mark.parametrize("name", ["report.html", "summary.md"])
    def test_removed_page_fails_verify_naming_it(
        self, release: Path, trusted: TrustedKey, policy: Policy, name: str
    ) -> None:
        """A release page deleted after the merge fails verify, naming the file."""
        (release / name).unlink()
        v = verify_report(release, trusted, policy)
        assert any(r.startswith(f"{name} is missing or unreadable") for r in v.reasons), v.reasons
