"""The probe x backend grid as text, for the terminal and for the job summary.

At its natural size the grid spells every verdict and backend out. A terminal is often 80
columns, and a grid wider than that wraps every row into noise (issue 29), so given a width
the grid shrinks to fit: verdicts become short codes, backends become column letters, and a
legend under it says what each means. Colour marks the verdicts only when asked (a terminal
that wants it); the text is the same either way.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# The short codes of the compact grid: at most four characters, so a column is four wide.
SHORT = {
    "PASS": "PASS",
    "FAIL": "FAIL",
    "INCONCLUSIVE": "INC",
    "ERROR": "ERR",
    "UNAVAILABLE": "UNAV",
    "NOT_APPLICABLE": "N/A",
}
# What each code means, for the legend (a FAIL is an escape that was seen, not a crash).
MEANING = {
    "PASS": "held",
    "FAIL": "escape seen",
    "INC": "inconclusive",
    "ERR": "error",
    "UNAV": "unavailable",
    "N/A": "not applicable",
}
# SGR colours by verdict: red for what a reader must act on, dim for what attests nothing.
COLOUR = {
    "PASS": "32",
    "FAIL": "1;31",
    "INCONCLUSIVE": "33",
    "ERROR": "35",
    "UNAVAILABLE": "2",
    "NOT_APPLICABLE": "2",
}
GAP = "  "
# Below this a probe's name is cut; the columns are split into blocks instead.
MIN_PROBE_WIDTH = 16
DEMO_MARK = "*"


def _paint(text: str, verdict: str, colour: bool) -> str:
    code = COLOUR.get(verdict)
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def _table(
    probes: list[str],
    columns: list[tuple[str, str]],
    verdicts: dict[tuple[str, str], str],
    *,
    short: bool,
    first: int,
    colour: bool,
) -> list[str]:
    """Rows of one block: `columns` is (backend, header) in order."""
    widths = [max(len(h), 4 if short else 14) for _, h in columns]
    lines = [
        GAP.join(
            ["probe".ljust(first), *(h.ljust(w) for (_, h), w in zip(columns, widths, strict=True))]
        ).rstrip()
    ]
    for probe in probes:
        name = probe if len(probe) <= first else probe[: first - 1] + "~"
        row = [name.ljust(first)]
        for (backend, _), w in zip(columns, widths, strict=True):
            verdict = verdicts.get((probe, backend), "-")
            word = SHORT.get(verdict, verdict) if short else verdict
            # Padding outside the colour codes, so a row's trailing blanks can be stripped.
            row.append(_paint(word, verdict, colour) + " " * (w - len(word)))
        lines.append(GAP.join(row).rstrip())
    return lines


def render_grid(
    cells: Sequence[Mapping[str, Any]],
    *,
    width: int | None = None,
    colour: bool = False,
    demonstrations: dict[str, str] | None = None,
) -> list[str]:
    """Rows of probes, columns of backends, each cell its verdict; then any legend.

    Args:
        cells: evidence entries (backend, probe, verdict).
        width: the terminal's columns; None keeps the natural size (full words).
        colour: wrap verdicts in ANSI colours (the caller decides: a terminal, no NO_COLOR).
        demonstrations: backend -> why it is in the set to show a verdict; its column is
            marked and the reason printed under the grid.

    Returns:
        Lines, none longer than `width` when given (ANSI codes not counted).
    """
    demos = demonstrations or {}
    backends: list[str] = []
    probes: list[str] = []
    verdicts: dict[tuple[str, str], str] = {}
    for cell in cells:
        if cell["backend"] not in backends:
            backends.append(cell["backend"])
        if cell["probe"] not in probes:
            probes.append(cell["probe"])
        verdicts[(cell["probe"], cell["backend"])] = str(cell["verdict"])
    if not cells:
        return ["(no cells ran)"]
    longest = max(len("probe"), *(len(p) for p in probes))
    full = [(b, b + (DEMO_MARK if b in demos else "")) for b in backends]
    notes = [f"{DEMO_MARK} {b} is a demonstration: {demos[b]}" for b in backends if b in demos]
    plain = _table(probes, full, verdicts, short=False, first=longest, colour=False)
    if width is None or max(len(line) for line in plain) <= width:
        if colour:
            plain = _table(probes, full, verdicts, short=False, first=longest, colour=True)
        return plain + _wrap(notes, width)
    # Compact: a letter per backend, four-character codes, a legend for both.
    letters = [(b, _letter(i) + (DEMO_MARK if b in demos else "")) for i, b in enumerate(backends)]
    per_column = 4 + len(GAP) + (1 if demos else 0)
    first = min(longest, max(MIN_PROBE_WIDTH, width - len(GAP) - per_column * len(letters)))
    fit = max(1, (width - first) // per_column)
    lines: list[str] = []
    for start in range(0, len(letters), fit):
        if start:
            lines.append("")
        lines += _table(
            probes, letters[start : start + fit], verdicts, short=True, first=first, colour=colour
        )
    key = [f"{h.rstrip(DEMO_MARK)}={b}" for b, h in letters]
    codes = [f"{code}={MEANING[code]}" for code in SHORT.values()]
    legend = [f"columns: {'  '.join(key)}", f"verdicts: {'  '.join(codes)}"]
    return lines + _wrap(legend + notes, width)


def _letter(i: int) -> str:
    """A, B, ... Z, then AA, AB, ...: a column key two characters at most for 702 columns."""
    return chr(65 + i) if i < 26 else chr(64 + i // 26) + chr(65 + i % 26)


def _wrap(lines: list[str], width: int | None) -> list[str]:
    """`lines` each wrapped to `width` (continuations indented), or as they are without one."""
    if width is None:
        return lines
    out: list[str] = []
    for line in lines:
        out += textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False) or [""]
    return out
