"""The probe x backend grid as text, for the terminal and for the job summary."""

from __future__ import annotations

from typing import Any


def render_grid(cells: list[dict[str, Any]]) -> list[str]:
    """Rows of probes, columns of backends, each cell the verdict word."""
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
    first = max(len("probe"), *(len(p) for p in probes))
    widths = [max(len(b), 14) for b in backends]
    lines = [
        "  ".join(
            ["probe".ljust(first), *(b.ljust(w) for b, w in zip(backends, widths, strict=True))]
        )
    ]
    for probe in probes:
        row = [
            verdicts.get((probe, b), "-").ljust(w) for b, w in zip(backends, widths, strict=True)
        ]
        lines.append("  ".join([probe.ljust(first), *row]))
    return lines
