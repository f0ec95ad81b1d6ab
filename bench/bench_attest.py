"""Time sign_report + verify_report on 200 synthetic cells; prints seconds and the ratio to 1 s.

Run: .venv/bin/python bench/bench_attest.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*

from harness.attest import sign_report
from harness.attest.keys import SigningKey, TrustedKey
from harness.attest.policy import load_policy
from harness.attest.verify import verify_report
from tests.attest.builder import build_report, make_cells, write_policy

BUDGET_S = 1.0


def main() -> None:
    """Build a 200-cell report (4 backends x 50 probes), then time signing and verifying it."""
    probes = tuple(f"probe_{i:02d}" for i in range(50))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        policy_path = write_policy(root / "policy.toml", probes=probes)
        cells = make_cells(backends=("none", "bubblewrap", "docker", "command"), probes=probes)
        report = build_report(root / "run", policy_path, cells)
        key = SigningKey.from_private_key(Ed25519PrivateKey.generate(), "file:bench")
        trusted = TrustedKey(key.public_key, key.keyid, "bench")
        policy = load_policy(policy_path)
        t0 = time.perf_counter()
        sign_report(report, key, policy=policy, env={})
        t1 = time.perf_counter()
        result = verify_report(report, trusted, policy)
        t2 = time.perf_counter()
        assert result.ok, result.reasons
        size = (report / "evidence.json").stat().st_size
        print(f"cells={len(cells)} evidence.json={size / 1024:.0f} KiB")
        print(f"sign   {t1 - t0:.4f} s")
        print(f"verify {t2 - t1:.4f} s")
        print(f"total  {t2 - t0:.4f} s  = {(t2 - t0) / BUDGET_S:.3f} x the 1 s budget")


if __name__ == "__main__":
    main()
