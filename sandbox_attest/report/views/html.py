"""report.html: one self-contained page for a security reviewer.

No network fetches, no scripts: inline CSS, `:target` to open and highlight the cell a grid
link points at, `<details>` for the raw JSON and a checkbox with `:has()` to filter the
non-PASS cells, so the file opens the same from an artifact download, an air-gapped machine
or a mail attachment. Every value
from evidence goes through `html.escape`: evidence carries probe output, and a hostile
payload's stderr must render as text, never as markup.
"""

from __future__ import annotations

import json
from html import escape
from typing import TYPE_CHECKING, Any

from sandbox_attest.report.outcomes import count_failures, one_line

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox_attest.report.outcomes import CellOutcome
    from sandbox_attest.report.views.model import ReportView

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#1b1b1b;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em} h2{font-size:1.15em;margin-top:1.6em}
.banner{padding:.7em 1em;border-radius:6px;font-weight:600;margin:.5em 0}
.g-PASSED{background:#d7f5dd} .g-WARNED{background:#fff2c6} .g-FAILED{background:#fbd3d0}
.sig{padding:.5em 1em;border-left:4px solid #888;background:#f4f4f4}
.sig.untrusted{border-color:#c60;background:#fff0e0}
table{border-collapse:collapse;margin:.4em 0} th,td{border:1px solid #ccc;padding:.3em .5em;
vertical-align:top;text-align:left} th{background:#f0f0f0}
#grid td{min-width:7em} #grid a{color:inherit;font-weight:600;text-decoration:none}
section.cell{border:1px solid #ccc;border-radius:4px;margin:.3em 0;padding:.2em .5em}
section.cell h3{font-size:1em;margin:.2em 0} section.cell .body{display:none}
section.cell.open .body,section.cell:target .body{display:block}
section.cell:target{outline:3px solid #1a5fb4;box-shadow:0 0 0 6px #c9dcf7}
.badge{font-size:11px;border-radius:3px;padding:0 .35em;border:1px solid #888;font-weight:600}
.badge.required{background:#1b1b1b;color:#fff} .badge.optional{background:#fff;color:#555}
.badge.control{background:#fff;color:#7a4b00;border-color:#c60}
#grid td.optional{opacity:.75} #grid td.control{background-image:repeating-linear-gradient(
45deg,transparent 0 6px,rgba(0,0,0,.06) 6px 12px)} #grid sup{font-size:9px;margin-left:.2em}
body:has(#only-nonpass:checked) #grid tr.all-pass,
body:has(#only-nonpass:checked) section.cell.v-PASS{display:none}
table.facts th{font-weight:400;color:#444;background:#f7f7f7}
.v-PASS{background:#c8efcf} .v-FAIL{background:#f6b5ae} .v-INCONCLUSIVE{background:#ffe7a3}
.v-ERROR{background:#f3c1f0} .v-UNAVAILABLE{background:#e2e2e2} .v-NOT_APPLICABLE{background:#eef}
.v-MISSING{background:#f3c1f0;font-style:italic} .v-none{background:#fff;color:#999}
summary{cursor:pointer;font-weight:600} pre{white-space:pre-wrap;word-break:break-all;
max-height:24em;overflow:auto;background:#fafafa;border:1px solid #ddd;padding:.4em;font-size:12px}
dl{margin:.3em 0} dt{font-weight:600;margin-top:.3em} dd{margin:0 0 0 1em}
.small{font-size:12px;color:#555}
#attention ul{padding-left:0;list-style:none;margin:.3em 0} #attention li{margin:.15em 0;
padding:.15em .5em;border-radius:3px} #attention h2{margin-top:.6em} #attested{margin:.4em 0}
"""

CSS = _CSS  # the release page (sandbox_attest/report/views/release.py) looks the same

NOT_PROVEN = (
    (
        "It tests only the probes listed in the grid, on this machine, at this time, with the "
        "backend versions and profiles recorded above. Another kernel, version or profile is "
        "another claim."
    ),
    (
        "A PASS means the attempted escape was refused and a working witness saw nothing; it does "
        "not mean no other escape exists. Escapes the catalogue does not attempt (side channels, "
        "kernel exploits, timing, covert storage) are not covered."
    ),
    (
        "The outside world was a fake on loopback. Behaviour against real networks, real DNS "
        "resolvers or real package indexes was not observed."
    ),
    (
        "UNAVAILABLE and NOT_APPLICABLE cells were not run; INCONCLUSIVE and ERROR cells prove "
        "nothing either way."
    ),
    (
        "The signature proves who signed this evidence and that it was not changed since; it does "
        "not make the harness or the signer trustworthy. Trust comes from `sandbox-attest verify` "
        "with a key you trust."
    ),
)


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _json(value: object) -> str:
    return _e(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str))


def plain(value: object) -> str:
    """A value in plain words: yes/no for booleans, "none" for null, lists joined by commas.

    Evidence holds JSON; a reviewer should read "available: no", not Python's `False`.
    """
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if value is None or value in ("", [], {}):
        return "none"
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {plain(v)}" for k, v in value.items())
    return str(value)


def _facts_table(value: object, css: str) -> str:
    """A dict as a two-column table (nested dicts flattened as a.b), in plain words."""
    rows: list[tuple[str, object]] = []

    def walk(prefix: str, node: object) -> None:
        if isinstance(node, dict) and node:
            for key, child in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), child)
        else:
            rows.append((prefix or "value", node))

    walk("", value)
    if not rows or rows == [("value", {})]:
        return "<p class=small>nothing recorded</p>"
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(plain(v))}</td></tr>" for k, v in rows)
    return f"<table class={css}>{body}</table>"


_ATTEMPT_COLUMNS = (
    ("attempt", "what"),
    ("role", "role"),
    ("outcome", "outcome"),
    ("errno", "errno"),
    ("status", "status"),
    ("what the host saw", "detail"),
)


def _attempts(cell: Mapping[str, Any]) -> str:
    rows = "".join(
        "<tr>" + "".join(f"<td>{_e(plain(a.get(k)))}</td>" for _, k in _ATTEMPT_COLUMNS) + "</tr>"
        for a in cell.get("attempts") or []
        if isinstance(a, dict)
    )
    if not rows:
        return "<p class=small>no attempts recorded</p>"
    head = "".join(f"<th>{h}</th>" for h, _ in _ATTEMPT_COLUMNS)
    return f"<table class=attempts><tr>{head}</tr>{rows}</table>"


def anchor(cell_id: str) -> str:
    """The id of a cell's section: the grid links to `#<anchor>`."""
    return "cell-" + cell_id


def _badge(o: CellOutcome) -> str:
    text = "required" if o.required else "optional"
    return f"<span class='badge {text}'>{text}</span>"


def _cell_section(o: CellOutcome) -> str:
    cell: Mapping[str, Any] = o.cell or {}
    run = cell.get("run") or {}
    verdict = o.verdict
    opened = " open" if o.status in ("failed", "error") or o.warned else ""
    control = " <span class='badge control'>unconfined control</span>" if o.control else ""
    head = (
        f"<h3><a href='#{_e(anchor(o.cell_id))}'>{_e(o.cell_id)}</a>: "
        f"<span class=verdict>{_e(verdict)}</span> {_badge(o)}{control}"
        f" <span class=small>shown as {_e(o.status)}</span></h3>"
    )
    if o.cell is None:
        body = f"<p class=reason>{_e(o.detail)}</p>"
    else:
        timing = (
            f"took {_e(plain(run.get('duration_s', '?')))} s, exit code "
            f"{_e(plain(run.get('exit_code')))}, timed out: {_e(plain(run.get('timed_out')))}, "
            f"started: {_e(plain(run.get('started')))}"
        )
        body = (
            f"<p class=reason>{_e(o.detail or 'no reason recorded')}</p>"
            "<table class=expect>"
            f"<tr><th>expected</th><td>{_e(plain(cell.get('expected')))}</td></tr>"
            f"<tr><th>observed</th><td>{_e(plain(cell.get('observed')))}</td></tr>"
            f"<tr><th>timing</th><td>{timing}</td></tr></table>"
            f"<h4>Attempts (errno and status)</h4>{_attempts(cell)}"
            f"<h4>What the host witnessed</h4>{_facts_table(cell.get('witness') or {}, 'facts')}"
            f"<h4>Control</h4>{_facts_table(cell.get('control') or {}, 'facts')}"
            f"<details class=raw><summary>raw evidence (JSON)</summary><pre>{_json(cell)}</pre>"
            "</details>"
        )
    return (
        f"<section id='{_e(anchor(o.cell_id))}' class='cell v-{_e(verdict)} s-{o.status}"
        f"{opened}' data-cell='{_e(o.cell_id)}' data-status='{o.status}'>{head}"
        f"<div class=body>{body}<p><a class=back href='#grid'>&uarr; back to the grid</a></p>"
        "</div></section>"
    )


def _demonstrations(view: ReportView) -> dict[str, str]:
    """Backends in the run to show a verdict (matrix.toml's `demonstration`), with why."""
    return {
        str(b.get("name")): str(b["demonstration"])
        for b in view.evidence.get("backends") or []
        if b.get("demonstration")
    }


def _grid(view: ReportView) -> str:
    demos = _demonstrations(view)
    head = "".join(
        f"<th>{_e(b)}"
        + ("<br><span class='badge control'>unconfined control</span>" if b == "none" else "")
        # Its FAIL is on purpose: the badge and its title say so before anyone reads it as news.
        + (
            f"<br><span class='badge demo' title='{_e(demos[b])}'>demonstration</span>"
            if b in demos
            else ""
        )
        + "</th>"
        for b in view.backends
    )
    rows = []
    for probe in view.probes:
        tds = []
        all_pass = True
        for backend in view.backends:
            o = view.outcome(backend, probe)
            if o is None:
                tds.append("<td class=v-none>no cell</td>")
                continue
            all_pass = all_pass and o.verdict == "PASS"
            mark = "<sup title='required by the gate'>req</sup>" if o.required else ""
            tds.append(
                f"<td class='v-{_e(o.verdict)} s-{o.status}"
                f"{' optional' if not o.required else ''}{' control' if o.control else ''}' "
                f"data-cell='{_e(o.cell_id)}' data-verdict='{_e(o.verdict)}' "
                f"data-status='{o.status}'><a href='#{_e(anchor(o.cell_id))}'>"
                f"{_e(o.verdict)}</a>{mark}</td>"
            )
        css = " class=all-pass" if all_pass else ""
        rows.append(f"<tr{css}><th>{_e(probe)}</th>{''.join(tds)}</tr>")
    return (
        "<p><label><input type=checkbox id=only-nonpass> show only cells that did not PASS"
        "</label></p>"
        f"<table id=grid><tr><th>probe \\ backend</th>{head}</tr>{''.join(rows)}</table>"
        "<p class=small><sup>req</sup> marks a cell the gate requires to PASS; the others are "
        "optional: a non-PASS there makes the gate WARNED, not FAILED.</p>"
    )


def _cells(view: ReportView) -> str:
    """Every cell's evidence: failing the gate, then warned (both open), passed, not run."""
    count = count_failures(view.outcomes)
    passed = sorted(count.passed, key=lambda o: o.control)
    outcomes = [*count.gating_found, *count.warned, *passed, *count.gating_not_run, *count.not_run]
    return "<section id=cells>" + "".join(_cell_section(o) for o in outcomes) + "</section>"


def _attention_item(o: CellOutcome) -> str:
    control = " <span class='badge control'>unconfined control</span>" if o.control else ""
    return (
        f"<li class='v-{_e(o.verdict)}' data-cell='{_e(o.cell_id)}' data-status='{o.status}'>"
        f"<strong>{_e(o.verdict)}</strong> <a href='#{_e(anchor(o.cell_id))}'>{_e(o.cell_id)}</a>"
        f" {_badge(o)}{control}: <span class=reason>{_e(one_line(o.detail or o.message))}</span>"
        "</li>"
    )


def _attention(view: ReportView) -> str:
    """The first screen's list: every cell failing the gate, then every warned one, open.

    Issue 29: a WARNED page listed its one FAIL as the 29th collapsed cell, after the
    UNAVAILABLE ones. Here each FAIL, INCONCLUSIVE, ERROR and MISSING cell, required or
    not, is one line with its reason (which carries the fix), above everything else.
    """
    count = count_failures(view.outcomes)
    parts = [f"<p id=count><strong>{_e(count.line())}</strong></p>"]
    found = count.gating_found
    if found:
        parts.append(
            f"<h2 id=gating-head>Failing the gate ({len(found)})</h2><ul id=gating>"
            + "".join(_attention_item(o) for o in found)
            + "</ul>"
        )
    if count.warned:
        parts.append(
            f"<h2 id=warned-head>Warned: optional, not gating ({len(count.warned)})</h2>"
            "<ul id=warned>" + "".join(_attention_item(o) for o in count.warned) + "</ul>"
        )
    if count.gating_not_run:
        # One line per backend and reason: a leg that is down is one fact, not 25.
        items = "".join(
            f"<li class='v-{_e(verdict)}' data-cells='{_e(' '.join(ids))}'><strong>"
            f"{_e(verdict)}</strong> {_e(backend)}: {len(ids)} required "
            f"{'cell' if len(ids) == 1 else 'cells'} not run: "
            f"<span class=reason>{_e(reason)}</span></li>"
            for backend, verdict, reason, ids in count.not_run_groups()
        )
        parts.append(
            f"<h2 id=gating-not-run-head>Failing the gate: required but not run "
            f"({len(count.gating_not_run)})</h2><ul id=gating-not-run>{items}</ul>"
        )
    if not count.attention:
        parts.append("<p>No cell failed or warned.</p>")
    return "<section id=attention>" + "".join(parts) + "</section>"


def _backends(view: ReportView) -> str:
    rows = []
    for b in view.evidence.get("backends") or []:
        ident = b.get("identity") or {}
        name = str(b.get("name"))
        label = " (unconfined control)" if name == "none" else ""
        if b.get("demonstration"):
            label += f" (demonstration: {b['demonstration']})"
        rows.append(
            "<tr>"
            f"<td>{_e(name)}{label}</td><td>{_e(plain(bool(b.get('available'))))}</td>"
            f"<td>{_e(ident.get('version', ''))}</td><td>{_e(ident.get('platform', ''))}</td>"
            f"<td>{_e(plain(ident.get('policy') or {}))}</td>"
            f"<td class=small>{_e(ident.get('profile_digest', ''))}</td>"
            f"<td>{_e(b.get('reason', ''))}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "backend",
            "available",
            "version",
            "platform",
            "declared claims",
            "profile",
            "reason",
        )
    )
    return f"<table id=backends><tr>{head}</tr>{''.join(rows)}</table>"


def _control(view: ReportView) -> str:
    cells = [o for o in view.outcomes.cells if o.control]
    if not cells:
        return (
            "<p><strong>No control leg ran.</strong> Without it nothing shows the probes can see "
            "an escape on an open host, so every denial in this report is unproven.</p>"
        )
    rows = "".join(
        f"<tr><td><a href='#{_e(anchor(o.cell_id))}'>{_e(o.probe)}</a></td>"
        f"<td class='v-{_e(o.verdict)}'>{_e(o.verdict)}</td></tr>"
        for o in cells
    )
    return (
        "<p>The <code>none</code> backend is the <strong>unconfined control</strong>: it runs "
        "every probe with nothing confining it, so there the escape is the expected outcome. "
        "A PASS here proves the probe can see what it tests; each row links to its cell.</p>"
        f"<table id=control><tr><th>probe</th><th>verdict</th></tr>{rows}</table>"
    )


def _not_proven(view: ReportView) -> str:
    items = list(NOT_PROVEN)
    skipped = [
        f"{o.cell_id} ({o.verdict}: {o.detail})"
        for o in view.outcomes.cells
        if o.verdict in ("UNAVAILABLE", "NOT_APPLICABLE", "INCONCLUSIVE", "ERROR", "MISSING")
    ]
    if skipped:
        items.append("In this run, these cells prove nothing: " + "; ".join(skipped))
    if view.untrusted:
        items.append(
            "This report was signed by an untrusted local key: the signature ties it to this "
            "machine's key file only, not to any identity a release can trust."
        )
    if not view.signed:
        items.append("This report is not signed: anyone could have edited it.")
    return "<ul id=not-proven>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>"


def render_page(view: ReportView) -> str:
    """The whole page as a string."""
    ev = view.evidence
    platform = ev.get("platform") or {}
    policy = ev.get("policy") or {}
    gate = view.gate
    # Only what no cell carries: each cell's problem is a line of the list below the banner.
    problems = "".join(f"<li>{_e(p)}</li>" for p in view.outcomes.run_problems)
    sandboxes = ", ".join(b for b in view.backends if b != "none") or "no sandbox"
    control_leg = " and the unconfined control leg (none)" if "none" in view.backends else ""
    sig_class = "sig untrusted" if view.untrusted or not view.signed else "sig"
    where = " ".join(str(platform.get(k, "")) for k in ("system", "release", "machine"))
    harness_version = (ev.get("harness") or {}).get("version", "?")
    policy_digest = f"<span class=small>sha256 {_e(policy.get('sha256', '?'))}</span>"
    world_value, trust_value = ev.get("world"), ev.get("trust_domains")
    world: dict[str, Any] = world_value if isinstance(world_value, dict) else {}
    trust: dict[str, Any] = trust_value if isinstance(trust_value, dict) else {}
    commit = (ev.get("harness") or {}).get("commit") or "none recorded"
    return f"""<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8>
<meta name=viewport content="width=device-width,initial-scale=1">
<title>sandbox-attest report {_e(ev.get("run_id", ""))}</title>
<style>{_CSS}</style></head><body>
<h1>sandbox-attest report <code>{_e(ev.get("run_id", ""))}</code></h1>
<div id=verdict class="banner g-{_e(gate.result)}">Overall: {_e(gate.result)}
{f"<ul>{problems}</ul>" if problems else ""}</div>
<div id=signature class="{sig_class}">Signature: {_e(view.signature)}</div>
<p id=attested>Attested: {len(view.outcomes.cells)} cells, {len(view.probes)} probes on
 {_e(sandboxes)}{control_leg}; {_e(where)}; policy {_e(policy.get("path", "?"))}.</p>
{_attention(view)}
<h2>Run</h2>
<table id=run>
<tr><th>platform</th><td>{_e(where)}
 (python {_e(platform.get("python", "?"))})</td></tr>
<tr><th>harness version</th><td>{_e(harness_version)} (commit {_e(commit)})</td></tr>
<tr id=world><th>world</th><td>{_e(world.get("kind", "not recorded"))}:
 {_e(world.get("reason", ""))}</td></tr>
<tr id=trust><th>trust domains</th><td>{
        _e("separated" if trust.get("separated") else "NOT separated")
    }: {_e(trust.get("reason", "not recorded"))}</td></tr>
<tr><th>started / finished</th><td>{_e(ev.get("started_at", "?"))} /
 {_e(ev.get("finished_at", "?"))} (complete: {_e(plain(ev.get("complete") is True))})</td></tr>
<tr><th>policy</th><td>{_e(policy.get("path", "?"))} {policy_digest}</td></tr>
</table>
<h2>Backends</h2>{_backends(view)}
<h2>Probe &times; backend</h2>
<p class=small>Each verdict links to its cell below, which opens and is highlighted:
expected and observed, the attempts (errno and status), what the host witnessed, the control,
timing and the raw evidence. Cells failing the gate come first, then warned ones, both open
already; cells not run come last.</p>
{_grid(view)}
<h2>Cells</h2>{_cells(view)}
<h2>Control leg (<code>none</code>)</h2>{_control(view)}
<h2>What this run does not prove</h2>{_not_proven(view)}
</body></html>
"""
