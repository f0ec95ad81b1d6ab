"""A vendor's loop, live: claims with their sources, one cell rerun, its FAIL's fix, SARIF, diff.

Runs the real CLI in a subprocess against `matrix/backends/bwrap-generic.toml` (a spec with
a known hole: `ipc = "isolated"` implies a filtered syscall surface that bwrap cannot give
from a spec), as a vendor would, with no matrix or policy written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).parents[2]
CLI = [sys.executable, "-m", "sandbox_attest.cli"]
SPEC = ROOT / "matrix" / "backends" / "bwrap-generic.toml"
SCHEMA = ROOT / "tests" / "data" / "sarif" / "sarif-schema-2.1.0.json"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sys.platform != "linux" or shutil.which("bwrap") is None,
        reason="bwrap-generic needs bubblewrap on Linux (apt-get install bubblewrap)",
    ),
]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess from the repository root (bounded wait, not a timing check)."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=600, check=False, cwd=ROOT
    )


def cells(report: Path) -> dict[str, dict[str, object]]:
    """The report's cells by id."""
    evidence = json.loads((report / "evidence.json").read_text(encoding="utf-8"))
    return {str(c["cell_id"]): c for c in evidence["cells"]}


class TestVendorLoop:
    def test_backends_names_where_each_claim_comes_from(self) -> None:
        """`backends --backend-spec` prints the implied syscall claim and the spec's own line."""
        proc = cli("backends", "--backend-spec", str(SPEC))
        assert proc.returncode == 0, proc.stderr
        assert 'syscalls = "filtered"  (implied by ipc = "isolated")' in proc.stdout
        assert f'network = "proxy"  ({SPEC}:' in proc.stdout

    def test_one_probe_one_backend(self, tmp_path: Path) -> None:
        """`run --probe` runs only that probe on the spec and the control leg, and passes."""
        out = tmp_path / "pass"
        proc = cli(
            "run", "--probe", "net_denied_host", "--backend-spec", str(SPEC), "--out", str(out)
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert set(cells(out)) == {"none-net_denied_host", "bwrap-generic-net_denied_host"}
        assert {c["verdict"] for c in cells(out).values()} == {"PASS"}
        sarif = json.loads((out / "results.sarif").read_text(encoding="utf-8"))
        assert sarif["runs"][0]["results"] == []

    def test_a_fail_says_implied_names_the_fix_and_is_a_sarif_result(self, tmp_path: Path) -> None:
        """The known hole FAILs naming the implied claim and its fix, and is one SARIF result."""
        old = tmp_path / "old"
        new = tmp_path / "new"
        first = cli(
            "run", "--probe", "net_denied_host", "--backend-spec", str(SPEC), "--out", str(old)
        )
        assert first.returncode == 0, first.stdout + first.stderr
        proc = cli(
            "run",
            "--probe",
            "net_denied_host",
            "--probe",
            "proc_syscall_surface",
            "--backend-spec",
            str(SPEC),
            "--out",
            str(new),
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        fail = cells(new)["bwrap-generic-proc_syscall_surface"]
        assert fail["verdict"] == "FAIL"
        reason = str(fail["reason"])
        assert 'claims a filtered syscall surface (implied by ipc = "isolated")' in reason
        assert "; fix: " in reason
        sarif = json.loads((new / "results.sarif").read_text(encoding="utf-8"))
        jsonschema.Draft4Validator(json.loads(SCHEMA.read_text(encoding="utf-8"))).validate(sarif)
        (result,) = sarif["runs"][0]["results"]
        assert result["ruleId"] == "proc_syscall_surface"
        uris = [loc["physicalLocation"]["artifactLocation"]["uri"] for loc in result["locations"]]
        assert uris == ["matrix/backends/bwrap-generic.toml", "probes/proc_syscall_surface.py"]
        diff = cli("diff", str(old), str(new))
        # The new probe's cells are "added" (not worse); nothing old got worse here.
        assert diff.returncode == 0, diff.stdout + diff.stderr
        assert "bwrap-generic-proc_syscall_surface: - -> FAIL (added)" in diff.stdout
