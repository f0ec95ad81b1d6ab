"""A proxy's refusal is no PASS where the host saw a way around the proxy (issue 27).

`sandbox_attest.catalog.net.direct.around_the_proxy`, applied by the runner to every cell of
the probes that judge the proxy's checks: under a network claim cut by a namespace, a payload
the host saw in the harness's network namespace reaches what the proxy refuses without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import CellContext, WorldLike, around_the_proxy
from sandbox_attest.verdict import Assessment, decide

SHARED = {"seen": True, "pid": 41, "shared_with_harness": ["net"], "namespaces": {"net": "net:[7]"}}
OWN = {"seen": True, "pid": 41, "shared_with_harness": [], "default_routes": []}


def ctx(probe: str, view: dict[str, Any], cut: str = "namespace") -> CellContext:
    """A cell of `probe` on a backend claiming the proxy as its only route (cut by `cut`)."""
    claims = DeclaredClaims(
        network="proxy",
        filesystem="workspace",
        ipc="isolated",
        network_cut=cut,  # type: ignore[arg-type]  # the test's parameter is a plain str
    )
    return CellContext(
        probe=probe,
        backend="wrapper",
        nonce="n0",
        world=cast("WorldLike", None),
        workspace=Path("/nonexistent"),
        cell_dir=Path("/nonexistent"),
        claims=claims,
        host_view=dict(view),
    )


def refused() -> Assessment:
    """The proxy answered 403 to every request, and no witness heard anything."""
    return Assessment(
        "refused", controls_ok=True, reasons=["proxy answered 403"], observed="refused"
    )


class TestAroundTheProxy:
    def test_shared_network_makes_a_refusal_an_escape(self) -> None:
        """Seen in the harness's netns: FAIL observed by the host, naming the netns and a fix."""
        judged = around_the_proxy(ctx("net_denied_host", SHARED), refused())
        decision = decide("denied", judged)
        assert decision.verdict.value == "FAIL"
        assert decision.reason.startswith("escape observed by the host")
        assert "harness's network namespace (net:[7])" in decision.reason
        assert "fix: give the payload a network namespace of its own" in decision.reason
        assert "proxy answered 403" in decision.reason

    @pytest.mark.parametrize("cut", ["seccomp", "proxy-only"])
    def test_a_cut_that_shares_the_namespace_by_design_is_left_alone(self, cut: str) -> None:
        """Under seccomp or proxy-only cuts the netns is shared by design: the refusal stands."""
        assert around_the_proxy(ctx("net_denied_host", SHARED, cut), refused()).escape == "refused"

    def test_an_own_network_is_left_alone(self) -> None:
        """A payload in a namespace of its own with no default route: the refusal stands."""
        assert around_the_proxy(ctx("net_proxy_smuggling", OWN), refused()).escape == "refused"

    def test_other_probes_are_left_alone(self) -> None:
        """Only the probes of the proxy's checks: net_direct_egress reads the netns itself."""
        assert around_the_proxy(ctx("fs_read_secrets", SHARED), refused()).escape == "refused"

    def test_no_host_reading_is_left_alone(self) -> None:
        """Where the host saw no payload process, nothing is read into the cell."""
        assert around_the_proxy(ctx("net_denied_host", {"seen": False}), refused()).escape == (
            "refused"
        )
