"""Benchmark: bubblewrap spawn overhead, and the matrix's wall time serial vs parallel.

Run by hand: `.venv/bin/python bench/bench_matrix.py [--runs N]`. Everything is measured side
by side in this one run on this machine, and printed as ratios, because absolute seconds on a
shared 2-core machine mean little.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.backends.base import ProbeRequest
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.backends.process import run_process
from sandbox_attest.catalog.dev import read_view
from sandbox_attest.host.trust import give, payload_user
from sandbox_attest.payload import LAUNCHER_SOURCE, interpreter_paths
from sandbox_attest.run import hostview

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

ROOT = Path(__file__).resolve().parent.parent


def spawn_times(runs: int) -> tuple[float, float]:
    """Median seconds of `python -c pass` bare and under our bubblewrap argv."""
    backend = BubblewrapBackend()
    bare: list[float] = []
    boxed: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        from sandbox_attest.backends.base import ProbeRequest  # noqa: PLC0415

        request = ProbeRequest(
            cell_id="bench",
            argv=(sys.executable, "-c", "pass"),
            env={},
            workspace=workspace,
            read_only=tuple(interpreter_paths()),
            egress=None,
            timeout=30,
            cell_dir=workspace,
        )
        argv = backend.build_argv(request)
        for _ in range(runs):
            start = time.perf_counter()
            run_process("bench", [sys.executable, "-c", "pass"], {}, workspace, 30)
            bare.append(time.perf_counter() - start)
            start = time.perf_counter()
            run_process("bench", argv, {}, workspace, 30)
            boxed.append(time.perf_counter() - start)
    return statistics.median(bare), statistics.median(boxed)


def matrix_run(
    jobs: int, backends: tuple[str, ...] = ("none", "bubblewrap")
) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds of `sandbox-attest run` on `backends` (none: the default set), its cells.

    A run exits 0 or 1 by its gate (a demonstration backend may fail it, and so may a host
    that cannot judge a required cell, such as dev_access without devices); only a crash
    (exit 2 and above) stops the bench.
    """
    named = [arg for backend in backends for arg in ("--backend", backend)]
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.run(
            [str(ROOT / ".venv/bin/sandbox-attest"), "run", *named, "--out", out, "-j", str(jobs)],
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - start
        if proc.returncode > 1:
            print(proc.stdout[-3000:], proc.stderr[-2000:])
            raise SystemExit(f"matrix run failed (exit {proc.returncode})")
        cells = json.loads((Path(out) / "evidence.json").read_text())["cells"]
    return wall, cells


def inspection_cost(runs: int, *, looking: bool = False) -> tuple[float, float, float]:
    """Median seconds of a trivial payload with and without the host's inspection.

    The third value is the median time the host held the payload at its rendezvous (ready
    file seen to go written): the readings' own cost, without the machine's noise around it.

    Through the launcher under the none backend; the inspection is sandbox_attest/run/hostview.py.
    `looking` adds what the specs now ask of the rendezvous: fs_read_secrets' four canary
    paths looked at in the payload's view, and dev_access's listing of its /dev.
    """
    with tempfile.TemporaryDirectory(prefix="sa-bench-rv-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        probe = base / "probe.py"
        probe.write_text("print('SANDBOX-ATTEST-START x')\n")
        probe.chmod(0o644)
        # The launcher's source under probes/ (staged elsewhere as hostview.LAUNCHER).
        launcher = ROOT / "probes" / LAUNCHER_SOURCE
        backend, user = NoneBackend(), payload_user()
        held: list[float] = []

        def once(i: int, wait: float) -> float:
            workspace = base / f"ws{i}-{wait}"
            workspace.mkdir()
            give(workspace, user)
            task = base / f"task{i}-{wait}.json"
            nonce = f"n{i}"
            task.write_text(
                json.dumps({"workspace": str(workspace), "nonce": nonce, "rendezvous_s": wait})
            )
            task.chmod(0o644)
            request = ProbeRequest(
                cell_id="bench",
                argv=(sys.executable, str(launcher), str(probe), str(task)),
                env={"PATH": "/usr/bin:/bin"},
                workspace=workspace,
                read_only=(),
                egress=None,
                timeout=20,
                cell_dir=base,
                user=user,
            )
            start = time.perf_counter()
            if wait:
                look = [f"{base}/canary-{k}" for k in ("ssh", "aws", "docker", "dotenv")]
                watch = hostview.Rendezvous(
                    workspace,
                    task,
                    nonce,
                    look if looking else (),
                    {"dev_access": read_view} if looking else {},
                )
                watch.start()
                backend.run(request)
                view = watch.finish()
                if not view.get("seen"):
                    sys.exit("the host did not see the payload at its rendezvous")
                held.append(float(view["held_ms"]) / 1000)
            else:
                backend.run(request)
            return time.perf_counter() - start

        seen, unseen = [], []
        for i in range(runs):  # alternated, so drift hits both alike
            seen.append(once(i, hostview.RENDEZVOUS_S))
            unseen.append(once(i, 0))
    return statistics.median(seen), statistics.median(unseen), statistics.median(held)


@dataclass
class _Stage:
    """A launcher and a no-op probe staged where the payload user can read them."""

    base: Path
    launcher: Path
    probe: Path
    python: str


def _stage(base: Path) -> _Stage:
    import shutil  # noqa: PLC0415

    base.chmod(0o755)
    probe = base / "probe.py"
    probe.write_text("print('SANDBOX-ATTEST-START x')\n")
    launcher = base / hostview.LAUNCHER  # staged under the name the host knows
    shutil.copyfile(ROOT / "probes" / LAUNCHER_SOURCE, launcher)
    for path in (probe, launcher):
        path.chmod(0o644)
    # The system interpreter: the one bubblewrap's default binds show the payload.
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    return _Stage(base, launcher, probe, python)


def _rendezvous(
    stage: _Stage,
    backend: BubblewrapBackend | NoneBackend,
    tag: str,
    hooks: Mapping[str, Callable[[int], dict[str, Any] | None]] | None = None,
) -> dict[str, Any]:
    """One payload under `backend` with the host's rendezvous (and `hooks`): the host's view."""
    user = payload_user()
    workspace = stage.base / f"ws-{tag}"
    workspace.mkdir()
    give(workspace, user)
    task = stage.base / f"task-{tag}.json"
    nonce = f"g{tag}"
    task.write_text(json.dumps({"workspace": str(workspace), "nonce": nonce, "rendezvous_s": 5}))
    task.chmod(0o644)
    request = ProbeRequest(
        cell_id="bench",
        argv=(stage.python, str(stage.launcher), str(stage.probe), str(task)),
        env={"PATH": "/usr/bin:/bin"},
        workspace=workspace,
        read_only=(stage.base,),
        egress=None,
        timeout=20,
        cell_dir=stage.base,
        user=user,
    )
    watch = hostview.Rendezvous(workspace, task, nonce, hooks=dict(hooks or {}))
    watch.start()
    backend.run(request)
    view = watch.finish()
    if not view.get("seen"):
        sys.exit(f"{backend.name}: the host did not see the payload: {view}")
    return view


def group_reading_cost(runs: int) -> dict[str, tuple[float, float]]:
    """Per backend: median ms the host held the payload, and median processes it read.

    The rendezvous reads every process of the cell's group (sandbox_attest/host/cellgroup.py)
    before it lets the payload go, so `held_ms` is what reading all of them costs a cell:
    under bubblewrap its two bwrap processes and the payload, under none the payload alone.
    """
    results: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sa-bench-group-") as tmp:
        stage = _stage(Path(tmp))
        for backend in (BubblewrapBackend(), NoneBackend()):
            held: list[float] = []
            read: list[int] = []
            for i in range(runs):
                view = _rendezvous(stage, backend, f"{backend.name}-{i}")
                held.append(float(view["held_ms"]))
                read.append(sum(1 for p in view["processes"] if p["when"] == "rendezvous"))
            results[backend.name] = (statistics.median(held), statistics.median(read))
    return results


def _identity_readers() -> dict[str, Callable[[int], dict[str, Any] | None]]:
    """The readings issue 26 added to a cell's rendezvous, each as a spec's hook takes it.

    The walk of the view (ipc_unix_socket_escape, dev_access), the mount map (the fs probes)
    and the whole-view device reading; the descriptors' identities are read for every cell
    inside `read_process` itself, so they are in both columns (run/fdview.py).
    """
    from sandbox_attest.catalog.dev import read_whole_view  # noqa: PLC0415
    from sandbox_attest.host import mountview, viewwalk  # noqa: PLC0415

    return {
        "walk": lambda pid: viewwalk.walk_view(pid).as_evidence(),
        "mounts": lambda pid: mountview.map_mounts(pid).record(),
        "devices": read_whole_view,
    }


def identity_reading_cost(runs: int) -> dict[str, float]:
    """Median ms the host held a bubblewrap payload: today's readings, and with each of issue 26's.

    Keys: "without", then each reading's name alone. Alternated run by run, so drift on this
    shared machine hits all alike. A cell takes at most one of them (each belongs to its
    probe), so each alone, minus "without", is what it adds to a cell.
    """
    readers = _identity_readers()
    held: dict[str, list[float]] = {"without": [], **{name: [] for name in readers}}
    with tempfile.TemporaryDirectory(prefix="sa-bench-identity-") as tmp:
        stage = _stage(Path(tmp))
        backend = BubblewrapBackend()
        for i in range(runs):
            for name, values in held.items():
                hooks = {name: readers[name]} if name in readers else {}
                view = _rendezvous(stage, backend, f"{name}-{i}", hooks)
                values.append(float(view["held_ms"]))
    return {name: statistics.median(values) for name, values in held.items()}


def main() -> None:
    """Print the measurements."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    for looking in (False, True):
        seen, unseen, held = inspection_cost(args.runs, looking=looking)
        what = "with look paths and the /dev listing" if looking else "process only"
        print(
            f"inspection ({what}): payload with the host's rendezvous {seen * 1000:.1f} ms, "
            f"without {unseen * 1000:.1f} ms; cost per cell {(seen - unseen) * 1000:.1f} ms, "
            f"held at the rendezvous {held * 1000:.1f} ms (target < 20)"
        )
    for name, (held_ms, members) in group_reading_cost(args.runs).items():
        print(
            f"cell group reading ({name}): {members:.0f} process(es) read at the rendezvous, "
            f"held {held_ms:.1f} ms median of {args.runs} (target < 20)"
        )
    identity = identity_reading_cost(args.runs)
    without = identity.pop("without")
    added = ", ".join(f"{name} +{ms - without:.1f} ms" for name, ms in identity.items())
    print(
        f"identity readings (bubblewrap, median of {args.runs}): held {without:.1f} ms without; "
        f"{added} (each cell takes at most one; target < 20)"
    )
    bare, boxed = spawn_times(args.runs)
    print(
        f"spawn: bare python -c pass {bare * 1000:.1f} ms, under bubblewrap "
        f"{boxed * 1000:.1f} ms (median of {args.runs}); ratio {boxed / bare:.2f}x"
    )
    serial, cells = matrix_run(1)
    parallel, _ = matrix_run(2)
    print(
        f"matrix none+bubblewrap ({len(cells)} cells): serial {serial:.1f} s, -j 2 "
        f"{parallel:.1f} s; parallel/serial {parallel / serial:.2f}x (target < 20 s)"
    )
    default_wall, default_cells = matrix_run(2, backends=())
    slowest = max(default_cells, key=lambda c: float((c.get("run") or {}).get("duration_s", 0)))
    print(
        f"default matrix (every backend here, {len(default_cells)} cells), -j 2: "
        f"{default_wall:.1f} s (target < 60 s); slowest cell {slowest['cell_id']} "
        f"{float((slowest.get('run') or {}).get('duration_s', 0)):.1f} s"
    )
    per_probe: dict[str, dict[str, float]] = defaultdict(dict)
    for cell in cells:
        run = cell.get("run") or {}
        per_probe[str(cell["probe"])][str(cell["backend"])] = float(run.get("duration_s", 0.0))
    print(f"{'probe':24} {'none s':>8} {'bwrap s':>8}")
    for probe, cost in per_probe.items():
        print(f"{probe:24} {cost.get('none', 0):8.2f} {cost.get('bubblewrap', 0):8.2f}")


if __name__ == "__main__":
    main()
