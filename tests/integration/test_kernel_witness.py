"""The kernel witness, live: a real filter's refusals carry the kernel's syscall and errno.

A run of `sandbox-attest run` on sandlock (Landlock + seccomp in the harness's own namespaces,
matrix/backends/sandlock.toml) for fs_read_secrets and net_ipv6_udp_icmp: each refusal the
payload reports is in the evidence beside what the kernel answered that attempt. Then the
run's end: no bpftrace of the run is left, whether it finished or was sent SIGTERM, and a
tracefs mount the run made is gone.

Skips, naming why, where no witness can run (not root, no bpftrace, not Linux x86_64) or
sandlock is not installed (scripts/real-sandboxes.sh).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.host import cellgroup
from sandbox_attest.host.kernel import KernelWitness, cgroup_id, unavailable_reason
from sandbox_attest.world.lab import lab_supported

ROOT = Path(__file__).parent.parent.parent
SPEC = ROOT / "matrix" / "backends" / "sandlock.toml"
SANDLOCK_PY = Path("/opt/sandbox-attest/py/bin/python")
CLI = [sys.executable, "-m", "sandbox_attest.cli"]
RUN_TIMEOUT_S = 180.0

_why = unavailable_reason(cells_have_cgroups=True)
pytestmark = [
    pytest.mark.skipif(bool(_why), reason=f"no kernel witness here: {_why}"),
    pytest.mark.skipif(not SPEC.is_file(), reason=f"{SPEC} is not in this checkout"),
    pytest.mark.skipif(
        not SANDLOCK_PY.is_file(), reason="sandlock is not installed: scripts/real-sandboxes.sh"
    ),
]


def run_cli(out: Path, *probes: str) -> dict[str, Any]:
    """One run on sandlock in the lab (loopback where no lab); its evidence."""
    world = "lab" if lab_supported() else "loopback"
    argv = [*CLI, "run", "--backend-spec", str(SPEC), "--world", world, "-j", "2"]
    for probe in probes:
        argv += ["--probe", probe]
    subprocess.run([*argv, "--out", str(out)], cwd=ROOT, timeout=RUN_TIMEOUT_S, check=False)
    evidence: dict[str, Any] = json.loads((out / "evidence.json").read_text())
    return evidence


def witness_processes(pid: int) -> list[int]:
    """The bpftrace processes whose program names harness pid `pid` (program_text)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"bpftrace")
            and f"/pid == {pid} &&".encode() in b" ".join(argv)
        ):
            found.append(int(entry.name))
    return found


def cell(evidence: dict[str, Any], cell_id: str) -> dict[str, Any]:
    """The evidence entry of `cell_id`."""
    return next(c for c in evidence["cells"] if c["cell_id"] == cell_id)


class TestOnSandlock:
    """A Landlock + seccomp sandbox's refusals, corroborated by the kernel."""

    def test_each_refusal_has_the_kernels_syscall_and_errno(self, tmp_path: Path) -> None:
        """Every refused canary open and connect names the syscall and the errno behind it."""
        evidence = run_cli(tmp_path / "r", "fs_read_secrets", "net_ipv6_udp_icmp")
        facts = evidence["kernel_witness"]
        assert facts["status"] == "attached", facts
        assert facts["tracefs"] in {"was mounted", "mounted and unmounted by this run"}
        secrets_cell = cell(evidence, "sandlock-fs_read_secrets")
        kernel = secrets_cell["witness"]["kernel"]
        refused = [a for a in secrets_cell["attempts"] if a.get("outcome") == "refused"]
        assert len(kernel["corroborated"]) == len(refused) == 4, kernel
        for event in kernel["events"]:
            assert (event["syscall"], event["error"]) == ("openat", "EACCES"), event
            assert event["text"] in secrets_cell["reason"]
        assert secrets_cell["verdict"] == "PASS", secrets_cell["reason"]
        net_cell = cell(evidence, "sandlock-net_ipv6_udp_icmp")
        net_kernel = net_cell["witness"]["kernel"]
        assert {(e["syscall"], e["error"]) for e in net_kernel["events"]} == {
            ("connect", "ECONNREFUSED")
        }
        assert net_cell["verdict"] == "PASS", net_cell["reason"]
        # The host view keeps the cell's kernel reading bounded: counts and a few refusals.
        view = secrets_cell["host_view"]["kernel"]
        assert "events" not in view
        assert view["events_total"] >= 4
        assert view["drain_ms"] < 1000


class TestNothingLeftBehind:
    """The run's bpftrace and any tracefs mount it made end with the run."""

    def test_a_finished_run_leaves_no_witness(self, tmp_path: Path) -> None:
        """After a run, no bpftrace of it runs, and tracefs is as it was before."""
        mounted_before = Path("/sys/kernel/tracing/events").is_dir()
        proc = subprocess.Popen(
            [
                *CLI,
                "run",
                "--backend-spec",
                str(SPEC),
                "--world",
                "loopback",
                "--probe",
                "fs_read_secrets",
                "--out",
                str(tmp_path / "r"),
            ],
            cwd=ROOT,
        )
        assert proc.wait(RUN_TIMEOUT_S) in {0, 1}
        assert witness_processes(proc.pid) == []
        facts = json.loads((tmp_path / "r" / "evidence.json").read_text())["kernel_witness"]
        expected = "was mounted" if mounted_before else "mounted and unmounted by this run"
        # Another run on this host may mount tracefs between our look and our start.
        assert facts["tracefs"] in {expected, "was mounted"}
        assert "notes" not in facts

    def test_sigterm_stops_the_witness(self, tmp_path: Path) -> None:
        """A run cut short by SIGTERM once its witness is attached leaves no bpftrace."""
        proc = subprocess.Popen(
            [
                *CLI,
                "run",
                "--backend-spec",
                str(SPEC),
                "--world",
                "loopback",
                "--out",
                str(tmp_path / "r"),
            ],
            cwd=ROOT,
        )
        deadline = time.monotonic() + 60.0
        while not witness_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert witness_processes(proc.pid), "the run never started its witness"
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(RUN_TIMEOUT_S)
        assert witness_processes(proc.pid) == []


# mov eax, 257; int 0x80; ret: i386's remap_file_pages, whose number is x86_64's openat.
INT80_257 = "b801010000cd80c3"
COMPAT_PAYLOAD = f"""
import ctypes, mmap, os
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(bytes.fromhex("{INT80_257}"))
ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()
try:
    os.open("/nonexistent/native", os.O_RDONLY)
except OSError:
    pass
"""


class TestOneCell:
    """One cell registered and drained by hand (no matrix run)."""

    def test_a_32_bit_syscall_is_not_read_as_a_64_bit_one(self) -> None:
        """A 32-bit call numbered 257 (not openat) is left out; the native openat is recorded."""
        witness = KernelWitness().start(cells_have_cgroups=True)
        group = cellgroup.new_cell()
        try:
            assert witness.attached, witness.why
            assert group.path is not None
            procs = group.path / "cgroup.procs"
            cg = cgroup_id(group.path)
            assert witness.register(cg)
            subprocess.run(
                [sys.executable, "-S", "-c", COMPAT_PAYLOAD],
                preexec_fn=lambda: procs.write_text("0"),
                check=True,
            )
            got = witness.drain(cg)
        finally:
            group.close(kill=True)
            witness.stop()
        assert got is not None
        opens = [e.describe() for e in got.events if e.syscall == "openat" and e.error]
        assert "openat(/nonexistent/native) -> ENOENT" in opens
        assert not [e for e in got.events if e.syscall == "openat" and e.error == "EINVAL"]
