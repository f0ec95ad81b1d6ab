"""ipc_unix_socket_escape under `ipc = "open"`: no claim to test, so NOT_APPLICABLE (issue 27).

A backend that claims open IPC promises nothing about the host's unix sockets. Before, the
spec turned that claim into an expectation that the escape succeeds, so a sandbox that
blocks more than it claims came out INCONCLUSIVE. The control leg (`none`, which claims
nothing) must still run the probe: it is the unconfined leg every PASS rests on.
"""

from __future__ import annotations

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.backends.none import CLAIMS as CONTROL_LEG
from sandbox_attest.catalog import PROBES

SPEC = PROBES["ipc_unix_socket_escape"]


class TestOpenIpcClaim:
    def test_open_ipc_on_a_confining_backend_is_not_claimed(self) -> None:
        """Proxy network, workspace files, open IPC: the probe tests no claim it makes."""
        declared = DeclaredClaims("proxy", "workspace", "open")
        why = SPEC.not_claimed(declared)
        assert why is not None
        assert 'ipc = "open"' in why
        assert "ipc_unix_socket_escape" in why

    def test_the_control_leg_still_runs_it(self) -> None:
        """The control leg claims nothing: it runs the probe and must see the escape."""
        assert SPEC.not_claimed(CONTROL_LEG) is None
        assert SPEC.expectation(CONTROL_LEG) == "allowed"

    def test_isolated_ipc_is_judged(self) -> None:
        """`ipc = "isolated"` is the claim this probe tests: it runs, the escape denied."""
        declared = DeclaredClaims("proxy", "workspace", "isolated")
        assert SPEC.not_claimed(declared) is None
        assert SPEC.expectation(declared) == "denied"
