"""The run's cells in a pool when jobs > 1 (see `CellPool.plan`), else one at a time."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandbox_attest.host.lifetime import caught_signal

if TYPE_CHECKING:
    from sandbox_attest.report.evidence import CellEntry
    from sandbox_attest.run.matrix import Cell
    from sandbox_attest.run.world import RunWorld


@dataclass
class CellPool:
    """Runs a run's cells against its world: in a pool once planned, else one at a time.

    Attributes:
        world: the run's world, which judges each cell.
        jobs: cells to run at once (1: no pool, each cell runs when its item asks).
        control_leg: the matrix's control backend, whose cells run first.
        futures: each planned cell's result by cell id (empty until `plan`).
    """

    world: RunWorld
    jobs: int
    control_leg: str
    futures: dict[str, Future[CellEntry]] = field(default_factory=dict)

    def plan(self, cells: list[Cell]) -> None:
        """With jobs > 1, start running `cells` in a pool: the control leg first, then the rest.

        A cell of a later leg is judged against its probe's control cell, so it starts only
        once that cell is done; it does not wait for the whole control leg (a barrier there
        left a worker idle behind the leg's slowest cell). Otherwise cells start in collection
        order, the order pytest waits for their items in: each item's timeout (the probe's,
        plus a margin) runs while it waits, so a cell moved later would time out an item
        whose cell never hung. Each cell has its own nonce, so the shared world's logs never
        mix. Items still report (and evidence is still appended) in collection order.
        """
        if self.jobs <= 1 or self.futures:
            return
        self.world.ensure()
        self.futures = {cell.cell_id: Future() for cell in cells}
        queue = _CellQueue(cells, self.control_leg)

        def run_into(cell: Cell) -> None:
            future = self.futures[cell.cell_id]
            cut = caught_signal()
            if cut is not None:
                # A signal ends the run: queued cells are not started (their items record
                # them as cut short), so the interrupted run stops instead of finishing.
                future.set_exception(cut)
                return
            try:
                future.set_result(self.world.judge(cell))
            except BaseException as exc:  # surfaced to the waiting item, never swallowed
                future.set_exception(exc)

        def work() -> None:
            while (cell := queue.take()) is not None:
                try:
                    run_into(cell)
                finally:
                    queue.done(cell)

        for number in range(self.jobs):
            threading.Thread(target=work, name=f"cell-{number}", daemon=True).start()

    def result(self, cell: Cell) -> CellEntry:
        """The cell's evidence entry: awaited when planned in the pool, else judged now."""
        future = self.futures.get(cell.cell_id)
        return future.result() if future is not None else self.world.judge(cell)


class _CellQueue:
    """The cells not yet started: control cells first, then each cell whose control is done.

    In collection order within each (see `CellPool.plan` for why not longest first).
    """

    def __init__(self, cells: list[Cell], control_leg: str) -> None:
        """Queue `cells`; those of `control_leg` are the controls the others wait for."""
        self.control_leg = control_leg
        self.controls = [c for c in cells if c.backend == control_leg]
        self.rest = [c for c in cells if c.backend != control_leg]
        self.controlled = {c.probe.id for c in self.controls}
        self.controls_done: set[str] = set()
        self.changed = threading.Condition()

    def take(self) -> Cell | None:
        """The next cell to start, waiting while every cell left waits for its control."""
        with self.changed:
            while True:
                if self.controls:
                    return self.controls.pop(0)
                for index, cell in enumerate(self.rest):
                    probe = cell.probe.id
                    if probe in self.controls_done or probe not in self.controlled:
                        return self.rest.pop(index)
                if not self.rest:
                    return None
                self.changed.wait()

    def done(self, cell: Cell) -> None:
        """`cell` ended (judged, or cut short): the cells of its probe may start."""
        if cell.backend != self.control_leg:
            return
        with self.changed:
            self.controls_done.add(cell.probe.id)
            self.changed.notify_all()
