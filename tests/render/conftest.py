"""Fixtures for rendering tests: a signed synthetic report with a failing, hostile cell."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest import sign_report
from sandbox_attest.attest.keys import SigningKey
from tests.attest.builder import build_report, make_cells, write_policy

if TYPE_CHECKING:
    from pathlib import Path

# Probe output is attacker-controlled: the page must show it as text, never run it.
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """A signed report: bubblewrap-fs_write_outside FAILs (hostile stderr); one UNAVAILABLE."""
    policy = write_policy(tmp_path / "policy.toml")
    cells = make_cells(
        backends=("none", "bubblewrap", "docker"),
        verdicts={
            "bubblewrap-fs_write_outside": "FAIL",
            "docker-dns_resolution": "UNAVAILABLE",
        },
    )
    for cell in cells:
        if cell["cell_id"] == "bubblewrap-fs_write_outside":
            cell["reason"] = "escape observed by the host: canary ~/.bashrc changed"
            cell["run"]["stderr"] = HOSTILE
            cell["witness"] = {"canary": {"path": "/home/u/.bashrc", "changed": True}}
            cell["attempts"][0]["errno"] = None
            cell["attempts"][0]["detail"] = "wrote 12 bytes | rename-over ok"
    report_dir = build_report(tmp_path / "run", policy, cells)
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    sign_report(report_dir, SigningKey.from_private_key(key, "file:t"), env={})
    return report_dir
