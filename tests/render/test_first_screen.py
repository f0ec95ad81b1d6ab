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

from sandbox_attest.attest.policy import load_policy
from sandbox_attest.outcomes import count_failures, run_outcomes
from sandbox_attest.render import render_html
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


def test_first_screen_lists_every_fail(
    warned_page: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """At 1280x800 the gate, signer, scope and every FAIL/INCONCLUSIVE reason show, above N/A."""
    page, _ = warned_page
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "report-first-screen-warned.png"
    with Browser(chromium(), tmp_path / "profile") as browser:
        browser.open(page.as_uri())
        browser.screenshot(shot, width=WIDTH, height=HEIGHT)
        assert browser.evaluate("window.innerHeight") == HEIGHT
        assert browser.evaluate("window.scrollY") == 0
        boxes = browser.evaluate(
            """(() => {
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
                  "section.cell.v-UNAVAILABLE, section.cell.v-NOT_APPLICABLE")].map(box);
              return {items, notRun, verdict: box(document.getElementById('verdict')),
                      signature: box(document.getElementById('signature')),
                      attested: box(document.getElementById('attested')),
                      count: box(document.getElementById('count'))};
            })()"""
        )
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    def on_screen(box: dict[str, Any] | None) -> bool:
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

    for name in ("verdict", "signature", "attested", "count"):
        assert on_screen(boxes[name]), (name, boxes[name])
    assert "WARNED" in boxes["verdict"]["text"]
    assert "NOT SIGNED" in boxes["signature"]["text"]
    assert DEMO in boxes["attested"]["text"]
    items = boxes["items"]
    assert set(items) == set(FINDINGS), sorted(items)
    for cell_id, verdict in FINDINGS.items():
        item = items[cell_id]
        assert on_screen(item), (cell_id, item)
        assert item["text"].startswith(verdict), item["text"]
        assert "optional" in item["text"]
        assert "fix: confine" in item["text"], item["text"]
    lowest = max(item["bottom"] for item in items.values())
    assert boxes["notRun"], "the run has cells that were not run"
    assert all(b["top"] > lowest for b in boxes["notRun"])


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
