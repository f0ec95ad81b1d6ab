"""The run's cells in a pool when jobs > 1 (see `CellPool.plan`), else one at a time."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
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

        Later legs are judged against the control leg, so phase two starts only when every
        control cell is done. Each cell has its own nonce, so the shared world's logs never
        mix. Items still report (and evidence is still appended) in collection order.
        """
        if self.jobs <= 1 or self.futures:
            return
        self.world.ensure()
        self.futures = {cell.cell_id: Future() for cell in cells}
        control = [c for c in cells if c.backend == self.control_leg]
        rest = [c for c in cells if c.backend != self.control_leg]

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

        def orchestrate() -> None:
            with ThreadPoolExecutor(self.jobs, thread_name_prefix="cell") as pool:
                list(pool.map(run_into, control))
                list(pool.map(run_into, rest))

        threading.Thread(target=orchestrate, name="cell-pool", daemon=True).start()

    def result(self, cell: Cell) -> CellEntry:
        """The cell's evidence entry: awaited when planned in the pool, else judged now."""
        future = self.futures.get(cell.cell_id)
        return future.result() if future is not None else self.world.judge(cell)
