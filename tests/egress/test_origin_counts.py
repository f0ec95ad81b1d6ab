"""The test origin's accept count is read by waiting for it, never bare (issue 18).

The origin is the real threaded loopback server the egress tests use; connections here are
real TCP connections made straight to it.
"""

from __future__ import annotations

import socket
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.egress.egress_helpers import Origin


def _connect(origin: Origin) -> socket.socket:
    return socket.create_connection((origin.host, origin.port), timeout=10)


class TestSettledAccepts:
    def test_a_fresh_origin_settles_at_zero(self, make_origin: Callable[..., Origin]) -> None:
        """An origin nobody connected to settles at zero, and its marker is not counted."""
        origin = make_origin("echo")
        assert origin.settled_accepts() == 0
        assert origin.settled_accepts() == 0
        assert origin.accepts == 0

    def test_connections_made_before_the_call_are_all_counted(
        self, make_origin: Callable[..., Origin]
    ) -> None:
        """Every connection whose handshake completed before settled_accepts() is counted."""
        origin = make_origin("http")
        clients = [_connect(origin) for _ in range(4)]
        try:
            assert origin.settled_accepts() == 4
        finally:
            for sock in clients:
                sock.close()
        assert origin.requests == []  # the marker was never served as a request

    def test_settling_waits_for_a_held_count(self, make_origin: Callable[..., Origin]) -> None:
        """A count held back in the accept thread is waited for, not read as missing."""
        reached = threading.Event()
        release = threading.Event()

        def hold() -> None:
            reached.set()
            release.wait(timeout=30)

        origin = make_origin("echo", on_accept=hold)
        client = _connect(origin)
        try:
            assert reached.wait(timeout=10)
            bare = origin.accepts
            releaser = threading.Thread(target=release.set)
            releaser.start()
            settled = origin.settled_accepts()
            releaser.join(timeout=10)
        finally:
            release.set()
            client.close()
        assert (bare, settled) == (0, 1)


class TestWaitForAccepts:
    def test_the_deadline_returns_the_short_count(self, make_origin: Callable[..., Origin]) -> None:
        """When fewer accepts than asked arrive, the wait ends at its deadline with the count."""
        origin = make_origin("echo")
        with _connect(origin):
            assert origin.wait_for_accepts(1) == 1
            assert origin.wait_for_accepts(2, timeout=0.2) == 1
