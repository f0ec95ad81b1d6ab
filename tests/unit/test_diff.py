"""`sandbox-attest diff OLD NEW`: cells whose verdict changed, why, and exit 1 when worse.

Reports are written by the attest tests' builder, as a run writes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sandbox_attest.cli import main
from sandbox_attest.report.diff import EXIT_WORSE, compare
from tests.attest.builder import build_report, make_cell, make_cells, write_policy


def report(tmp_path: Path, name: str, verdicts: dict[str, str], reason: str = "") -> Path:
    """A report directory whose cells PASS except `verdicts` (cell id -> verdict)."""
    policy = write_policy(tmp_path / "policy.toml")
    cells = make_cells(verdicts=verdicts)
    for cell in cells:
        if reason and cell["cell_id"] in verdicts:
            cell["reason"] = reason
    return build_report(tmp_path / name, policy, cells)


class TestDiff:
    def test_a_new_fail_is_worse_and_exits_1(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A cell that went from PASS to FAIL is printed with its reason, and diff exits 1."""
        old = report(tmp_path, "old", {})
        new = report(
            tmp_path, "new", {"bubblewrap-net_denied_host": "FAIL"}, reason="the origin saw it"
        )
        assert main(["diff", str(old), str(new)]) == EXIT_WORSE
        out = capsys.readouterr().out
        assert "linux:bubblewrap-net_denied_host: PASS -> FAIL (worse): the origin saw it" in out
        assert "(was: proxy answered 403)" in out

    def test_only_better_exits_0(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A cell that went from FAIL to PASS is listed as better, and diff exits 0."""
        old = report(tmp_path, "old", {"bubblewrap-fs_write_outside": "FAIL"})
        new = report(tmp_path, "new", {})
        assert main(["diff", str(old), str(new)]) == 0
        assert "FAIL -> PASS (better)" in capsys.readouterr().out

    def test_unchanged_prints_no_cell(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Two reports with the same verdicts differ in nothing and exit 0."""
        assert main(["diff", str(report(tmp_path, "a", {})), str(report(tmp_path, "b", {}))]) == 0
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "no verdict changed" in captured.err

    def test_release_against_a_run(self, tmp_path: Path) -> None:
        """A merged release's legs are compared cell by cell; legs a run lacks are not worse."""
        release = tmp_path / "release"
        leg = report(tmp_path, "leg-linux", {})
        shutil.copytree(leg, release / "legs" / "01-linux")
        mac = build_report(
            tmp_path / "leg-mac",
            write_policy(tmp_path / "policy.toml"),
            [make_cell("seatbelt", "net_denied_host", platform="darwin")],
            platform="darwin",
        )
        shutil.copytree(mac, release / "legs" / "02-macos")
        run = report(tmp_path, "run", {"none-dns_resolution": "INCONCLUSIVE"})
        kinds = {(c.platform, c.cell_id): c.kind for c in compare(release, run)}
        assert kinds == {
            ("linux", "none-dns_resolution"): "worse",
            ("darwin", "seatbelt-net_denied_host"): "removed",
        }

    def test_json_lists_each_change(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--json gives the count of worse cells and each change with its kind."""
        old = report(tmp_path, "old", {})
        new = report(tmp_path, "new", {"bubblewrap-dns_resolution": "ERROR"})
        assert main(["diff", "--json", str(old), str(new)]) == EXIT_WORSE
        data = json.loads(capsys.readouterr().out)
        assert data["worse"] == 1
        assert data["changes"][0]["kind"] == "worse"
        assert data["changes"][0]["new"] == "ERROR"

    def test_not_a_report_is_a_usage_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A directory with no evidence exits 2 and says what to pass."""
        assert main(["diff", str(tmp_path), str(tmp_path)]) == 2
        assert "pass a report directory" in capsys.readouterr().err
