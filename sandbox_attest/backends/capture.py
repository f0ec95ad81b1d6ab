"""Capped output capture: keep the head of a stream, note that more came, never grow past it.

The head is what matters (the start marker and the JSON line come first); anything past
MAX_CAPTURE_BYTES is noise or an attack on the harness's memory. One buffer per stream, fed by
whoever reads it; `capture()` may be taken while a reader is still feeding (a reader stuck on
a pipe held open past the deadline), so what arrived so far is never lost.
"""

from __future__ import annotations

import threading

from sandbox_attest.backends.process import MAX_CAPTURE_BYTES, Capture


class CappedBuffer:
    """The first `limit` bytes of a stream, and whether any byte was dropped."""

    def __init__(self, limit: int = MAX_CAPTURE_BYTES) -> None:
        """An empty buffer keeping at most `limit` bytes."""
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._truncated = False
        self._lock = threading.Lock()  # feed() in a reader thread, capture() in the caller

    def feed(self, chunk: bytes) -> bool:
        """Keep what fits of `chunk`; False once anything has been dropped.

        A reader that may stop early (a log stream) stops at False; one whose writer must
        never block on a full pipe keeps reading and feeding, which then costs nothing.
        """
        with self._lock:
            keep = chunk[: max(0, self._limit - self._size)]
            if keep:
                self._chunks.append(keep)
                self._size += len(keep)
            self._truncated = self._truncated or len(keep) < len(chunk)
            return not self._truncated

    def capture(self) -> Capture:
        """What was kept so far."""
        with self._lock:
            return Capture(b"".join(self._chunks), self._truncated)
