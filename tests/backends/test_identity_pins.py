"""Backend identities pin what ran and who ran it; wrappers run as the payload user.

Live: real bubblewrap, real wrapper scripts run through `CommandBackend`, real uids.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.backends.base import EgressRoute, ProbeRequest
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.errors import ConfigError
from sandbox_attest.host.trust import payload_user
from sandbox_attest.world.core import World, start_world
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root")

# A wrapper that records the uid it runs as, then runs the payload (no confinement at all:
# only who runs it is under test here).
WRAPPER = """#!/bin/sh
id -u > "$UID_FILE"
exec "$@"
"""

SPEC = """
[backend]
name = "uid-recorder"
[detect]
executables = ["{wrapper}"]
[run]
egress = "harness-tcp"
argv = ["{wrapper}", "{{payload}}"]
{user}
[env]
set = {{UID_FILE = "{{run_dir}}/uid"}}
[claims]
network = "open"
filesystem = "open"
ipc = "open"
"""


def sha256_of(path: str) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def make_spec(tmp_path: Path, user: str = "") -> Path:
    """The uid-recording wrapper and its spec, with an optional `[run] user` block."""
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    spec = tmp_path / "uid-recorder.toml"
    spec.write_text(SPEC.format(wrapper=wrapper, user=user))
    return spec


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """A real running world: a command wrapper renders its placeholders from one."""
    with reachable_tempdir("sa-pin-") as base, start_world(base / "w") as running:
        yield running


def run_once(backend: CommandBackend, tmp_path: Path, world: World) -> int:
    """Run a payload that prints the start marker; return the uid the wrapper recorded."""
    cell_dir = tmp_path / "cell"
    workspace = cell_dir / "workspace"
    workspace.mkdir(parents=True)
    request = ProbeRequest(
        cell_id="uid-recorder-x",
        argv=(sys.executable, "-c", "print('SANDBOX-ATTEST-START x')"),
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        workspace=workspace,
        read_only=(),
        egress=EgressRoute(Path(world.info.proxy.socket), world.info.proxy.url),
        timeout=20,
        cell_dir=cell_dir,
        world=world.info,
        user=payload_user(),
    )
    run = backend.run(request)
    assert run.started, run.stderr
    return int((cell_dir / f"run-{backend.name}" / "uid").read_text())


class TestExecutablesPinned:
    def test_bubblewrap_pins_bwrap_and_the_interpreter(self) -> None:
        """The identity names bwrap, prlimit and python by the sha256 of the files that run."""
        identity = BubblewrapBackend().availability().identity
        assert identity is not None
        bwrap = identity.executables["bwrap"]
        assert bwrap["sha256"] == sha256_of(bwrap["realpath"])
        assert bwrap["realpath"] == os.path.realpath(shutil.which("bwrap") or "")
        python = identity.executables["{python}"]
        assert python["sha256"] == sha256_of(os.path.realpath(sys.executable))
        assert "prlimit" in identity.executables

    def test_a_script_wrapper_pins_its_interpreter_and_spec_bytes(self, tmp_path: Path) -> None:
        """A #! wrapper is pinned with its interpreter; the spec's own bytes are digested."""
        spec = make_spec(tmp_path)
        identity = CommandBackend.from_path(spec).availability().identity
        assert identity is not None
        facts = identity.executables[str(tmp_path / "wrapper.sh")]
        assert facts["sha256"] == sha256_of(str(tmp_path / "wrapper.sh"))
        assert facts["interpreter"]["realpath"] == os.path.realpath("/bin/sh")
        assert identity.spec_sha256 == hashlib.sha256(spec.read_bytes()).hexdigest()


@needs_root
class TestWhoRunsTheWrapper:
    def test_wrapper_runs_as_the_payload_user(self, tmp_path: Path, world: World) -> None:
        """By default the wrapper is the payload user's process, never the harness's (root)."""
        user = payload_user()
        assert user is not None
        backend = CommandBackend.from_path(make_spec(tmp_path))
        assert run_once(backend, tmp_path, world) == user.uid != 0
        identity = backend.availability().identity
        assert identity is not None
        assert identity.runs_as == f"{user.name} (uid {user.uid})"

    def test_root_needs_a_written_reason(self, tmp_path: Path) -> None:
        """`[run] user = "root"` without a reason is refused, naming the key to add."""
        with pytest.raises(ConfigError, match=r"user_reason.*is required"):
            CommandBackend.from_path(make_spec(tmp_path, 'user = "root"'))

    def test_root_with_a_reason_runs_as_root_and_says_why(
        self, tmp_path: Path, world: World
    ) -> None:
        """With a reason the wrapper runs as root, and the identity carries that reason."""
        block = 'user = "root"\nuser_reason = "the wrapper is setuid-free and needs root"'
        backend = CommandBackend.from_path(make_spec(tmp_path, block))
        assert run_once(backend, tmp_path, world) == 0
        identity = backend.availability().identity
        assert identity is not None
        assert "needs root" in identity.runs_as
