"""Per-cell overhead of the docker backend vs bubblewrap vs a bare process, measured side by side.

    .venv/bin/python bench/bench_docker.py [-n RUNS]

Each leg runs `python -c pass` N times (the host's /usr/bin/python3, the same binary in all
three): bare as a child process; under bwrap with the bubblewrap backend's namespace flags and
mounts; in a container through `DockerBackend.run` (create, start, wait, logs, remove, and the
workspace chown). Legs are interleaved run by run so drift on a shared machine hits all three
alike. Prints the median and p90 per leg and the ratios to bare and to bubblewrap, from this
one run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sandbox_attest.backends.base import ProbeRequest
from sandbox_attest.backends.docker.backend import DockerBackend

PYTHON = "/usr/bin/python3"


def bwrap_argv() -> list[str]:
    """The bubblewrap backend's confinement around `python -c pass` (no egress, no workspace)."""
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for root in ("/bin", "/sbin", "/lib", "/lib64"):
        path = Path(root)
        if path.is_symlink():
            argv += ["--symlink", str(path.readlink()), root]
        elif path.is_dir():
            argv += ["--ro-bind", root, root]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108  (a private tmpfs)
    return [*argv, "--", PYTHON, "-c", "pass"]


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def summary(samples: list[float]) -> tuple[float, float]:
    """Median and p90 in milliseconds."""
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return statistics.median(ordered) * 1000, p90 * 1000


def main() -> int:
    """Run the three legs interleaved and print medians and ratios."""
    parser = argparse.ArgumentParser(description="docker vs bwrap vs bare per-cell overhead")
    parser.add_argument("-n", "--runs", type=int, default=20)
    args = parser.parse_args()
    has_bwrap = shutil.which("bwrap") is not None
    samples: dict[str, list[float]] = {"bare": [], "bwrap": [], "docker": []}
    with DockerBackend() as backend, tempfile.TemporaryDirectory() as tmp:
        avail = backend.availability()
        if not avail.ok:
            print(f"docker backend unavailable: {avail.reason}", file=sys.stderr)
            return 1
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        request = ProbeRequest(
            cell_id="bench-pass",
            argv=(PYTHON, "-c", "pass"),
            env={"PATH": "/usr/bin:/bin"},
            workspace=workspace,
            read_only=(),
            egress=None,
            timeout=60.0,
            cell_dir=Path(tmp),
        )
        bare = [PYTHON, "-c", "pass"]
        for _ in range(args.runs):
            samples["bare"].append(timed(lambda: subprocess.run(bare, check=True)))
            if has_bwrap:
                samples["bwrap"].append(timed(lambda: subprocess.run(bwrap_argv(), check=True)))
            samples["docker"].append(timed(lambda: backend.run(request)))
    bare_med = summary(samples["bare"])[0]
    bwrap_med = summary(samples["bwrap"])[0] if samples["bwrap"] else float("nan")
    print(f"python -c pass, {args.runs} runs per leg, interleaved")
    print(f"{'leg':8} {'median ms':>10} {'p90 ms':>8} {'x bare':>7} {'x bwrap':>8}")
    for leg, data in samples.items():
        if not data:
            print(f"{leg:8} n/a (bwrap not installed)")
            continue
        med, p90 = summary(data)
        print(f"{leg:8} {med:10.1f} {p90:8.1f} {med / bare_med:7.1f} {med / bwrap_med:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
