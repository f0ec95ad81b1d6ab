"""Signals on a real `sandbox-attest run`: a signed incomplete report, 128 + N, nothing left."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandbox_attest.host import journal
from sandbox_attest.run import sweep
from tests.integration.test_cli_run import CLI, keypair, run_cli, small_policy

REPO = Path(__file__).parent.parent.parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]


def matrix(directory: Path) -> Path:
    """fs_write_outside then proc_visibility (whose anchor marks a cell in flight)."""
    path = directory / "signals.toml"
    path.write_text(
        '[[probe]]\nid = "fs_write_outside"\ntimeout = 30\n'
        '[[probe]]\nid = "proc_visibility"\ntimeout = 30\n'
        '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        '[[backend]]\nname = "bubblewrap"\nplatforms = ["linux"]\nreason = "namespaces"\n'
    )
    return path


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def descendants(root: int) -> dict[int, str]:
    """Every live descendant of `root`: pid -> start time (to tell a reused pid apart)."""
    parents: dict[int, int] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) and fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
            starts[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = starts[pid]
                frontier.append(pid)
    return found


def still_alive(processes: dict[int, str]) -> list[int]:
    """The pids of `processes` that still run (same start time, not a zombie)."""
    return [
        pid
        for pid, start in processes.items()
        if (fields := _stat(pid)) is not None and fields[0] != "Z" and fields[19] == start
    ]


def anchor_in_flight(harness: int) -> bool:
    """Whether the harness has an anchor child: the proc_visibility cell is running."""
    for pid in descendants(harness):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if sweep.is_harness_child(argv) and argv[3].startswith(sweep.ANCHOR_MARKER):
            return True
    return False


class Run:
    """A `sandbox-attest run` subprocess of the signals matrix, stopped mid-cell."""

    def __init__(self, tmp_path: Path) -> None:
        """Start the run with a fresh key and report directory; read its run id."""
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.private, self.public = keypair(tmp_path)
        self.out = tmp_path / "r"
        self.proc = subprocess.Popen(
            [
                *CLI,
                "run",
                "--matrix",
                str(matrix(tmp_path)),
                "--policy",
                str(small_policy(tmp_path)),
                "--out",
                str(self.out),
                "--key",
                str(self.private),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        self.run_id = first.split("run ", 1)[1].split(",", 1)[0]

    def stop_mid_cell(self, signum: int) -> tuple[str, dict[int, str], Path]:
        """Wait for an anchor, send `signum`; the output, the run's processes, its scratch."""
        deadline = time.monotonic() + 240
        while not anchor_in_flight(self.proc.pid):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the proc_visibility cell never started"
            time.sleep(0.02)
        entry = journal.journal_dir() / f"run-{self.run_id}.json"
        scratch = Path(json.loads(entry.read_text())["paths"][0])
        processes = descendants(self.proc.pid)
        self.proc.send_signal(signum)
        out, err = self.proc.communicate(timeout=240)
        return out + err, processes, scratch


@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)],
    ids=["SIGTERM", "SIGINT", "SIGHUP"],
)
def test_signal_ends_in_a_signed_incomplete_report_and_nothing_left(
    tmp_path: Path, signum: signal.Signals, status: int
) -> None:
    """The run exits 128+N with a FAILED gate, a signed incomplete report, and no leftovers."""
    run = Run(tmp_path)
    output, processes, scratch = run.stop_mid_cell(signum)
    assert run.proc.returncode == status, output[-4000:]
    gate = [line for line in output.splitlines() if line.startswith("gate:")]
    assert gate, output[-4000:]
    assert "gate: FAILED" in gate
    assert not any("PASSED" in line for line in gate)
    assert f"gate: the run was cut short by {signum.name}" in gate
    evidence = json.loads((run.out / "evidence.json").read_text())
    assert evidence["complete"] is False
    cut = [c for c in evidence["cells"] if c["reason"].startswith(f"cut short by {signum.name}")]
    assert [c["probe"] for c in cut] == ["proc_visibility"]
    assert cut[0]["verdict"] == "ERROR"
    assert (run.out / "attestation.intoto.jsonl").is_file()
    verify = run_cli("verify", str(run.out), "--trusted-key", str(run.public), "--partial")
    assert verify.returncode != 0, verify.stdout + verify.stderr
    # Nothing of the run is left: proxy, anchor, payloads, signer, and the scratch directory.
    assert still_alive(processes) == []
    assert not scratch.exists()
    assert not (journal.journal_dir() / f"run-{run.run_id}.json").exists()


def test_sigkill_leaves_what_the_next_run_sweeps_and_reports(tmp_path: Path) -> None:
    """After kill -9 its children die with it, and the next run removes its scratch and says so."""
    first = Run(tmp_path / "first")
    _, processes, scratch = first.stop_mid_cell(signal.SIGKILL)
    assert first.proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while still_alive(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert still_alive(processes) == []  # PR_SET_PDEATHSIG: the proxy and the anchor died too
    assert scratch.is_dir()  # only the next run can remove it
    second_out = tmp_path / "second"
    second = run_cli(
        "run",
        "--matrix",
        str(matrix(tmp_path)),
        "--policy",
        str(small_policy(tmp_path)),
        "--backend",
        "none",
        "--out",
        str(second_out),
    )
    assert f"swept: removed path {scratch} (left by run {first.run_id}" in second.stdout, (
        second.stdout[-4000:] + second.stderr[-2000:]
    )
    assert not scratch.exists()
    swept = json.loads((second_out / "evidence.json").read_text())["swept"]
    assert any(s["what"] == "path" and s["target"] == str(scratch) and s["removed"] for s in swept)
