"""summary.md: the run in a few lines of Markdown for `$GITHUB_STEP_SUMMARY`.

GitHub refuses a step summary over 1 MiB, so the text is cut at a line boundary to fit what
is left of that budget, with a note saying so. GitHub renders HTML inside summaries, so every
value from evidence is HTML-escaped and table pipes are escaped too.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_attest.report.outcomes import count_failures

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox_attest.report.outcomes import CellOutcome
    from sandbox_attest.report.views.model import ReportView

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub's per-step limit
_MARGIN = 4096  # room for the truncation note and for other tools appending later
TRUNCATED_NOTE = "\n\n_Summary truncated to stay under GitHub's 1 MiB limit; see report.html._\n"


def grid_cell(outcome: CellOutcome | None) -> str:
    """One grid cell in Markdown: the verdict, bold with a star when required, "-" if absent."""
    if outcome is None:
        return "-"
    if outcome.required:
        return f"**{md_cell(outcome.verdict)}**\\*"
    return md_cell(outcome.verdict)


def md_cell(value: object) -> str:
    """`value` as one line of a Markdown table cell: HTML-escaped, pipes escaped, spaces folded."""
    text = html.escape(str(value), quote=False).replace("|", "\\|")
    return " ".join(text.split())


def _listed(o: CellOutcome) -> str:
    """One list line: the cell, required or optional, its status, its one-line reason."""
    return f"- `{md_cell(o.cell_id)}` ({o.mark}, {o.status}): {md_cell(o.message)}"


def _attested(view: ReportView) -> str:
    """What was attested, in one line: platform, harness, backends and policy."""
    ev = view.evidence
    policy = ev.get("policy") or {}
    sandboxes = [b for b in view.backends if b != "none"]
    control = " (with the unconfined control leg `none`)" if "none" in view.backends else ""
    return (
        f"**Attested:** {len(view.outcomes.cells)} cells, {len(view.probes)} probes on "
        f"{md_cell(', '.join(sandboxes) or 'no sandbox')}{control}; platform "
        f"{md_cell((ev.get('platform') or {}).get('system', '?'))}, harness "
        f"{md_cell((ev.get('harness') or {}).get('version', '?'))}, policy "
        f"`{md_cell(policy.get('path', '?'))}` "
        f"(sha256 {md_cell(str(policy.get('sha256', '?'))[:16])}...)."
    )


def _grid(view: ReportView) -> list[str]:
    """The grid (probe x backend, control first) and its legend, demonstrations named."""
    heads = [
        f"{md_cell(b)} (unconfined control)" if b == "none" else md_cell(b) for b in view.backends
    ]
    # A backend in the set to show a verdict says so, with why (matrix.toml, issue 29).
    demos = {
        str(b.get("name")): str(b["demonstration"])
        for b in view.evidence.get("backends") or []
        if b.get("demonstration")
    }
    heads = [
        f"{h} (demonstration)" if b in demos else h
        for b, h in zip(view.backends, heads, strict=True)
    ]
    lines = ["| probe | " + " | ".join(heads) + " |"]
    lines.append("|---" * (len(view.backends) + 1) + "|")
    for probe in view.probes:
        row = [grid_cell(view.outcome(backend, probe)) for backend in view.backends]
        lines.append(f"| {md_cell(probe)} | " + " | ".join(row) + " |")
    lines += ["", "\\* required by the gate (bold); the others are optional.", ""]
    lines += [f"{md_cell(b)} is a demonstration: {md_cell(why)}" for b, why in demos.items()]
    if demos:
        lines.append("")
    return lines


def render_markdown(view: ReportView) -> str:
    """The summary as Markdown, what to act on first (issue 29).

    On top: the gate, who signed, what was attested, the one count line
    (`sandbox_attest.report.outcomes.count_failures`, printed the same in every view), then every
    cell failing the gate and every warned one (FAIL, INCONCLUSIVE, ERROR, required or not)
    with its one-line reason, before the grid; cells not run (UNAVAILABLE, NOT_APPLICABLE)
    come last, folded. No link points into report.html: a GitHub step summary is not next
    to the report, so its anchors would lead nowhere. The words passed / failed / error /
    skipped are the same as in junit.xml.
    """
    ev = view.evidence
    count = count_failures(view.outcomes)
    lines = [
        f"## sandbox-attest: {view.gate.result} (run `{md_cell(ev.get('run_id', ''))}`)",
        "",
        f"**Signature:** {md_cell(view.signature)}",
        "",
        _attested(view),
        "",
        f"**{md_cell(count.line())}**",
        "",
    ]
    if count.gating_found:
        lines += [f"### Failing the gate ({len(count.gating_found)})", ""]
        lines += [_listed(o) for o in count.gating_found]
        lines.append("")
    if count.warned:
        lines += [f"### Warned: optional, not gating ({len(count.warned)})", ""]
        lines += [_listed(o) for o in count.warned]
        lines.append("")
    if count.gating_not_run:
        # After the warned cells, one line per backend and reason: a leg that is down must
        # not push an escape found elsewhere out of sight.
        lines += [f"### Failing the gate: required but not run ({len(count.gating_not_run)})", ""]
        lines += [
            f"- **{md_cell(verdict)}** {md_cell(backend)}: {len(ids)} required "
            f"{'cell' if len(ids) == 1 else 'cells'} not run: {md_cell(reason)} "
            f"({md_cell(', '.join(ids))})"
            for backend, verdict, reason, ids in count.not_run_groups()
        ]
        lines.append("")
    problems = view.outcomes.run_problems
    if problems:
        lines += ["### Run problems", ""]
        lines += [f"- {md_cell(p)}" for p in problems]
        lines.append("")
    lines += _grid(view)
    if count.not_run:
        lines += [
            (
                f"<details><summary>Not run here ({len(count.not_run)}): these cells attest "
                "nothing</summary>"
            ),
            "",
            *(_listed(o) for o in count.not_run),
            "",
            "</details>",
            "",
        ]
    lines.append("Full evidence: `report.html` and `evidence.json` in the report directory.")
    return "\n".join(lines) + "\n"


def fit(text: str, budget: int) -> str:
    """Cut `text` at a line boundary so it and the note fit in `budget` UTF-8 bytes."""
    data = text.encode("utf-8")
    if len(data) <= budget:
        return text
    room = max(0, budget - len(TRUNCATED_NOTE.encode("utf-8")))
    cut = data[:room].decode("utf-8", errors="ignore")
    return cut[: cut.rfind("\n") + 1] + TRUNCATED_NOTE


def summary_text(view: ReportView) -> str:
    """The summary as summary.md holds it: the Markdown, cut to fit one step summary."""
    return fit(render_markdown(view), STEP_SUMMARY_LIMIT - _MARGIN)


def append_step_summary(text: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Append `text` to $GITHUB_STEP_SUMMARY when set, within what is left of its budget.

    Returns:
        The step-summary file appended to, or None when the variable is unset or the file
        has no room left.
    """
    env = os.environ if env is None else env
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    step = Path(target)
    used = step.stat().st_size if step.exists() else 0
    budget = STEP_SUMMARY_LIMIT - _MARGIN - used
    if budget <= len(TRUNCATED_NOTE):
        return None
    with step.open("a", encoding="utf-8") as handle:
        handle.write(fit(text, budget))
    return step
