"""A command wrapper sees the egress shim under the cell's neutral name (issue 23, part 4)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.backends.base import EgressRoute, ProbeRequest
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.payload import TELLTALE_WORDS, staged_shim_path
from sandbox_attest.world.core import World, start_world

if TYPE_CHECKING:
    from collections.abc import Iterator

# Egress through the harness's unix socket with the default `shim_inside = "{shim}"`: the
# shim's own path is in the payload's argv, where the wrapper reads it.
SPEC = """
[backend]
name = "plain"
description = "runs its payload as given"
platforms = ["linux"]

[detect]
executables = ["env"]

[run]
egress = "harness-unix"
argv = ["env", "{payload}"]

[claims]
network = "proxy"
filesystem = "open"
ipc = "open"
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module (its proxy socket is what the shim is given)."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


def backend(tmp_path: Path) -> CommandBackend:
    """The harness-unix spec above, loaded from a file."""
    spec = tmp_path / "plain.toml"
    spec.write_text(SPEC)
    return CommandBackend.from_path(spec)


def test_the_payload_argv_names_the_staged_shim(world: World, tmp_path: Path) -> None:
    """The rendered payload runs the cell's staged copy, and no word names the harness."""
    cell_dir = tmp_path / "cell"
    (cell_dir / "workspace").mkdir(parents=True)
    staged = staged_shim_path(cell_dir)
    request = ProbeRequest(
        cell_id="plain-x",
        argv=(sys.executable, "/app/main.py", "/app/job.py", "/app/config.json"),
        env={},
        workspace=cell_dir / "workspace",
        read_only=(),
        egress=EgressRoute(Path(world.info.proxy.socket), world.info.proxy.url),
        timeout=5,
        cell_dir=cell_dir,
        world=world.info,
        shim=staged,
    )
    run_dir = cell_dir / "run-plain"
    run_dir.mkdir()
    payload = backend(tmp_path).context(request, run_dir).payload
    assert payload[1] == str(staged)
    # The names the harness chose below the cell dir (this suite's own temp root is
    # `attest-tests-*`, which a run's scratch is not).
    chosen = str(Path(payload[1]).relative_to(cell_dir)).lower()
    assert [w for w in TELLTALE_WORDS if w in chosen] == []


def test_the_inside_route_is_the_staged_shim(world: World, tmp_path: Path) -> None:
    """What a probe attacks as the shim is the copy the cell really runs."""
    cell_dir = tmp_path / "cell"
    paths = backend(tmp_path).inside_paths(world.info, cell_dir)
    assert paths is not None
    assert paths.shim == str(staged_shim_path(cell_dir))
