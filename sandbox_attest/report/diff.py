"""`sandbox-attest diff OLD NEW`: which cells changed verdict between two reports, and why.

For a release pipeline that must not regress: OLD is the last release (a merged directory,
its legs under `legs/`) or a run's report directory, NEW another of either. Cells are
matched by platform and cell id (`<backend>-<probe>`). A cell is *worse* when its verdict
moved down the order PASS, NOT_APPLICABLE, UNAVAILABLE, INCONCLUSIVE/ERROR, FAIL (a PASS
lost, or a new FAIL), and the command then exits 1. A cell present on one side only is
listed but is not a regression: a one-machine run compared with a many-legged release
lacks the other legs by design.

It compares what each evidence.json says; it checks no signature. Verify both reports
first (`sandbox-attest verify`) when the comparison must be trusted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from sandbox_attest.errors import ConfigError
from sandbox_attest.report.evidence import CellEntry, parse_cells

EVIDENCE: Final = "evidence.json"
# Lower is better. INCONCLUSIVE and ERROR tie: both mean nothing was proven.
RANK: Final[dict[str, int]] = {
    "PASS": 0,
    "NOT_APPLICABLE": 1,
    "UNAVAILABLE": 2,
    "INCONCLUSIVE": 3,
    "ERROR": 3,
    "FAIL": 4,
}
# Exit statuses, also in `diff --help`.
EXIT_SAME_OR_BETTER: Final = 0
EXIT_WORSE: Final = 1
DESCRIPTION: Final = """Print every cell whose verdict changed between two reports, and why.

OLD and NEW are report directories (reports/<run-id>) or merged releases (legs/ inside).
Cells are matched by platform and <backend>-<probe>. A cell is worse when its verdict
moves down PASS > NOT_APPLICABLE > UNAVAILABLE > INCONCLUSIVE = ERROR > FAIL.

exit status of diff: 0 no cell got worse; 1 at least one cell got worse; 2 a report
could not be read. It compares evidence only: verify both reports first."""


@dataclass(frozen=True)
class Change:
    """One cell whose verdict differs (or that one side lacks)."""

    platform: str
    cell_id: str
    old: str  # "" when OLD lacks the cell
    new: str  # "" when NEW lacks the cell
    old_reason: str
    new_reason: str

    @property
    def kind(self) -> str:
        """The kind of change: worse, better, changed (same rank), added or removed."""
        if not self.old:
            return "added"
        if not self.new:
            return "removed"
        old, new = RANK.get(self.old, 3), RANK.get(self.new, 3)
        return "worse" if new > old else "better" if new < old else "changed"

    def line(self) -> str:
        """The human line: cell, verdicts, kind, then the reason that explains it."""
        head = (
            f"{self.platform}:{self.cell_id}: {self.old or '-'} -> {self.new or '-'} ({self.kind})"
        )
        why = self.new_reason if self.new else self.old_reason
        was = f" (was: {self.old_reason})" if self.old and self.new and self.old_reason else ""
        return f"{head}: {why or 'no reason recorded'}{was}"


def load_cells(report: Path) -> dict[tuple[str, str], CellEntry]:
    """Every cell of a report directory or merged release, by (platform, cell id).

    Raises:
        ConfigError: neither evidence.json nor legs/*/evidence.json is there, or one is
            not the harness's JSON (naming the file and what to pass instead, or the key a
            cell lacks: `parse_cells`).
    """
    files = [report / EVIDENCE] if (report / EVIDENCE).is_file() else []
    files = files or sorted((report / "legs").glob(f"*/{EVIDENCE}"))
    if not files:
        raise ConfigError(
            f"{report}: no {EVIDENCE} and no legs/*/{EVIDENCE}; pass a report directory "
            "(reports/<run-id>) or a merged release"
        )
    cells: dict[tuple[str, str], CellEntry] = {}
    for path in files:
        try:
            evidence = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not readable evidence ({exc}); re-run or re-merge") from exc
        if not isinstance(evidence, dict):
            raise ConfigError(f"{path}: evidence must be a JSON object; re-run or re-merge")
        platform = str((evidence.get("platform") or {}).get("system", ""))
        for cell in parse_cells(evidence.get("cells", []), str(path), ConfigError):
            key = (str(cell.get("platform") or platform), str(cell.get("cell_id", "")))
            cells[key] = cell
    return cells


def compare(old: Path, new: Path) -> list[Change]:
    """Every cell whose verdict differs between `old` and `new`, in platform and id order."""
    before, after = load_cells(old), load_cells(new)
    changes = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        va, vb = (str(c["verdict"]) if c else "" for c in (a, b))
        if va != vb:
            ra, rb = (str(c["reason"]) if c else "" for c in (a, b))
            changes.append(Change(key[0], key[1], va, vb, ra, rb))
    return changes


def cmd_diff(args: argparse.Namespace) -> int:
    """`sandbox-attest diff OLD NEW`: print the changes; exit 1 when a cell got worse."""
    changes = compare(Path(args.old), Path(args.new))
    worse = [c for c in changes if c.kind == "worse"]
    if args.json:
        rows = [asdict(c) | {"kind": c.kind} for c in changes]
        print(json.dumps({"worse": len(worse), "changes": rows}, indent=2))
    else:
        # Regressions first: they are what a release pipeline stops for.
        order = {"worse": 0, "removed": 1, "changed": 2, "better": 3, "added": 4}
        for change in sorted(changes, key=lambda c: order[c.kind]):
            print(change.line())
        counts = {k: sum(1 for c in changes if c.kind == k) for k in order}
        summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no verdict changed"
        print(f"diff: {summary}", file=sys.stderr)
    return EXIT_WORSE if worse else EXIT_SAME_OR_BETTER


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `diff` to the CLI's subcommands."""
    parser = sub.add_parser(
        "diff",
        help="print cells whose verdict changed between two reports; exit 1 if one got worse",
        description=DESCRIPTION,
    )
    parser.add_argument("old", metavar="OLD", help="the earlier report or release directory")
    parser.add_argument("new", metavar="NEW", help="the later report directory")
    parser.add_argument("--json", action="store_true", help="print the changes as JSON")
    parser.set_defaults(func=cmd_diff)
