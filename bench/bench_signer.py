"""Benchmark: signing a 200-cell report through the signer process vs in this process.

Run by hand: `.venv/bin/python bench/bench_signer.py [--runs N]`. The two ways sign the same
judged bytes (evidence, junit, the rendered views) side by side, interleaved, so a busy moment
of a shared machine hits both alike; the medians are printed with their ratio and the
signer's overhead as a share of its 50 ms budget (issue 12: separating the key into its own
process must not make signing noticeably slower). This was a test's assertion until the suite
stopped asserting on time (issue 24): on a loaded 2-core machine a budget measures the load,
not the code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*

from sandbox_attest.attest import sign_judged
from sandbox_attest.attest.keys import SigningKey, private_key_pem
from sandbox_attest.attest.signer import Signer
from sandbox_attest.attest.subjects import EVIDENCE, HTML, JUNIT, SUMMARY
from sandbox_attest.report.files import make_report_dir, open_report_dir
from sandbox_attest.report.policy import Policy, gate_for, load_policy
from sandbox_attest.report.signature import SignerFacts
from sandbox_attest.report.views import render_html, render_summary
from tests.attest.builder import build_report, make_cells, write_policy

CELLS = 200
# What the signer process may add to one signing step, over signing in-process.
OVERHEAD_BUDGET_S = 0.050
# 29 backends x the core probes, cut to CELLS: the shape the test had.
BACKENDS = ("none", "bubblewrap", *(f"b{i:02d}" for i in range(27)))


def judged_bytes(root: Path, policy: Policy, facts: SignerFacts) -> dict[str, bytes]:
    """The bytes a session hands the signer: evidence and junit as built, views rendered."""
    source = build_report(root / "built", Path(policy.path), make_cells(backends=BACKENDS)[:CELLS])
    evidence_bytes = (source / EVIDENCE).read_bytes()
    evidence = json.loads(evidence_bytes)
    assert len(evidence["cells"]) == CELLS, len(evidence["cells"])  # the shape the test had
    return {
        EVIDENCE: evidence_bytes,
        JUNIT: (source / JUNIT).read_bytes(),
        HTML: render_html(evidence, facts, policy).encode(),
        SUMMARY: render_summary(evidence, facts, policy).encode(),
    }


def measure(runs: int) -> tuple[list[float], list[float]]:
    """Seconds per signing step, (through the signer, in-process), `runs` of each, interleaved.

    The signer's start (once per run in real use) is outside the timing, as are the views.
    """
    process: list[float] = []
    local: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        policy = load_policy(write_policy(root / "policy.toml"))
        policy_bytes = Path(policy.path).read_bytes()
        key_file = root / "signing.pem"
        key_file.write_bytes(private_key_pem(Ed25519PrivateKey.generate()))
        key_file.chmod(0o600)
        key = SigningKey.from_private_key(Ed25519PrivateKey.generate(), "file:bench")
        with Signer.start(key_file, {}, payload=None) as signer:
            files = judged_bytes(root, policy, signer.facts)
            gate = gate_for(json.loads(files[EVIDENCE]), policy).result
            for i in range(runs):
                out = make_report_dir(root / f"p{i}")
                began = time.perf_counter()
                signer.sign_report(
                    out, files, policy_bytes=policy_bytes, policy_path=policy.path, gate=gate
                )
                process.append(time.perf_counter() - began)

                out = make_report_dir(root / f"i{i}")
                began = time.perf_counter()
                dir_fd = open_report_dir(out)
                try:
                    sign_judged(out, dir_fd, key, files, policy=policy, expected_gate=gate, env={})
                finally:
                    os.close(dir_fd)
                local.append(time.perf_counter() - began)
    return process, local


def main(argv: list[str] | None = None) -> None:
    """Print both medians side by side, their ratio, and the overhead against its budget."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="signing steps of each kind")
    args = parser.parse_args(argv)
    process, local = measure(args.runs)
    median_process = statistics.median(process)
    median_local = statistics.median(local)
    overhead = median_process - median_local
    print(f"cells={CELLS} runs={args.runs} (medians, interleaved)")
    print(f"{'way':<24} {'median ms':>10}")
    print(f"{'signer process':<24} {median_process * 1000:>10.1f}")
    print(f"{'in-process sign_judged':<24} {median_local * 1000:>10.1f}")
    print(f"signer / in-process: {median_process / median_local:.2f}x")
    print(
        f"overhead {overhead * 1000:.1f} ms = {overhead / OVERHEAD_BUDGET_S:.2f} x its "
        f"{OVERHEAD_BUDGET_S * 1000:.0f} ms budget"
    )


if __name__ == "__main__":
    main()
