"""Time signing and verifying a 200-cell report; one row per way of signing, seconds and ratio.

Run: .venv/bin/python bench/bench_attest.py

Each row is a `Case`: a name and a function that signs the built report and returns when the
attestation is on disk. To add a row (e.g. the separate signer process), append a `Case` to
`CASES`; every row is verified by the same `verify_report` and printed the same way.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*

from sandbox_attest.attest import sign_judged
from sandbox_attest.attest.keys import SigningKey, TrustedKey, private_key_pem
from sandbox_attest.attest.signer import Signer
from sandbox_attest.attest.subjects import EVIDENCE, HTML, JUNIT, SARIF, SUMMARY
from sandbox_attest.attest.verification import Checks
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.report import files as reportfs
from sandbox_attest.report.junit import render_junit
from sandbox_attest.report.outcomes import run_outcomes
from sandbox_attest.report.policy import Policy, gate_for, load_policy
from sandbox_attest.report.sarif import render_sarif
from sandbox_attest.report.signature import SignerFacts
from sandbox_attest.report.views import render_html, render_summary
from tests.attest.builder import build_report, make_cells, write_policy

if TYPE_CHECKING:
    from collections.abc import Callable

BUDGET_S = 1.0
PROBES = tuple(f"probe_{i:02d}" for i in range(50))
BACKENDS = ("none", "bubblewrap", "docker", "command")


@dataclass(frozen=True)
class Case:
    """One way of signing: `sign(report_dir, key, policy)` leaves a signed report behind."""

    name: str
    sign: Callable[[Path, SigningKey, Policy], object]


def _views(report: Path, policy: Policy, facts: SignerFacts | None) -> dict[str, bytes]:
    """The judged bytes a session hands over: evidence as written, views rendered from it."""
    evidence_bytes = (report / EVIDENCE).read_bytes()
    evidence = json.loads(evidence_bytes)
    outcomes = run_outcomes(evidence, policy)
    return {
        EVIDENCE: evidence_bytes,
        JUNIT: render_junit(evidence, outcomes),
        HTML: render_html(evidence, facts, policy).encode(),
        SUMMARY: render_summary(evidence, facts, policy).encode(),
        SARIF: render_sarif(evidence),
    }


def _in_process(report: Path, key: SigningKey, policy: Policy) -> float:
    """The signing step in this process: `sign_judged` over the judged bytes."""
    files = _views(report, policy, None)
    evidence = json.loads(files[EVIDENCE])
    dir_fd = reportfs.open_report_dir(report)
    try:
        t0 = time.perf_counter()
        sign_judged(
            report,
            dir_fd,
            key,
            files,
            policy=policy,
            expected_gate=gate_for(evidence, policy).result,
            env={},
        )
        return time.perf_counter() - t0
    finally:
        os.close(dir_fd)


def _signer_process(report: Path, key: SigningKey, policy: Policy) -> float:
    """The same step as a run does it: the separate signer process, handed the same bytes.

    The signer's start (about 0.1 s, once per run) is outside the timing, as it is outside a
    run's signing step; the views are rendered before the clock starts, for both rows.
    """
    key_file = report.parent / f"{report.name}.key.pem"
    key_file.write_bytes(private_key_pem(key.private_key))
    key_file.chmod(0o600)
    with Signer.start(key_file, {}) as signer:
        files = _views(report, policy, signer.facts)
        evidence = json.loads(files[EVIDENCE])
        t0 = time.perf_counter()
        signer.sign_report(
            report,
            files,
            policy_bytes=Path(policy.path).read_bytes(),
            policy_path=policy.path,
            gate=gate_for(evidence, policy).result,
        )
        return time.perf_counter() - t0


CASES = [
    Case("in-process sign_judged", _in_process),
    Case("signer process", _signer_process),
]


def time_case(case: Case, root: Path, policy_path: Path) -> tuple[float, float, int]:
    """Build a fresh 200-cell report, then time signing it and verifying it (seconds)."""
    cells = make_cells(backends=BACKENDS, probes=PROBES)
    report = build_report(root / case.name.replace(" ", "-"), policy_path, cells)
    key = SigningKey.from_private_key(Ed25519PrivateKey.generate(), "file:bench")
    trusted = TrustedKey(key.public_key, key.keyid, "bench")
    policy = load_policy(policy_path)
    t0 = time.perf_counter()
    timed = case.sign(report, key, policy)
    t1 = time.perf_counter()
    if isinstance(timed, float):  # a case that times its own signing step (not its start-up)
        t0 = t1 - timed
    result = verify_report(report, trusted, policy, checks=Checks(untrusted_keyids=frozenset()))
    t2 = time.perf_counter()
    assert result.ok, result.reasons
    return t1 - t0, t2 - t1, (report / "evidence.json").stat().st_size


def main() -> None:
    """Print one row per case: sign, verify and total time, and total as a share of 1 s."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        policy_path = write_policy(root / "policy.toml", probes=PROBES)
        print(f"cells={len(BACKENDS) * len(PROBES)}")
        print(f"{'case':<28} {'sign s':>8} {'verify s':>9} {'total s':>8} {'x 1 s':>7}")
        for case in CASES:
            sign_s, verify_s, size = time_case(case, root, policy_path)
            total = sign_s + verify_s
            print(
                f"{case.name:<28} {sign_s:>8.4f} {verify_s:>9.4f} {total:>8.4f} "
                f"{total / BUDGET_S:>7.3f}   (evidence.json {size / 1024:.0f} KiB)"
            )


if __name__ == "__main__":
    main()
