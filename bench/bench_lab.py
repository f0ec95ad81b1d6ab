"""Benchmark: the lab's set-up and tear-down, and the 48-cell matrix in the lab vs loopback.

Run by hand, as root: `.venv/bin/python bench/bench_lab.py [--runs N] [--matrix-runs M]`.
Everything is measured side by side in this one run and printed with ratios, because
absolute seconds on a shared 2-core machine mean little. Targets (issue 13): set-up plus
tear-down under 300 ms; the none+bubblewrap matrix with -j 2 no more than 10% slower in the
lab than in the loopback world.

Set-up is `enter_lab` in a fresh child process (its own measurement); tear-down is the time
from the child's last word to its reaping, against the same for a child that made no lab
(the kernel destroys the namespaces, veth and mounts as the last process leaves them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, time
from sandbox_attest.world.lab import enter_lab
lab = enter_lab() if sys.argv[1] == "lab" else None
print(json.dumps({"setup_s": lab.setup_s if lab else 0.0, "t": time.time()}), flush=True)
"""


def lab_cycle(kind: str) -> tuple[float, float]:
    """One child: (set-up seconds, seconds from its last line to its reaping)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, kind], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert child.stdout is not None
    line = json.loads(child.stdout.readline())
    child.wait()
    reaped = time.time()
    child.stdout.close()
    return float(line["setup_s"]), reaped - float(line["t"])


def matrix_seconds(world: str) -> float:
    """Wall seconds of `sandbox-attest run --backend none --backend bubblewrap -j 2`."""
    with tempfile.TemporaryDirectory(prefix="sa-bench-lab-") as tmp:
        out = Path(tmp) / "report"
        start = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "sandbox_attest.cli",
                "run",
                "--backend",
                "none",
                "--backend",
                "bubblewrap",
                "-j",
                "2",
                "--world",
                world,
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        elapsed = time.monotonic() - start
        evidence = json.loads((out / "evidence.json").read_text())
    kind = evidence["world"]["kind"]
    if done.returncode != 0 or kind != world:
        sys.exit(f"the {world} run failed (exit {done.returncode}, world {kind}): {done.stdout}")
    return elapsed


def main() -> None:
    """Print the lab's set-up/tear-down and the matrix's lab/loopback ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="lab cycles (default 20)")
    parser.add_argument("--matrix-runs", type=int, default=3, help="runs of each world")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root: run this as root")
    labs = [lab_cycle("lab") for _ in range(args.runs)]
    bare = [lab_cycle("none") for _ in range(args.runs)]
    setup = statistics.median(s for s, _ in labs)
    teardown = statistics.median(t for _, t in labs)
    bare_teardown = statistics.median(t for _, t in bare)
    print(f"lab cycles: {args.runs}")
    print(f"  set-up     median {setup * 1000:7.1f} ms (max {max(s for s, _ in labs) * 1000:.1f})")
    print(
        f"  tear-down  median {teardown * 1000:7.1f} ms "
        f"(a child without a lab: {bare_teardown * 1000:.1f} ms)"
    )
    print(f"  total      {(setup + teardown) * 1000:7.1f} ms   (target < 300 ms)")
    lab_s: list[float] = []
    loop_s: list[float] = []
    for _ in range(args.matrix_runs):  # alternated, so drift hits both alike
        lab_s.append(matrix_seconds("lab"))
        loop_s.append(matrix_seconds("loopback"))
    lab_med, loop_med = statistics.median(lab_s), statistics.median(loop_s)
    print(f"48-cell none+bubblewrap -j 2, {args.matrix_runs} runs each, alternated:")
    print(f"  lab      median {lab_med:6.1f} s  {[round(x, 1) for x in lab_s]}")
    print(f"  loopback median {loop_med:6.1f} s  {[round(x, 1) for x in loop_s]}")
    print(f"  lab / loopback  {lab_med / loop_med:6.3f}   (target <= 1.10)")


if __name__ == "__main__":
    main()
