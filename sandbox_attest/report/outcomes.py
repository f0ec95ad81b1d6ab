"""One mapping from a cell's verdict to what every output shows: JUnit, Allure, HTML, summary.

The signed gate (`sandbox_attest.report.policy.evaluate`) decides the run; every view a person or a
CI tool reads must say the same thing. So no renderer maps verdicts itself: each asks
`run_outcomes` and shows the `CellOutcome`s it returns, in its own words.

The mapping (also in README.md, "Reading the results"):

| verdict | required cell | optional cell |
| --- | --- | --- |
| PASS | passed | passed |
| FAIL | failed | skipped, message "FAIL (optional, gate WARNED): ..." (Allure: failed) |
| INCONCLUSIVE | failed | skipped, message "INCONCLUSIVE (optional, ...): ..." (Allure: failed) |
| ERROR | error | skipped, message "ERROR (optional, gate WARNED): ..." (Allure: broken) |
| UNAVAILABLE | error | skipped with the reason |
| NOT_APPLICABLE | error | skipped with the reason |
| (missing) | error, message "MISSING: ..." | - |

Why optional non-PASS cells are skipped rather than failed: the gate holds (WARNED, exit 0)
when only cells nothing requires did not PASS, and a CI check reading JUnit failures must
make that same decision. The message keeps the verdict first, so an optional escape is still
found by its word (Allure's "Escapes" category matches it in either status), and every view
marks the cell optional. Why a required INCONCLUSIVE is *failed* and not *error*: the harness
worked and the evidence proves nothing, which the policy treats as not passing, exactly as
it treats an escape; "error" is kept for cells the harness could not judge at all.
Allure is the exception: it has no status that is both red and non-gating, and a grey
"skipped" hid escapes on its dashboard (issue 29), so there a warned cell is failed (broken for
an ERROR) and labelled "does not gate"; a CI check reads JUnit, not Allure.

How many cells fail the gate, how many warn and how many were not run is counted once,
`count_failures`, and every view prints its `FailureCounts.line()` word for word (issue 29: the
terminal, JUnit, the page and the summary each counted on their own and disagreed).

Run-level problems that no cell carries (an interrupted run, a control-only run, a filter
that dropped cells) are one more outcome, the gate itself (`GATE_ID`), failed when the gate
is FAILED; so "any failure or error" is exactly "the gate is FAILED" in every format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.report.policy import (
    CONTROL_BACKEND,
    WARNED_VERDICTS,
    cell_leg,
    cell_required,
    gate_for,
    required_cells,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sandbox_attest.report.policy import Gate, Policy

__all__ = [
    "GATE_ID",
    "MISSING",
    "CellOutcome",
    "FailureCounts",
    "RunOutcomes",
    "Status",
    "count_failures",
    "count_line_of",
    "counted",
    "one_line",
    "run_outcomes",
]

Status = Literal["passed", "failed", "error", "skipped"]
MISSING = "MISSING"  # the verdict word of a required cell the run never produced
GATE_ID = "release-gate"
OPTIONAL_NOTE = "optional, gate WARNED"
# What each status is called where a format has its own word (Allure says "broken").
ALLURE_STATUS: dict[Status, str] = {
    "passed": "passed",
    "failed": "failed",
    "error": "broken",
    "skipped": "skipped",
}
_REQUIRED_STATUS: dict[str, Status] = {
    "PASS": "passed",
    "FAIL": "failed",
    "INCONCLUSIVE": "failed",
    "ERROR": "error",
    "UNAVAILABLE": "error",
    "NOT_APPLICABLE": "error",
    MISSING: "error",
}


def one_line(text: object) -> str:
    """`text` with every run of whitespace (newlines too) collapsed to one space."""
    return " ".join(str(text).split())


@dataclass(frozen=True)
class CellOutcome:
    """What every view shows for one cell; get them from `run_outcomes`, never build one.

    `message` is one line that starts with the verdict word (empty for a PASS); `detail`
    is the full reason. `cell` is the evidence entry (None for a missing cell).
    """

    cell_id: str
    backend: str
    probe: str
    platform: str
    verdict: str
    required: bool
    status: Status
    message: str
    detail: str
    cell: CellEntry | None = None

    @property
    def control(self) -> bool:
        """Whether the cell belongs to the unconfined control leg (`none`)."""
        return self.backend == CONTROL_BACKEND

    @property
    def warned(self) -> bool:
        """Whether the cell is optional and did not PASS in a way that WARNs the gate."""
        return not self.required and self.verdict in WARNED_VERDICTS

    @property
    def allure_status(self) -> str:
        """The status in Allure's words (an error is "broken"); a warned cell is not skipped.

        Allure greys out "skipped", so an optional escape is "failed" there (an optional
        ERROR "broken"), labelled as not gating (`sandbox_attest/report/allure.py`).
        """
        if self.warned:
            return "broken" if self.verdict == "ERROR" else "failed"
        return ALLURE_STATUS[self.status]

    @property
    def mark(self) -> str:
        """Either "required" or "optional", as every view labels the cell."""
        return "required" if self.required else "optional"


@dataclass(frozen=True)
class RunOutcomes:
    """Every cell's outcome, the missing required cells, and the gate they agree with."""

    cells: tuple[CellOutcome, ...]
    gate: Gate
    run_problems: tuple[str, ...] = field(default=())

    @property
    def gate_status(self) -> Status:
        """The gate as one more outcome: failed exactly when the gate is FAILED."""
        return "failed" if self.gate.result == "FAILED" else "passed"

    def by_id(self) -> dict[str, CellOutcome]:
        """The outcomes keyed by cell id."""
        return {o.cell_id: o for o in self.cells}

    def counts(self) -> dict[Status, int]:
        """How many cells have each status (the gate outcome not included)."""
        out: dict[Status, int] = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for o in self.cells:
            out[o.status] += 1
        return out


# The order problems are listed in, everywhere: escapes, then blind probes, then the rest.
_VERDICT_ORDER = ("FAIL", "INCONCLUSIVE", "ERROR", MISSING, "UNAVAILABLE", "NOT_APPLICABLE")
_NOT_RUN = frozenset({"UNAVAILABLE", "NOT_APPLICABLE"})


def _by_verdict(cells: tuple[CellOutcome, ...]) -> str:
    """The verdicts of `cells` counted ("1 FAIL, 2 INCONCLUSIVE"), in listing order."""
    seen: dict[str, int] = {}
    for o in cells:
        seen[o.verdict] = seen.get(o.verdict, 0) + 1
    rank = {v: i for i, v in enumerate(_VERDICT_ORDER)}
    return ", ".join(
        f"{n} {v}" for v, n in sorted(seen.items(), key=lambda kv: (rank.get(kv[0], -1), kv[0]))
    )


@dataclass(frozen=True)
class FailureCounts:
    """A run's cells in four piles; get one from `count_failures`, never build one.

    `gating` are the cells that make the gate FAILED (required and not PASS, missing ones
    included: status failed or error); `warned` the optional FAIL, INCONCLUSIVE and ERROR
    cells that make it WARNED; `not_run` the optional UNAVAILABLE and NOT_APPLICABLE ones;
    `passed` the rest. Each pile is in listing order: FAIL, INCONCLUSIVE, ERROR, MISSING,
    then the rest, each by cell id.
    """

    gating: tuple[CellOutcome, ...]
    warned: tuple[CellOutcome, ...]
    not_run: tuple[CellOutcome, ...]
    passed: tuple[CellOutcome, ...]

    @property
    def attention(self) -> tuple[CellOutcome, ...]:
        """The cells a reader must see first: every gating and every warned cell."""
        return self.gating + self.warned

    @property
    def gating_found(self) -> tuple[CellOutcome, ...]:
        """The gating cells that ran or should have (FAIL, INCONCLUSIVE, ERROR, MISSING)."""
        return tuple(o for o in self.gating if o.verdict not in _NOT_RUN)

    @property
    def gating_not_run(self) -> tuple[CellOutcome, ...]:
        """The required cells that were not run (UNAVAILABLE, NOT_APPLICABLE).

        Listed after every warned cell: a whole leg down must not push an escape found
        elsewhere off the first screen (issue 29).
        """
        return tuple(o for o in self.gating if o.verdict in _NOT_RUN)

    def not_run_groups(self) -> list[tuple[str, str, str, list[str]]]:
        """The required cells not run, grouped: (backend, verdict, reason, cell ids)."""
        groups: dict[tuple[str, str, str], list[str]] = {}
        for o in self.gating_not_run:
            groups.setdefault((o.backend, o.verdict, one_line(o.detail)), []).append(o.cell_id)
        return [(b, v, r, ids) for (b, v, r), ids in groups.items()]

    def line(self) -> str:
        """The one sentence every view prints, e.g. "2 fail the gate (1 FAIL, 1 MISSING), ..."."""
        parts = [
            f"{len(self.gating)} failing the gate"
            + (f" ({_by_verdict(self.gating)})" if self.gating else ""),
            f"{len(self.warned)} warned (optional, not gating)"
            + (f" ({_by_verdict(self.warned)})" if self.warned else ""),
            f"{len(self.not_run)} not run"
            + (f" ({_by_verdict(self.not_run)})" if self.not_run else ""),
            f"{len(self.passed)} passed",
        ]
        return "cells: " + ", ".join(parts)


def count_failures(outcomes: RunOutcomes) -> FailureCounts:
    """Sort a run's outcomes into gating, warned, not run and passed: the one count.

    Every view (terminal, summary.md, report.html, junit.xml, Allure) prints this and
    nothing of its own, so they cannot disagree.
    """
    rank = {v: i for i, v in enumerate(_VERDICT_ORDER)}

    def ordered(cells: list[CellOutcome]) -> tuple[CellOutcome, ...]:
        return tuple(sorted(cells, key=lambda o: (rank.get(o.verdict, -1), o.control, o.cell_id)))

    gating = [o for o in outcomes.cells if o.status in ("failed", "error")]
    warned = [o for o in outcomes.cells if o.warned]
    passed = [o for o in outcomes.cells if o.status == "passed"]
    not_run = [o for o in outcomes.cells if o.status == "skipped" and not o.warned]
    return FailureCounts(ordered(gating), ordered(warned), ordered(not_run), tuple(passed))


def counted(
    evidence: Mapping[str, Any], policy: Policy | None, *, also_missing: Iterable[str] = ()
) -> FailureCounts:
    """`count_failures` straight from evidence (for the terminal's count line)."""
    return count_failures(run_outcomes(evidence, policy, also_missing=also_missing))


def count_line_of(
    cells: Iterable[CellEntry],
    platform: str,
    policy: Policy | None,
    *,
    also_missing: Iterable[str] = (),
) -> str:
    """`FailureCounts.line()` of a run's judged cells, before evidence.json is written.

    The terminal prints it under the grid (sandbox_attest/plugin/__init__.py); the outputs print the
    same line from the evidence those cells are serialized into.
    """
    evidence = {"cells": list(cells), "platform": {"system": platform}}
    return counted(evidence, policy, also_missing=also_missing).line()


def _outcome(cell: CellEntry, platform: str, *, required: bool) -> CellOutcome:
    verdict = str(cell.get("verdict", ""))
    reason = one_line(cell.get("reason") or "no reason recorded")
    if verdict == "PASS":
        status: Status = "passed"
        message = ""
    elif required:
        # An unknown verdict word fails closed, as the gate fails it.
        status = _REQUIRED_STATUS.get(verdict, "error")
        message = f"{verdict}: {reason}"
    elif verdict in WARNED_VERDICTS:
        status = "skipped"
        message = f"{verdict} ({OPTIONAL_NOTE}): {reason}"
    else:
        status = "skipped"
        message = f"{verdict}: {reason}"
    backend = str(cell.get("backend", ""))
    probe = str(cell.get("probe", ""))
    return CellOutcome(
        cell_id=str(cell.get("cell_id") or f"{backend}-{probe}"),
        backend=backend,
        probe=probe,
        platform=platform,
        verdict=verdict,
        required=required,
        status=status,
        message=message,
        detail=str(cell.get("reason") or ""),
        cell=cell,
    )


def run_outcomes(
    evidence: Mapping[str, Any],
    policy: Policy | None,
    *,
    also_missing: Iterable[str] = (),
) -> RunOutcomes:
    """Map one run's evidence to outcomes that agree with its gate (`gate_for`).

    A cell is required exactly when the gate requires it: the policy names it for its leg,
    or the run marked it `"required": true`. Missing cells are the policy's required cells
    of the legs present that the evidence lacks, plus `also_missing`.

    Args:
        evidence: the parsed evidence.json (the bytes that are signed).
        policy: the policy the gate is derived with (None: the cells judged alone).
        also_missing: more cell ids the run required and never produced (a named backend's
            cells that an interrupted run did not reach); `RunSession.missing_required`.

    Returns:
        The outcomes in evidence order, then the missing cells sorted by id.
    """
    gate = gate_for(evidence, policy)
    cells: list[CellEntry] = list(evidence.get("cells") or [])
    default = str((evidence.get("platform") or {}).get("system") or "")
    legs = {cell_leg(c, default) for c in cells}
    required_here = required_cells(policy, legs)
    wanted: dict[tuple[str, str], set[str]] = {}
    for req in policy.requirements if policy is not None else ():
        if (req.platform, req.backend) in legs:
            wanted.setdefault((req.platform, req.backend), set()).update(req.probes)
    outcomes: list[CellOutcome] = []
    seen: set[str] = set()
    for cell in cells:
        platform, backend = cell_leg(cell, default)
        key = (platform, backend, str(cell.get("probe", "")))
        required = cell_required(cell, key, required_here)
        outcome = _outcome(cell, platform, required=required)
        seen.add(outcome.cell_id)
        outcomes.append(outcome)
    missing = {
        f"{backend}-{probe}": (platform, backend, probe)
        for (platform, backend), probes in wanted.items()
        for probe in probes
    }
    for cell_id in also_missing:
        backend, _, probe = cell_id.partition("-")
        missing.setdefault(cell_id, (default, backend, probe))
    for cell_id in sorted(set(missing) - seen):
        platform, backend, probe = missing[cell_id]
        reason = (
            f"required cell {cell_id} on {platform} is not in the evidence: the run never "
            "produced it (interrupted, deselected, or its backend was not selected)"
        )
        outcomes.append(
            CellOutcome(
                cell_id=cell_id,
                backend=backend,
                probe=probe,
                platform=platform,
                verdict=MISSING,
                required=True,
                status="error",
                message=f"{MISSING}: {reason}",
                detail=reason,
            )
        )
    failing = [o for o in outcomes if o.status in ("failed", "error")]
    run_problems = tuple(p for p in gate.problems if not any(_names(p, o) for o in failing))
    return RunOutcomes(tuple(outcomes), gate, run_problems)


def _names(problem: str, o: CellOutcome) -> bool:
    """Whether a gate problem is about cell `o` (each form `policy.evaluate` words one in).

    Such a problem is already a line of the failing cells' list; the views show only the
    rest as run problems, so a run whose docker leg is down does not push the FAILs off the
    first screen with one banner line per UNAVAILABLE cell (issue 29).
    """
    return problem.startswith(
        (
            f"{o.cell_id} ",
            f"{o.platform}:{o.cell_id} ",
            f"required probe {o.probe} on {o.platform}/{o.backend} ",
            f"missing required cell {o.cell_id} on ",
        )
    )
