"""ipc_proxy_socket_tamper attacks the route each backend really gives it (issue 14, item 5).

Each backend says where it shows the payload the egress socket and shim (`inside_paths`);
the runner hands that to the cell as its `InsideRoute`. After the cell the harness removes
whatever carries the nonce from every host directory of the route, and names it as a leak.
Real backends' objects, real spec files, a real running world; the reports are hand-made.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import (
    NAMESPACED_INSIDE_PATHS,
    SANDBOX_PROXY_SOCKET,
    SANDBOX_SHIM,
    DeclaredClaims,
)
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.catalog import PROBES, CellContext, InsideRoute
from sandbox_attest.catalog.ipc.proxy_socket import TAMPER_OPS, IpcProxySocketTamper
from sandbox_attest.paths import matrix_dir
from sandbox_attest.run.runner import inside_route
from sandbox_attest.verdict import Verdict, decide
from sandbox_attest.world.core import World, start_world
from tests.catalog.test_proc import CONFINED, att
from tests.reachable import reachable_tempdir

SOCKETS = Path(__file__).parent.parent / "data" / "sockets"


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One world for the module, under a short /tmp path (unix socket limits)."""
    with reachable_tempdir("sa-route-") as base, start_world(base / "w") as running:
        yield running


class TestInsidePaths:
    def test_bubblewrap_uses_the_sandbox_run_dir(self, world: World, tmp_path: Path) -> None:
        """The bubblewrap backend shows the route at SANDBOX_RUN_DIR (/run/kiln/) in every cell."""
        route = inside_route(BubblewrapBackend(), world.info, tmp_path)
        assert route is not None
        assert (route.proxy_socket, route.shim) == (SANDBOX_PROXY_SOCKET, SANDBOX_SHIM)

    def test_a_wrapper_uses_its_specs_paths(self, world: World, tmp_path: Path) -> None:
        """A command wrapper's route is its spec's [run] *_inside, not the fixed path."""
        route = inside_route(
            CommandBackend.from_path(SOCKETS / "hole_host_run.toml"), world.info, tmp_path
        )
        assert route is not None
        assert (route.proxy_socket, route.shim) == (
            "/sandbox-route/proxy.sock",
            "/sandbox-route/shim.py",
        )

    def test_a_wrapper_default_is_rendered_for_the_world(
        self, world: World, tmp_path: Path
    ) -> None:
        """A spec's default inside paths render to this world's socket and the shim's path."""
        backend = CommandBackend.from_path(SOCKETS / "egress_dir_only.toml")
        route = inside_route(backend, world.info, tmp_path)
        assert route is not None
        assert route.proxy_socket == world.info.proxy.socket
        assert Path(route.shim) == route.shim_source

    def test_own_egress_has_no_route(self, world: World, tmp_path: Path) -> None:
        """A wrapper with its own proxy (srt) has no harness route inside: None."""
        srt = CommandBackend.from_path(matrix_dir() / "backends" / "srt.toml")
        assert inside_route(srt, world.info, tmp_path) is None

    def test_a_backend_without_a_say_gets_the_namespaced_paths(
        self, world: World, tmp_path: Path
    ) -> None:
        """The control leg (TCP to the proxy, no shim inside) gets the namespaced default."""
        route = inside_route(NoneBackend(), world.info, tmp_path)
        assert route is not None
        assert (route.proxy_socket, route.shim) == (
            NAMESPACED_INSIDE_PATHS.proxy_socket,
            NAMESPACED_INSIDE_PATHS.shim,
        )


def tamper_ctx(world: World, tmp_path: Path, route: InsideRoute) -> CellContext:
    """A confined tamper cell on the real world, with `route` as its inside route."""
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    return CellContext(
        probe="ipc_proxy_socket_tamper",
        backend="a-wrapper",
        nonce=nonce,
        world=world,
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=CONFINED,
        route=route,
    )


def refused_report() -> dict[str, Any]:
    """Every control op worked in the workspace; every op on decoy and route refused."""
    attempts = [att(f"workspace:{op}", "succeeded", "control") for op in TAMPER_OPS]
    for key in ("decoy", "sandbox"):
        attempts += [att(f"{key}:{op}", "refused", errno="EACCES") for op in TAMPER_OPS]
    attempts.append(att("route-after", "succeeded", "control", status=200))
    facts = {"mntns": "mnt:[1]", "sandbox_route_tried": True, "visible:sandbox": True}
    return {"attempts": attempts, "facts": facts}


class TestLeftOnTheHost:
    def test_a_rogue_socket_in_the_routes_host_dir_is_fail_and_removed(
        self, world: World, tmp_path: Path
    ) -> None:
        """A rogue-<nonce>.sock the payload left in a host dir of the route is FAIL, and goes."""
        route_dir = tmp_path / "route"
        route_dir.mkdir()
        base = inside_route()
        route = InsideRoute(
            str(route_dir / "proxy.sock"),
            str(route_dir / "shim.py"),
            base.shim_port,
            base.shim_source,
        )
        ctx = tamper_ctx(world, tmp_path, route)
        spec = PROBES[ctx.probe]
        try:
            spec.prepare(ctx)
            rogue = route_dir / f"rogue-{ctx.nonce}.sock"
            rogue.write_text("")  # what a sandbox sharing this host dir lets the payload leave
            control = spec.host_control(ctx)
            assessment = spec.assess(ctx, refused_report(), world.records(ctx.nonce), control)
        finally:
            spec.cleanup(ctx)
        decision = decide("denied", assessment)
        assert decision.verdict is Verdict.FAIL
        assert f"rogue-{ctx.nonce}.sock appeared in the host's {route_dir} (removed)" in (
            decision.reason
        )
        assert assessment.witness["removed"] == [str(rogue)]
        assert not rogue.exists()

    def test_a_route_at_host_paths_is_withheld_without_a_uid_of_its_own(
        self, world: World, tmp_path: Path
    ) -> None:
        """A route at host paths is not handed to a payload of the harness's uid; it says why."""
        base = inside_route()
        route = InsideRoute(
            world.info.proxy.socket, str(base.shim_source), base.shim_port, base.shim_source
        )
        ctx = tamper_ctx(world, tmp_path, route)
        spec = PROBES[ctx.probe]
        try:
            targets = spec.prepare(ctx)
            assert targets["shim_url"] == ""
            report = refused_report()
            report["facts"]["sandbox_route_tried"] = False
            report["attempts"] = [a for a in report["attempts"] if "sandbox:" not in a["what"]]
            control = spec.host_control(ctx)
            assessment = spec.assess(ctx, report, world.records(ctx.nonce), control)
        finally:
            spec.cleanup(ctx)
        decision = decide("denied", assessment)
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert "run as root so payloads get a uid of their own" in decision.reason


class TestApplicable:
    def test_no_network_claimed_means_no_route_to_tamper_with(self) -> None:
        """Under network = "none" the probe is NOT_APPLICABLE; under a proxied network it runs."""
        spec = IpcProxySocketTamper()
        none = DeclaredClaims(network="none", filesystem="workspace", ipc="isolated")
        proxied = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
        assert spec.not_claimed(none) == (
            'the backend claims network = "none": it gives the payload no egress route '
            "to tamper with; the net_* probes judge that claim"
        )
        assert spec.not_claimed(proxied) is None
