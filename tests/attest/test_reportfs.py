"""reportfs: the report directory is the harness's alone, and nothing planted in it is followed.

Every case plants real files, symlinks and FIFOs in a real directory, the way a helper left
behind by a wrapper did in issue 12 (b), and checks what the kernel shows afterwards.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.errors import ConfigError, ReportError
from sandbox_attest.report import files as reportfs
from sandbox_attest.report.evidence import CellEntry, EvidenceWriter, cell_entry

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX links, FIFOs and modes")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[int]:
    """A descriptor of a fresh report directory."""
    fd = reportfs.open_report_dir(reportfs.make_report_dir(tmp_path / "report"))
    yield fd
    os.close(fd)


def cell(cell_id: str, verdict: str) -> CellEntry:
    """A minimal evidence cell with this id and verdict."""
    return cell_entry(
        cell_id=cell_id, backend="b", probe="p", platform="linux", verdict=verdict, reason=""
    )


class TestMakeReportDir:
    def test_new_directory_is_0700(self, tmp_path: Path) -> None:
        """A new report directory (and its missing parents) is created, itself mode 0700."""
        out = reportfs.make_report_dir(tmp_path / "a" / "b" / "report")
        assert stat.S_IMODE(out.stat().st_mode) == 0o700
        assert out.stat().st_uid == os.geteuid()

    def test_existing_empty_directory_is_tightened(self, tmp_path: Path) -> None:
        """An existing empty directory of the harness's is accepted and set to 0700."""
        out = tmp_path / "report"
        out.mkdir(mode=0o755)
        reportfs.make_report_dir(out)
        assert stat.S_IMODE(out.stat().st_mode) == 0o700

    def test_non_empty_directory_is_refused(self, tmp_path: Path) -> None:
        """A directory that holds anything is refused, naming what is there and the fix."""
        out = tmp_path / "report"
        out.mkdir()
        (out / "evidence.json").write_text("{}")
        with pytest.raises(ConfigError, match="pass a new or empty directory") as err:
            reportfs.make_report_dir(out)
        assert "is not empty (it holds evidence.json)" in str(err.value)

    def test_symlink_is_refused(self, tmp_path: Path) -> None:
        """A symlink in place of the report directory is refused, even to an empty directory."""
        real = tmp_path / "real"
        real.mkdir()
        link = tmp_path / "report"
        link.symlink_to(real)
        with pytest.raises(ConfigError, match="is a symlink; pass a new or empty directory"):
            reportfs.make_report_dir(link)

    def test_group_writable_directory_is_refused(self, tmp_path: Path) -> None:
        """A directory others can write is refused: they could plant files in the report."""
        out = tmp_path / "report"
        out.mkdir()
        out.chmod(0o777)
        with pytest.raises(ConfigError, match=r"writable by group or others \(mode 777\)"):
            reportfs.make_report_dir(out)

    @pytest.mark.skipif(not ROOT, reason="only root can hand a directory to another uid")
    def test_someone_elses_directory_is_refused(self, tmp_path: Path) -> None:
        """A directory owned by another uid is refused, naming both uids."""
        out = tmp_path / "report"
        out.mkdir(mode=0o700)
        os.chown(out, 65534, 65534)
        with pytest.raises(ConfigError, match="belongs to uid 65534, not to the harness"):
            reportfs.make_report_dir(out)

    def test_a_file_in_the_way_is_one_clear_line(self, tmp_path: Path) -> None:
        """A regular file at the path says the directory cannot be created there."""
        out = tmp_path / "report"
        out.write_text("x")
        with pytest.raises(ConfigError, match="cannot create the report directory there"):
            reportfs.make_report_dir(out)


class TestWriteNew:
    def test_writes_exact_bytes_and_mode(self, tmp_path: Path, dir_fd: int) -> None:
        """The file holds exactly the bytes, with exactly the mode, and no temp file is left."""
        old = os.umask(0o077)
        try:
            reportfs.write_new(dir_fd, "report.html", b"<p>judged</p>", 0o644)
        finally:
            os.umask(old)
        target = tmp_path / "report" / "report.html"
        assert target.read_bytes() == b"<p>judged</p>"
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        assert [p.name for p in (tmp_path / "report").iterdir()] == ["report.html"]

    def test_symlink_at_the_final_name_is_replaced_not_followed(
        self, tmp_path: Path, dir_fd: int
    ) -> None:
        """A planted symlink at the final name is replaced; its target keeps its own bytes."""
        forged = tmp_path / "forged.json"
        forged.write_text('{"all": "PASS"}')
        link = tmp_path / "report" / "evidence.json"
        link.symlink_to(forged)
        reportfs.write_new(dir_fd, "evidence.json", b'{"judged": "FAIL"}')
        assert not link.is_symlink()
        assert link.read_bytes() == b'{"judged": "FAIL"}'
        assert forged.read_text() == '{"all": "PASS"}'

    def test_planted_tmp_fifo_is_never_opened(self, tmp_path: Path, dir_fd: int) -> None:
        """`<name>.tmp` planted as a symlink to a FIFO is never written through (no reader hangs).

        The old path wrote `evidence.json.tmp` by name, so it opened the FIFO and blocked until
        the planted helper read it; the new temp name is random and created O_EXCL|O_NOFOLLOW.
        """
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        (tmp_path / "report" / "evidence.json.tmp").symlink_to(fifo)
        reportfs.write_new(dir_fd, "evidence.json", b"judged")
        assert (tmp_path / "report" / "evidence.json").read_bytes() == b"judged"
        assert stat.S_ISFIFO(fifo.lstat().st_mode)
        # Nothing was written into the FIFO: a non-blocking read finds no writer's data.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert os.read(fd, 100) == b""
        finally:
            os.close(fd)

    def test_name_with_a_slash_is_refused(self, dir_fd: int) -> None:
        """Only plain names inside the directory can be written."""
        with pytest.raises(ValueError, match="not a plain file name"):
            reportfs.write_new(dir_fd, "../evidence.json", b"x")


class TestReadRegular:
    def test_reads_a_regular_file(self, tmp_path: Path, dir_fd: int) -> None:
        """A regular file is read whole."""
        (tmp_path / "report" / "junit.xml").write_bytes(b"<testsuites/>")
        assert reportfs.read_regular(dir_fd, "junit.xml") == b"<testsuites/>"

    def test_symlink_is_refused(self, tmp_path: Path, dir_fd: int) -> None:
        """A symlink in place of junit.xml is not followed."""
        (tmp_path / "forged.xml").write_text("<testsuites/>")
        (tmp_path / "report" / "junit.xml").symlink_to(tmp_path / "forged.xml")
        with pytest.raises(ReportError, match=r"cannot read junit\.xml"):
            reportfs.read_regular(dir_fd, "junit.xml")

    def test_fifo_is_refused_without_blocking(self, tmp_path: Path, dir_fd: int) -> None:
        """A FIFO in place of junit.xml is refused at once instead of waiting for a writer."""
        os.mkfifo(tmp_path / "report" / "junit.xml")
        with pytest.raises(ReportError, match="is not a regular file; it was planted"):
            reportfs.read_regular(dir_fd, "junit.xml")


class TestJournal:
    def test_existing_journal_is_refused(self, tmp_path: Path, dir_fd: int) -> None:
        """The journal is created O_EXCL: one already there (another run's) is refused."""
        (tmp_path / "report" / "evidence.jsonl").write_text("")
        with pytest.raises(ReportError, match=r"already holds evidence\.jsonl"):
            reportfs.create_append(dir_fd, "evidence.jsonl")

    def test_lines_go_to_the_file_created_not_to_a_swapped_name(self, tmp_path: Path) -> None:
        """Cells are appended through the journal's descriptor: a link swapped in gets nothing."""
        report = tmp_path / "report"
        writer = EvidenceWriter(
            report_dir=report, run_id="r", policy_path=tmp_path / "p", matrix_digest="0"
        )
        assert stat.S_IMODE(report.stat().st_mode) == 0o700
        writer.add_cell(cell("a", "FAIL"))
        (report / "evidence.jsonl").rename(tmp_path / "journal.kept")
        decoy = tmp_path / "decoy"
        decoy.write_text("")
        (report / "evidence.jsonl").symlink_to(decoy)
        writer.add_cell(cell("b", "PASS"))
        kept = [json.loads(line) for line in (tmp_path / "journal.kept").read_text().splitlines()]
        assert [c["cell_id"] for c in kept] == ["a", "b"]
        assert decoy.read_text() == ""
        assert stat.S_IMODE((tmp_path / "journal.kept").stat().st_mode) == 0o600
