"""The cell pool: the control leg first, no barrier behind it, collection order otherwise.

Event-driven, not timed: each check is about which cell the pool started, in what order, or
which cell a blocked one waited for; no clock reading is compared with a bound.
"""

from __future__ import annotations

import threading
from typing import Any

from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.pool import CellPool

# How long a blocked cell waits for the cell that should release it, before it gives up and
# records that it was not released (the old barrier's deadlock, made visible).
RELEASE_WAIT_S = 20.0


class RecordingWorld:
    """A world whose judge records the order cells started and ended in.

    A cell named in `held` blocks until the cell named as its releaser has been judged.
    """

    def __init__(self, held: dict[str, str] | None = None) -> None:
        """`held`: cell id -> the cell id whose judging releases it."""
        self.held = held or {}
        self.releases = {releaser: threading.Event() for releaser in self.held.values()}
        self.released: dict[str, bool] = {}
        self.started: list[str] = []
        self.ended: list[str] = []
        self.lock = threading.Lock()

    def ensure(self) -> None:
        """Nothing to build."""

    def judge(self, cell: Cell) -> Any:
        """Record the start; wait for the releaser if held; record the end."""
        with self.lock:
            self.started.append(cell.cell_id)
        if cell.cell_id in self.held:
            event = self.releases[self.held[cell.cell_id]]
            self.released[cell.cell_id] = event.wait(RELEASE_WAIT_S)
        with self.lock:
            self.ended.append(cell.cell_id)
        if cell.cell_id in self.releases:
            self.releases[cell.cell_id].set()
        return {"cell_id": cell.cell_id}


def cell(backend: str, probe: str, timeout: float = 60) -> Cell:
    """A cell of `backend` for a probe row with `timeout`."""
    return Cell(backend, ProbeRow(probe, timeout, ("linux",), ""), None)


def run(cells: list[Cell], world: RecordingWorld, jobs: int = 2) -> None:
    """Plan `cells` in a pool of `jobs` and wait for every result, in collection order."""
    pool = CellPool(world, jobs, "none")  # type: ignore[arg-type]
    pool.plan(cells)
    for c in cells:
        assert pool.result(c) == {"cell_id": c.cell_id}


def test_a_cell_starts_only_after_its_probes_control() -> None:
    """No sandbox cell starts before the control cell of its own probe has ended."""
    world = RecordingWorld()
    cells = [cell("none", "a"), cell("none", "b"), cell("box", "a"), cell("box", "b")]
    run(cells, world)
    for probe in ("a", "b"):
        assert world.ended.index(f"none-{probe}") < world.started.index(f"box-{probe}")


def test_no_barrier_behind_the_control_legs_slowest_cell() -> None:
    """A sandbox cell whose control is done runs while another probe's control still runs.

    none-slow is held until box-fast has been judged: behind a barrier after the control leg
    (the old pool) box-fast could not start, and none-slow would wait out RELEASE_WAIT_S.
    """
    world = RecordingWorld(held={"none-slow": "box-fast"})
    cells = [cell("none", "slow"), cell("none", "fast"), cell("box", "fast"), cell("box", "slow")]
    run(cells, world)
    assert world.released == {"none-slow": True}
    assert world.ended.index("box-fast") < world.ended.index("none-slow")


def test_cells_start_in_collection_order() -> None:
    """A 180 s probe listed last starts last: no reordering by cost.

    Pytest waits for the items in collection order, and each item's timeout runs while it
    waits; once, longest-first made items time out in a 462-cell run whose cells never hung.
    """
    world = RecordingWorld()
    cells = [cell("none", "short-a"), cell("none", "short-b"), cell("none", "long", 180)]
    run(cells, world, jobs=2)
    assert world.started[2] == "none-long"


def test_a_probe_with_no_control_cell_is_not_held() -> None:
    """A cell whose probe has no control cell (not in the control leg) starts at once."""
    world = RecordingWorld()
    run([cell("box", "only")], world)
    assert world.ended == ["box-only"]
