"""summary.md: the gate, the grid in Markdown, escaping, and GitHub's 1 MiB budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox_attest.attest.subjects import SUMMARY
from sandbox_attest.report.views.summary import (
    STEP_SUMMARY_LIMIT,
    TRUNCATED_NOTE,
    append_step_summary,
    fit,
)

if TYPE_CHECKING:
    from pathlib import Path


class TestSummary:
    def test_content(self, report: Path) -> None:
        """The summary names the gate, signer, grid (required marked), and the failing reason."""
        text = (report / SUMMARY).read_text()
        assert text.startswith("## sandbox-attest: FAILED")
        assert "signed with a provided Ed25519 key" in text
        assert "| probe | none (unconfined control) | bubblewrap | docker |" in text
        assert "| net_denied_host | **PASS**\\* | **PASS**\\* | PASS |" in text
        assert (
            "- `bubblewrap-fs_write_outside` (required, failed): FAIL: escape observed by the "
            "host: canary ~/.bashrc changed\n"
        ) in text
        assert "`docker-dns_resolution` (optional, skipped): UNAVAILABLE:" in text

    def test_failures_on_top_and_no_dead_anchors(self, report: Path) -> None:
        """Failing cells are listed above the grid, not-run ones below, with no link to anchors."""
        text = (report / SUMMARY).read_text()
        grid = text.index("| probe |")
        assert text.index("### Failing the gate") < grid
        assert text.index("`bubblewrap-fs_write_outside` (required, failed)") < grid
        assert text.index("`docker-dns_resolution` (optional, skipped): UNAVAILABLE") > grid
        assert "**Attested:**" in text[:grid]
        assert "**cells: " in text[:grid]
        assert "report.html#" not in text
        assert "](#" not in text  # nor a same-page link: GitHub renames a summary's anchors

    def test_appends_to_step_summary(self, report: Path, tmp_path: Path) -> None:
        """With $GITHUB_STEP_SUMMARY set, the summary is appended after what is already there."""
        step = tmp_path / "step.md"
        step.write_text("earlier step\n")
        assert append_step_summary(
            (report / SUMMARY).read_text(), {"GITHUB_STEP_SUMMARY": str(step)}
        )
        content = step.read_text()
        assert content.startswith("earlier step\n## sandbox-attest: FAILED")

    def test_unset_step_summary_is_left_alone(self, report: Path) -> None:
        """Without $GITHUB_STEP_SUMMARY nothing is appended anywhere."""
        assert append_step_summary((report / SUMMARY).read_text(), {}) is None

    def test_stays_under_the_limit(self, report: Path, tmp_path: Path) -> None:
        """A step summary already near 1 MiB only gets what fits, cut with a note."""
        step = tmp_path / "step.md"
        step.write_text("x" * (STEP_SUMMARY_LIMIT - 4096 - 600) + "\n")
        append_step_summary((report / SUMMARY).read_text(), {"GITHUB_STEP_SUMMARY": str(step)})
        assert step.stat().st_size < STEP_SUMMARY_LIMIT
        assert step.read_text().endswith(TRUNCATED_NOTE)

    def test_fit_cuts_on_a_line_boundary(self) -> None:
        """fit() keeps whole lines and adds the note when the text is too long."""
        text = "".join(f"line {i}\n" for i in range(10_000))
        cut = fit(text, 1000)
        assert len(cut.encode()) <= 1000
        assert cut.endswith(TRUNCATED_NOTE)
        assert cut[: -len(TRUNCATED_NOTE)].endswith("\n")
        assert fit("short\n", 1000) == "short\n"

    def test_values_are_escaped(self, report: Path) -> None:
        """A pipe in a reason does not break the table and HTML is escaped."""
        text = (report / SUMMARY).read_text()
        assert "<script" not in text
