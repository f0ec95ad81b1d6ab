"""The run's preflight: what the payload user cannot reach stops the run in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_attest.backends.base import shim_path
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.host.trust import payload_user
from sandbox_attest.paths import matrix_dir, payload_copy, probes_dir
from sandbox_attest.run.reach import (
    Need,
    Preflight,
    Problem,
    check_as,
    stage_payload_files,
    unstage,
)

USER = payload_user()
pytestmark = pytest.mark.skipif(USER is None, reason="needs the root harness's payload user")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root_only_dir() -> Iterator[Path]:
    """A `mktemp -d` directory: 0700 and root's, as pipx's home under /root or a venv's."""
    directory = Path(tempfile.mkdtemp(prefix="h2-reach-"))
    try:
        yield directory
    finally:
        for child in sorted(directory.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        directory.rmdir()


def test_a_path_under_a_root_only_dir_is_named_with_mode_owner_and_fix(
    root_only_dir: Path,
) -> None:
    """The child running as the payload user is refused; the line says where, why and the fix."""
    assert USER is not None
    inside = root_only_dir / "lib"
    inside.mkdir(mode=0o755)
    python = payload_interpreter(USER).path
    problems = check_as(USER, python, [(inside, "dir", "the interpreter's directory")])
    assert [(p.path, p.error) for p in problems] == [(inside, "EACCES")]
    line = problems[0].line(USER)
    assert line.startswith(
        f"the payload user {USER.name} (uid {USER.uid}) cannot enter the interpreter's "
        f"directory {inside} (EACCES): {root_only_dir} is mode 700, owner root:root"
    )
    assert f"chmod o+x {root_only_dir}" in line
    assert "\n" not in line


def test_what_the_user_can_reach_passes(tmp_path: Path) -> None:
    """A traversable directory and a world-readable file raise nothing."""
    assert USER is not None
    readable = tmp_path / "f.py"
    readable.write_text("pass\n")
    readable.chmod(0o644)
    python = payload_interpreter(USER).path
    assert check_as(USER, python, [(tmp_path, "dir", "a dir"), (readable, "read", "a file")]) == []


def test_an_unreadable_file_in_a_readable_dir_is_found(tmp_path: Path) -> None:
    """Mode bits on the file itself are checked too (root's os.access would say yes)."""
    assert USER is not None
    secret = tmp_path / "payload.py"
    secret.write_text("pass\n")
    secret.chmod(0o600)
    python = payload_interpreter(USER).path
    problems = check_as(USER, python, [(secret, "read", "the payload")])
    assert [p.error for p in problems] == ["EACCES"]
    assert "payload.py is mode 600, owner root:root" in problems[0].line(USER)


def test_the_run_stops_with_one_line_and_exit_2(root_only_dir: Path, tmp_path: Path) -> None:
    """`run` with the scratch's temp dir out of the payload user's reach: one line, exit 2."""
    tmpdir = root_only_dir / "tmp"
    tmpdir.mkdir(mode=0o1777)
    tmpdir.chmod(0o1777)
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_attest.cli", "run", "--backend", "none", "--out", "r"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("sandbox-attest: error: the payload user ")
    assert f"cannot enter the temp directory (the run's scratch) {tmpdir}" in lines[0]
    assert f"{root_only_dir} is mode 700, owner root:root" in lines[0]
    assert f"chmod o+x {root_only_dir}" in lines[0]
    assert lines[0].endswith("or set TMPDIR to a directory others can enter")
    assert not (tmp_path / "r").exists()  # stopped before the report directory was made


def test_plain_pytest_stops_with_the_same_line_and_exit_2(
    root_only_dir: Path, tmp_path: Path
) -> None:
    """`pytest --sandbox-attest M` (the plugin, no CLI) stops at collection with that line."""
    tmpdir = root_only_dir / "tmp"
    tmpdir.mkdir()
    tmpdir.chmod(0o1777)
    matrix = tmp_path / "m.toml"
    matrix.write_text(
        '[matrix]\ncontrol = "none"\n\n[[probe]]\nid = "net_denied_host"\ntimeout = 60\n\n'
        '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(matrix),
            f"--sandbox-attest={matrix}",
            f"--rootdir={tmp_path}",
            "-c",
            str(matrix_dir() / "pytest.ini"),
            f"--sandbox-attest-report-dir={tmp_path / 'r'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if "sandbox-attest: error:" in line]
    assert said, done.stdout[-3000:]
    assert f"cannot enter the temp directory (the run's scratch) {tmpdir}" in said[0]
    assert f"chmod o+x {root_only_dir}" in said[0]


def test_unreadable_payload_files_are_copied_for_the_run(tmp_path: Path) -> None:
    """Payload files the user cannot read are copied, readable, and the readers follow."""
    assert USER is not None
    installed_probes, installed_shim = probes_dir(), shim_path()
    needed = Preflight(
        payload_interpreter(USER), [Problem(installed_shim, "read", "EACCES", "the egress shim")]
    )
    try:
        copy = stage_payload_files(tmp_path, needed)
        assert copy == tmp_path / "lib"
        assert payload_copy() == copy
        assert probes_dir() == copy / "probes"
        assert shim_path() == copy / "shim.py"
        assert shim_path().read_bytes() == installed_shim.read_bytes()
        assert {p.name for p in probes_dir().glob("*.py")} == {
            p.name for p in installed_probes.glob("*.py")
        }
        python = payload_interpreter(USER).path
        items: list[tuple[Path, Need, str]] = [(shim_path(), "read", "the shim")]
        items += [(p, "read", "a payload") for p in probes_dir().glob("*.py")]
        assert check_as(USER, python, items) == []
    finally:
        unstage()
    assert probes_dir() == installed_probes
    assert shim_path() == installed_shim


def test_nothing_is_copied_when_the_installed_files_serve(tmp_path: Path) -> None:
    """With no payload file out of reach the run reads the installed ones."""
    assert USER is not None
    assert stage_payload_files(tmp_path, Preflight(payload_interpreter(USER), [])) is None
    assert payload_copy() is None
    assert list(tmp_path.iterdir()) == []
