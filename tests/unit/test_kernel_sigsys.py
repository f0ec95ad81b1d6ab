"""The kernel witness's record of SIGSYS (issue 27): a seccomp kill is the kernel's own answer.

(And the events bpftrace's buffers lose: counted as the live cells' drops, `TestLostEvents`.)

A call seccomp kills (its architecture check on an int 0x80 call, SECCOMP_RET_KILL_*) reaches
neither `sys_enter` nor a recorded `sys_exit`; the kernel raises SIGSYS with si_code
SYS_SECCOMP for the thread that made it (`force_sig_seccomp`), which
`tracepoint:signal:signal_generate` shows (fields sig, errno, code, comm, pid, group, result
on this kernel's format). The `KG` lines below are the ones live cells printed
(/tmp/ks2-r2: sandlock's socketcall-i386 child, 2026-12-02).
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sandbox_attest.host.kernel.program import (
    DRAIN,
    MARK_ONLY,
    PERF_RB_PAGES,
    QUEUEING,
    SIGSYS,
    KernelEvent,
    lost_count,
    parse_line,
    program_text,
)
from sandbox_attest.host.kernel.witness import KernelWitness

CELL = 1523559
# cgroup, pid, tid, target pid, code, group, result, queued by itself, comm
SECCOMP_KILL = f"KG\t{CELL}\t11449\t11449\t11449\t1\t0\t0\t0\tpython\n"


def sigsys(line: str) -> KernelEvent:
    """The event a `KG` line is."""
    got = parse_line(line)
    assert isinstance(got, KernelEvent), got
    return got


class TestProgram:
    """What the program attaches for SIGSYS, and how it keeps it cheap."""

    def test_it_records_sigsys_raised_in_a_cell(self) -> None:
        """One probe on signal_generate, filtered in the kernel by signal and cell."""
        text = program_text(1)
        assert f"tracepoint:signal:signal_generate /args->sig == {SIGSYS} && @cells[cgroup]/" in (
            text
        )
        assert "args->code, args->group, args->result, @queue[tid], comm" in text

    def test_the_signal_queueing_calls_are_marked_not_recorded(self) -> None:
        """rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal (x86_64 and i386 numbers)."""
        text = program_text(1)
        for nr in QUEUEING:
            assert f"@want[{nr}] = {MARK_ONLY};" in text
        assert f"if (@want[args->id] == {MARK_ONLY}) {{ @queue[tid] = 1; return; }}" in text
        assert f"if (@want[args->id] == {MARK_ONLY}) {{ delete(@queue[tid]); return; }}" in text

    def test_sigsys_events_count_against_the_cells_cap(self) -> None:
        """A payload raising SIGSYS in a loop fills its own cell's cap, no more."""
        after = program_text(1).split("signal_generate", 1)[1]
        assert "@drop[cgroup] = @drop[cgroup] + 1; return;" in after


class TestParser:
    """A `KG` line, and what makes it seccomp's answer."""

    def test_a_seccomp_kill_of_the_running_thread(self) -> None:
        """si_code SYS_SECCOMP, for the thread itself, not queued by it: seccomp's SIGSYS."""
        event = sigsys(SECCOMP_KILL)
        assert event.syscall == "signal"
        assert not event.entered
        assert event.error == "SIGSYS"
        assert event.signal["seccomp"] is True
        assert event.describe() == "SIGSYS to 11449 (seccomp)"
        assert event.as_dict()["signal"]["code"] == 1

    def test_a_sigsys_the_thread_queued_itself_is_not_seccomps(self) -> None:
        """rt_tgsigqueueinfo(self, SIGSYS, {si_code 1}) is allowed to a thread: no answer."""
        event = sigsys(f"KG\t{CELL}\t7\t7\t7\t1\t0\t0\t1\tpython\n")
        assert event.signal["queued_by_itself"] is True
        assert event.signal["seccomp"] is False
        assert event.error == ""

    def test_a_sigsys_sent_by_kill_is_not_seccomps(self) -> None:
        """kill(pid, SIGSYS) has si_code SI_USER (0): a signal, not a refusal."""
        assert sigsys(f"KG\t{CELL}\t7\t7\t8\t0\t1\t0\t0\tpython\n").error == ""

    def test_a_sigsys_for_another_thread_is_not_seccomps(self) -> None:
        """Seccomp signals the thread that made the call; another target is someone's send."""
        assert sigsys(f"KG\t{CELL}\t7\t7\t8\t1\t0\t0\t0\tpython\n").error == ""

    def test_a_short_line_is_none(self) -> None:
        """A line cut short is not an event."""
        assert parse_line(f"KG\t{CELL}\t7\t7\n") is None

    def test_the_witness_keeps_it_with_the_cells_events(self) -> None:
        """Taken like any event of a registered cell; drained with them."""
        witness = KernelWitness()
        witness.take(f"KC\t{CELL}\n")
        witness.take(SECCOMP_KILL)
        (event,) = witness.events_of(CELL)
        assert event.error == "SIGSYS"
        assert event.pid == 11449


class TestLostEvents:
    """bpftrace's "Lost N events": a CPU's buffer overflowed; not seen is then not never."""

    def test_the_line_is_read(self) -> None:
        """Its number; any other line is 0."""
        assert lost_count("Lost 779 events\n") == 779
        assert lost_count("Lost track\n") == 0
        assert lost_count(f"KC\t{CELL}\n") == 0

    def test_every_live_cell_counts_them_as_dropped(self) -> None:
        """The kernel does not say whose they were: each cell live then drops them, no other.

        Measured (ks2's note): with bpftrace's default 64 pages a CPU, a cell of 2000 opens
        lost 779 of its events at load 3; drained, it said `dropped` 0, so a refusal in the
        lost part would have read as a report the kernel never saw (an ERROR).
        """
        witness = KernelWitness()
        other = CELL + 1
        witness.take(f"KC\t{CELL}\n")
        witness.take("Lost 779 events\n")
        witness.take(f"KC\t{other}\n")
        assert witness.lost == 779
        assert witness._lost == {CELL: 779}  # what drain adds to the cell's dropped
        assert witness.facts()["lost_events"] == 779

    def test_the_buffers_are_large_enough(self) -> None:
        """A power of two (bpftrace's rule), well above its default 64 pages."""
        assert PERF_RB_PAGES >= 1024
        assert PERF_RB_PAGES & (PERF_RB_PAGES - 1) == 0

    def test_an_echo_lost_with_them_is_asked_for_again(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A drain whose marker echo was lost asks again instead of failing the run's witness.

        Measured (ks2's note, bench at load 4 with 64-page buffers): a drain timed out, the
        witness went "failed", and every later cell of the run had no kernel reading.
        """
        witness = KernelWitness()
        witness.status = "attached"
        witness._proc = cast("Any", SimpleNamespace(poll=lambda: None))
        witness.take(f"KC\t{CELL}\n")
        sent: list[int] = []

        def feed(lines: list[str]) -> None:
            for line in lines:
                witness.take(line)

        def lseek(fd: int, offset: int, whence: int) -> int:
            sent.append(whence)
            # The reader thread's lines: the first echo is lost, the second comes.
            lines = ["Lost 12 events\n"] if len(sent) == 1 else [f"KM\t{offset}\t0\n"]
            threading.Thread(target=feed, args=(lines,)).start()
            raise OSError(9, "EBADF")

        monkeypatch.setattr(os, "lseek", lseek)
        assert witness._send(CELL, DRAIN, "mark")  # the marker's echo, asked twice
        assert sent == [DRAIN, DRAIN]
        assert witness.status == "attached"
