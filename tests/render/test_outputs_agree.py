"""One run, five outputs: evidence and gate, junit.xml, allure-results/, report.html, summary.md.

The run has required FAIL, ERROR and INCONCLUSIVE cells, an optional FAIL, an UNAVAILABLE
cell and a missing required cell; every output is rendered the way the session renders it
(report/outcomes.py) and read back the way its consumer reads it: JUnit as XML, Allure
through the real Allure 3 CLI, the page in headless Chromium. They must agree cell by cell,
with the gate, and on the one count (`count_failures`) the terminal prints too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from sandbox_attest.report.allure import (
    CATEGORIES,
    CONTROL_DIR,
    NOT_GATING,
    epoch_ms,
    render_allure,
    write_results,
)
from sandbox_attest.report.junit import render_junit
from sandbox_attest.report.outcomes import (
    GATE_ID,
    RunOutcomes,
    count_failures,
    count_line_of,
    run_outcomes,
)
from sandbox_attest.report.policy import Policy, load_policy
from sandbox_attest.report.views import render_html, render_summary
from tests.attest.builder import build_report, make_cells, write_policy
from tests.render.cdp import Browser
from tests.render.test_html import chromium

ROOT = Path(__file__).resolve().parent.parent.parent
ALLURE_VERSION = "3.18.0"  # pinned: the categories and result format are checked against it
ALLURE_PREFIX = ROOT / ".state" / "allure"
SHOTS = Path(os.environ.get("SANDBOX_ATTEST_SHOTS", "/tmp/shots"))
VERDICTS = {
    "bubblewrap-fs_write_outside": "FAIL",
    "bubblewrap-dns_resolution": "ERROR",
    "bubblewrap-net_denied_host": "INCONCLUSIVE",
    "docker-net_direct_egress": "UNAVAILABLE",
    "docker-pkg_pip_install": "FAIL",
}
MISSING_CELL = "bubblewrap-pkg_pip_install"
# The run's end (it started 18 s before: 2026-11-30T05:01:02Z), and the wall-clock start it
# records for one cell (runner.py, `run.started_ms`): 3 s into the run.
FINISHED = datetime(2026, 11, 30, 5, 1, 20, tzinfo=UTC)
STARTED_MS = {"bubblewrap-fs_write_outside": 1_796_014_865_000}


def _word(status: str) -> str:
    """JUnit's and Allure's words for a status, as one vocabulary."""
    return {"failure": "failed", "broken": "error"}.get(status, status)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Policy, Path]:
    """The evidence of one run, its policy, and a directory with all five outputs."""
    tmp = tmp_path_factory.mktemp("five")
    policy_path = write_policy(tmp / "policy.toml")
    cells = make_cells(backends=("none", "bubblewrap", "docker"), verdicts=VERDICTS)
    cells = [c for c in cells if c["cell_id"] != MISSING_CELL]
    for c in cells:
        if c["cell_id"] in VERDICTS:
            c["reason"] = f"{VERDICTS[c['cell_id']].lower()} because of a reason\nline two"
        if c["cell_id"] in STARTED_MS:
            c["run"]["started_ms"] = STARTED_MS[c["cell_id"]]
    report = build_report(
        tmp / "run",
        policy_path,
        cells,
        finished_at=FINISHED,
        extra={"world": {"kind": "loopback"}},
    )
    evidence = json.loads((report / "evidence.json").read_text())
    policy = load_policy(policy_path)
    outcomes = run_outcomes(evidence, policy)
    (report / "junit.xml").write_bytes(render_junit(evidence, outcomes))
    (report / "report.html").write_text(render_html(evidence, None, policy))
    (report / "summary.md").write_text(render_summary(evidence, None, policy))
    allure = report / "allure-results"
    shutil.rmtree(allure)
    allure.mkdir()
    write_results(allure, render_allure(evidence, outcomes))
    return evidence, policy, report


@pytest.fixture(scope="module")
def outcomes(run: tuple[dict[str, Any], Policy, Path]) -> RunOutcomes:
    """The one mapping every output is rendered from."""
    return run_outcomes(run[0], run[1])


def junit_statuses(report: Path) -> dict[str, str]:
    """Each testcase's status as JUnit says it (passed / failed / error / skipped)."""
    root = ET.fromstring((report / "junit.xml").read_bytes())  # noqa: S314  (ours)
    out = {}
    for case in root.iter("testcase"):
        kids = [k.tag for k in case if k.tag in ("failure", "error", "skipped")]
        out[str(case.get("name"))] = _word(kids[0]) if kids else "passed"
    return out


def allure_statuses(report: Path) -> dict[str, str]:
    """Each result's status in allure-results/ and its control/ directory, by test case id."""
    out = {}
    for path in (report / "allure-results").rglob("*-result.json"):
        result = json.loads(path.read_text())
        out[result["testCaseId"]] = _word(result["status"])
    return out


def html_statuses(report: Path) -> dict[str, str]:
    """Each grid cell's status in report.html."""
    page = (report / "report.html").read_text()
    return dict(
        re.findall(
            r"<td class='v-\w+ s-\w+[^']*' data-cell='([\w-]+)' "
            r"data-verdict='\w+' data-status='(\w+)'",
            page,
        )
    )


def summary_statuses(report: Path) -> dict[str, str]:
    """Each non-passing cell's status in summary.md (the rest are passed)."""
    text = (report / "summary.md").read_text()
    return dict(re.findall(r"^- `([\w-]+)` \((?:required|optional), (\w+)\)", text, re.MULTILINE))


class TestAgreement:
    def test_the_run_has_every_kind_of_cell(self, outcomes: RunOutcomes) -> None:
        """The run under test has FAIL, ERROR, INCONCLUSIVE, UNAVAILABLE and MISSING cells."""
        verdicts = {o.verdict for o in outcomes.cells}
        assert {"PASS", "FAIL", "ERROR", "INCONCLUSIVE", "UNAVAILABLE", "MISSING"} <= verdicts
        assert outcomes.gate.result == "FAILED"

    def test_every_output_agrees_cell_by_cell(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes
    ) -> None:
        """JUnit, Allure, the page and the summary give every cell the mapping's status."""
        report = run[2]
        expected = {o.cell_id: o.status for o in outcomes.cells}
        junit = junit_statuses(report)
        allure = allure_statuses(report)
        assert junit.pop(GATE_ID) == allure.pop(GATE_ID) == "failed"
        assert junit == expected
        # Allure has no red status that does not gate: a warned cell is failed there, tagged.
        assert allure == {o.cell_id: _word(o.allure_status) for o in outcomes.cells}
        assert allure["docker-pkg_pip_install"] == "failed"
        assert {k: v for k, v in allure.items() if v != expected[k]} == {
            "docker-pkg_pip_install": "failed"
        }
        assert html_statuses(report) == expected
        summary = summary_statuses(report)
        assert summary == {k: v for k, v in expected.items() if v != "passed"}
        assert expected[MISSING_CELL] == "error"
        assert expected["bubblewrap-fs_write_outside"] == "failed"
        assert expected["bubblewrap-net_denied_host"] == "failed"  # required INCONCLUSIVE
        assert expected["bubblewrap-dns_resolution"] == "error"
        assert expected["docker-pkg_pip_install"] == "skipped"  # optional FAIL: gate WARNs
        assert expected["docker-net_direct_egress"] == "skipped"

    def test_junit_counts_decide_as_the_gate(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes
    ) -> None:
        """Failures + errors in junit.xml are non-zero exactly when the gate is FAILED."""
        root = ET.fromstring((run[2] / "junit.xml").read_bytes())  # noqa: S314  (ours)
        failing = int(root.get("failures", "0")) + int(root.get("errors", "0"))
        assert (failing > 0) == (outcomes.gate.result == "FAILED")
        suites = {s.get("name"): s for s in root.findall("testsuite")}
        assert list(suites) == ["linux/none", "linux/bubblewrap", "linux/docker", GATE_ID]
        suite_props = suites["linux/docker"].find("properties")
        assert suite_props is not None
        props = {str(p.get("name")): str(p.get("value")) for p in suite_props}
        assert props["run_id"] == run[0]["run_id"]
        assert props["world"] == "loopback"
        assert props["backend.version"] == "0.8.0"
        assert props["backend.profile_digest"].startswith("sha256:")
        assert json.loads(props["backend.claims"])["network"] == "proxy"
        assert props["required"] == "0 of 7 cells required"

    def test_a_warned_run_has_no_junit_failures(self, tmp_path: Path) -> None:
        """A run whose only non-PASS cells are optional is WARNED and JUnit shows no failure."""
        policy_path = write_policy(tmp_path / "policy.toml")
        cells = make_cells(
            backends=("none", "bubblewrap", "docker"),
            verdicts={"docker-fs_write_outside": "FAIL", "docker-dns_resolution": "ERROR"},
        )
        report = build_report(tmp_path / "run", policy_path, cells)
        evidence = json.loads((report / "evidence.json").read_text())
        outcomes = run_outcomes(evidence, load_policy(policy_path))
        root = ET.fromstring(render_junit(evidence, outcomes))  # noqa: S314  (ours)
        assert outcomes.gate.result == "WARNED"
        assert (root.get("failures"), root.get("errors"), root.get("skipped")) == ("0", "0", "2")


def allure_results(report: Path) -> list[dict[str, Any]]:
    """Every result file of allure-results/ and its control/ directory, parsed."""
    return [
        json.loads(path.read_text())
        for path in sorted((report / "allure-results").rglob("*-result.json"))
    ]


def html_list(report: Path, list_id: str) -> list[str]:
    """The cell ids report.html lists in its first-screen list `list_id`, in order."""
    page = (report / "report.html").read_text()
    found = re.search(f"<ul id={list_id}>(.*?)</ul>", page, re.DOTALL)
    return re.findall(r"<li class='v-\w+' data-cell='([\w-]+)'", found.group(1)) if found else []


def summary_section(report: Path, heading: str) -> list[str]:
    """The cell ids summary.md lists under the `### heading...` section, in order."""
    text = (report / "summary.md").read_text()
    start = text.index(f"### {heading}")
    block = text[start:].split("\n\n", 2)[1]
    return re.findall(r"^- `([\w-]+)`", block, re.MULTILINE)


class TestOneCount:
    def test_the_run_has_required_and_optional_failures(self, outcomes: RunOutcomes) -> None:
        """The run counts required FAILs, an optional FAIL and UNAVAILABLE cells apart."""
        count = count_failures(outcomes)
        assert {o.verdict for o in count.gating} >= {"FAIL", "INCONCLUSIVE", "ERROR", "MISSING"}
        assert [o.cell_id for o in count.warned] == ["docker-pkg_pip_install"]
        assert "UNAVAILABLE" in {o.verdict for o in count.not_run}
        assert len(outcomes.cells) == sum(
            map(len, (count.gating, count.warned, count.not_run, count.passed))
        )

    def test_every_output_prints_the_same_count(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes
    ) -> None:
        """Terminal, summary.md, report.html, junit.xml and Allure print one count line."""
        evidence, policy, report = run
        line = count_failures(outcomes).line()
        assert line.startswith("cells: 4 failing the gate (")
        # The terminal's line under the grid (plugin/__init__.py) over the same cells.
        assert count_line_of(evidence["cells"], "linux", policy) == line
        assert f"**{line}**" in (report / "summary.md").read_text()
        assert f"<p id=count><strong>{line}</strong></p>" in (report / "report.html").read_text()
        root = ET.fromstring((report / "junit.xml").read_bytes())  # noqa: S314  (ours)
        gate_suite = next(s for s in root.findall("testsuite") if s.get("name") == GATE_ID)
        props = {p.get("name"): p.get("value") for p in gate_suite.iter("property")}
        assert props["cells"] == line
        assert gate_suite.findtext("testcase/system-out") == f"gate: FAILED; {line}"
        gate_result = next(r for r in allure_results(report) if r["testCaseId"] == GATE_ID)
        assert gate_result["description"] == f"gate: FAILED; {line}"

    def test_every_output_counts_the_same_cells(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes
    ) -> None:
        """The cells each output counts as failing the gate and as warned are the count's."""
        report = run[2]
        count = count_failures(outcomes)
        gating = [o.cell_id for o in count.gating]
        warned = [o.cell_id for o in count.warned]
        assert not count.gating_not_run  # so the one list holds every gating cell
        assert html_list(report, "gating") == gating
        assert html_list(report, "warned") == warned
        assert summary_section(report, "Failing the gate") == gating
        assert summary_section(report, "Warned") == warned
        root = ET.fromstring((report / "junit.xml").read_bytes())  # noqa: S314  (ours)
        # failures + errors over the cells (the release gate's own failure aside).
        cell_failing = int(root.get("failures", "0")) - 1 + int(root.get("errors", "0"))
        assert cell_failing == len(gating)
        gate_suite = next(s for s in root.findall("testsuite") if s.get("name") == GATE_ID)
        props = {p.get("name"): p.get("value") for p in gate_suite.iter("property")}
        assert props["cells.failing_the_gate"] == str(len(gating))
        assert props["cells.warned"] == str(len(warned))
        results = [r for r in allure_results(report) if r["testCaseId"] != GATE_ID]
        red = {r["testCaseId"] for r in results if r["status"] in ("failed", "broken")}
        assert red == set(gating) | set(warned)
        tagged = {
            r["testCaseId"] for r in results if {"name": "tag", "value": NOT_GATING} in r["labels"]
        }
        assert tagged == set(warned)

    def test_cell_problems_are_listed_once(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes
    ) -> None:
        """A gate problem about a listed cell is not repeated as a run problem on top."""
        report = run[2]
        assert len(outcomes.gate.problems) == len(count_failures(outcomes).gating)
        assert outcomes.run_problems == ()
        assert "### Run problems" not in (report / "summary.md").read_text()
        page = (report / "report.html").read_text()
        banner = page[page.index("<div id=verdict") : page.index("<div id=signature")]
        assert "<li>" not in banner

    def test_a_problem_no_cell_carries_stays_on_top(self, tmp_path: Path) -> None:
        """An interrupted run's problem is named in the banner and the summary's run problems."""
        policy_path = write_policy(tmp_path / "policy.toml")
        cells = make_cells(backends=("none", "bubblewrap"))
        report = build_report(tmp_path / "run", policy_path, cells, complete=False)
        evidence = json.loads((report / "evidence.json").read_text())
        policy = load_policy(policy_path)
        problem = "the evidence is marked incomplete (the run was interrupted)"
        assert run_outcomes(evidence, policy).run_problems == (problem,)
        page = render_html(evidence, None, policy)
        banner = page[page.index("<div id=verdict") : page.index("<div id=signature")]
        assert f"<li>{problem}</li>" in banner
        summary = render_summary(evidence, None, policy)
        assert f"### Run problems\n\n- {problem}" in summary


class TestAllureTimes:
    def test_results_carry_the_cells_wall_clock(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes
    ) -> None:
        """Each result starts when its cell ran (epoch ms), or at the run's start; never 1970."""
        evidence, _, report = run
        run_start = epoch_ms(evidence["started_at"])
        assert run_start > epoch_ms("2020-01-01T00:00:00Z")
        by_id = outcomes.by_id()
        for result in allure_results(report):
            assert result["start"] >= run_start, result["testCaseId"]
            assert result["stop"] >= result["start"]
            for step in result["steps"]:
                assert (step["start"], step["stop"]) == (result["start"], result["stop"])
            o = by_id.get(result["testCaseId"])
            if o is None:  # the release gate: the whole run
                assert result["stop"] == epoch_ms(evidence["finished_at"])
                continue
            run_facts: Mapping[str, Any] = (o.cell.get("run") if o.cell else None) or {}
            want = STARTED_MS.get(o.cell_id, run_start)
            assert result["start"] == want, o.cell_id
            assert result["stop"] - result["start"] == int(1000 * run_facts.get("duration_s", 0))

    def test_epoch_ms_reads_rfc3339_and_refuses_the_rest(self) -> None:
        """An RFC 3339 stamp becomes epoch milliseconds; anything else the default."""
        assert epoch_ms("1970-01-01T00:00:01Z") == 1000
        assert epoch_ms("2026-11-30T05:01:02Z") == 1_796_014_862_000
        assert epoch_ms("not a time", 7) == 7
        assert epoch_ms(None, 7) == 7


class TestBrowser:
    def test_click_opens_and_highlights_the_cell(
        self, run: tuple[dict[str, Any], Policy, Path], tmp_path: Path
    ) -> None:
        """Clicking a grid cell opens its section, highlighted; the page asks for no URL."""
        page = run[2] / "report.html"
        SHOTS.mkdir(parents=True, exist_ok=True)
        with Browser(chromium(), tmp_path / "profile") as browser:
            browser.open(page.as_uri())
            browser.screenshot(SHOTS / "report-grid.png")
            target = "bubblewrap-net_direct_egress"
            section = f"document.getElementById('cell-{target}')"
            body = f"getComputedStyle({section}.querySelector('.body')).display"
            assert browser.evaluate(body) == "none"  # a PASS cell starts closed
            browser.evaluate(
                f"document.querySelector(\"#grid td[data-cell='{target}'] a\").click()"
            )
            assert browser.evaluate("location.hash") == f"#cell-{target}"
            assert browser.evaluate(body) == "block"
            assert browser.evaluate(f"getComputedStyle({section}).outlineStyle") == "solid"
            browser.screenshot(SHOTS / "report-cell.png")
            # The non-PASS filter hides passing rows without any script of the page's own.
            browser.evaluate("document.getElementById('only-nonpass').click()")
            hidden = browser.evaluate(
                "[...document.querySelectorAll('#grid tr.all-pass')]"
                ".every(r => getComputedStyle(r).display === 'none')"
            )
            assert hidden is True
            assert browser.evaluate("document.scripts.length") == 0
            urls = browser.requested_urls()
        assert urls, "the navigation itself is a request"
        assert all(u.startswith(("file:", "data:", "about:")) for u in urls), urls


def allure_cli() -> Path:
    """The Allure 3 CLI, installed from npm into .state/allure once; FAILS in CI without it."""
    cli = ALLURE_PREFIX / "node_modules" / "allure" / "cli.js"
    if cli.is_file():
        return cli
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is missing: install it with `apt-get install -y npm` (Debian)")
    done = subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(ALLURE_PREFIX),
            "--no-audit",
            "--no-fund",
            f"allure@{ALLURE_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0 or not cli.is_file():
        message = f"could not install allure@{ALLURE_VERSION} from npm: {done.stderr[-1500:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(f"SKIPPED LOUDLY (not in CI): {message}")
    return cli


def allure_generate(results: Path, out: Path) -> None:
    """Render `results` with the real Allure 3 CLI and its own allurerc.json into `out`."""
    cli = allure_cli()
    done = subprocess.run(
        [
            "node",
            str(cli),
            "generate",
            "--config",
            str(results / "allurerc.json"),
            "--output",
            str(out),
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=out.parent,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def allure_names(report: Path) -> set[str]:
    """The test names an Allure 3 report lists (its test-results.json)."""
    data = json.loads((report / "test-results.json").read_text())
    return {str(t["name"]) for t in data["byId"].values()}


class TestAllure:
    def test_control_leg_never_counts_in_the_pass_ring(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes, tmp_path: Path
    ) -> None:
        """Allure 3's statistics and pass ring count no control cell; control/ is its own report."""
        results = run[2] / "allure-results"
        allure_generate(results, tmp_path / "main")
        sandbox = [o for o in outcomes.cells if not o.control]
        control = [o for o in outcomes.cells if o.control]
        assert control, "the run under test has a control leg"
        stats = json.loads((tmp_path / "main" / "widgets" / "statistic.json").read_text())
        assert stats["total"] == len(sandbox) + 1  # the sandbox cells and the release gate
        assert stats.get("passed", 0) == sum(o.status == "passed" for o in sandbox)
        names = allure_names(tmp_path / "main")
        assert not any(o.cell_id in n for o in control for n in names), names
        ring = json.loads((tmp_path / "main" / "widgets" / "pie_chart.json").read_text())
        assert sum(s["count"] for s in ring["slices"]) == len(sandbox) + 1
        # Allure's success rate: passed over passed + failed + broken, truncated to 0.01 %.
        counted = sum(o.allure_status in ("passed", "failed", "broken") for o in sandbox) + 1
        rate = sum(o.status == "passed" for o in sandbox) / counted
        assert ring["percentage"] == int(rate * 10000) / 100
        allure_generate(results / CONTROL_DIR, tmp_path / "control")
        control_stats = json.loads(
            (tmp_path / "control" / "widgets" / "statistic.json").read_text()
        )
        assert control_stats["total"] == len(control)
        assert allure_names(tmp_path / "control") == {
            f"{o.cell_id} (unconfined control)" for o in control
        }

    def test_allure3_shows_real_dates_and_the_optional_escape_as_failed(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes, tmp_path: Path
    ) -> None:
        """The real Allure 3 report dates each cell in the run, and an optional FAIL is failed."""
        evidence, _, report = run
        allure_generate(report / "allure-results", tmp_path / "main")
        shown = {}
        for path in (tmp_path / "main" / "data" / "test-results").glob("*.json"):
            result = json.loads(path.read_text())
            shown[str(result["name"])] = result
        assert shown, "Allure 3 wrote no per-test data"
        run_start = epoch_ms(evidence["started_at"])
        for name, result in shown.items():
            assert run_start <= result["start"] <= epoch_ms(evidence["finished_at"]), name
        assert (
            shown["bubblewrap-fs_write_outside"]["start"]
            == STARTED_MS["bubblewrap-fs_write_outside"]
        )
        optional = shown["docker-pkg_pip_install"]
        assert optional["status"] == "failed"
        assert {"name": "tag", "value": NOT_GATING} in optional["labels"]
        assert outcomes.by_id()["docker-pkg_pip_install"].status == "skipped"  # JUnit's word

    def test_allure3_groups_findings_in_our_categories(
        self, run: tuple[dict[str, Any], Policy, Path], outcomes: RunOutcomes, tmp_path: Path
    ) -> None:
        """The real Allure 3 CLI reads the results and files each finding in its category."""
        cli = allure_cli()
        results = run[2] / "allure-results"
        out = tmp_path / "allure-report"
        done = subprocess.run(
            [
                "node",
                str(cli),
                "generate",
                "--config",
                str(results / "allurerc.json"),
                "--output",
                str(out),
                str(results),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        found = list(out.rglob("categories.json"))
        assert found, sorted(str(p.relative_to(out)) for p in out.rglob("*"))[:50]
        text = "\n".join(p.read_text() for p in found)
        for name in (c["name"] for c in CATEGORIES[:3]):
            assert f'"{name}"' in text, name
