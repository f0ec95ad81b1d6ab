"""The unix socket's handoff: a shim hands the proxy the payload's own TCP connection.

The in-sandbox shim does not relay bytes itself: for each connection it accepts it sends one
NUL byte carrying that TCP socket (SCM_RIGHTS; read by `take_handoff`), and the proxy serves
the payload's connection directly, so every byte still passes the proxy's admission,
accounting and backpressure. That takes the shim's copy hop out of the path
(bench/bench_proxy.py: about 2.3 GB/s handed off against 1.7-2.4 GB/s relayed, and the shim's
CPU from about 0.27 s/GiB to none). Only the sandbox's own socket crosses the boundary, into
the proxy; no host socket is ever passed into a sandbox. The proxy adopts a handed-over
descriptor only if it is a connected TCP socket (`adopt_handed_socket`, 400 otherwise), and
keeps it, and the upstream dialed for it, no longer than the unix connection that brought it
stays open (`Leash`), so nothing handed over outlives the shim or its sandbox, whatever the
origin does. A unix client that does not start with NUL simply speaks HTTP.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import TYPE_CHECKING

from sandbox_attest.world.egress.wire import Refusal, abort_sockets

if TYPE_CHECKING:
    from sandbox_attest.world.egress.decisions import DecisionRecord

# The first byte a shim sends on the unix socket to hand over a connection; no HTTP request
# head starts with NUL, so a plain client can never be mistaken for a handoff.
HANDOFF_MARKER = b"\x00"
# Ends the reason of a decision line whose tunnel was cut by its leash (`Leash`).
CUT_REASON = "cut: the unix connection that handed it over closed"


def take_handoff(
    conn: socket.socket, record: DecisionRecord, head_timeout: float
) -> tuple[socket.socket, bytes]:
    """Read a unix client's first byte: a handoff (marker + one TCP socket) or plain HTTP.

    Returns the socket to serve and the bytes already read from it. Descriptors that are
    not exactly one connected TCP socket behind the marker are closed and refused.
    """
    conn.settimeout(head_timeout)
    try:
        # Room for one descriptor only: the kernel drops any extra and sets MSG_CTRUNC.
        data, fds, flags, _ = socket.recv_fds(conn, 1, 1)
    except TimeoutError:
        raise Refusal(408, f"request head not complete within {head_timeout:g}s") from None
    conn.settimeout(None)
    if data != HANDOFF_MARKER or len(fds) != 1 or flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        if data == HANDOFF_MARKER:
            raise Refusal(400, "a handoff must carry exactly one TCP socket")
        if fds or flags & socket.MSG_CTRUNC:
            raise Refusal(400, "descriptors sent without the handoff marker")
        return conn, data
    client = adopt_handed_socket(fds[0])
    record.client = "unix-handoff"
    return client, b""


class Leash:
    """Ties a handed-over socket, and the upstream dialed for it, to the unix connection.

    The sender keeps that connection open while the payload's connection lives (the shim
    waits for our close). When it closes, because the shim or its whole sandbox is gone, the
    tunnel is cut: without this a sandbox could hand over both ends of one TCP connection and
    leave a tunnel running after it exited. The cut shuts down both ends, the handed-over
    socket and the upstream (`hold`), because each pump blocks reading one of them: shutting
    only the client leaves the pump that reads a silent origin asleep, and the tunnel, its
    threads, descriptors and decision line wait for the origin to close (issue 18).

    Made by `server._Server._handle` for a handed-over client only. It never closes a socket:
    the owners close them after `release`, so a shutdown from the watcher can never reach a
    descriptor number that was reused in between.
    """

    def __init__(self, conn: socket.socket, client: socket.socket) -> None:
        """Start watching `conn`, the unix connection that handed `client` over."""
        self._conn = conn
        self._ends = [client]
        self._lock = threading.Lock()
        self._released = False
        self._fired = False
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @property
    def fired(self) -> bool:
        """Whether the sender closed while the tunnel was held, so the cut ended it."""
        with self._lock:
            return self._fired

    def hold(self, upstream: socket.socket) -> None:
        """Cut `upstream` with the client; at once if the leash fired while it was dialed."""
        with self._lock:
            if self._released:
                return
            self._ends.append(upstream)
            if self._fired:
                abort_sockets(upstream)

    def _watch(self) -> None:
        with contextlib.suppress(OSError):
            # Returns at EOF (the sender is gone) or on any byte (not part of the protocol).
            self._conn.recv(1)
        with self._lock:
            if not self._released:
                self._fired = True
                abort_sockets(*self._ends)  # wakes both pumps; their owners close the sockets

    def release(self) -> None:
        """End the watch before the owners close the sockets; a second call does nothing.

        After it returns the watcher has exited and touches no held socket again.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
        with contextlib.suppress(OSError):
            self._conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher's recv
        self._thread.join()

    def note(self, record: DecisionRecord) -> None:
        """Append the cut to `record`'s reason if the leash fired; call once, before writing."""
        if self.fired:
            record.reason = f"{record.reason}; {CUT_REASON}"


def adopt_handed_socket(fd: int) -> socket.socket:
    """Wrap a descriptor a sandbox handed over; only a connected TCP socket is accepted.

    The proxy only reads, writes and closes it; checking the kind keeps a pipe, a listener, a
    UDP or a unix socket from being served as if it were the payload's connection.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        raise Refusal(400, "the handed-over descriptor is not a socket") from None
    try:
        is_tcp = (
            sock.family in (socket.AF_INET, socket.AF_INET6)
            and sock.type == socket.SOCK_STREAM
            and sock.proto == socket.IPPROTO_TCP
            and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        )
        if is_tcp:
            sock.getpeername()  # raises ENOTCONN for a socket that never connected
    except OSError:
        is_tcp = False
    if not is_tcp:
        sock.close()
        raise Refusal(400, "the handed-over descriptor is not a connected TCP socket")
    return sock
