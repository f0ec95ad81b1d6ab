"""A release's own pages: report.html and summary.md of a merged directory, every leg side by side.

`merge` copies each leg's report under `legs/NN-<dir>/` and signs one statement over them;
these two pages are the release's front door. They show the merged gate (the one the merge
signs) and every leg's grid in one table, each cell linking to its evidence in that leg's own
report.html, and they map each cell through `report.outcomes` exactly as the legs' pages,
JUnit and Allure do, with the policy the merge judged. So a cell reads "failed" here exactly
when the merged gate fails it.

They are rendered in memory, before signing, from the verified legs (`Verification.evidence`,
the bytes the merge copies), never from files on disk, and are signed subjects of the merged
statement themselves. They do not verify anything: they say who signs and point at
`sandbox-attest verify`.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from sandbox_attest.report.outcomes import CellOutcome, RunOutcomes, run_outcomes
from sandbox_attest.report.policy import CONTROL_BACKEND
from sandbox_attest.report.views.html import CSS, anchor
from sandbox_attest.report.views.model import signature_sentence
from sandbox_attest.report.views.summary import (
    STEP_SUMMARY_LIMIT,
    fit,
    grid_cell,
    md_cell,  # one escaping rule for every summary
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from sandbox_attest.report.policy import Gate, Policy
    from sandbox_attest.report.signature import SignerFacts

__all__ = [
    "LegView",
    "ReleaseView",
    "release_view",
    "render_release_html",
    "render_release_summary",
]

_MARGIN = 4096  # as summary.md: room for the truncation note and later appends


@dataclass(frozen=True)
class LegView:
    """One leg of a release as its pages show it; get them from `release_view`.

    Attributes:
        label: `NN-<dir>`, the leg's directory under `legs/`.
        run_id: the leg's run id.
        outcomes: its cells through the one verdict mapping, under the release policy.
        backends: its grid columns, the control leg first.
        carried: backends whose cells ride along with this leg (the control leg `none`,
            unless the release expects it as a leg of its own); the merged gate names their
            cells `...@<label>`.
    """

    label: str
    run_id: str
    outcomes: RunOutcomes
    backends: tuple[str, ...]
    carried: frozenset[str]

    def outcome(self, backend: str, probe: str) -> CellOutcome | None:
        """The outcome for one grid position of this leg, if it has one."""
        for o in self.outcomes.cells:
            if o.backend == backend and o.probe == probe:
                return o
        return None

    def link(self, name: str = "report.html") -> str:
        """A relative link to one of this leg's copied files."""
        return f"legs/{self.label}/{name}"

    def gate_name(self, o: CellOutcome) -> str:
        """The name the merged gate gives this cell (`platform:cell_id`, `@label` if carried)."""
        carried = f"@{self.label}" if o.backend in self.carried else ""
        return f"{o.platform}:{o.cell_id}{carried}"


@dataclass(frozen=True)
class ReleaseView:
    """What both release pages show: the merged gate, who signs, and every leg."""

    gate: Gate
    signature: str
    legs: tuple[LegView, ...]
    probes: tuple[str, ...]
    policy_path: str
    policy_sha256: str


def release_view(
    legs: Sequence[tuple[str, Mapping[str, Any]]],
    gate: Gate,
    policy: Policy,
    signer: SignerFacts | None,
    *,
    control_is_leg: bool = False,
) -> ReleaseView:
    """The view of a release from its verified legs' evidence and the merged gate.

    Args:
        legs: (label, parsed evidence.json) of each leg, in merge order.
        gate: the merged gate (`sandbox_attest.attest.legs.combine`), the one the merge signs.
        policy: the release policy every leg was judged with.
        signer: who signs the merge (None: not signed).
        control_is_leg: the expect-legs file lists a `none` leg itself, so its cells are
            not carried by the leg that ran them.
    """
    views: list[LegView] = []
    probes: list[str] = []
    for label, evidence in legs:
        outcomes = run_outcomes(evidence, policy)
        backends: list[str] = []
        for o in outcomes.cells:
            if o.backend not in backends:
                backends.append(o.backend)
            if o.probe not in probes:
                probes.append(o.probe)
        backends.sort(key=lambda b: (b != CONTROL_BACKEND, b))
        carried = frozenset() if control_is_leg else frozenset({CONTROL_BACKEND})
        views.append(
            LegView(label, str(evidence.get("run_id", "")), outcomes, tuple(backends), carried)
        )
    return ReleaseView(
        gate=gate,
        signature=signature_sentence(signer),
        legs=tuple(views),
        probes=tuple(probes),
        policy_path=policy.path,
        policy_sha256=policy.sha256,
    )


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _leg_heads(view: ReleaseView) -> tuple[str, str]:
    top = "".join(
        f"<th colspan={len(leg.backends)} class=leg>{_e(leg.label)}<br>"
        f"<a href='{_e(leg.link())}'>report</a> &middot; "
        f"<a href='{_e(leg.link('summary.md'))}'>summary</a>"
        f"<br><span class=small>run {_e(leg.run_id)}</span></th>"
        for leg in view.legs
    )
    second = "".join(
        f"<th>{_e(b)}"
        + ("<br><span class='badge control'>unconfined control</span>" if b == "none" else "")
        + "</th>"
        for leg in view.legs
        for b in leg.backends
    )
    return top, second


def _grid(view: ReleaseView) -> str:
    top, second = _leg_heads(view)
    rows = []
    for probe in view.probes:
        tds = []
        all_pass = True
        for leg in view.legs:
            for backend in leg.backends:
                o = leg.outcome(backend, probe)
                if o is None:
                    tds.append("<td class=v-none>no cell</td>")
                    continue
                all_pass = all_pass and o.verdict == "PASS"
                mark = "<sup title='required by the gate'>req</sup>" if o.required else ""
                # A missing cell has no section in the leg's page: link the leg's grid.
                target = f"#{anchor(o.cell_id)}" if o.cell is not None else "#grid"
                tds.append(
                    f"<td class='v-{_e(o.verdict)} s-{o.status}"
                    f"{' optional' if not o.required else ''}{' control' if o.control else ''}' "
                    f"data-cell='{_e(leg.label)}/{_e(o.cell_id)}' "
                    f"data-gate-name='{_e(leg.gate_name(o))}' data-verdict='{_e(o.verdict)}' "
                    f"data-status='{o.status}'><a href='{_e(leg.link())}{_e(target)}' "
                    f"title='{_e(o.message or o.verdict)}'>{_e(o.verdict)}</a>{mark}</td>"
                )
        css = " class=all-pass" if all_pass else ""
        rows.append(f"<tr{css}><th>{_e(probe)}</th>{''.join(tds)}</tr>")
    return (
        "<p><label><input type=checkbox id=only-nonpass> show only probes that did not PASS "
        "everywhere</label></p>"
        f"<table id=grid><tr><th rowspan=2>probe \\ leg</th>{top}</tr><tr>{second}</tr>"
        f"{''.join(rows)}</table>"
        "<p class=small><sup>req</sup> marks a cell the release policy requires to PASS; the "
        "others are optional: a non-PASS there makes the gate WARNED, not FAILED. Each verdict "
        "links to its cell in that leg's own report.</p>"
    )


def _not_passing(view: ReleaseView) -> list[tuple[LegView, CellOutcome]]:
    return [
        (leg, o)
        for leg in view.legs
        for o in leg.outcomes.cells
        if o.status != "passed" and o.verdict != "NOT_APPLICABLE"
    ]


def render_release_html(view: ReleaseView) -> str:
    """The release's report.html: the merged gate, every leg's grid, links to the legs' pages."""
    gate = view.gate
    problems = "".join(f"<li>{_e(p)}</li>" for p in gate.problems)
    bad = "".join(
        f"<li><a href='{_e(leg.link())}#{_e(anchor(o.cell_id)) if o.cell else 'grid'}'>"
        f"{_e(leg.label)}: {_e(o.cell_id)}</a> ({o.mark}, {_e(o.status)}): {_e(o.message)}</li>"
        for leg, o in _not_passing(view)
    )
    legs = "".join(
        f"<tr><td><a href='{_e(leg.link())}'>{_e(leg.label)}</a></td><td>{_e(leg.run_id)}</td>"
        f"<td>{_e(', '.join(leg.backends))}</td>"
        f"<td>{_e(', '.join(f'{n} {k}' for k, n in leg.outcomes.counts().items()))}</td></tr>"
        for leg in view.legs
    )
    untrusted = "untrusted" in view.signature or view.signature.startswith("NOT SIGNED")
    return f"""<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8>
<meta name=viewport content="width=device-width,initial-scale=1">
<title>sandbox-attest release: {_e(gate.result)}</title>
<style>{CSS}</style></head><body>
<h1>sandbox-attest release</h1>
<div id=verdict class="banner g-{_e(gate.result)}">Release gate: {_e(gate.result)}
({len(view.legs)} {"leg" if len(view.legs) == 1 else "legs"} merged)
{f"<ul>{problems}</ul>" if problems else ""}</div>
<div id=signature class="sig{" untrusted" if untrusted else ""}">Signature: {_e(view.signature)}
</div>
<p>Policy: {_e(view.policy_path)} <span class=small>sha256 {_e(view.policy_sha256)}</span></p>
<h2>Legs</h2>
<table id=legs><tr><th>leg</th><th>run</th><th>backends</th><th>cells</th></tr>{legs}</table>
<h2>Probe &times; leg &times; backend</h2>
{_grid(view)}
<h2>Not passing</h2>
{f"<ul id=not-passing>{bad}</ul>" if bad else "<p id=not-passing>Every cell passed.</p>"}
<p class=small>Each leg's page, summary, JUnit, Allure results and attestation are copied, byte
for byte as verified, under <code>legs/</code>. Trust comes from
<code>sandbox-attest verify</code> of this directory with a key you trust.</p>
</body></html>
"""


def render_release_summary(view: ReleaseView) -> str:
    """The release's summary.md: the merged gate, the grid of every leg, what did not pass.

    Cut to fit one GitHub step summary, as a leg's summary.md is.
    """
    lines = [
        (
            f"## sandbox-attest release: {view.gate.result} ({len(view.legs)} "
            f"{'leg' if len(view.legs) == 1 else 'legs'} merged)"
        ),
        "",
        f"**Signature:** {md_cell(view.signature)}",
        "",
        "Full release page: `report.html`. Legs: "
        + ", ".join(
            f"[{md_cell(leg.label)}]({leg.link()}) ([summary]({leg.link('summary.md')}))"
            for leg in view.legs
        )
        + ".",
        "",
    ]
    lines += [f"- {md_cell(p)}" for p in view.gate.problems]
    if view.gate.problems:
        lines.append("")
    heads = [
        f"{md_cell(leg.label)}: {md_cell(b)}" + (" (unconfined control)" if b == "none" else "")
        for leg in view.legs
        for b in leg.backends
    ]
    lines.append("| probe | " + " | ".join(heads) + " |")
    lines.append("|---" * (len(heads) + 1) + "|")
    for probe in view.probes:
        row = [
            grid_cell(leg.outcome(backend, probe)) for leg in view.legs for backend in leg.backends
        ]
        lines.append(f"| {md_cell(probe)} | " + " | ".join(row) + " |")
    lines += ["", "\\* required by the release policy (bold); the others are optional.", ""]
    bad = _not_passing(view)
    if bad:
        lines += ["### Not passing", ""]
        lines += [
            f"- `{md_cell(leg.label)}/{md_cell(o.cell_id)}` ({o.mark}, {o.status}): "
            f"{md_cell(o.message)} "
            f"([evidence]({leg.link()}#{anchor(o.cell_id) if o.cell else 'grid'}))"
            for leg, o in bad
        ]
    return fit("\n".join(lines) + "\n", STEP_SUMMARY_LIMIT - _MARGIN)
