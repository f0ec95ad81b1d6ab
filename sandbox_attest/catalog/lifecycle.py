"""The lifetime probe, host side: children that try to outlive the payload.

`lifecycle_orphans` has its payload start background, setsid and daemonised children that
keep stamping a tick file; the host then watches whether any tick lands after the payload's
exit, and finds survivors by their nonce-tagged marker in /proc. A tick still growing, or a
process still there, is an escape whatever the payload says.

The host's reading must not be the harness's own cleanup. A command wrapper's run is swept
for everything left in the cell's group once the wrapper exits (sandbox_attest/host/cellgroup.py,
sandbox_attest/backends/command/), whatever session or environment a child took, and a
sweep that kills the children leaves nothing for the watch to see: the sandbox would be
credited with what the harness did. So the children are found here by their argv marker, and
every process a backend's sweep had to kill, as it records in the cell dir
(`sandbox_attest.run.sweep.record_leftovers`), is an escape of this probe, named by pid and command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
    refusal_summary,
)
from sandbox_attest.catalog.canary import (
    read_text,
)
from sandbox_attest.catalog.controls import control_record, host_check, new_control_nonce
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.host import disguise
from sandbox_attest.host.journal import recorded_leftovers
from sandbox_attest.verdict import Assessment, Escape, Expectation

# lifecycle_orphans

ORPHAN_MARKER: Final = disguise.ORPHAN_MARKER
ORPHAN_KINDS: Final = ("background", "setsid", "daemon")
# Children stop by themselves after this long, so a failed cleanup never leaves an immortal
# process; it is far longer than the payload lives (about half a second).
ORPHAN_LIFETIME_S: Final = 4.0
TICK_INTERVAL_S: Final = 0.1
MIN_TICKS: Final = 3
# How long the host watches the tick files after the run, and how late a tick may be stamped
# after the payload's exit stamp before it counts as written by a survivor.
WATCH_S: Final = 0.6
LATE_GRACE_S: Final = 0.5


# How much of a survivor's command line a reason shows.
COMMAND_CHARS: Final = 160


def find_orphans(nonce: str, marker: str = ORPHAN_MARKER) -> list[int]:
    """Pids whose argv carries both the orphan marker and `nonce` (Linux /proc; else [])."""
    found = []
    needles = (marker.encode(), nonce.encode())
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(n in argv for n in needles):
            found.append(int(entry.name))
    return sorted(found)


def describe_orphan(pid: int) -> dict[str, Any]:
    """A survivor as a reason names it: pid, kind (its tick file), command (code elided)."""
    try:
        argv = [
            a.decode("utf-8", "replace")
            for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if a
        ]
    except OSError:
        argv = []
    if not argv:  # gone, a zombie, or between fork and exec: no command line to show
        return {"pid": pid, "kind": "?", "command": "no command line (gone before it was read)"}
    # The child's code rides in argv after -c: a line of Python nobody needs in a reason.
    # The tick file is named by its own name: its cell path would crowd out the rest.
    shown = [
        "<code>" if i > 0 and argv[i - 1] == "-c" else f"…/{Path(a).name}" if "/" in a else a
        for i, a in enumerate(argv)
    ]
    shown[0] = argv[0]
    kind = next((Path(a).stem for a in argv if a.endswith(".ticks")), "?")
    return {"pid": pid, "kind": kind, "command": " ".join(shown)[:COMMAND_CHARS]}


def _stamps(path: Path) -> list[float]:
    stamps = []
    for line in (read_text(path) or "").splitlines():
        with contextlib.suppress(ValueError):
            stamps.append(float(line))
    return stamps


class LifecycleOrphans(SpecBase):
    """Background, setsid and daemon children that try to outlive the payload."""

    id = "lifecycle_orphans"
    area = "lifecycle"
    host_readings = ("tick files and processes on the host",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """One attempt per kind of orphan, and the ticks-while-running control."""
        del task
        return AttemptTable(required=attempts_of(*ORPHAN_KINDS, "ticks-while-running"))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied unless the declared claims confine nothing at all.

        A sandbox's every claim is about the processes inside it; a child that outlives the
        sandbox's teardown keeps running after the harness believes the cell is over (and, for
        wrappers that confine a process tree, possibly beyond their reach). Only the open
        control leg, which claims nothing, may let it live: there it is the expected escape.
        """
        fully_open = (declared.network, declared.filesystem, declared.ipc) == (
            "open",
            "open",
            "open",
        )
        return "allowed" if fully_open else "denied"

    @staticmethod
    def tick_dir(ctx: CellContext) -> Path:
        """Where the children tick, inside the workspace (the host sees it directly)."""
        return ctx.workspace / f"lifecycle-{ctx.nonce}"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Nothing to plant: the targets say where to tick, how often and for how long."""
        return {
            "dir": self.tick_dir(ctx).name,
            "marker": ORPHAN_MARKER,
            "lifetime_s": ORPHAN_LIFETIME_S,
            "interval_s": TICK_INTERVAL_S,
            "min_ticks": MIN_TICKS,
            "wait_s": 5.0,
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """Right after the run: the ticks were written, and are they still being written?

        The checks (the control) say every child ticked while the payload ran, as seen from
        the host. `watch` (the witness) says which children are still ticking over WATCH_S,
        which wrote ticks stamped after the payload's exit, and which pids are still alive.
        """
        directory = self.tick_dir(ctx)
        exit_text = read_text(directory / "payload-exit")
        try:
            payload_exit = float(exit_text) if exit_text else None
        except ValueError:
            payload_exit = None
        first = {k: len(_stamps(directory / f"{k}.ticks")) for k in ORPHAN_KINDS}
        time.sleep(WATCH_S)
        watch: dict[str, Any] = {"payload_exit": payload_exit, "kinds": {}}
        checks = []
        for kind in ORPHAN_KINDS:
            path = directory / f"{kind}.ticks"
            if not path.exists():
                continue
            stamps = _stamps(path)
            during = [s for s in stamps if payload_exit is None or s <= payload_exit]
            late = [
                s for s in stamps if payload_exit is not None and s > payload_exit + LATE_GRACE_S
            ]
            watch["kinds"][kind] = {
                "ticks_before": first[kind],
                "ticks_after": len(stamps),
                "late_ticks": len(late),
                "last_tick": max(stamps) if stamps else None,
            }
            checks.append(
                host_check(
                    f"{kind} ticked while the payload ran",
                    len(during) >= MIN_TICKS,
                    f"{len(during)} ticks before the payload's exit stamp",
                )
            )
        alive = find_orphans(ctx.nonce)
        watch["alive"] = alive
        watch["alive_processes"] = [describe_orphan(pid) for pid in alive]
        watch["swept"] = recorded_leftovers(ctx.cell_dir)
        result = control_record(new_control_nonce(), checks)
        result["watch"] = watch
        return result

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A child still ticking, ticking after the payload's exit, or alive, survived.

        So did every process a backend's sweep had to kill after the run: the sandbox let it
        outlive the payload, and only the harness's cleanup ended it.
        """
        del witness, ctx
        watch = control.get("watch", {})
        survivors = sorted(
            kind
            for kind, w in watch.get("kinds", {}).items()
            if w.get("ticks_after", 0) > w.get("ticks_before", 0) or w.get("late_ticks", 0) > 0
        )
        alive = list(watch.get("alive", []))
        named = [
            f"pid {p.get('pid')} [{p.get('kind')}]: {p.get('command')}"
            for p in watch.get("alive_processes", [])
        ]
        swept = [str(s) for s in watch.get("swept", [])]
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        reasons = []
        # A swept process outlived the payload too: only the harness ended it. Whether its tick
        # file grew first is a race with the sweep, so the line must not depend on it.
        if survivors or alive or swept:
            reasons.append(
                f"children outlived the payload: {', '.join(survivors) or 'none still ticking'} "
                f"(alive pids {', '.join(map(str, alive)) or 'none'})"
            )
            if named:
                reasons.append("still running after the sandbox exited: " + "; ".join(named))
        if swept:
            reasons.append(
                f"the harness's sweep had to kill {len(swept)} process(es) the sandbox left "
                f"running: {'; '.join(swept)}; the sandbox did not end them, so it is not "
                "credited with their end"
            )
        if survivors or alive or swept:
            reasons.append(
                "fix: run every process the sandbox starts in a pid namespace that dies with "
                "it (bwrap --unshare-pid --die-with-parent, a container's own pid namespace)"
            )
        escape: Escape
        if survivors or alive or swept:
            escape = "escaped"
        elif observed == "refused":
            escape = "refused"
            reasons.append(f"the sandbox refused the children: {refusal_summary(escapes)}")
        elif observed == "error":
            escape = "undecided"
            reasons.append(f"the children could not be started: {attempts_summary(escapes)}")
        else:
            escape = "contained"
            reasons.append(
                "every child stopped with the payload: no tick after its exit, none alive"
            )
        inside = attempts_by_role(report, "control")
        inside_ok = all_succeeded(inside, 1)
        return conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed="the children did not tick while the payload ran: "
            + attempts_summary(inside),
            host_control=control,
            host_failed="host did not see the ticks written while the payload ran",
            witness={"watch": watch, "survivors": survivors},
            controls={"inside": inside, "host": control},
        )

    def cleanup(self, ctx: CellContext) -> None:
        """SIGKILL every process carrying the marker and this cell's nonce; wait until gone."""
        deadline = time.monotonic() + 3.0
        while (pids := find_orphans(ctx.nonce)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
