"""One full-matrix run of a real sandbox, as a user runs it: shared by test_real_sandboxes*.py.

`sandbox-attest run --backend NAME --world lab -j 2` in a subprocess of its own (whether *it*
can make the lab is the question, not whether this pytest process could), its evidence read
back, its wall time measured (printed by the tests, never asserted: the machine is shared).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.world.lab import lab_supported
from tests.here import not_judgeable_here

ROOT = Path(__file__).parent.parent.parent
CLI = [sys.executable, "-m", "sandbox_attest.cli"]
# A full matrix takes about a minute here; three is a hang, not a slow machine.
RUN_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class MatrixRun:
    """A finished run: the backend's cells by probe, the whole evidence, the wall seconds."""

    cells: dict[str, dict[str, Any]]
    evidence: dict[str, Any]
    wall_s: float


def skip_without_lab() -> None:
    """Skip, naming why, where the lab world cannot be made (not root, no namespaces)."""
    supported, why_not = lab_supported()
    if not supported:
        pytest.skip(f"the lab world needs root and network namespaces: {why_not}")


def run_full_matrix(backend: str, out: Path) -> MatrixRun:
    """Run the full matrix on `backend` in the lab, its control leg included, into `out`."""
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "run", "--backend", backend, "--world", "lab", "-j", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        cwd=ROOT,
    )
    wall = time.monotonic() - started
    print(f"{backend} full matrix: {wall:.1f} s")
    evidence = out / "evidence.json"
    assert evidence.is_file(), f"no evidence (exit {proc.returncode}): {proc.stderr[-2000:]}"
    data = json.loads(evidence.read_text())
    cells = {c["probe"]: c for c in data["cells"] if c["backend"] == backend}
    return MatrixRun(cells, data, wall)


def unjudged_here() -> dict[str, str]:
    """The probes this host cannot judge (tests/here.py), with the host's reason."""
    return {p: r for p in PROBES if (r := not_judgeable_here(p)) is not None}


def show(cells: dict[str, dict[str, Any]], probes: set[str]) -> str:
    """The named cells' verdicts and reasons, for an assertion's message."""
    return "; ".join(
        f"{p}: {cells[p]['verdict']} {cells[p]['reason'][:200]}" for p in sorted(probes)
    )
