"""CappedBuffer: the one capped capture docker and appcontainer share."""

from __future__ import annotations

from sandbox_attest.backends.capture import CappedBuffer
from sandbox_attest.backends.process import Capture


def test_keeps_the_head_and_says_it_dropped_the_rest() -> None:
    """Bytes past the cap are dropped and flagged; the head stays whole."""
    buffer = CappedBuffer(limit=5)
    assert buffer.feed(b"abc")
    assert not buffer.feed(b"defg")
    assert not buffer.feed(b"more")
    assert buffer.capture() == Capture(b"abcde", truncated=True)


def test_exactly_full_is_not_truncated() -> None:
    """Filling the cap exactly drops nothing; only a further byte is a truncation."""
    buffer = CappedBuffer(limit=4)
    assert buffer.feed(b"abcd")
    assert buffer.capture() == Capture(b"abcd", truncated=False)
    assert buffer.feed(b"")
    assert not buffer.feed(b"e")
    assert buffer.capture().truncated


def test_capture_while_still_feeding_keeps_what_arrived() -> None:
    """A snapshot taken before the reader finishes holds the bytes so far (a stuck reader)."""
    buffer = CappedBuffer()
    buffer.feed(b"SANDBOX-ATTEST-START n\n")
    assert buffer.capture().data == b"SANDBOX-ATTEST-START n\n"
    buffer.feed(b"{}\n")
    assert buffer.capture().data.endswith(b"{}\n")
