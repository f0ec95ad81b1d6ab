"""One `sandbox-attest run` over hole wrappers beside strong backends, shared by the class tests.

The escape-class tests (machinery, races, syscalls, host reach) each run a small matrix of
their probes on the control leg, the strong backends and a wrapper per hole, with a release
policy and a key, and then read the signed evidence cell by cell. This is that run, once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.report.evidence import EVIDENCE_NAME
from tests.integration.test_cli_run import CLI, keypair
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

# What every live hole test needs: root (the payload user exists only as root), bubblewrap,
# and time; each file adds its own bound (`pytest.mark.timeout`).
LIVE_HOLE_MARKS = (
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install)"),
    pytest.mark.slow,
)

# The checkout, where the run starts (tests/integration/hole_runs.py -> its root).
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class HoleRun:
    """What the run left: its report dir, exit status and output."""

    out: Path
    returncode: int
    stdout: str
    stderr: str

    def cell(self, backend: str, probe: str) -> dict[str, Any]:
        """One cell of the signed evidence; fails naming the run's output if there is none."""
        path = self.out / EVIDENCE_NAME
        assert path.is_file(), f"no evidence: {self.stdout[-3000:]} {self.stderr[-2000:]}"
        cells = {c["cell_id"]: c for c in json.loads(path.read_text())["cells"]}
        cell: dict[str, Any] = cells[f"{backend}-{probe}"]
        return cell


@contextlib.contextmanager
def hole_run(
    prefix: str,
    *,
    probes: Sequence[str],
    legs: Sequence[str],
    required: Sequence[str],
    specs: Sequence[Path],
    named: Sequence[str] = (),
    probe_timeout: int = 30,
    run_timeout: int = 300,
) -> Iterator[HoleRun]:
    """Run `probes` on the matrix `legs` plus the wrappers in `specs`; its result.

    Args:
        prefix: the temp dir's name prefix (reachable by the payload user).
        probes: the matrix's probes, each with `probe_timeout`.
        legs: the matrix's [[backend]] rows (the control leg `none` among them).
        required: the legs the release policy requires every probe on.
        specs: wrapper specs passed as --backend-spec (each a hole).
        named: backends passed as --backend (none: the run takes every matrix row).
        probe_timeout: each probe's timeout in the matrix, seconds.
        run_timeout: the whole run's bound, seconds.
    """
    with reachable_tempdir(prefix) as root:
        matrix = root / "matrix.toml"
        matrix.write_text(
            "".join(f'[[probe]]\nid = "{p}"\ntimeout = {probe_timeout}\n' for p in probes)
            + "".join(f'[[backend]]\nname = "{b}"\nplatforms = ["linux"]\n' for b in legs)
        )
        policy = root / "policy.toml"
        listed = ", ".join(f'"{p}"' for p in probes)
        policy.write_text(
            "".join(
                f'[[require]]\nplatform = "linux"\nbackend = "{b}"\nprobes = [{listed}]\n'
                for b in required
            )
        )
        private, _ = keypair(root)
        out = root / "report"
        argv = [*CLI, "run", "--matrix", str(matrix), "--policy", str(policy)]
        argv += [a for b in named for a in ("--backend", b)]
        argv += [a for spec in specs for a in ("--backend-spec", str(spec))]
        argv += ["--key", str(private), "--out", str(out), "-j", "2"]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=run_timeout, check=False, cwd=REPO
        )
        yield HoleRun(out, done.returncode, done.stdout, done.stderr)
