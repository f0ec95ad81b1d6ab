"""No test asserts how fast something ran: timings are bench/'s, printed side by side as ratios.

On a shared 2-core machine a budget measures the load, not the code (issue 24: the signer's
50 ms budget failed a fresh machine's run). A test may still bound a wait, against the time
the wrong behaviour would take, named (`wrapper_s`, `SIGN_TIMEOUT`) or as a deadline
(`time.monotonic() < deadline`): what this finds is a clock reading compared with a bare
number.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# Calls that read a clock, and names that conventionally hold what one measured.
CLOCKS = frozenset({"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time"})
MEASURED = frozenset({"elapsed", "took", "duration", "duration_s", "elapsed_s", "took_s"})


def reads_a_clock(node: ast.AST) -> bool:
    """Whether the expression calls a clock or uses a name that holds a measured time."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in CLOCKS and not sub.args:
                return True
        if isinstance(sub, ast.Name) and sub.id in MEASURED:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in MEASURED:
            return True
    return False


def is_number(node: ast.AST) -> bool:
    """A bare numeric literal (an unnamed budget)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float)


def timing_assertions(source: str) -> list[int]:
    """Line numbers of asserts that compare a clock reading with a bare number."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [compare.left, *compare.comparators]
            ordered = all(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in compare.ops)
            if ordered and any(map(reads_a_clock, sides)) and any(map(is_number, sides)):
                found.append(node.lineno)
    return found


def test_no_test_asserts_a_time_budget() -> None:
    """Every file under tests/ is free of asserts comparing a clock reading with a number."""
    found = {
        str(path.relative_to(TESTS)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if (lines := timing_assertions(path.read_text()))
    }
    assert not found, f"timing assertions (move them to bench/, or bound by a named wait): {found}"


def test_the_check_finds_a_budget_and_spares_a_deadline() -> None:
    """The check flags `elapsed < 0.05` and a clock minus a start, not a named deadline."""
    flagged = (
        "assert elapsed < 0.05\n"
        "assert time.monotonic() - start < 5\n"
        "assert 3 > time.perf_counter() - t0\n"
    )
    spared = (
        "assert time.monotonic() < deadline\n"
        "assert time.monotonic() - start < wrapper_s\n"
        "assert len(items) < 5\n"
    )
    assert timing_assertions(flagged) == [1, 2, 3]
    assert timing_assertions(spared) == []
