"""A slirp-style gateway is a path out: net_direct_egress FAILs and names what was reached.

The wrapper (tests/data/gateway/relay_wrapper.py) gives the payload a private network
namespace, as a sandbox with a user-mode network stack does, and relays the sandbox's own
address to the harness side's loopback. Nothing but the namespace's own address and
127.0.0.1 is ever dialled.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.report.evidence import CellEntry
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

DATA = Path(__file__).resolve().parents[1] / "data" / "gateway"


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """A real running world (loopback: the relay dials the harness side's 127.0.0.1)."""
    with reachable_tempdir("sa-gw-") as base, start_world(base / "w") as running:
        yield running


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> CommandBackend:
    """The leaky wrapper's backend, its spec naming the wrapper's absolute path."""
    if shutil.which("ip") is None:
        pytest.fail("iproute2 is required for this test: apt-get install iproute2")
    spec = tmp_path_factory.mktemp("gateway") / "gateway.toml"
    text = (DATA / "gateway.toml").read_text()
    spec.write_text(text.replace("WRAPPER_PATH", str(DATA / "relay_wrapper.py")))
    return CommandBackend.from_path(spec)


def run(world: World, scratch: Path, gateway: CommandBackend) -> CellEntry:
    """The control leg, then the gateway wrapper, on net_direct_egress."""
    none = NoneBackend()
    runner = CellRunner(
        world=world,
        scratch=scratch,
        backends={"none": none, gateway.name: gateway},
        availability={"none": none.availability(), gateway.name: gateway.availability()},
        platform="linux",
    )
    row = ProbeRow("net_direct_egress", 60)
    control = runner.run_cell(Cell("none", row, None))
    assert control["verdict"] == "PASS", control["reason"]
    return runner.run_cell(Cell(gateway.name, row, None))


def test_a_gateway_relaying_to_the_host_side_fails_and_names_the_address(
    world: World, gateway: CommandBackend, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The payload reached the witness through its own address: FAIL, address named."""
    avail = gateway.availability()
    assert avail.ok, avail.reason  # a private network namespace: it may run
    entry = run(world, tmp_path_factory.mktemp("gw-cells"), gateway)
    assert entry["verdict"] == "FAIL", entry["reason"]
    assert "reached " in entry["reason"]
    assert "127.0.0.1" in entry["reason"]
    own = {a["what"]: a["outcome"] for a in entry["attempts"]}
    assert own["tcp-own-198.18.99.15"] == "succeeded", own
    assert "198.18.99.15" in entry["probe_facts"]["own_addresses"]
