"""allure-results/ rendered from the judged evidence: one result per cell, as the gate says.

allure-pytest recorded pytest's outcome: an escape raised a non-assertion exception and
showed as *broken*, every cell sat in one flat suite, and the categories used `(?s)`, which
JavaScript (Allure 3) rejects. So the run renders the results itself, from the evidence the
signer signs, through the one verdict mapping (`sandbox_attest.report.outcomes`):

- a result per cell (and per missing required cell), status `passed` / `failed` / `broken`
  / `skipped` as `CellOutcome.allure_status` says, message the one-line reason; an optional
  cell that did not PASS is failed (broken for an ERROR), tagged `NOT_GATING`, not a grey
  skipped (issue 29); start and stop are the cell's run in epoch milliseconds;
- labels `parentSuite` = platform, `suite` = backend, `subSuite` = the probe's area (the
  prefix of its id, `net_...`), `severity` critical for a probe that attempts an escape and
  normal for one that checks an allowed capability;
- the unconfined control leg (`none`) in its own results directory, `control/` (parentSuite
  "unconfined control"): Allure 3 reads only the files directly in the directory it is
  given, so `allure generate allure-results` never counts a control cell in its pass ring
  (`widgets/statistic.json`, `pie_chart.json`), and `allure generate --config
  allure-results/control/allurerc.json allure-results/control` renders the control leg as its
  own report. The control's verdicts still reach the release gate's result, which stays in
  the main directory. (Allure 3 has no JSON-config way to drop results from its statistics:
  `environments` matchers and the awesome plugin's `filter` are JavaScript functions, and a
  "muted" resolution applies to failed results only, so passing control cells still counted.)
- steps stage, run, witness and judge, each with its part of the evidence attached;
- `environment.properties` (run id, platform, world, every backend's version and digest)
  and `categories.json` ("Escapes", "Blind probes", "Harness errors", "Not run here"), whose
  regexes are valid in Java and JavaScript and match the whole message;
- `allurerc.json`, the same categories as Allure 3's config (Allure 3's default report
  reads categories from its config, not from categories.json): `allure generate --config
  allure-results/allurerc.json allure-results`.

Names are derived from the run id and cell id (uuid5), so the same evidence renders the same
bytes; the directory is a signed subject (its tree digest). It does not judge anything.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from sandbox_attest.report.outcomes import (
    GATE_ID,
    CellOutcome,
    RunOutcomes,
    count_failures,
    one_line,
)

if TYPE_CHECKING:
    from collections.abc import Mapping


class Category(TypedDict):
    """One entry of allure's categories.json."""

    name: str
    messageRegex: str  # allure's own key names (camelCase)
    matchedStatuses: list[str]


# Messages start with the verdict word (report.outcomes). `[\s\S]*` instead of `(?s).*`:
# JavaScript has no inline flags, and Allure 2 matches the whole message, Allure 3 any part.
CATEGORIES: list[Category] = [
    {
        "name": "Escapes",
        "messageRegex": r"^FAIL\b[\s\S]*",
        "matchedStatuses": ["failed", "skipped"],
    },
    {
        "name": "Blind probes",
        "messageRegex": r"^INCONCLUSIVE\b[\s\S]*",
        "matchedStatuses": ["failed", "skipped"],
    },
    {
        "name": "Harness errors",
        "messageRegex": r"^(ERROR|MISSING)\b[\s\S]*",
        "matchedStatuses": ["broken", "skipped"],
    },
    {
        "name": "Not run here",
        "messageRegex": r"^(UNAVAILABLE|NOT_APPLICABLE)\b[\s\S]*",
        "matchedStatuses": ["broken", "skipped"],
    },
    {
        "name": "Release gate",
        "messageRegex": r"^gate FAILED\b[\s\S]*",
        "matchedStatuses": ["failed"],
    },
]
CONTROL_SUITE = "unconfined control"
# The label of an optional cell that did not PASS: red in Allure, but it does not gate.
NOT_GATING = "optional: does not gate (gate WARNED, not FAILED, by this cell)"
# The control leg's own results directory inside allure-results/ (see the module docstring).
CONTROL_DIR = "control"
_NAMESPACE = uuid.UUID("6f1f3c0e-5a57-4d8e-9a51-2f1f0c3d7b21")  # ours: stable result names


def _severity(outcome: CellOutcome) -> str:
    cell: Mapping[str, Any] = outcome.cell or {}
    attempts = cell.get("attempts") or []
    escape = cell.get("expected") == "denied" or any(
        isinstance(a, dict) and a.get("role") == "escape" for a in attempts
    )
    return "critical" if escape else "normal"


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode("utf-8")


class _Writer:
    """Collects the files of one results directory in memory."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.files: dict[str, bytes] = {}

    def uid(self, *parts: str) -> str:
        return str(uuid.uuid5(_NAMESPACE, "/".join((self.run_id, *parts))))

    def attach(self, owner: str, name: str, value: object, where: str = "") -> dict[str, str]:
        """Store an attachment in results directory `where` ("" or "control/")."""
        source = f"{self.uid(owner, name)}-attachment.json"
        # Allure resolves `source` in the directory the result file sits in.
        self.files[where + source] = _json_bytes(value)
        return {"name": name, "source": source, "type": "application/json"}


def _where(o: CellOutcome) -> str:
    """The results directory of a cell's files, relative to allure-results/."""
    return f"{CONTROL_DIR}/" if o.control else ""


def _steps(w: _Writer, o: CellOutcome, start: int, stop: int) -> list[dict[str, Any]]:
    cell: Mapping[str, Any] = o.cell or {}
    run = cell.get("run") or {}
    parts: list[tuple[str, str, dict[str, object]]] = [
        (
            "stage",
            "passed",
            {"nonce": cell.get("nonce"), "expected": cell.get("expected")},
        ),
        (
            "run",
            "broken" if o.verdict == "ERROR" else "passed",
            {"run": run, "attempts": cell.get("attempts") or []},
        ),
        ("witness", "passed", {"witness": cell.get("witness") or {}}),
        (
            "judge",
            o.allure_status,
            {
                "verdict": o.verdict,
                "required": o.required,
                "reason": o.detail,
                "observed": cell.get("observed"),
                "control": cell.get("control") or {},
            },
        ),
    ]
    steps = []
    for name, status, body in parts:
        attachments = [w.attach(o.cell_id, name, body, _where(o))]
        if name == "run":
            # The attempts on their own too: what a reader opens first (errno, status).
            attachments.append(w.attach(o.cell_id, "attempts", body["attempts"], _where(o)))
        steps.append(
            {
                "name": name,
                "status": status,
                "stage": "finished",
                "start": start,
                "stop": stop,
                "attachments": attachments,
                "steps": [],
            }
        )
    return steps


def _result(w: _Writer, o: CellOutcome, start: int, stop: int) -> dict[str, Any]:
    area = o.probe.split("_", 1)[0] or "other"
    parent = CONTROL_SUITE if o.control else o.platform
    labels = [
        ("parentSuite", parent),
        ("suite", o.backend),
        ("subSuite", area),
        ("severity", _severity(o)),
        ("framework", "sandbox-attest"),
        ("backend", o.backend),
        ("probe", o.probe),
        ("platform", o.platform),
        ("tag", o.mark),
    ]
    if o.control:
        labels.append(("tag", CONTROL_SUITE))
    if o.warned:
        labels.append(("tag", NOT_GATING))
    result: dict[str, Any] = {
        "uuid": w.uid(o.cell_id),
        # The same cell in every run: Allure's history and retries key on it.
        "historyId": str(uuid.uuid5(_NAMESPACE, f"{o.platform}/{o.cell_id}")),
        "testCaseId": o.cell_id,
        "name": o.cell_id + (" (unconfined control)" if o.control else ""),
        "fullName": f"{o.platform}.{o.backend}.{o.cell_id}",
        "status": o.allure_status,
        "stage": "finished",
        "start": start,
        "stop": stop,
        "labels": [{"name": k, "value": v} for k, v in labels],
        "parameters": [
            {"name": "backend", "value": o.backend},
            {"name": "probe", "value": o.probe},
            {"name": "platform", "value": o.platform},
            {"name": "required", "value": o.mark},
        ],
        "steps": _steps(w, o, start, stop) if o.cell is not None else [],
        "attachments": [],
    }
    if o.message:
        result["statusDetails"] = {"message": o.message, "trace": o.detail}
    if o.warned:
        result["description"] = f"{NOT_GATING}: {o.message}"
    if o.cell is not None:
        result["attachments"].append(w.attach(o.cell_id, "evidence", dict(o.cell), _where(o)))
    return result


def epoch_ms(stamp: object, default: int = 0) -> int:
    """An RFC 3339 UTC stamp ("2026-11-30T05:01:02Z") as epoch milliseconds; else `default`."""
    if not isinstance(stamp, str):
        return default
    try:
        when = datetime.fromisoformat(stamp)  # Python 3.11+ reads the "Z"
    except ValueError:
        return default
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def cell_times(o: CellOutcome, run_start: int) -> tuple[int, int]:
    """A cell's start and stop in epoch milliseconds, as Allure shows them.

    The run records each cell's wall-clock start (`run.started_ms`); Allure read the old
    renderer's offsets counted from 0 as dates in January 1970 (issue 29). A cell that
    never ran (UNAVAILABLE, NOT_APPLICABLE, missing), or evidence from before the start was
    recorded, takes the run's start: a real date, and a duration of 0.
    """
    cell: Mapping[str, Any] = o.cell or {}
    run = cell.get("run") or {}
    if not isinstance(run, dict):
        return run_start, run_start
    started = run.get("started_ms")
    start = started if isinstance(started, int) and started > 0 else run_start
    seconds = run.get("duration_s")
    span = int(1000 * seconds) if isinstance(seconds, int | float) and seconds > 0 else 0
    return start, start + span


def _environment(evidence: Mapping[str, Any]) -> dict[str, str]:
    world = evidence.get("world") or {}
    env = {
        "run_id": str(evidence.get("run_id", "")),
        "platform": str((evidence.get("platform") or {}).get("system", "")),
        "world": f"{world.get('kind', 'not recorded')} {world.get('reason', '')}",
        "harness": str((evidence.get("harness") or {}).get("version", "")),
        "policy": f"sha256:{(evidence.get('policy') or {}).get('sha256', '')}",
    }
    for record in evidence.get("backends") or []:
        ident = record.get("identity") or {}
        env[f"backend.{record.get('name')}"] = (
            f"{ident.get('version', '?')}; {ident.get('profile_digest', '?')}"
            if record.get("available")
            else f"UNAVAILABLE: {record.get('reason', '')}"
        )
    return env


def render_allure(evidence: Mapping[str, Any], outcomes: RunOutcomes) -> dict[str, bytes]:
    """Every file of allure-results/ (name -> bytes), rendered from one run's evidence.

    Args:
        evidence: the parsed evidence.json the outcomes came from.
        outcomes: `sandbox_attest.report.outcomes.run_outcomes` over that evidence.

    Returns:
        File paths relative to the results directory (the control leg's under `control/`),
        and their bytes.
    """
    w = _Writer(str(evidence.get("run_id", "")))
    run_start = epoch_ms(evidence.get("started_at"))
    run_stop = max(run_start, epoch_ms(evidence.get("finished_at"), run_start))
    for o in outcomes.cells:
        start, stop = cell_times(o, run_start)
        result = _result(w, o, start, stop)
        w.files[f"{_where(o)}{result['uuid']}-result.json"] = _json_bytes(result)
    gate = outcomes.gate
    gate_result: dict[str, Any] = {
        "uuid": w.uid(GATE_ID),
        "historyId": GATE_ID,
        "testCaseId": GATE_ID,
        "name": f"release gate: {gate.result}",
        "fullName": f"sandbox-attest.{GATE_ID}",
        "status": outcomes.gate_status,
        "stage": "finished",
        "start": run_start,
        "stop": run_stop,
        "labels": [
            {"name": "parentSuite", "value": "release gate"},
            {"name": "severity", "value": "blocker"},
        ],
        "steps": [],
        "attachments": [w.attach(GATE_ID, "gate problems", list(gate.problems))],
    }
    gate_result["description"] = f"gate: {gate.result}; {count_failures(outcomes).line()}"
    if outcomes.gate_status == "failed":
        first = one_line(gate.problems[0]) if gate.problems else "a required cell did not PASS"
        gate_result["statusDetails"] = {
            "message": f"gate FAILED: {first}",
            "trace": "\n".join(gate.problems),
        }
    w.files[f"{gate_result['uuid']}-result.json"] = _json_bytes(gate_result)
    lines = [f"{k}={one_line(v)}" for k, v in sorted(_environment(evidence).items())]
    properties = ("\n".join(lines) + "\n").encode("utf-8")
    dirs = [("", f"sandbox-attest {w.run_id}")]
    if any(o.control for o in outcomes.cells):
        dirs.append((f"{CONTROL_DIR}/", f"sandbox-attest {w.run_id}: {CONTROL_SUITE}"))
    for where, name in dirs:
        w.files[f"{where}environment.properties"] = properties
        w.files[f"{where}categories.json"] = _json_bytes(CATEGORIES)
        w.files[f"{where}allurerc.json"] = _json_bytes(
            {"name": name, "categories": {"rules": CATEGORIES}}
        )
    return w.files


def write_results(results_dir: Path, files: Mapping[str, bytes]) -> None:
    """Write `render_allure`'s files into the results directory, safely.

    allure-results/ is a signed subject (its tree digest), so these are written like every
    report file: new temp file, no-follow, rename, relative to the directory's descriptor
    (`sandbox_attest.report.files`). A directory that does not exist yet (the results directory,
    or its `control/`) is created 0700.

    Raises:
        ConfigError: the directory is someone else's or writable by others.
        ReportError: a file could not be written.
    """
    from sandbox_attest.report import files as reportfs  # noqa: PLC0415  (cryptography: only a run signs)

    by_dir: dict[str, dict[str, bytes]] = {}
    for path, data in files.items():
        sub, _, name = path.rpartition("/")
        by_dir.setdefault(sub, {})[name] = data
    # The top directory first: a subdirectory (control/) is created inside it.
    for sub in sorted(by_dir, key=lambda d: (d != "", d)):
        dir_fd = reportfs.ensure_report_dir(results_dir / sub if sub else results_dir)
        try:
            for name, data in by_dir[sub].items():
                reportfs.write_new(dir_fd, name, data)
        finally:
            os.close(dir_fd)


def write_run_files(results_dir: Path, environment: dict[str, str]) -> None:
    """Write environment.properties and categories.json only (for a results dir of pytest's).

    Raises:
        ConfigError: the directory is someone else's or writable by others.
        ReportError: a file could not be written.
    """
    # Java properties: one key=value per line; keep values on one line.
    lines = [f"{key}={one_line(value)}" for key, value in sorted(environment.items())]
    write_results(
        results_dir,
        {
            "environment.properties": ("\n".join(lines) + "\n").encode(),
            "categories.json": _json_bytes(CATEGORIES),
        },
    )
