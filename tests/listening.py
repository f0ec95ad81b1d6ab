"""Stopping a test's own accept loop for good.

A thread blocked in `accept()` does not wake when another thread closes the listening socket
(Linux keeps the blocked call on the open file). Such a thread outlives its test, and a later
check that needs a single-threaded process (entering the lab) then fails for a reason no test
names. `shutdown()` wakes the accept with EINVAL; then the socket can be closed and the thread
joined. The harness's own pipe broker stops its listener the same way.
"""

from __future__ import annotations

import contextlib
import socket
import threading


def stop_accept_loop(
    sock: socket.socket, thread: threading.Thread | None, timeout: float = 5.0
) -> None:
    """Wake the thread accepting on `sock`, close `sock`, and wait for the thread to end."""
    with contextlib.suppress(OSError):  # (never listened, or already shut down)
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    if thread is not None:
        thread.join(timeout)
        if thread.is_alive():
            raise AssertionError(f"the accept loop {thread.name} did not end on shutdown")
