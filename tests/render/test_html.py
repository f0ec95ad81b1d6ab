"""report.html as the signer wrote it: self-contained, escaped, rendered by a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.attest.subjects import HTML
from tests.render.conftest import HOSTILE

if TYPE_CHECKING:
    from pathlib import Path

INSTALL_HINT = "chromium is missing: install it with `apt-get install -y chromium` (Debian)"


def chromium() -> str:
    """Path of the chromium binary; the test FAILS (never skips) without it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(INSTALL_HINT)
    return path


def run_chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run headless chromium on a local file, with every network feature off."""
    argv = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        # Resolve nothing: the page must not need the network, and no test may reach it.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        *extra,
        page.as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)


class TestStatic:
    def test_self_contained_and_escaped(self, report: Path) -> None:
        """The page has no scripts, no external URLs, and shows hostile stderr only as text."""
        page = (report / HTML).read_text()
        assert "<script" not in page
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
        assert "&lt;script&gt;document.title=" in page
        assert HOSTILE not in page

    def test_sections_present(self, report: Path) -> None:
        """Verdict, signature, backends, grid, control leg and the not-proven section exist."""
        page = (report / HTML).read_text()
        for marker in (
            "id=verdict",
            "id=signature",
            "id=backends",
            "id=grid",
            "id=control",
            "id=not-proven",
            "Overall: FAILED",
            "signed with a provided Ed25519 key",
            "ed25519 only",
        ):
            assert marker in page, marker


class TestBrowser:
    def test_grid_and_failing_cell_render(self, report: Path, tmp_path: Path) -> None:
        """Chromium renders the grid with verdict classes and the failing cell's evidence."""
        page = report / HTML
        done = run_chromium(page, tmp_path / "profile-dom", "--dump-dom")
        assert done.returncode == 0, done.stderr[-2000:]
        dom = done.stdout
        assert '<table id="grid">' in dom
        cells = re.findall(r'<td class="v-(\w+) s-(\w+)[^"]*" data-cell="([\w-]+)"', dom)
        assert len(cells) == 21
        # The policy requires none and bubblewrap: the FAIL there is a failure; docker is
        # optional, so its UNAVAILABLE cell is skipped (sandbox_attest/report/outcomes.py).
        assert ("FAIL", "failed", "bubblewrap-fs_write_outside") in cells
        assert ("UNAVAILABLE", "skipped", "docker-dns_resolution") in cells
        # The grid cell links to the cell's own section, which is open because it FAILed.
        assert 'href="#cell-bubblewrap-fs_write_outside"' in dom
        failing = dom[dom.index('<section id="cell-bubblewrap-fs_write_outside"') :]
        assert failing.startswith(
            '<section id="cell-bubblewrap-fs_write_outside" class="cell v-FAIL s-failed open"'
        )
        # Up to the next cell's section (or the end of the cells), so only this cell is read.
        after = re.search(r'<section[^>]*class="cell v-', failing[1:])
        failing = failing[: after.start() + 1 if after else failing.index("</section>")]
        assert "canary ~/.bashrc changed" in failing
        assert "/home/u/.bashrc" in failing
        assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in failing
        # The hostile markup never became elements: no script ran, the title is ours.
        assert "<script" not in dom
        assert "pwned" not in dom[: dom.index("</title>")]

    def test_screenshot(self, report: Path, tmp_path: Path) -> None:
        """Chromium takes a screenshot of the page (kept in the test's tmp dir for a human)."""
        page = report / HTML
        shot = tmp_path / "report.png"
        done = run_chromium(
            page,
            tmp_path / "profile-shot",
            f"--screenshot={shot}",
            "--window-size=1400,1800",
            "--hide-scrollbars",
        )
        assert done.returncode == 0, done.stderr[-2000:]
        data = shot.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(data) > 20_000


def test_header_names_the_world_and_the_trust_domains() -> None:
    """The run table says which world the fakes lived in and who ran the judged code."""
    from sandbox_attest.report.views import render_html  # noqa: PLC0415

    evidence = {
        "schema": "sandbox-attest/evidence/v1",
        "run_id": "r1",
        "complete": True,
        "cells": [],
        "platform": {"system": "linux"},
        "world": {"kind": "lab", "reason": "fixture hosts in a namespace of their own"},
        "trust_domains": {"separated": False, "reason": "the harness is not root"},
    }
    page = render_html(evidence, None, None)
    assert "<th>world</th><td>lab:" in page
    assert "NOT separated</td>" not in page  # the reason follows the word
    assert "NOT separated: the harness is not root" in page
