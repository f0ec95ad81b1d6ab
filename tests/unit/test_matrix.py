"""Loading the matrix file: good data loads, broken files name the file, entry and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.matrix import load_matrix
from harness.paths import matrix_dir

DATA = Path(__file__).parent.parent / "data"


class TestLoadMatrix:
    def test_shipped_matrix_loads_with_control_first(self) -> None:
        """The shipped matrix loads and the control leg's cells come before any other."""
        matrix = load_matrix(matrix_dir() / "matrix.toml")
        cells = matrix.cells(["bubblewrap", "none"], "linux")
        assert cells[0].backend == "none"
        assert {c.backend for c in cells[: len(matrix.probes)]} == {"none"}
        assert len(cells) == 2 * len(matrix.probes)
        assert all(c.not_applicable is None for c in cells)

    def test_backend_of_another_platform_is_not_applicable_with_reason(self) -> None:
        """Seatbelt on Linux is NOT_APPLICABLE, and the reason is the written one."""
        matrix = load_matrix(matrix_dir() / "matrix.toml")
        cells = [c for c in matrix.cells(["seatbelt"], "linux") if c.backend == "seatbelt"]
        assert cells
        assert all(c.not_applicable and "macOS" in c.not_applicable for c in cells)

    @pytest.mark.parametrize(
        ("name", "needle"),
        [
            ("matrix_unknown_key.toml", "unknown key(s) ['timout']"),
            ("matrix_exclusion_without_reason.toml", "needs a written 'reason'"),
            ("matrix_empty.toml", "empty matrix can never attest"),
            ("matrix_duplicate_probe.toml", "listed twice"),
            ("matrix_bad_toml.toml", "not valid TOML"),
        ],
    )
    def test_broken_files_are_named_errors(self, name: str, needle: str) -> None:
        """Each broken matrix file fails with a message naming the file and what to fix."""
        with pytest.raises(ConfigError) as err:
            load_matrix(DATA / name)
        assert name in str(err.value)
        assert needle in str(err.value)
