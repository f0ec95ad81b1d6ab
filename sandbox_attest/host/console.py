"""What a run prints goes on even when nobody reads it any more.

`sandbox-attest run | head -1` closes the pipe after one line; the next print raises
BrokenPipeError, and a run that died of it left an empty report directory: no evidence, no
attestation, for cells that may already have been judged. A run's output is for people; its
report is the product. So when a reader goes away, the stream it read is pointed at
/dev/null (the fd itself, so nothing buffered fails again at exit) and the run finishes.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import IO, Any, TextIO, cast


class ReaderGoneStream:
    """A text stream that survives its reader: after EPIPE it writes to /dev/null.

    Args:
        inner: the stream to wrap (sys.stdout or sys.stderr).
    """

    def __init__(self, inner: IO[str]) -> None:
        """Wrap `inner`; nothing is redirected until a write finds its reader gone."""
        self._inner = inner
        self.reader_gone = False

    def write(self, text: str) -> int:
        """Write `text`; a closed pipe turns this and later writes into no-ops."""
        if not self.reader_gone:
            try:
                return self._inner.write(text)
            except BrokenPipeError:
                self._lose_reader()
        return len(text)

    def flush(self) -> None:
        """Flush, unless the reader is gone."""
        if not self.reader_gone:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self._lose_reader()

    def isatty(self) -> bool:
        """A tty only while someone reads it."""
        return not self.reader_gone and self._inner.isatty()

    def _lose_reader(self) -> None:
        self.reader_gone = True
        # The fd too: what the inner buffer still holds would raise again at interpreter exit.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._inner.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        """Everything else (encoding, errors, fileno, buffer...) is the wrapped stream's."""
        return getattr(self._inner, name)


@contextlib.contextmanager
def readers_may_leave() -> Iterator[None]:
    """Within: sys.stdout and sys.stderr survive their readers; the streams are put back after."""
    saved = sys.stdout, sys.stderr
    sys.stdout = cast("TextIO", ReaderGoneStream(sys.stdout))
    sys.stderr = cast("TextIO", ReaderGoneStream(sys.stderr))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
