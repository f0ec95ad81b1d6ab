"""allure extras: each verdict lands in its own category; environment values stay one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.allure_results import CATEGORIES, write_run_files
from harness.plugin import CellFailed


def category_of(message: str, status: str) -> list[str]:
    """Names of the categories allure would put a result with this message and status in."""
    return [
        c["name"]
        for c in CATEGORIES
        if status in c["matchedStatuses"] and re.fullmatch(c["messageRegex"], message)
    ]


class TestCategories:
    @pytest.mark.parametrize(
        ("verdict", "expected"),
        [
            ("FAIL", "Escape (FAIL)"),
            ("INCONCLUSIVE", "Inconclusive (a control failed or the witnesses disagree)"),
            ("ERROR", "Error (crash, timeout, no start marker, bad output)"),
            ("UNAVAILABLE", "Unavailable backend"),
        ],
    )
    def test_each_failing_verdict_has_one_category(self, verdict: str, expected: str) -> None:
        """The message allure records for a non-PASS cell falls in exactly its category."""
        exc = CellFailed({"verdict": verdict, "reason": "why\nwith a second line"})
        message = f"harness.plugin.CellFailed: {exc}"
        assert category_of(message, "broken") == [expected]

    def test_skips_are_grouped_by_their_reason(self) -> None:
        """A skipped unavailable or not-applicable cell lands in its own category."""
        assert category_of("UNAVAILABLE: install bubblewrap", "skipped") == ["Unavailable backend"]
        assert category_of("NOT_APPLICABLE: macOS only", "skipped") == [
            "Not applicable (written reason)"
        ]


def test_environment_and_categories_written(tmp_path: Path) -> None:
    """environment.properties has one line per key; categories.json parses."""
    write_run_files(tmp_path / "allure", {"backend.x": "bubblewrap 0.8.0;\n digest", "run": "r"})
    lines = (tmp_path / "allure" / "environment.properties").read_text().splitlines()
    assert lines == ["backend.x=bubblewrap 0.8.0; digest", "run=r"]
    assert json.loads((tmp_path / "allure" / "categories.json").read_text()) == CATEGORIES
