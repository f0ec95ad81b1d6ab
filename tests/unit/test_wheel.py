"""The wheel carries probes/, fixtures/ and matrix/ and finds them when installed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once (offline: hatchling comes from the test dependencies)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("sandbox_attest-*.whl")
    return built


@pytest.mark.slow
class TestWheel:
    def test_data_folders_are_package_data(self, wheel: Path) -> None:
        """Every probe, the matrix and the fixture data ride under sandbox_attest/_data."""
        names = set(zipfile.ZipFile(wheel).namelist())
        for probe in (ROOT / "probes").glob("*.py"):
            assert f"sandbox_attest/_data/probes/{probe.name}" in names
        for required in (
            "sandbox_attest/_data/matrix/matrix.toml",
            "sandbox_attest/_data/matrix/policy.toml",
            "sandbox_attest/_data/fixtures/blob.toml",
            "sandbox_attest/world/egress/shim.py",
        ):
            assert required in names
        # The one import package: no top-level probes/fixtures/matrix to shadow PyPI's.
        assert not {n.split("/")[0] for n in names} & {"probes", "fixtures", "matrix", "reports"}

    def test_installed_copy_reads_its_own_data(self, wheel: Path, tmp_path: Path) -> None:
        """Unpacked like site-packages, the package finds _data, not a folder beside it."""
        site = tmp_path / "site"
        zipfile.ZipFile(wheel).extractall(site)
        (site / "probes").mkdir()  # another distribution's `probes` package, say
        code = (
            "from sandbox_attest.paths import probes_dir, matrix_dir; "
            "print(probes_dir()); print(matrix_dir())"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": str(site)},
            timeout=60,
            cwd=tmp_path,  # not the clone: `python -c` puts the cwd first on sys.path
        ).stdout
        assert out.split() == [
            str(site / "sandbox_attest/_data/probes"),
            str(site / "sandbox_attest/_data/matrix"),
        ]
