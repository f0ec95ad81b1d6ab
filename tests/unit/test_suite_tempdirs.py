"""The suite's temporary directories stay reachable by the payload user while other pytests start.

pytest tightens `<tmp>/pytest-of-<user>` to 0700 whenever a pytest of that user starts. The
suite's own directories live elsewhere (tests/conftest.py), so a nested or concurrent pytest
cannot take the payload user's way to a cell's task file for that moment.
"""

from __future__ import annotations

import getpass
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox_attest.host.trust import payload_user, unreachable_by

# pytest's own base for every run of this user (`_pytest.tmpdir`'s naming).
SHARED = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"


def test_tmp_path_is_not_under_the_shared_pytest_directory(tmp_path: Path) -> None:
    """The base is this suite's own root, which no other pytest chmods."""
    assert SHARED not in tmp_path.parents
    assert tmp_path.parents[-3].name.startswith("attest-tests-")


@pytest.mark.skipif(payload_user() is None, reason="needs root (a payload user to reach with)")
def test_another_pytest_starting_leaves_the_way_open(tmp_path: Path) -> None:
    """A pytest started now (as a test of the plugin does) tightens only its own directory."""
    user = payload_user()
    task = tmp_path / "task.json"
    task.write_text("{}")
    assert unreachable_by(task.parent, user) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "test_nothing.py").write_text("def test_nothing(tmp_path):\n    pass\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:sandbox_attest",
            str(empty),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=empty,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    # The nested run used (and tightened) the shared directory, not ours.
    assert stat.S_IMODE(SHARED.stat().st_mode) & 0o077 == 0
    assert unreachable_by(task.parent, user) is None
