"""report.html: one self-contained page for a security reviewer.

No network fetches, no scripts: inline CSS and `<details>` for expansion, so the file opens
the same from an artifact download, an air-gapped machine or a mail attachment. Every value
from evidence goes through `html.escape`: evidence carries probe output, and a hostile
payload's stderr must render as text, never as markup.
"""

from __future__ import annotations

import json
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.render import ReportView

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
details.cell{border:1px solid #ccc;border-radius:4px;margin:.3em 0;padding:.2em .5em}
.v-PASS{background:#c8efcf} .v-FAIL{background:#f6b5ae} .v-INCONCLUSIVE{background:#ffe7a3}
.v-ERROR{background:#f3c1f0} .v-UNAVAILABLE{background:#e2e2e2} .v-NOT_APPLICABLE{background:#eef}
.v-missing{background:#fff;color:#999}
summary{cursor:pointer;font-weight:600} pre{white-space:pre-wrap;word-break:break-all;
max-height:24em;overflow:auto;background:#fafafa;border:1px solid #ddd;padding:.4em;font-size:12px}
dl{margin:.3em 0} dt{font-weight:600;margin-top:.3em} dd{margin:0 0 0 1em}
.small{font-size:12px;color:#555}
"""

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


def _attempts(cell: dict[str, Any]) -> str:
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{_e(a.get(k) if a.get(k) is not None else '')}</td>"
            for k in ("what", "role", "outcome", "errno", "status", "detail")
        )
        + "</tr>"
        for a in cell.get("attempts") or []
        if isinstance(a, dict)
    )
    if not rows:
        return "<p class=small>no attempts recorded</p>"
    head = "".join(
        f"<th>{h}</th>" for h in ("what", "role", "outcome", "errno", "status", "detail")
    )
    return f"<table class=attempts><tr>{head}</tr>{rows}</table>"


def _anchor(cell: dict[str, Any]) -> str:
    return "cell-" + str(cell.get("cell_id", ""))


def _cell_details(cell: dict[str, Any]) -> str:
    run = cell.get("run") or {}
    timing = (
        f"duration {_e(run.get('duration_s', '?'))} s, exit {_e(run.get('exit_code'))}, "
        f"timed out: {_e(run.get('timed_out'))}, started: {_e(run.get('started'))}"
    )
    verdict = str(cell.get("verdict", ""))
    is_open = " open" if verdict in ("FAIL", "ERROR") else ""
    required = " (required)" if cell.get("required") else ""
    return (
        f"<details{is_open} id='{_e(_anchor(cell))}' class='cell v-{_e(verdict)}' "
        f"data-cell='{_e(cell.get('cell_id', ''))}'>"
        f"<summary>{_e(cell.get('cell_id', ''))}: {_e(verdict)}{required}</summary>"
        f"<p class=reason>{_e(cell.get('reason', ''))}</p><dl>"
        f"<dt>expected</dt><dd>{_e(cell.get('expected'))}</dd>"
        f"<dt>observed</dt><dd>{_e(cell.get('observed'))}</dd>"
        f"<dt>witness</dt><dd><pre>{_json(cell.get('witness') or {})}</pre></dd>"
        f"<dt>control</dt><dd><pre>{_json(cell.get('control') or {})}</pre></dd>"
        f"<dt>attempts (errno / status)</dt><dd>{_attempts(cell)}</dd>"
        f"<dt>timing</dt><dd>{timing}</dd></dl>"
        f"<details class=raw><summary>raw evidence</summary><pre>{_json(cell)}</pre></details>"
        "</details>"
    )


def _grid(view: ReportView) -> str:
    head = "".join(f"<th>{_e(b)}</th>" for b in view.backends)
    rows = []
    for probe in view.probes:
        tds = []
        for backend in view.backends:
            cell = view.cell(backend, probe)
            if cell is None:
                tds.append("<td class=v-missing>no cell</td>")
                continue
            verdict = str(cell.get("verdict", ""))
            tds.append(
                f"<td class='v-{_e(verdict)}' data-cell='{_e(cell.get('cell_id', ''))}' "
                f"data-verdict='{_e(verdict)}'><a href='#{_e(_anchor(cell))}'>"
                f"{_e(verdict)}</a></td>"
            )
        rows.append(f"<tr><th>{_e(probe)}</th>{''.join(tds)}</tr>")
    return f"<table id=grid><tr><th>probe \\ backend</th>{head}</tr>{''.join(rows)}</table>"


def _cells(view: ReportView) -> str:
    """Every cell's evidence, failing ones first and open; the grid links here."""
    order = {"FAIL": 0, "ERROR": 1, "INCONCLUSIVE": 2, "UNAVAILABLE": 3, "PASS": 4}
    cells = [
        cell
        for backend in view.backends
        for probe in view.probes
        if (cell := view.cell(backend, probe)) is not None
    ]
    cells.sort(key=lambda c: order.get(str(c.get("verdict")), 5))
    return "<section id=cells>" + "".join(_cell_details(c) for c in cells) + "</section>"


def _backends(view: ReportView) -> str:
    rows = []
    for b in view.evidence.get("backends") or []:
        ident = b.get("identity") or {}
        rows.append(
            "<tr>"
            f"<td>{_e(b.get('name'))}</td><td>{_e(b.get('available'))}</td>"
            f"<td>{_e(ident.get('version', ''))}</td><td>{_e(ident.get('platform', ''))}</td>"
            f"<td>{_e(json.dumps(ident.get('policy') or {}, sort_keys=True))}</td>"
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
            "declared policy",
            "profile",
            "reason",
        )
    )
    return f"<table id=backends><tr>{head}</tr>{''.join(rows)}</table>"


def _control(view: ReportView) -> str:
    cells = [c for c in view.cells if c.get("backend") == "none"]
    if not cells:
        return (
            "<p><strong>No control leg ran.</strong> Without it nothing shows the probes can see "
            "an escape on an open host, so every denial in this report is unproven.</p>"
        )
    rows = "".join(
        f"<tr><td>{_e(c.get('probe'))}</td><td class='v-{_e(c.get('verdict'))}'>"
        f"{_e(c.get('verdict'))}</td><td>{_e(c.get('reason', ''))}</td></tr>"
        for c in cells
    )
    return (
        "<p>The <code>none</code> backend runs every probe unconfined: there the escape is the "
        "expected outcome, proving each probe can see what it tests.</p>"
        f"<table id=control><tr><th>probe</th><th>verdict</th><th>reason</th></tr>{rows}</table>"
    )


def _not_proven(view: ReportView) -> str:
    items = list(NOT_PROVEN)
    skipped = [
        f"{c.get('cell_id')} ({c.get('verdict')}: {c.get('reason', '')})"
        for c in view.cells
        if c.get("verdict") in ("UNAVAILABLE", "NOT_APPLICABLE", "INCONCLUSIVE", "ERROR")
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
    problems = "".join(f"<li>{_e(p)}</li>" for p in gate.problems)
    counts: dict[str, int] = {}
    for c in view.cells:
        counts[str(c.get("verdict"))] = counts.get(str(c.get("verdict")), 0) + 1
    count_text = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no cells"
    sig_class = "sig untrusted" if view.untrusted or not view.signed else "sig"
    where = " ".join(str(platform.get(k, "")) for k in ("system", "release", "machine"))
    harness_version = (ev.get("harness") or {}).get("version", "?")
    policy_digest = f"<span class=small>sha256 {_e(policy.get('sha256', '?'))}</span>"
    return f"""<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8>
<meta name=viewport content="width=device-width,initial-scale=1">
<title>sandbox-attest report {_e(ev.get("run_id", ""))}</title>
<style>{_CSS}</style></head><body>
<h1>sandbox-attest report <code>{_e(ev.get("run_id", ""))}</code></h1>
<div id=verdict class="banner g-{_e(gate.result)}">Overall: {_e(gate.result)} ({_e(count_text)})
{f"<ul>{problems}</ul>" if problems else ""}</div>
<div id=signature class="{sig_class}">Signature: {_e(view.signature)}</div>
<h2>Run</h2>
<table id=run>
<tr><th>platform</th><td>{_e(where)}
 (python {_e(platform.get("python", "?"))})</td></tr>
<tr><th>harness version</th><td>{_e(harness_version)}</td></tr>
<tr><th>started / finished</th><td>{_e(ev.get("started_at", "?"))} /
 {_e(ev.get("finished_at", "?"))} (complete: {_e(ev.get("complete"))})</td></tr>
<tr><th>policy</th><td>{_e(policy.get("path", "?"))} {policy_digest}</td></tr>
</table>
<h2>Backends</h2>{_backends(view)}
<h2>Probe &times; backend</h2>
<p class=small>Each verdict links to its cell below: expected / observed / witness / control,
errno and status, timing and the raw evidence. Failing cells come first and are expanded.</p>
{_grid(view)}
<h2>Cells</h2>{_cells(view)}
<h2>Control leg (<code>none</code>)</h2>{_control(view)}
<h2>What this run does not prove</h2>{_not_proven(view)}
</body></html>
"""
