"""The world one run's cells run in: its scratch, its world and its cell runner.

Started with the first cell (or when a pool is planned), never at collection: a run that
judges nothing starts nothing. Before it makes anything it sweeps what runs that are gone
left on this host, and it journals its scratch, so a killed run's leftovers are found by the
next one (sandbox_attest/run/sweep.py, sandbox_attest/host/journal.py). A world that could not
start is remembered as the reason every cell is ERROR.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.errors import FixtureError, HarnessError
from sandbox_attest.payload import SCRATCH_PREFIX
from sandbox_attest.report.evidence import CellEntry, cell_entry
from sandbox_attest.run.reach import stage_payload_files, unstage
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.verdict import Verdict
from sandbox_attest.world.core import ANY_CHECK, World, start_world
from sandbox_attest.world.lab import current_lab

if TYPE_CHECKING:
    from sandbox_attest.backends import Backend
    from sandbox_attest.backends.base import Availability
    from sandbox_attest.host.trust import PayloadUser
    from sandbox_attest.run.matrix import Cell
    from sandbox_attest.run.reach import Preflight


@dataclass
class RunWorld:
    """The scratch, the world and the cell runner of one run, started once.

    Attributes:
        run_id: the run's id (its journal entry is named by it).
        user: the payload user (None: the harness's own).
        reach: what the payload user can reach of the installed payload files.
        backends: the run's backends by name, control leg first.
        availability: each backend's answer to whether it runs here.
        platform: this machine's platform.
        control_leg: the matrix's control backend.
        run_facts: the evidence's run facts, where `swept` and `payload_files` are recorded.
        world: the started world (None until the first cell, or if it failed).
        error: why no cell can run (the world or the payload files failed), or None.
        runner: the cell runner over the started world.
        scratch: the run's scratch directory (every cell dir lives under it).
        swept_lines: the sweep's lines for the run's output (empty before the world starts).
    """

    run_id: str
    user: PayloadUser | None
    reach: Preflight
    backends: dict[str, Backend]
    availability: dict[str, Availability]
    platform: str
    control_leg: str
    run_facts: dict[str, Any]
    world: World | None = None
    error: str | None = None
    runner: CellRunner | None = None
    scratch: Path | None = None
    swept_lines: list[str] = field(default_factory=list)

    def ensure(self) -> CellRunner | None:
        """The cell runner, starting the world first if no cell has yet (None: it failed)."""
        if self.runner is not None or self.error is not None:
            return self.runner
        self._sweep_leftovers()
        # A neutral name: every workspace lives under it, so a wrapper sees it (issue 23).
        self.scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        self._journal_scratch()
        # The scratch holds workspaces that non-root sandbox users must traverse.
        self.scratch.chmod(0o755)
        if not self._stage_payload_files(self.scratch):
            return None
        try:
            self.world = start_world(self.scratch / "world", lab=current_lab())
        except (HarnessError, OSError) as exc:
            self.error = f"the world failed to start: {exc}"
            return None
        self.runner = CellRunner(
            world=self.world,
            scratch=self.scratch,
            backends=self.backends,
            availability=self.availability,
            platform=self.platform,
            control_leg=self.control_leg,
            user=self.user,
        )
        return self.runner

    def _stage_payload_files(self, scratch: Path) -> bool:
        """Copy the payload files into `scratch` if the payload user cannot read the installed.

        Returns:
            False when the copy failed (the reason is the run's world error: every cell is
            ERROR with it, since no payload could start).
        """
        try:
            copy = stage_payload_files(scratch, self.reach)
        except OSError as exc:
            self.error = f"the payload files could not be copied into {scratch}: {exc}"
            return False
        if copy is not None:
            self.run_facts["payload_files"] = {
                "copied_to": str(copy),
                # The first refusal says why and what would fix it; the rest share its cause.
                "because": next(p.line(self.user) for p in self.reach.copy_needed if self.user),
                "unreadable": len(self.reach.copy_needed),
            }
        return True

    def judge(self, cell: Cell) -> CellEntry:
        """Run `cell` in the world; ERROR with the reason when no world can run it."""
        runner = self.ensure()
        reason = self.error
        if runner is not None and self.world is not None and cell.not_applicable is None:
            try:
                # A fixture that died in an earlier cell stays dead: this cell is not run
                # against it (its payload's attempts would go unwitnessed), only recorded.
                # The fault is the one an earlier cell's check found after its payload; one
                # that dies from then to this payload's end is found by this cell's own.
                self.world.check_health(since=ANY_CHECK)
            except FixtureError as exc:
                reason = f"not run: {exc}"
                runner = None
        if runner is None:
            return cell_entry(
                cell_id=cell.cell_id,
                backend=cell.backend,
                probe=cell.probe.id,
                platform=self.platform,
                verdict=Verdict.ERROR.value,
                # `ensure` returns None only with its error set.
                reason=reason or "the world is not running",
            )
        return runner.run_cell(cell)

    def stop(self) -> None:
        """Stop the world (the scratch stays until `remove_scratch`)."""
        if self.world is not None:
            self.world.stop()

    def remove_scratch(self) -> None:
        """Remove the scratch, its journal entry and the copy of the payload files."""
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self._unjournal_scratch()
            unstage()  # the copy of the payload files went with the scratch

    # -- what killed runs leave (sandbox_attest/run/sweep.py)
    # -------------------------------------------

    def _sweep_leftovers(self) -> None:
        """Remove what runs that are gone left on this host, before this run makes anything.

        Recorded in the evidence as `swept` (what, target, why, removed) and said in the
        run's output: a cell must never depend on an earlier run's leftovers, and a reader
        must see that the host was cleaned. Never a live run's (see sandbox_attest/run/sweep.py).
        """
        from sandbox_attest.run import sweep  # noqa: PLC0415

        homes = [self.user.home] if self.user is not None else [Path.home()]
        owners = {os.geteuid(), *([self.user.uid] if self.user is not None else [])}
        try:
            swept = sweep.sweep(homes=homes, owners=owners, docker=True)
        except (HarnessError, OSError) as exc:
            self.swept_lines = [f"swept: the sweep of earlier runs' leftovers failed: {exc}"]
            self.run_facts["swept"] = [
                {"what": "sweep", "target": "", "why": str(exc), "removed": False}
            ]
            return
        self.run_facts["swept"] = [dataclasses.asdict(s) for s in swept]
        self.swept_lines = [s.line() for s in swept]

    def _journal_key(self) -> str:
        return f"run-{self.run_id}"

    def _journal_scratch(self) -> None:
        """Journal the scratch directory (and docker run ids) before anything is put in it.

        A SIGKILLed run cannot remove its scratch or containers; the next run's sweep finds
        them through this entry once this process is gone.
        """
        from sandbox_attest.host import journal as sweep  # noqa: PLC0415

        if self.scratch is None:
            return
        # Docker labels its containers with the backend's own run id, not the session's.
        ids = (getattr(b, "run_id", None) for b in self.backends.values())
        docker_ids = [i for i in ids if isinstance(i, str)]
        try:
            sweep.record(
                self._journal_key(), [self.scratch], run_id=self.run_id, docker_run_ids=docker_ids
            )
        except (HarnessError, OSError) as exc:
            self.swept_lines = [*self.swept_lines, f"swept: scratch not journalled: {exc}"]

    def _unjournal_scratch(self) -> None:
        from sandbox_attest.host import journal as sweep  # noqa: PLC0415

        try:
            sweep.forget(self._journal_key())
        except (HarnessError, OSError) as exc:
            print(f"sandbox-attest: journal entry of {self.scratch} not removed: {exc}")
