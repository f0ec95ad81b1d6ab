"""The kernel witness's program text and its parser, on lines a live run recorded (issue 27).

The lines come from /tmp/kw/rec.py on 2026-12-02 (bpftrace 0.17, Linux 6.18): a payload in a
registered cell that sends a UDP datagram to [::1]:9, opens a missing file, connects to
127.0.0.1:1 (refused) and to a missing unix socket.
"""

from __future__ import annotations

import os
import platform
import signal
from pathlib import Path

import pytest

from sandbox_attest.host.kernel import witness as kernelwitness
from sandbox_attest.host.kernel.program import (
    CELL_CAP,
    DRAIN,
    FLUSH,
    NOTIF_IOCTL_TYPE,
    REGISTER,
    SYSCALLS,
    KernelEvent,
    hex_bytes,
    parse_line,
    program_text,
    sockaddr,
)
from sandbox_attest.host.kernel.witness import KernelWitness, unavailable_reason

CELL = 1476705
RECORDED = [
    "KR\n",
    f"KC\t{CELL}\n",
    "KS\t29939\t32843542888434\t/nonexistent/secret\n",
    "KA\t29939\t32843543389862\t\\x01\\x00/nonexistent.sock\\x00\\x00\\x00\\x00\\x00P\\xc5\\xce)\n",
    (
        "KA\t29939\t32843541011124\t\\x0a\\x00\\x00\\x09\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
        "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01\\x00\\x00\\x00\\x00\n"
    ),
    f"KE\t{CELL}\t29939\t29939\t44\t1\t32843541011124\t3\t10875248\t1\t0\tpython3\n",
    (
        "KA\t29939\t32843543146525\t\\x02\\x00\\x00\\x01\\x7f\\x00\\x00\\x01\\x00\\x00\\x00\\x00"
        "\\x00\\x00\\x00\\x00\\xc0\\x9c\\x95\\x00\\x00\\x00\\x00\\x00P\\xc5\\xce)\n"
    ),
    f"KE\t{CELL}\t29939\t29939\t42\t-111\t32843543146525\t4\t140726754475264\t16\t1\tpython3\n",
    f"KE\t{CELL}\t29939\t29939\t42\t-2\t32843543389862\t5\t140726754475264\t20\t1\tpython3\n",
    f"KE\t{CELL}\t29939\t29939\t257\t-2\t32843542888434\t4294967196\t1\t524288\t0\tpython3\n",
    # seccomp refused ptrace before sys_enter: key 0, no KS line, no argument.
    f"KE\t{CELL}\t29940\t29940\t101\t-1\t0\t0\t0\t0\t0\tpython3\n",
    f"KM\t{CELL}\t3\n",
]


class TestProgramText:
    """The bpftrace program a run attaches."""

    def test_it_names_every_syscall_once_in_its_map(self) -> None:
        """Every syscall of the table is in @want, so the filter is one map lookup."""
        text = program_text(4242)
        for nr, _, _ in SYSCALLS.values():
            assert text.count(f"@want[{nr}] = ") == 1

    def test_it_listens_to_the_harness_alone_for_cells(self) -> None:
        """Only the harness's lseek(-1, id, REGISTER/DRAIN) names a cell to the program."""
        text = program_text(4242)
        assert "/pid == 4242 && args->fd == 4294967295/" in text
        assert f"args->whence == {REGISTER}" in text
        assert f"args->whence == {DRAIN}" in text
        assert f"args->whence == {FLUSH}" in text
        assert "@cells[cgroup]" in text

    def test_it_bounds_each_cell_and_leaves_out_the_notify_ioctls(self) -> None:
        """The per-cell cap is in the kernel; seccomp user-notify ioctls are not recorded."""
        text = program_text(1)
        assert f"@n[cgroup] >= {CELL_CAP}" in text
        assert f"% 256 == {NOTIF_IOCTL_TYPE}" in text

    def test_it_leaves_out_32_bit_syscalls(self) -> None:
        """Both probes skip a task in a 32-bit syscall (TS_COMPAT), read by its offset."""
        text = program_text(1, status_offset=16)
        assert text.count("(*(uint32 *)((uint64)curtask + 16) & 2) == 0") == 2
        assert "curtask->" not in text  # BTF through curtask costs a second of compiling

    def test_it_reads_user_memory_with_uptr(self) -> None:
        """Paths and socket addresses are the payload's memory: read as user addresses."""
        text = program_text(1)
        assert "str(uptr(args->args[1]))" in text
        assert "buf(uptr(args->args[4]), 28)" in text


class TestParser:
    """`parse_line` and the pairing of an exit with its enter's argument."""

    def test_control_lines(self) -> None:
        """Ready, a registered cell, and a drain marker with the cell's drop count."""
        assert parse_line("KR\n") == ("ready", 0, 0, "")
        assert parse_line(f"KC\t{CELL}\n") == ("cell", CELL, 0, "")
        assert parse_line(f"KM\t{CELL}\t3\n") == ("mark", CELL, 3, "")
        assert parse_line(f"KF\t{CELL}\n") == ("flush", CELL, 0, "")

    @pytest.mark.parametrize(
        "line",
        ["Attaching 4 probes...\n", "@want[2]: 9\n", "KE\tnot\tnumbers\n", "KS\t1\n", ""],
        ids=["notice", "map-dump", "bad-numbers", "short", "empty"],
    )
    def test_other_lines_are_none(self, line: str) -> None:
        """Notices of bpftrace's own and map dumps at exit are not events."""
        assert parse_line(line) is None

    def test_sockaddr_of_each_family(self) -> None:
        """The recorded socket addresses read as family, address and port."""
        v6 = sockaddr(
            hex_bytes("\\x0a\\x00\\x00\\x09" + "\\x00" * 19 + "\\x01\\x00\\x00\\x00\\x00")
        )
        assert v6 == {"family": "AF_INET6", "ip": "::1", "port": 9, "address": "[::1]:9"}
        v4 = sockaddr(hex_bytes("\\x02\\x00\\x00\\x01\\x7f\\x00\\x00\\x01"))
        assert v4["address"] == "127.0.0.1:1"
        unix = sockaddr(b"\x01\x00/run/x.sock\x00junk")
        assert unix == {"family": "AF_UNIX", "address": "/run/x.sock"}
        assert sockaddr(b"\x00") == {}

    def test_recorded_lines_pair_by_thread_and_key(self) -> None:
        """Each exit gets its own enter's argument, whichever of the two lines came first."""
        witness = KernelWitness()
        for line in RECORDED:
            witness.take(line)
        said = [e.describe() for e in witness.events_of(CELL)]
        assert said == [
            "sendto([::1]:9) -> 1",
            "connect(127.0.0.1:1) -> ECONNREFUSED",
            "connect(/nonexistent.sock) -> ENOENT",
            "openat(/nonexistent/secret) -> ENOENT",
            "ptrace(arguments not seen: refused before the syscall began (seccomp)) -> EPERM",
        ]

    def test_an_exit_read_before_its_enter_waits_for_it(self) -> None:
        """Lines of two CPUs come in no set order: an early exit takes its later argument."""
        witness = KernelWitness()
        witness.take(f"KC\t{CELL}\n")
        witness.take(f"KE\t{CELL}\t7\t7\t257\t-13\t99\t0\t0\t0\t0\tpython3\n")
        witness.take("KS\t7\t98\t/older/call\n")  # another call of the same thread
        witness.take("KS\t7\t99\t/home/u/.ssh/id\n")
        (event,) = witness.events_of(CELL)
        assert event.describe() == "openat(/home/u/.ssh/id) -> EACCES"

    def test_events_of_a_cell_not_registered_are_only_counted(self) -> None:
        """A line read after its cell was drained (or never registered) is counted as late."""
        witness = KernelWitness()
        witness.take(f"KE\t{CELL}\t7\t7\t257\t-13\t0\t0\t0\t0\t0\tpython3\n")
        assert witness.events_of(CELL) == []
        assert witness.late == 1

    def test_an_event_as_the_evidence_shows_it(self) -> None:
        """The evidence carries syscall, pid, answer, arguments and the decoded address."""
        event = KernelEvent(
            CELL, 5, 5, "connect", -13, entered=True, args=(3, 1, 16, 0), comm="python3", key=7
        )
        event.address = {"family": "AF_INET", "address": "127.0.0.1:9"}
        shown = event.as_dict()
        assert shown["error"] == "EACCES"
        assert shown["address"]["address"] == "127.0.0.1:9"
        assert "text" not in shown


class TestWhereItCannotRun:
    """Where no witness can run, it says exactly why."""

    def test_not_root(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A harness that is not root is told that eBPF needs root."""
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        assert "not root" in unavailable_reason(cells_have_cgroups=True)

    def test_no_bpftrace(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A host without bpftrace names the package to install."""
        monkeypatch.setattr(kernelwitness, "BPFTRACE", "/nonexistent/bpftrace")
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        monkeypatch.setattr(platform, "machine", lambda: "x86_64")
        assert "apt-get install bpftrace" in unavailable_reason(cells_have_cgroups=True)

    def test_cells_without_cgroups(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Subtree cell groups cannot be filtered by cgroup: said, with the cell group's why."""
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        monkeypatch.setattr(Path, "is_file", lambda _self: True)
        monkeypatch.setattr(platform, "machine", lambda: "x86_64")
        why = unavailable_reason(cells_have_cgroups=False, why_not="no cgroup2 mount")
        assert why.startswith("cells have no cgroup of their own (no cgroup2 mount)")

    def test_turned_off(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The environment switch is named as the reason, and nothing is started."""
        monkeypatch.setenv(kernelwitness.DISABLE_ENV, "off")
        monkeypatch.setattr(kernelwitness, "_RUN_WITNESS", None)
        witness = kernelwitness.start_run(cells_have_cgroups=True)
        assert witness.facts() == {
            "status": "unavailable",
            "tool": "bpftrace (/usr/bin/bpftrace)",
            "why": f"turned off by {kernelwitness.DISABLE_ENV}",
        }


class _Bpftrace:
    """Stands in for the bpftrace process: counts the signals; still detaching until waited."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.waited = False
        self.stdout = None
        self.stderr = None

    def poll(self) -> int | None:
        return 0 if self.waited else None

    def send_signal(self, number: int) -> None:
        self.signals.append(number)

    def wait(self, timeout: float) -> int:
        del timeout
        self.waited = True
        return 0


class TestStopping:
    """The session interrupts bpftrace first and stops the world while it detaches."""

    def test_interrupt_sends_one_sigint_and_stop_only_waits(self) -> None:
        """`interrupt` then `stop`: one SIGINT in all (a second could cut the detach short)."""
        proc = _Bpftrace()
        witness = KernelWitness()
        witness._proc = proc  # type: ignore[assignment]
        witness.interrupt()
        witness.interrupt()
        assert proc.signals == [signal.SIGINT]
        witness.stop()
        assert proc.signals == [signal.SIGINT]
        assert witness.stopped

    def test_stop_alone_still_interrupts(self) -> None:
        """Without `interrupt`, `stop` sends the SIGINT itself."""
        proc = _Bpftrace()
        witness = KernelWitness()
        witness._proc = proc  # type: ignore[assignment]
        witness.stop()
        assert proc.signals == [signal.SIGINT]
