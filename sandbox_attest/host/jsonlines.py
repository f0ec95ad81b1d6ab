"""Read a JSON-lines log that another thread or process may be appending to right now.

A writer appends one JSON object and its newline, but a reader can still see the line half
written: the writer's buffered file may split a long line over several `write` calls, and on
Linux a `read` of a regular file is not serialised against a concurrent `write` to it. The
proxy's decision log, read by the session while the proxy child writes it, showed exactly
that (issue 18: `JSONDecodeError: Unterminated string`, an ERROR cell and a failed gate).

So a line counts only once its newline is there. `read_complete_lines` parses every
newline-terminated line and leaves a trailing fragment unread, so the next call, after the
writer finished it, sees the whole line. What it does not do: it does not remember where it
stopped (each call reads the file from the start), and it never forgives a line that is
complete but not a JSON object: that is a broken writer or a tampered file, and the error
names the file and the line.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sandbox_attest.errors import FixtureError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["LogLineError", "read_complete_lines"]


class LogLineError(FixtureError):
    """A complete (newline-terminated) line of a JSON-lines log is not a JSON object.

    A `FixtureError`, because every such log here is a fixture's witness log: a cell that
    reads a corrupt witness cannot be judged and must end as ERROR, never as a verdict.
    """


def read_complete_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of the JSON-lines file at `path`, parsed, oldest first.

    Blank lines are skipped. Bytes after the last newline are a line still being written: they
    are neither parsed nor returned, and a later call returns them once the writer has ended
    the line.

    Args:
        path: the log file. It may not exist yet (a writer creates it on its first line); that
            reads as an empty log.

    Returns:
        One dict per complete, non-blank line.

    Raises:
        LogLineError: a complete line is not UTF-8, not JSON, or not a JSON object; the message
            names the file and the 1-based line number.
        OSError: the file exists but cannot be read (permissions, a directory...).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    # Everything after the last newline is the fragment a writer is still appending to.
    complete, newline, _fragment = data.rpartition(b"\n")
    if not newline:
        return []
    entries: list[dict[str, Any]] = []
    for number, raw in enumerate(complete.split(b"\n"), start=1):
        if not raw.strip():
            continue
        entries.append(_parse(path, number, raw))
    return entries


def _parse(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    """One complete line as a JSON object, or a LogLineError naming `path:number`."""
    shown = raw[:200].decode("utf-8", "replace")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LogLineError(
            f"{path}, line {number}: a complete log line is not valid JSON ({exc}): {shown!r}; "
            "the writer is broken or the file was edited; keep the file for the bug report"
        ) from exc
    if not isinstance(value, dict):
        raise LogLineError(
            f"{path}, line {number}: a log line must be a JSON object, "
            f"got {type(value).__name__}: {shown!r}; the writer is broken or the file was edited"
        )
    return value
