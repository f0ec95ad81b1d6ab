"""Loading the matrix file: good data loads, broken files name the file, entry and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_attest.errors import ConfigError
from sandbox_attest.paths import matrix_dir
from sandbox_attest.run.matrix import load_matrix

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


def write_matrix(tmp_path: Path, head: str, tail: str = "") -> Path:
    """A small matrix (one real probe, the control leg and bubblewrap) with extra text."""
    path = tmp_path / "m.toml"
    path.write_text(
        f"{head}\n"
        '[[probe]]\nid = "fs_write_outside"\n'
        '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        '[[backend]]\nname = "bubblewrap"\nplatforms = ["linux"]\n'
        f"{tail}\n"
    )
    return path


class TestControlLeg:
    @pytest.mark.parametrize(
        ("head", "needle"),
        [
            ('[matrix]\ncontrol = "bubblewrap"', "confines by design"),
            ('[matrix]\ncontrol = "nnone"', "not a [[backend]] of this matrix"),
            ('[matrix]\ncontrl = "none"', "[matrix]: unknown key(s) ['contrl']"),
        ],
    )
    def test_bad_control_is_rejected_naming_the_key(
        self, tmp_path: Path, head: str, needle: str
    ) -> None:
        """A confining, unknown or misspelt control never silently becomes the control leg."""
        with pytest.raises(ConfigError) as err:
            load_matrix(write_matrix(tmp_path, head))
        assert needle in str(err.value)
        assert "[matrix]" in str(err.value)

    def test_spec_declaring_confinement_cannot_be_the_control(self, tmp_path: Path) -> None:
        """A wrapper spec is judged by its declared policy: anything not open is rejected."""
        path = write_matrix(
            tmp_path,
            '[matrix]\ncontrol = "firejail"',
            '[[backend]]\nname = "firejail"\nplatforms = ["linux"]',
        )
        with pytest.raises(ConfigError) as err:
            load_matrix(path)
        assert "[matrix] control = 'firejail'" in str(err.value)
        assert "firejail declares" in str(err.value)

    def test_default_control_is_none(self, tmp_path: Path) -> None:
        """Without [matrix] the control leg is `none`."""
        assert load_matrix(write_matrix(tmp_path, "")).control == "none"


class TestExclusions:
    @pytest.mark.parametrize(
        ("tail", "needle"),
        [
            ('[[exclude]]\nprobe = "fs_write_outside"\nreason = "r"', "missing 'backend'"),
            ('[[exclude]]\nbackend = "none"\nreason = "r"', "missing 'probe'"),
            (
                '[[exclude]]\nbackend = "none"\nprobe = "fs_writ"\nreason = "r"',
                "probe = 'fs_writ' is not in this matrix",
            ),
            (
                '[[exclude]]\nbackend = "dockr"\nprobe = "fs_write_outside"\nreason = "r"',
                "backend = 'dockr' is not in this matrix",
            ),
        ],
    )
    def test_exclusion_must_name_a_cell_of_the_matrix(
        self, tmp_path: Path, tail: str, needle: str
    ) -> None:
        """An exclusion that would exclude nothing is an error, not a silent no-op."""
        with pytest.raises(ConfigError) as err:
            load_matrix(write_matrix(tmp_path, "", tail))
        assert needle in str(err.value)
        assert "[[exclude]] #1" in str(err.value)
