"""junit.xml rendered from the judged evidence, so a CI check decides as the signed gate does.

pytest's own `--junitxml` wrote one `<testsuite name="pytest">` whose failures were pytest's
outcomes, not the gate's: a WARNED run (exit 0) showed failures, an interrupted one hid its
missing cells. This renders from the same evidence bytes the signer signs, through the one
verdict mapping (`sandbox_attest.report.outcomes`):

- one `<testsuite>` per leg (`<platform>/<backend>`), its `<properties>` saying the run id,
  platform, world, backend version and profile digest, the declared claims, and how many of
  its cells are required;
- one `<testcase>` per cell, `classname` `<platform>.<backend>.required|optional`, with
  `<failure>`, `<error>` or `<skipped>` whose `message` is the one-line reason;
- one last suite, `release-gate`, with one testcase that fails exactly when the gate is
  FAILED, carrying every gate problem (so a run-level problem, such as an interrupted run,
  is never a green JUnit).

So `failures + errors > 0` exactly when the gate is FAILED; tested in
tests/render/test_outputs_agree.py. It does not verify anything: `sandbox-attest verify` does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree as ET

from sandbox_attest.report.outcomes import (
    GATE_ID,
    CellOutcome,
    RunOutcomes,
    count_failures,
    one_line,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["render_junit"]

_TAG = {"failed": "failure", "error": "error", "skipped": "skipped"}


def _seconds(outcome: CellOutcome) -> str:
    cell: Mapping[str, Any] = outcome.cell or {}
    run = cell.get("run") or {}
    value = run.get("duration_s") if isinstance(run, dict) else None
    return f"{float(value):.3f}" if isinstance(value, int | float) else "0.000"


def _props(parent: ET.Element, pairs: list[tuple[str, str]]) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in pairs:
        ET.SubElement(props, "property", name=name, value=value)


def _backend_facts(evidence: Mapping[str, Any], backend: str) -> list[tuple[str, str]]:
    for record in evidence.get("backends") or []:
        if record.get("name") != backend:
            continue
        ident = record.get("identity") or {}
        facts = [
            ("backend.available", "yes" if record.get("available") else "no"),
            ("backend.version", str(ident.get("version") or "unknown")),
            ("backend.profile_digest", str(ident.get("profile_digest") or "none")),
            ("backend.claims", json.dumps(ident.get("policy") or {}, sort_keys=True)),
        ]
        if record.get("reason"):
            facts.append(("backend.reason", one_line(record["reason"])))
        return facts
    return [("backend.available", "not recorded")]


def _testcase(suite: ET.Element, outcome: CellOutcome) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        classname=f"{outcome.platform}.{outcome.backend}.{outcome.mark}",
        name=outcome.cell_id,
        time=_seconds(outcome),
    )
    _props(
        case,
        [("verdict", outcome.verdict), ("required", "true" if outcome.required else "false")],
    )
    tag = _TAG.get(outcome.status)
    if tag is not None:
        node = ET.SubElement(case, tag, message=outcome.message, type=outcome.verdict)
        if tag != "skipped":
            node.text = (
                f"{outcome.cell_id} ({outcome.mark}) is {outcome.verdict}:\n{outcome.detail}\n"
                "Evidence: evidence.json and report.html#cell-" + outcome.cell_id
            )


def _counts(outcomes: list[CellOutcome] | tuple[CellOutcome, ...]) -> dict[str, str]:
    return {
        "tests": str(len(outcomes)),
        "failures": str(sum(o.status == "failed" for o in outcomes)),
        "errors": str(sum(o.status == "error" for o in outcomes)),
        "skipped": str(sum(o.status == "skipped" for o in outcomes)),
    }


def _leg_suite(
    root: ET.Element,
    evidence: Mapping[str, Any],
    leg: tuple[str, str],
    cells: list[CellOutcome],
    run_facts: tuple[str, str],
) -> None:
    """One leg's <testsuite>: its counts, run and backend properties, then its cells.

    `run_facts` is (run id, the world as one line).
    """
    platform, backend = leg
    run_id, world_text = run_facts
    label = "unconfined control" if cells[0].control else "sandbox"
    attrs = {
        "name": f"{platform}/{backend}",
        "timestamp": str(evidence.get("started_at", "")),
        **_counts(cells),
        "time": f"{sum(float(_seconds(o)) for o in cells):.3f}",
    }
    suite = ET.SubElement(root, "testsuite", attrs)
    required = sum(o.required for o in cells)
    _props(
        suite,
        [
            ("run_id", run_id),
            ("platform", platform),
            ("world", world_text),
            ("backend", backend),
            ("leg", label),
            *_backend_facts(evidence, backend),
            ("required", f"{required} of {len(cells)} cells required"),
        ],
    )
    for o in cells:
        _testcase(suite, o)


def _gate_suite(root: ET.Element, outcomes: RunOutcomes, run_id: str) -> None:
    """The release gate's <testsuite>: one testcase that fails when the gate FAILED."""
    gate = outcomes.gate
    gate_suite = ET.SubElement(
        root,
        "testsuite",
        name=GATE_ID,
        tests="1",
        failures="1" if outcomes.gate_status == "failed" else "0",
        errors="0",
        skipped="0",
        time="0.000",
    )
    # The one count (sandbox_attest/report/outcomes.py), as the terminal, the page and the summary
    # print it: JUnit's own attributes cannot say "warned", so the numbers are properties.
    count = count_failures(outcomes)
    _props(
        gate_suite,
        [
            ("run_id", run_id),
            ("gate", gate.result),
            ("cells", count.line()),
            ("cells.failing_the_gate", str(len(count.gating))),
            ("cells.warned", str(len(count.warned))),
            ("cells.not_run", str(len(count.not_run))),
            ("cells.passed", str(len(count.passed))),
        ],
    )
    case = ET.SubElement(gate_suite, "testcase", classname="sandbox-attest", name=GATE_ID)
    _props(case, [("gate", gate.result)])
    if outcomes.gate_status == "failed":
        problems = list(gate.problems) or [f"{len(gate.failed)} required cells did not PASS"]
        n = len(problems)
        failure = ET.SubElement(
            case,
            "failure",
            message=f"gate FAILED: {one_line(problems[0])}"
            + (f" (and {n - 1} more)" if n > 1 else ""),
            type="FAILED",
        )
        failure.text = "\n".join(f"- {p}" for p in problems)
    # After any <failure>: the JUnit schema orders a testcase's children so.
    ET.SubElement(case, "system-out").text = f"gate: {gate.result}; {count.line()}"


def render_junit(evidence: Mapping[str, Any], outcomes: RunOutcomes) -> bytes:
    """junit.xml as bytes: a suite per leg, then the release gate's suite.

    Args:
        evidence: the parsed evidence.json the outcomes came from (run facts, backends).
        outcomes: `sandbox_attest.report.outcomes.run_outcomes` over that evidence.

    Returns:
        UTF-8 XML with a declaration and a trailing newline.
    """
    run_id = str(evidence.get("run_id", ""))
    world = evidence.get("world") or {}
    world_text = one_line(f"{world.get('kind', 'not recorded')} {world.get('reason', '')}")
    legs: dict[tuple[str, str], list[CellOutcome]] = {}
    for o in outcomes.cells:
        legs.setdefault((o.platform, o.backend), []).append(o)
    root = ET.Element("testsuites", name="sandbox-attest")
    for leg, cells in sorted(legs.items(), key=lambda kv: kv[0][1] != "none"):
        _leg_suite(root, evidence, leg, cells, (run_id, world_text))
    _gate_suite(root, outcomes, run_id)
    totals = _counts(outcomes.cells)
    failures = int(totals["failures"]) + (outcomes.gate_status == "failed")
    root.attrib.update({**totals, "tests": str(len(outcomes.cells) + 1)})
    root.set("failures", str(failures))
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"
