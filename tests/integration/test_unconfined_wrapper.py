"""A wrapper that runs nothing confined FAILs every negative probe, naming the hole (issue 27).

Three wrappers under tests/data/unconfined/ run the payload with no confinement at all and
declare the claims a strict sandbox makes (network through the proxy in a namespace of its
own, reads and writes limited to the workspace, protected paths, isolated ipc, a filtered
syscall surface, a scrubbed environment, non-root, resource limits), one per egress mode:
`harness-unix` (`env` around the harness's shim, which then listens in the harness's own
network namespace), `harness-tcp` (`env`, the payload dialing the harness proxy's loopback
port) and `own` (a correct allowlisting proxy of the wrapper's own beside the unconfined
payload). Each runs the whole catalogue with the control leg, in the lab, `-j 2`, as a user
runs it (`sandbox-attest run --backend-spec ... --world lab`).

The negative probes are read from the catalogue, never listed by hand: every probe whose
expectation under the wrapper's claims is "denied" and whose claim it makes. Each must be
FAIL with a reason that names the hole's object (a path, an address, a socket, a descriptor,
a syscall, a process), and the gate must be FAILED. The only other verdict allowed is
NOT_APPLICABLE: for a probe this host cannot judge at all (tests/here.py, the host's own
reason), or for a probe that cannot apply under the egress mode, listed below by name with
the runner's reason text. Nothing else is excused: a negative probe that PASSes on a wrapper
that confines nothing is a false pass, and this test fails on it.

Root only (the payload user and the lab exist only as root). Each run's wall time is printed
(`-s` shows it) and named in every assertion message about its cells.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.catalog import PROBES
from sandbox_attest.paths import matrix_dir
from sandbox_attest.report.evidence import EVIDENCE_NAME
from sandbox_attest.run.matrix import load_matrix
from sandbox_attest.world.lab import lab_supported
from tests.here import not_judgeable_here
from tests.reachable import reachable_tempdir

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation and the lab need root"),
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "unconfined"
CLI = [sys.executable, "-m", "sandbox_attest.cli"]
RUN_TIMEOUT_S = 600
# Each egress mode's wrapper (tests/data/unconfined/).
SPECS = {
    "harness-unix": DATA / "unconfined_unix.toml",
    "harness-tcp": DATA / "unconfined_tcp.toml",
    "own": DATA / "unconfined_own.toml",
}
# Probes that cannot apply under an egress mode, by name, with the runner's reason: under
# `own` the harness has no socket or shim inside to tamper with; the wrapper's own proxy is
# judged by the net_* probes.
CANNOT_APPLY: dict[str, dict[str, str]] = {
    "harness-unix": {},
    "harness-tcp": {},
    "own": {
        "ipc_proxy_socket_tamper": (
            'the backend brings its own proxy (egress "own"): no harness proxy socket or shim '
            "is inside it to tamper with; its proxy is judged by the net_* probes"
        ),
    },
}
# What a FAIL's reason must name, per probe: the hole's object. A negative probe missing
# here fails the test: a new probe must say which object its FAIL names.
_PATH = r"/[\w.@-]+/[\w./@-]+"
_ADDR = r"\b(?:\d{1,3}\.){3}\d{1,3}\b|\[?[0-9a-f]*:[0-9a-f:]+\]?:\d+"
HOLE_NAMED: dict[str, str] = {
    "net_denied_host": r"harness's network namespace \(net:\[\d+\]\)|denied",
    "net_direct_egress": r"harness's network namespace \(net:\[\d+\]\)",
    "dns_resolution": r"DNS fixture heard the payload|queries carrying the nonce",
    "ipc_unix_socket_escape": r"witness socket " + _PATH + r"|socket " + _PATH,
    "fs_write_outside": r"canary changes: \w+ \(" + _PATH,
    "net_host_canonical": r"harness's network namespace \(net:\[\d+\]\)",
    "net_proxy_confusion": r"harness's network namespace \(net:\[\d+\]\)",
    "net_private_address": r"harness's network namespace \(net:\[\d+\]\)|" + _ADDR,
    "net_proxy_env_override": r"rogue proxy saw \d+|denied origin \d+ requests",
    "net_loopback_services": r"service saw \d+ connections",
    "net_ipv6_udp_icmp": r"host saw (?:udp|tcp)[46]",
    "fs_read_secrets": r"canary bytes: \w+ \(" + _PATH,
    "fs_protected_in_workspace": r"the payload wrote \w+ \(\.[\w/.-]+\)",
    "fs_link_escape": r"canary reached",
    "dev_access": r"/dev/[\w/-]+",
    "env_inheritance": r"AWS_SECRET_ACCESS_KEY",
    "ipc_proxy_socket_tamper": r"decoy-(?:socket|shim)",
    "lifecycle_orphans": r"children outlived the payload: [\w, ]+",
    "proc_visibility": r"host pid \d+|pid \d+",
    "proc_privileges": r"pid \d+",
    "proc_namespace_escape": r"setns-(?:mnt|net)",
    "proc_syscall_surface": r"reached [\w, -]*(?:io_uring_setup|keyctl|bpf)",
    "resource_limits": r"fsize_mib=16 \(Max file size unlimited\) on pid \d+",
    "proc_syscall_surface_extended": r"reached [\w, -]*(?:add_key|userfaultfd|perf_event_open)",
    "proc_new_mount_api": r"reached [\w, -]*(?:clone3-newns|open_tree|fsopen)",
    "proc_cross_process": r"host pid \d+",
    "proc_kernel_tunables": r"group /sys/fs/cgroup/" + r"[\w./-]+",
    "fs_machinery_overwrite": r"machinery written: " + _PATH,
    # The canary by its host path, or through a descriptor: the payload's own, or another
    # process's through /proc/PID/fd (the harness's pid namespace, same uid).
    "fs_leaked_dirfd": r"(?:procfd|dirfd|fchdir):\d+|" + _PATH,
    "fs_setup_race": r"unix socket of the payload's is left on the host: " + _PATH,
    "fs_open_by_handle": r"canary outside its view",
    "net_proxy_dns_exfil": r"harness's network namespace \(net:\[\d+\]\)|DNS fixture logged",
    "net_socks5": r"harness's network namespace \(net:\[\d+\]\)|SOCKS",
    "net_metadata_service": r"metadata service's stand-in was reached",
    "net_proxy_ignored": r"allowed origin logged \d+ requests that bypassed the proxy",
    "net_proxy_smuggling": r"harness's network namespace \(net:\[\d+\]\)",
    "net_proxy_upgrade": r"harness's network namespace \(net:\[\d+\]\)",
    "net_dns_rebinding": r"harness's network namespace \(net:\[\d+\]\)",
    "net_doh_bypass": r"harness's network namespace \(net:\[\d+\]\)",
    "net_proxy_relay": r"harness's network namespace \(net:\[\d+\]\)",
}
# How a FAIL says what it rests on (tests/integration/test_real_sandboxes.py).
SAID = ("escape observed by the host", "escape reported by the payload (not seen by")


@dataclass(frozen=True)
class UnconfinedRun:
    """One full-matrix run of one unconfined wrapper: its cells, gate, exit and wall time."""

    egress: str
    backend: str
    cells: dict[str, dict[str, Any]]
    gate: str
    returncode: int
    wall_s: float
    output: str


def negative_probes(spec: Path) -> set[str]:
    """The probes whose expectation under `spec`'s claims is "denied", and whose claim it makes.

    Read from the catalogue: each spec's `expectation` and `not_claimed` against the claims
    the wrapper declares.
    """
    claims = CommandBackend.from_path(spec).spec.claims
    return {
        probe
        for probe, probe_spec in PROBES.items()
        if probe_spec.expectation(claims) == "denied" and probe_spec.not_claimed(claims) is None
    }


def run_unconfined(egress: str) -> UnconfinedRun:
    """Run the whole catalogue on the control leg and `egress`'s wrapper, in the lab, -j 2."""
    spec = SPECS[egress]
    backend = CommandBackend.from_path(spec).name
    probes = load_matrix(matrix_dir() / "matrix.toml").probes
    with reachable_tempdir("a27-unconf-") as root:
        matrix = root / "matrix.toml"
        matrix.write_text(
            "".join(f'[[probe]]\nid = "{p.id}"\ntimeout = {p.timeout:g}\n' for p in probes)
            + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        )
        listed = ", ".join(f'"{p.id}"' for p in probes)
        policy = root / "policy.toml"
        policy.write_text(
            "".join(
                f'[[require]]\nplatform = "linux"\nbackend = "{b}"\nprobes = [{listed}]\n'
                for b in ("none", backend)
            )
        )
        out = root / "report"
        argv = [*CLI, "run", "--matrix", str(matrix), "--policy", str(policy)]
        argv += ["--backend-spec", str(spec), "--world", "lab", "-j", "2", "--out", str(out)]
        start = time.monotonic()
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=REPO
        )
        wall = time.monotonic() - start
        output = f"exit {done.returncode}: {done.stdout[-3000:]} {done.stderr[-2000:]}"
        evidence = out / EVIDENCE_NAME
        assert evidence.is_file(), f"no evidence: {output}"
        cells = {
            c["probe"]: c
            for c in json.loads(evidence.read_text())["cells"]
            if c["backend"] == backend
        }
        gate = str(json.loads((out / "signing.json").read_text()).get("gate"))
    return UnconfinedRun(egress, backend, cells, gate, done.returncode, wall, output)


@pytest.fixture(scope="module", params=sorted(SPECS))
def run(request: pytest.FixtureRequest) -> UnconfinedRun:
    """One run per egress mode, one at a time (the module's tests share it)."""
    supported, why_not = lab_supported()
    if not supported:
        pytest.skip(f"the lab world needs root and network namespaces: {why_not}")
    done = run_unconfined(str(request.param))
    print(f"\nunconfined wrapper, egress {done.egress}: full matrix in {done.wall_s:.1f} s")
    return done


def _show(run: UnconfinedRun, probes: set[str]) -> str:
    cells = "; ".join(
        f"{p}: {run.cells[p]['verdict']} {run.cells[p]['reason'][:300]}" for p in sorted(probes)
    )
    return f"egress {run.egress} (full matrix in {run.wall_s:.1f} s): {cells}"


@pytest.mark.slow
class TestUnconfinedWrapper:
    def test_every_negative_probe_fails(self, run: UnconfinedRun) -> None:
        """Every negative probe is FAIL, but those that cannot apply (host or egress mode)."""
        negative = negative_probes(SPECS[run.egress])
        excused = set(CANNOT_APPLY[run.egress]) | {p for p in PROBES if not_judgeable_here(p)}
        assert set(run.cells) == set(PROBES), run.output
        missed = {p for p in negative - excused if run.cells[p]["verdict"] != "FAIL"}
        assert missed == set(), _show(run, missed)

    def test_fails_name_the_hole(self, run: UnconfinedRun) -> None:
        """Each FAIL says what it rests on and names the hole's object."""
        failed = {p for p, c in run.cells.items() if c["verdict"] == "FAIL"}
        assert set(HOLE_NAMED) >= negative_probes(SPECS[run.egress]), "a probe with no pattern"
        unnamed = {
            p
            for p in failed
            if not run.cells[p]["reason"].startswith(SAID)
            or not re.search(HOLE_NAMED[p], run.cells[p]["reason"])
        }
        assert unnamed == set(), _show(run, unnamed)

    def test_cells_that_cannot_apply_say_why(self, run: UnconfinedRun) -> None:
        """NOT_APPLICABLE only by name, with exactly the reason listed (or the host's own)."""
        want = dict(CANNOT_APPLY[run.egress])
        want |= {p: r for p in PROBES if (r := not_judgeable_here(p)) is not None}
        got = {p: c["reason"] for p, c in run.cells.items() if c["verdict"] == "NOT_APPLICABLE"}
        assert got == want

    def test_no_cell_is_error_or_inconclusive(self, run: UnconfinedRun) -> None:
        """No cell is ERROR, UNAVAILABLE or INCONCLUSIVE: an unconfined payload decides all."""
        odd = {
            p
            for p, c in run.cells.items()
            if c["verdict"] in ("ERROR", "UNAVAILABLE", "INCONCLUSIVE")
        }
        assert odd == set(), _show(run, odd)

    def test_gate_is_failed(self, run: UnconfinedRun) -> None:
        """The signed gate is FAILED and the run exits 1."""
        assert (run.gate, run.returncode) == ("FAILED", 1), run.output
