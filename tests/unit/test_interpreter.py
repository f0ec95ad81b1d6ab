"""The payload interpreter: one the payload user can run, chosen by asking as that user."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_attest.errors import ConfigError
from sandbox_attest.host.interpreter import bind_paths_of, choose, describe_as
from sandbox_attest.host.trust import payload_user

USER = payload_user()
needs_user = pytest.mark.skipif(USER is None, reason="needs the root harness's payload user")
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def root_only_dir() -> Iterator[Path]:
    """A `mktemp -d` directory (0700, root's) like the one a venv or pipx home sits in."""
    # Not the suite's tmp_path: the suite makes its directories traversable on purpose.
    directory = Path(tempfile.mkdtemp(prefix="h2-root-only-"))
    try:
        assert directory.stat().st_mode & 0o777 == 0o700
        yield directory
    finally:
        for child in sorted(directory.rglob("*"), reverse=True):
            child.unlink() if not child.is_dir() or child.is_symlink() else child.rmdir()
        directory.rmdir()


def python_link(directory: Path) -> Path:
    """A `bin/python` symlink to the system's Python, as a venv has."""
    (directory / "bin").mkdir(mode=0o755)
    link = directory / "bin" / "python"
    link.symlink_to(SYSTEM_PYTHON)
    return link


@needs_user
@pytest.mark.skipif(not Path(SYSTEM_PYTHON).is_file(), reason="needs the system's python3")
class TestChoice:
    def test_an_interpreter_under_a_root_only_dir_is_passed_over(self, root_only_dir: Path) -> None:
        """A harness Python the payload user cannot reach is rejected with why; /usr/bin wins."""
        assert USER is not None
        harness = python_link(root_only_dir)
        chosen = choose(USER, [(str(harness), "harness"), (SYSTEM_PYTHON, "system")])
        assert chosen.path == SYSTEM_PYTHON
        assert chosen.source == "system"
        assert len(chosen.rejected) == 1
        assert chosen.rejected[0].startswith(f"{harness}: cannot be started: Permission denied")
        assert str(harness) in chosen.reason

    def test_the_choice_is_recorded_with_its_reason(self, root_only_dir: Path) -> None:
        """The evidence record names the interpreter, its version, the rejected one and why."""
        assert USER is not None
        harness = python_link(root_only_dir)
        record = choose(USER, [(str(harness), "harness"), (SYSTEM_PYTHON, "system")]).as_dict()
        assert record["path"] == SYSTEM_PYTHON
        assert record["realpath"] == os.path.realpath(SYSTEM_PYTHON)
        assert record["version"].startswith("3.")
        assert record["source"] == "system"
        assert record["rejected"] == [f"{harness}: cannot be started: Permission denied (errno 13)"]
        assert record["harness_executable"] == sys.executable

    def test_a_reachable_harness_interpreter_is_kept(self, tmp_path: Path) -> None:
        """Where the payload user can run the harness's Python, that one is chosen."""
        assert USER is not None
        harness = python_link(tmp_path)  # the suite's tmp dirs are traversable by the user
        chosen = choose(USER, [(str(harness), "harness"), (SYSTEM_PYTHON, "system")])
        assert chosen.path == str(harness)
        assert chosen.source == "harness"
        assert chosen.rejected == ()

    def test_too_old_a_python_is_passed_over(self, tmp_path: Path) -> None:
        """A candidate that starts but reports Python 3.7 is rejected for its version."""
        assert USER is not None
        fake = tmp_path / "python3.7"
        fake.write_text(
            "#!/bin/sh\n"
            'echo \'{"version": [3, 7, 9], "executable": "x", "realpath": "x", "prefix": "/",'
            ' "base_prefix": "/", "pip": true, "missing": []}\'\n'
        )
        fake.chmod(0o755)
        chosen = choose(USER, [(str(fake), "path"), (SYSTEM_PYTHON, "system")])
        assert chosen.path == SYSTEM_PYTHON
        assert chosen.rejected == (f"{fake}: is Python 3.7.9, older than the payloads' 3.8",)

    def test_no_usable_interpreter_names_each_and_the_fix(self, root_only_dir: Path) -> None:
        """With nothing the payload user can run, the error lists every candidate and the fix."""
        assert USER is not None
        harness = python_link(root_only_dir)
        with pytest.raises(ConfigError) as caught:
            choose(USER, [(str(harness), "harness"), ("/bin/false", "path")])
        said = caught.value.diagnostics()
        assert f"{harness}: cannot be started: Permission denied" in said
        assert "/bin/false: failed to start: exit 1" in said
        assert "apt-get install python3" in said


@needs_user
def test_the_description_is_taken_as_the_payload_user() -> None:
    """The candidate is started under the payload user's uid, not root's."""
    assert USER is not None
    facts, why = describe_as(SYSTEM_PYTHON, USER)
    assert why == ""
    assert facts is not None
    assert facts["missing"] == []
    probe = Path(tempfile.mkdtemp(prefix="h2-owner-"))
    try:
        # A 0700 root directory: only a child that really is the payload user is refused.
        facts, why = describe_as(str(probe / "python"), USER)
        assert facts is None
        assert "Permission denied" in why
    finally:
        probe.rmdir()


class TestBindPaths:
    def test_a_venv_binds_itself_and_not_usr(self) -> None:
        """A venv over the system Python binds the venv once; /usr is bound by every backend."""
        found = bind_paths_of("/opt/v/bin/python", "/usr/bin/python3.11", ("/opt/v", "/usr"))
        assert found == [Path("/opt/v")]

    def test_the_system_python_binds_nothing_extra(self) -> None:
        """`/usr/bin/python3` needs no bind beyond the system roots."""
        assert bind_paths_of("/usr/bin/python3", "/usr/bin/python3.11", ("/usr",)) == []

    def test_a_python_outside_usr_binds_its_prefix(self) -> None:
        """A Python under /opt binds its prefix, which holds the executable and the stdlib."""
        found = bind_paths_of(
            "/opt/py/bin/python3", "/opt/py/bin/python3.12", ("/opt/py", "/opt/py")
        )
        assert found == [Path("/opt/py")]
