"""The first screen of a WARNED report, in real headless Chromium: every FAIL is on it (issue 29).

The run is shaped like a newcomer's first report: the required legs pass, an optional
demonstration backend has several FAILs and an INCONCLUSIVE, one backend is UNAVAILABLE for
every probe and another NOT_APPLICABLE for some. Before issue 29 the one FAIL was the 29th
collapsed cell under "Cells". Here the page is laid out at 1280x800 and each element's
bounding box is read: what a reviewer sees without scrolling must name every FAIL and
INCONCLUSIVE cell with its reason, the gate, the signer and what was attested, and nothing
UNAVAILABLE or NOT_APPLICABLE may come before them. The screenshot is saved for a human
(`$SANDBOX_ATTEST_SHOTS`, default /tmp/shots).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.report.outcomes import count_failures, run_outcomes
from sandbox_attest.report.policy import load_policy
from sandbox_attest.report.views import render_html, render_summary
from tests.attest.builder import CORE_PROBES, build_report, make_cells, write_policy
from tests.render.cdp import Browser
from tests.render.test_html import chromium

SHOTS = Path(os.environ.get("SANDBOX_ATTEST_SHOTS", "/tmp/shots"))
WIDTH, HEIGHT = 1280, 800  # a laptop's first screen
DEMO = "bwrap-generic"
# The optional demonstration backend's findings: what the first screen must show.
FINDINGS = {
    f"{DEMO}-fs_write_outside": "FAIL",
    f"{DEMO}-net_direct_egress": "FAIL",
    f"{DEMO}-dns_resolution": "FAIL",
    f"{DEMO}-ipc_unix_socket_escape": "FAIL",
    f"{DEMO}-pkg_pip_install": "INCONCLUSIVE",
}


@pytest.fixture(scope="module")
def warned_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """report.html of a WARNED run (optional FAILs, a whole UNAVAILABLE column), its evidence."""
    tmp = tmp_path_factory.mktemp("first-screen")
    policy_path = write_policy(tmp / "policy.toml")
    verdicts = dict(FINDINGS)
    verdicts |= {f"firejail-{p}": "UNAVAILABLE" for p in CORE_PROBES}
    verdicts |= {f"docker-{p}": "NOT_APPLICABLE" for p in CORE_PROBES[:4]}
    cells = make_cells(
        backends=("none", "bubblewrap", "docker", "firejail", DEMO), verdicts=verdicts
    )
    for cell in cells:
        verdict = verdicts.get(cell["cell_id"])
        if verdict == "UNAVAILABLE":
            cell["reason"] = "firejail is not installed: apt-get install -y firejail"
        elif verdict == "NOT_APPLICABLE":
            cell["reason"] = "docker's spec makes no such claim"
        elif verdict is not None:
            cell["reason"] = (
                f"{verdict} on {cell['cell_id']}: the host saw the attempt; fix: confine "
                f"{cell['probe']} in the {DEMO} profile"
            )
    report = build_report(tmp / "run", policy_path, cells)
    evidence = json.loads((report / "evidence.json").read_text())
    page = report / "report.html"
    page.write_text(render_html(evidence, None, load_policy(policy_path)))
    return page, evidence


def test_the_run_is_warned_with_findings_and_cells_not_run(
    warned_page: tuple[Path, dict[str, Any]],
) -> None:
    """The run under test is WARNED, its findings optional, and more cells not run than found."""
    page, evidence = warned_page
    policy = load_policy(page.parent.parent / "policy.toml")
    outcomes = run_outcomes(evidence, policy)
    count = count_failures(outcomes)
    assert outcomes.gate.result == "WARNED"
    assert not count.gating
    assert {o.cell_id for o in count.warned} == set(FINDINGS)
    assert len(count.not_run) > len(FINDINGS)


# Bounding boxes (viewport coordinates) of what the first screen must show, read in the page.
BOXES_JS = """(() => {
  const box = el => {
    if (!el) return null;
    const r = el.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
            width: r.width, height: r.height,
            shown: getComputedStyle(el).display !== 'none'
                   && getComputedStyle(el).visibility !== 'hidden',
            text: el.innerText};
  };
  const items = {};
  for (const li of document.querySelectorAll('#attention li[data-cell]')) {
    items[li.dataset.cell] = box(li);
  }
  const notRun = [...document.querySelectorAll(
      "section.cell.v-UNAVAILABLE, section.cell.v-NOT_APPLICABLE, #gating-not-run li")].map(box);
  return {items, notRun, verdict: box(document.getElementById('verdict')),
          signature: box(document.getElementById('signature')),
          attested: box(document.getElementById('attested')),
          count: box(document.getElementById('count'))};
})()"""


def first_screen(page: Path, profile: Path, shot: Path) -> dict[str, Any]:
    """Lay `page` out at WIDTH x HEIGHT in Chromium, save the PNG, return the boxes."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    with Browser(chromium(), profile) as browser:
        browser.open(page.as_uri())
        browser.screenshot(shot, width=WIDTH, height=HEIGHT)
        assert browser.evaluate("window.innerHeight") == HEIGHT
        assert browser.evaluate("window.scrollY") == 0
        boxes: dict[str, Any] = browser.evaluate(BOXES_JS)
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    return boxes


def on_screen(box: dict[str, Any] | None) -> bool:
    """Whether an element is shown and wholly inside the first screen."""
    return (
        box is not None
        and box["shown"]
        and box["width"] > 0
        and box["height"] > 0
        and box["top"] >= 0
        and box["bottom"] <= HEIGHT
        and box["left"] >= 0
        and box["right"] <= WIDTH
    )


def assert_findings_first(boxes: dict[str, Any], findings: dict[str, str], gate: str) -> None:
    """The gate, signer, scope and each finding with its fix are on screen, above cells not run."""
    for name in ("verdict", "signature", "attested", "count"):
        assert on_screen(boxes[name]), (name, boxes[name])
    assert gate in boxes["verdict"]["text"]
    assert "NOT SIGNED" in boxes["signature"]["text"]
    assert DEMO in boxes["attested"]["text"]
    items = boxes["items"]
    assert set(items) == set(findings), sorted(items)
    for cell_id, verdict in findings.items():
        item = items[cell_id]
        assert on_screen(item), (cell_id, item)
        assert item["text"].startswith(verdict), item["text"]
        assert "fix: confine" in item["text"], item["text"]
    lowest = max(item["bottom"] for item in items.values())
    assert boxes["notRun"], "the run has cells that were not run"
    assert all(b["top"] > lowest for b in boxes["notRun"])


def test_first_screen_lists_every_fail(
    warned_page: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """At 1280x800 the gate, signer, scope and every FAIL/INCONCLUSIVE reason show, above N/A."""
    shot = SHOTS / "report-first-screen-warned.png"
    boxes = first_screen(warned_page[0], tmp_path / "profile", shot)
    assert_findings_first(boxes, FINDINGS, "WARNED")
    assert all("optional" in boxes["items"][c]["text"] for c in FINDINGS)


def test_a_required_leg_down_does_not_hide_the_fails(tmp_path: Path) -> None:
    """With a whole required leg UNAVAILABLE, every FAIL (required or not) is still on screen."""
    policy_path = write_policy(
        tmp_path / "policy.toml",
        legs=(("linux", "none"), ("linux", "bubblewrap"), ("linux", "docker")),
    )
    required_fail = "bubblewrap-fs_write_outside"
    verdicts = dict(FINDINGS) | {required_fail: "FAIL"}
    verdicts |= {f"docker-{p}": "UNAVAILABLE" for p in CORE_PROBES}
    cells = make_cells(backends=("none", "bubblewrap", "docker", DEMO), verdicts=verdicts)
    for cell in cells:
        verdict = verdicts.get(cell["cell_id"])
        if verdict == "UNAVAILABLE":
            cell["reason"] = "no docker engine answered: start dockerd"
        elif verdict is not None:
            cell["reason"] = f"{verdict}: the host saw it; fix: confine {cell['probe']}"
    report = build_report(tmp_path / "run", policy_path, cells)
    evidence = json.loads((report / "evidence.json").read_text())
    policy = load_policy(policy_path)
    count = count_failures(run_outcomes(evidence, policy))
    assert len(count.gating_not_run) == len(CORE_PROBES)
    page = report / "report.html"
    page.write_text(render_html(evidence, None, policy))
    shot = SHOTS / "report-first-screen-leg-down.png"
    boxes = first_screen(page, tmp_path / "profile", shot)
    assert_findings_first(boxes, {required_fail: "FAIL", **FINDINGS}, "FAILED")
    assert "required" in boxes["items"][required_fail]["text"]
    # summary.md keeps the same order, the leg that is down as one line after the findings.
    summary = render_summary(evidence, None, policy)
    found = summary.index("### Failing the gate (1)")
    warned = summary.index(f"### Warned: optional, not gating ({len(FINDINGS)})")
    down = summary.index(f"### Failing the gate: required but not run ({len(CORE_PROBES)})")
    assert found < warned < down < summary.index("| probe |")
    assert (
        f"- **UNAVAILABLE** docker: {len(CORE_PROBES)} required cells not run: "
        "no docker engine answered: start dockerd ("
    ) in summary


def test_warned_cells_are_open_and_before_cells_not_run(
    warned_page: tuple[Path, dict[str, Any]],
) -> None:
    """Under "Cells", each warned FAIL is open and comes before every UNAVAILABLE one."""
    page = warned_page[0].read_text()
    cells = page[page.index("<section id=cells>") :]
    sections = re.findall(r"<section id='cell-([\w-]+)' class='cell v-(\w+) s-\w+( open)?'", cells)
    order = [cell_id for cell_id, _, _ in sections]
    opened = {cell_id for cell_id, _, is_open in sections if is_open}
    assert set(FINDINGS) <= opened
    first_not_run = min(
        i
        for i, (_, verdict, _) in enumerate(sections)
        if verdict in ("UNAVAILABLE", "NOT_APPLICABLE")
    )
    assert all(order.index(cell_id) < first_not_run for cell_id in FINDINGS)
