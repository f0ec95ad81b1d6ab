"""The JSON-lines reader returns whole lines only, and names a corrupt complete line."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.host.jsonlines import LogLineError, read_complete_lines

if TYPE_CHECKING:
    from pathlib import Path


def _append(path: Path, data: bytes) -> None:
    """Append `data` as a separate write, as a second writer process would."""
    with path.open("ab") as handle:
        handle.write(data)


class TestWholeLinesOnly:
    def test_a_missing_file_is_an_empty_log(self, tmp_path: Path) -> None:
        """A log whose writer has not created it yet reads as no entries."""
        assert read_complete_lines(tmp_path / "not-yet.jsonl") == []

    def test_a_line_written_in_two_halves_is_read_once_it_is_whole(self, tmp_path: Path) -> None:
        """The first half alone reads as nothing; after the second half the entry is whole."""
        log = tmp_path / "log.jsonl"
        _append(log, b'{"a": 1, "b": "par')
        assert read_complete_lines(log) == []
        _append(log, b'tial"}\n')
        assert read_complete_lines(log) == [{"a": 1, "b": "partial"}]

    def test_complete_lines_before_a_fragment_are_returned(self, tmp_path: Path) -> None:
        """Every newline-terminated line is returned and the trailing fragment is not."""
        log = tmp_path / "log.jsonl"
        _append(log, b'{"n": 1}\n{"n": 2}\n{"n": 3, "half": tr')
        assert read_complete_lines(log) == [{"n": 1}, {"n": 2}]
        _append(log, b"ue}\n")
        assert read_complete_lines(log) == [{"n": 1}, {"n": 2}, {"n": 3, "half": True}]

    def test_a_fragment_that_happens_to_parse_is_still_left(self, tmp_path: Path) -> None:
        """A fragment is left unread even when it is valid JSON: only the newline ends a line."""
        log = tmp_path / "log.jsonl"
        _append(log, b'{"n": 1}\n{"n": 2}')
        assert read_complete_lines(log) == [{"n": 1}]

    def test_a_multibyte_character_split_across_writes_is_not_an_error(
        self, tmp_path: Path
    ) -> None:
        """Half of a UTF-8 character at the end is a fragment, and whole it decodes."""
        log = tmp_path / "log.jsonl"
        encoded = json.dumps({"host": "bücher.test"}, ensure_ascii=False).encode()
        cut = encoded.index("ü".encode()) + 1  # inside the two-byte character
        _append(log, encoded[:cut])
        assert read_complete_lines(log) == []
        _append(log, encoded[cut:] + b"\n")
        assert read_complete_lines(log) == [{"host": "bücher.test"}]

    def test_blank_lines_are_skipped(self, tmp_path: Path) -> None:
        """Empty and whitespace-only complete lines carry no entry."""
        log = tmp_path / "log.jsonl"
        _append(log, b'\n{"n": 1}\n  \n{"n": 2}\r\n')
        assert read_complete_lines(log) == [{"n": 1}, {"n": 2}]


class TestCorruptCompleteLines:
    @pytest.mark.parametrize(
        ("line", "why"),
        [
            (b'{"a": 1, "b": "par\n', "not valid JSON"),
            (b"not json at all\n", "not valid JSON"),
            (b'\xff{"a": 1}\n', "not valid JSON"),
            (b"[1, 2]\n", "must be a JSON object, got list"),
            (b'"a string"\n', "must be a JSON object, got str"),
        ],
        ids=["truncated-then-ended", "text", "not-utf8", "array", "string"],
    )
    def test_a_corrupt_complete_line_names_the_file_and_line(
        self, tmp_path: Path, line: bytes, why: str
    ) -> None:
        """A newline-terminated line that is not a JSON object raises, naming file and line."""
        log = tmp_path / "log.jsonl"
        _append(log, b'{"n": 1}\n\n' + line + b'{"n": 4}\n')
        with pytest.raises(LogLineError, match=re.escape(f"{log}, line 3: ")) as caught:
            read_complete_lines(log)
        assert why in str(caught.value)

    def test_a_corrupt_line_is_a_fixture_error(self, tmp_path: Path) -> None:
        """The error is a FixtureError, so a cell reading a broken witness ends as ERROR."""
        log = tmp_path / "log.jsonl"
        _append(log, b"garbage\n")
        with pytest.raises(FixtureError):
            read_complete_lines(log)

    def test_a_corrupt_fragment_is_not_yet_an_error(self, tmp_path: Path) -> None:
        """Garbage without its newline is not judged until the writer ends the line."""
        log = tmp_path / "log.jsonl"
        _append(log, b'{"n": 1}\ngarb')
        assert read_complete_lines(log) == [{"n": 1}]
        _append(log, b"age\n")
        with pytest.raises(LogLineError, match="line 2"):
            read_complete_lines(log)
