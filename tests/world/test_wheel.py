"""The canary wheel: built with zipfile, valid for a real pip install."""

from __future__ import annotations

import base64
import csv
import hashlib
import subprocess
import sys
import zipfile
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.paths import fixtures_dir
from sandbox_attest.world.wheel import build_canary_wheel

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

SRC = fixtures_dir() / "canary_wheel"
DIST_INFO = "kiln_helpers-1.0.0.dist-info"


class TestBuild:
    def test_name_and_metadata(self, tmp_path: Path) -> None:
        """The wheel has the expected file name, METADATA name/version and WHEEL tag."""
        wheel = build_canary_wheel(SRC, tmp_path, "n1")
        assert wheel.name == "kiln_helpers-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as zf:
            metadata = zf.read(f"{DIST_INFO}/METADATA").decode()
            tags = zf.read(f"{DIST_INFO}/WHEEL").decode()
        assert "Name: kiln-helpers\n" in metadata
        assert "Version: 1.0.0\n" in metadata
        assert "Tag: py3-none-any\n" in tags
        assert "Root-Is-Purelib: true\n" in tags

    def test_record_matches_every_file(self, tmp_path: Path) -> None:
        """RECORD lists every other file with its urlsafe-b64 sha256 and size."""
        wheel = build_canary_wheel(SRC, tmp_path, "n1")
        with zipfile.ZipFile(wheel) as zf:
            rows = list(csv.reader(zf.read(f"{DIST_INFO}/RECORD").decode().splitlines()))
            names = set(zf.namelist())
            for name, digest, size in rows:
                if name == f"{DIST_INFO}/RECORD":
                    assert (digest, size) == ("", "")
                    continue
                data = zf.read(name)
                b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert digest == "sha256=" + b64.decode()
                assert int(size) == len(data)
        assert {r[0] for r in rows} == names

    def test_nonce_is_baked_in_and_build_is_deterministic(self, tmp_path: Path) -> None:
        """The nonce replaces the placeholder; the same nonce gives identical bytes."""
        first = build_canary_wheel(SRC, tmp_path / "a", "abc-123").read_bytes()
        again = build_canary_wheel(SRC, tmp_path / "b", "abc-123").read_bytes()
        other = build_canary_wheel(SRC, tmp_path / "c", "zzz").read_bytes()
        assert first == again
        assert first != other
        with zipfile.ZipFile(tmp_path / "a" / "kiln_helpers-1.0.0-py3-none-any.whl") as zf:
            source = zf.read("kiln_helpers/__init__.py").decode()
        assert 'NONCE = "abc-123"' in source
        assert "@NONCE@" not in source

    @pytest.mark.parametrize("nonce", ["", 'x"; import os', "a/b", "x" * 129])
    def test_unsafe_nonce_refused(self, tmp_path: Path, nonce: str) -> None:
        """A nonce that could break out of the string literal is refused."""
        with pytest.raises(FixtureError, match="nonce"):
            build_canary_wheel(SRC, tmp_path, nonce)


def test_pip_installs_file_and_import_prints_nonce(
    tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """A real `pip install --no-index --target` accepts the wheel; importing it gives the nonce."""
    wheel = build_canary_wheel(SRC, tmp_path / "dist", "pipnonce42")
    target = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--no-index", "--no-cache-dir",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=120, env=clean_env(), check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    out = subprocess.run(
        [sys.executable, "-c", "import kiln_helpers as c; print(c.NONCE)"],
        capture_output=True, text=True, timeout=30, env=clean_env(PYTHONPATH=str(target)),
        check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "pipnonce42"
