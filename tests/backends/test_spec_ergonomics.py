"""Spec ergonomics: one PATH, [run] cwd, {spec_dir}/{harness_home}, [lists], [env] wrapper.

Each test writes a small spec (and, where a wrapper must exist, a real script) and loads or
runs it for real: availability runs the wrapper's test command, prepare renders its files.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_attest.backends.base import EgressRoute, ProbeRequest
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.command.env import WRAPPER_ENV_FILE
from sandbox_attest.backends.command.spec_load import load_spec
from sandbox_attest.catalog import env as env_catalog
from sandbox_attest.errors import ConfigError
from sandbox_attest.world.core import World, start_world

WRAPPER = """#!/bin/sh
# A stand-in wrapper found only on [run] path: it runs its command unchanged.
exec "$@"
"""

BASE = """
[backend]
name = "ergonomic"
[detect]
executables = ["{exe}"]
[run]
egress = "harness-tcp"
{run}
argv = [{argv}"{{payload}}"]
{extra}
[claims]
network = "open"
filesystem = "open"
ipc = "open"
"""


def write(
    tmp_path: Path, exe: str = "env", run: str = "", argv: str = '"env", ', extra: str = ""
) -> Path:
    """A spec in `tmp_path` from BASE."""
    path = tmp_path / "ergonomic.toml"
    path.write_text(BASE.format(exe=exe, run=run, argv=argv, extra=extra))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


def request(world: World, tmp_path: Path) -> ProbeRequest:
    """A request for one cell, with the world's description."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return ProbeRequest(
        cell_id="ergonomic-x",
        argv=(sys.executable, "probe.py", "task.json"),
        env={"PATH": "/usr/bin:/bin", "HOME": str(workspace), "LANG": "C.UTF-8"},
        workspace=workspace,
        read_only=(Path("/opt/ro"),),
        egress=EgressRoute(Path(world.info.proxy.socket), world.info.proxy.url),
        timeout=5,
        cell_dir=tmp_path / "cell",
        world=world.info,
    )


class TestOnePath:
    def test_wrapper_only_on_run_path_is_found_and_run(self, tmp_path: Path) -> None:
        """A wrapper found only on [run] path is AVAILABLE, and its test command really ran."""
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        tmp_path.chmod(0o755)
        wrapper = bin_dir / "only-here-wrapper"
        wrapper.write_text(WRAPPER)
        wrapper.chmod(0o755)
        spec = write(
            tmp_path,
            exe="only-here-wrapper",
            run='path = "{spec_dir}/bin:/usr/bin:/bin"',
            argv='"only-here-wrapper", ',
        )
        backend = CommandBackend.from_path(spec)
        assert backend.run_path() == f"{tmp_path}/bin:/usr/bin:/bin"
        avail = backend.availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.profile["test_command"]["started"] is True
        assert avail.identity.profile["path"] == backend.run_path()

    def test_wrapper_missing_from_the_payload_path_is_unavailable(self, tmp_path: Path) -> None:
        """Detection looks where the cells look: not on the harness's PATH, on the payload's."""
        spec = write(tmp_path, exe="sandbox-attest-nowhere", argv='"sandbox-attest-nowhere", ')
        avail = CommandBackend.from_path(spec).availability()
        assert not avail.ok
        assert "not found on the payload's PATH (set [run] path)" in avail.reason

    def test_run_path_may_use_only_static_placeholders(self, tmp_path: Path) -> None:
        """[run] path is used before any cell exists, so {workspace} there is a ConfigError."""
        with pytest.raises(ConfigError, match=r"\[run\] path \(only \{spec_dir\}"):
            load_spec(write(tmp_path, run='path = "{workspace}/bin"'))

    def test_argv0_may_use_spec_dir(self, tmp_path: Path) -> None:
        """argv[0] may name the wrapper by {spec_dir}; a cell placeholder there is refused."""
        assert load_spec(write(tmp_path, argv='"{spec_dir}/w.sh", '))
        with pytest.raises(ConfigError, match=r"\[run\] argv\[0\]: must be the wrapper's"):
            load_spec(write(tmp_path, argv='"{run_dir}/w.sh", '))


class TestCwdAndPlaceholders:
    def test_cwd_renders_per_cell(self, world: World, tmp_path: Path) -> None:
        """[run] cwd = "{workspace}" makes the workspace the wrapper's working directory."""
        backend = CommandBackend.from_path(write(tmp_path, run='cwd = "{workspace}"'))
        req = request(world, tmp_path)
        _, _, cwd, _ = backend.prepare(req)
        assert cwd == req.workspace

    def test_cwd_that_is_no_directory_names_the_key(self, world: World, tmp_path: Path) -> None:
        """A cwd that renders to no directory is an error naming [run] cwd and the fix."""
        backend = CommandBackend.from_path(write(tmp_path, run='cwd = "{workspace}/nope"'))
        with pytest.raises(Exception, match=r"\[run\] cwd renders to .*nope, which is not a dir"):
            backend.prepare(request(world, tmp_path))

    def test_spec_dir_and_homes_render(self, world: World, tmp_path: Path) -> None:
        """{spec_dir}, {harness_home} and {wrapper_home} render to real directories."""
        extra = """
[[file]]
path = "where.json"
template = '{"spec": "{spec_dir}", "harness": "{harness_home}", "wrapper": "{wrapper_home}"}'
"""
        backend = CommandBackend.from_path(write(tmp_path, extra=extra))
        req = request(world, tmp_path)
        _, _, run_dir, _ = backend.prepare(req)
        where = json.loads((run_dir / "where.json").read_text())
        assert where["spec"] == str(tmp_path.resolve())
        assert where["harness"] == str(Path.home())
        assert where["wrapper"] == str(backend.wrapper_home(req))


class TestLists:
    def test_a_spec_list_splices_a_builtin_one(self, world: World, tmp_path: Path) -> None:
        """[lists] x = ["{read_only}", "/extra"] is read_only followed by /extra, in every form."""
        extra = """
[lists]
ro = ["{read_only}", "/extra", "{workspace}"]
[[file]]
path = "ro.json"
template = '{ro_json}'
"""
        backend = CommandBackend.from_path(
            write(tmp_path, argv='"env", {each = "ro", args = ["--ro={item}"]}, ', extra=extra)
        )
        req = request(world, tmp_path)
        argv, _, run_dir, _ = backend.prepare(req)
        want = ["/opt/ro", "/extra", str(req.workspace)]
        assert json.loads((run_dir / "ro.json").read_text()) == want
        assert argv[1:4] == [f"--ro={p}" for p in want]

    @pytest.mark.parametrize(
        ("lists", "needle"),
        [
            ('a = ["{b}"]\nb = ["/x"]', "splices a list defined after it"),
            ('read_only = ["/x"]', "must be a new lower-case identifier"),
            ('a = ["{nope}"]', "unknown placeholder {nope}"),
        ],
    )
    def test_bad_lists_name_the_key(self, tmp_path: Path, lists: str, needle: str) -> None:
        """A list splicing a later list, reusing a built-in name or a typo is a ConfigError."""
        with pytest.raises(ConfigError, match="lists") as info:
            load_spec(write(tmp_path, extra=f"[lists]\n{lists}\n"))
        assert needle in str(info.value)


class TestEnvWrapper:
    def test_wrapper_table_is_the_wrappers_alone(self, world: World, tmp_path: Path) -> None:
        """[env.wrapper] sets variables in the wrapper's env and records them for the probe."""
        extra = '[env.wrapper]\nCODEX_HOME = "{run_dir}/home"\n'
        backend = CommandBackend.from_path(write(tmp_path, extra=extra))
        req = request(world, tmp_path)
        _, env, run_dir, _ = backend.prepare(req)
        assert env["CODEX_HOME"] == f"{run_dir}/home"
        record = json.loads((req.cell_dir / WRAPPER_ENV_FILE).read_text())
        assert record["wrapper_only"] == ["CODEX_HOME"]

    def test_wrapper_list_refuses_secret_looking_names(self, tmp_path: Path) -> None:
        """A credential name in the [env] wrapper list is refused: never taken from the host."""
        with pytest.raises(ConfigError, match="never taken from the harness's environment"):
            load_spec(write(tmp_path, extra='[env]\nwrapper = ["GITHUB_TOKEN"]\n'))

    def test_a_name_in_set_and_wrapper_is_refused(self, tmp_path: Path) -> None:
        """A variable is the payload's to see (set) or the wrapper's alone, not both."""
        extra = '[env]\nset = {X = "1"}\nwrapper = {X = "2"}\n'
        with pytest.raises(ConfigError, match="either the payload's to see"):
            load_spec(write(tmp_path, extra=extra))

    def test_record_file_name_is_the_catalogues(self) -> None:
        """The backend writes the record where env_inheritance reads it."""
        assert WRAPPER_ENV_FILE == env_catalog.WRAPPER_ENV_FILE
