"""Taking a client off a stand-in proxy socket the way the egress proxy does.

The in-sandbox shim hands each connection over (one NUL byte carrying the socket); the
backend tests' small stand-in proxies use this to serve the payload's own socket, and record
which way the client came so a test can assert the handoff crossed the sandbox boundary.
"""

from __future__ import annotations

import os
import socket

from sandbox_attest.world.egress.handoff import HANDOFF_MARKER


def take_client(conn: socket.socket) -> tuple[socket.socket, bytes, str]:
    """Returns (the socket to serve, bytes already read from it, "handoff" or "stream")."""
    data, fds, _, _ = socket.recv_fds(conn, 1, 1)
    if data == HANDOFF_MARKER and len(fds) == 1:
        return socket.socket(fileno=fds[0]), b"", "handoff"
    for fd in fds:
        os.close(fd)
    return conn, data, "stream"
