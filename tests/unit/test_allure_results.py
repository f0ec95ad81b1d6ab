"""allure categories: each verdict's message lands in its one category, in Java's and JS's sense.

Allure 2 matches `messageRegex` against the whole message (Java `matches`), Allure 3 with
JavaScript's `RegExp.test`; the categories must work in both, so both are checked here.
The messages are the ones `sandbox_attest.report.outcomes` gives every format.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sandbox_attest.report.allure import (
    CATEGORIES,
    CONTROL_DIR,
    NOT_GATING,
    _result,
    _Writer,
    cell_times,
    render_allure,
    write_results,
    write_run_files,
)
from sandbox_attest.report.evidence import CellEntry, cell_entry
from sandbox_attest.report.outcomes import _outcome, run_outcomes
from tests.attest.builder import build_report, make_cells, write_policy


def category_of(message: str, status: str) -> list[str]:
    """Names of the categories a result with this message and status is in (Allure 2 and 3)."""
    names = []
    for c in CATEGORIES:
        if status not in c["matchedStatuses"]:
            continue
        java = re.fullmatch(c["messageRegex"], message) is not None
        javascript = re.search(c["messageRegex"], message) is not None
        assert java == javascript, c["name"]
        if java:
            names.append(c["name"])
    return names


def a_cell(verdict: str) -> CellEntry:
    """A cell of backend b, probe p with `verdict` and no reason recorded."""
    return cell_entry(
        cell_id="b-p", backend="b", probe="p", platform="linux", verdict=verdict, reason=""
    )


class TestCategories:
    @pytest.mark.parametrize(
        ("verdict", "required", "expected"),
        [
            ("FAIL", True, "Escapes"),
            ("FAIL", False, "Escapes"),
            ("INCONCLUSIVE", True, "Blind probes"),
            ("INCONCLUSIVE", False, "Blind probes"),
            ("ERROR", True, "Harness errors"),
            ("UNAVAILABLE", False, "Not run here"),
            ("NOT_APPLICABLE", False, "Not run here"),
        ],
    )
    def test_each_verdict_has_one_category(
        self, verdict: str, required: bool, expected: str
    ) -> None:
        """The message and status every format records for a non-PASS cell fall in one category."""
        cell = cell_entry(
            cell_id="b-p",
            backend="b",
            probe="p",
            platform="linux",
            verdict=verdict,
            reason="why\nwith a second line",
        )
        outcome = _outcome(cell, "linux", required=required)
        assert category_of(outcome.message, outcome.allure_status) == [expected]

    def test_no_inline_flags(self) -> None:
        """No category uses an inline flag group such as `(?s)`, which JavaScript rejects."""
        assert all("(?" not in c["messageRegex"] for c in CATEGORIES)


def test_environment_and_categories_written(tmp_path: Path) -> None:
    """environment.properties has one line per key; categories.json parses."""
    write_run_files(tmp_path / "allure", {"backend.x": "bubblewrap 0.8.0;\n digest", "run": "r"})
    lines = (tmp_path / "allure" / "environment.properties").read_text().splitlines()
    assert lines == ["backend.x=bubblewrap 0.8.0; digest", "run=r"]
    assert json.loads((tmp_path / "allure" / "categories.json").read_text()) == CATEGORIES


class TestControlDirectory:
    def test_control_results_and_their_attachments_live_in_control(self, tmp_path: Path) -> None:
        """Every control-leg result sits in control/ with its attachments; none at the top."""
        policy = write_policy(tmp_path / "policy.toml")
        report = build_report(tmp_path / "run", policy, make_cells())
        evidence = json.loads((report / "evidence.json").read_text())
        results = tmp_path / "results"
        write_results(results, render_allure(evidence, run_outcomes(evidence, None)))
        for where, control in ((results, False), (results / CONTROL_DIR, True)):
            found = [json.loads(p.read_text()) for p in where.glob("*-result.json")]
            cells = [r for r in found if r["testCaseId"] != "release-gate"]
            assert cells
            assert all((r["testCaseId"].startswith("none-")) == control for r in cells)
            for r in cells:
                sources = [a["source"] for s in r["steps"] for a in s["attachments"]]
                sources += [a["source"] for a in r["attachments"]]
                assert all((where / s).is_file() for s in sources), r["testCaseId"]
            assert (where / "allurerc.json").is_file()


class TestOptionalCells:
    @pytest.mark.parametrize(
        ("verdict", "status", "tagged"),
        [
            ("FAIL", "failed", True),
            ("INCONCLUSIVE", "failed", True),
            ("ERROR", "broken", True),
            ("UNAVAILABLE", "skipped", False),
            ("NOT_APPLICABLE", "skipped", False),
            ("PASS", "passed", False),
        ],
    )
    def test_optional_cell_status_and_tag(self, verdict: str, status: str, tagged: bool) -> None:
        """An optional non-PASS that WARNs is red in Allure and tagged as not gating."""
        cell = a_cell(verdict)
        outcome = _outcome(cell, "linux", required=False)
        result = _result(_Writer("r"), outcome, 1, 2)
        assert result["status"] == status
        assert ({"name": "tag", "value": NOT_GATING} in result["labels"]) is tagged

    def test_a_cell_that_never_ran_starts_with_the_run(self) -> None:
        """A cell without a recorded start or duration takes the run's start, never 0."""
        cell = a_cell("UNAVAILABLE")
        outcome = _outcome(cell, "linux", required=False)
        assert cell_times(outcome, 1_796_014_862_000) == (1_796_014_862_000, 1_796_014_862_000)
        ran = a_cell("PASS")
        ran["run"] = {"started": True, "started_ms": 1_796_014_865_000, "duration_s": 0.5}
        assert cell_times(_outcome(ran, "linux", required=False), 1) == (
            1_796_014_865_000,
            1_796_014_865_500,
        )
