"""The kernel witness's one bpftrace process per run: start, register, drain, stop.

See sandbox_attest/host/kernel/__init__.py for what is recorded and why this way.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sandbox_attest.host import lifetime
from sandbox_attest.host.cgroupfs import kernel_at_least
from sandbox_attest.host.kernel.program import (
    CELL_CAP,
    DRAIN,
    FLUSH,
    PERF_RB_PAGES,
    REGISTER,
    STRLEN,
    THREAD_INFO_STATUS,
    THREAD_INFO_STATUS_BEFORE_5_11,
    CellEvents,
    KernelEvent,
    fill_argument,
    has_argument,
    lost_count,
    parse_line,
    program_text,
)

BPFTRACE: Final = "/usr/bin/bpftrace"
# The environment variable that turns the witness off for a run (its reason is then this).
DISABLE_ENV: Final = "SANDBOX_ATTEST_KERNEL_WITNESS"
TRACEFS: Final = Path("/sys/kernel/tracing")
# How long `start` waits for bpftrace to say its probes are attached.
ATTACH_TIMEOUT_S: Final = 20.0
# How long a drain waits for its marker to come back through bpftrace.
DRAIN_TIMEOUT_S: Final = 2.0
# How often a wait for an echo looks whether events were lost since (then it asks again).
RESEND_S: Final = 0.1
# Argument lines kept while their exit line has not come (a capped cell's may never come).
EARLY_CAP: Final = 4096


def unavailable_reason(cells_have_cgroups: bool, why_not: str = "") -> str:  # noqa: PLR0911
    """Why no kernel witness can run here, or "" where one may."""
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform}): the kernel witness uses eBPF"
    if os.geteuid() != 0:
        return "the harness is not root: attaching eBPF programs needs root"
    if platform.machine() != "x86_64":
        return f"the witness's syscall table is x86_64's; this machine is {platform.machine()}"
    if not Path(BPFTRACE).is_file():
        return f"no bpftrace at {BPFTRACE} (apt-get install bpftrace)"
    if not Path("/sys/kernel/btf").is_dir() and not Path("/proc/config.gz").exists():
        return "the kernel shows neither BTF nor its config: no sign it has BPF"
    if not cells_have_cgroups:
        return f"cells have no cgroup of their own ({why_not}): the witness filters by cgroup"
    return ""


def _status_offset() -> int:
    """`thread_info.status`'s offset in task_struct on this kernel (program.THREAD_INFO_STATUS)."""
    return THREAD_INFO_STATUS if kernel_at_least((5, 11)) else THREAD_INFO_STATUS_BEFORE_5_11


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass
class KernelWitness:
    """One bpftrace process for the run; you get one from `KernelWitness().start(...)`.

    `status` is what the evidence carries: "attached" with the attach time, "unavailable"
    with the reason, "failed" once bpftrace stopped answering mid-run; `stopped` at the end.
    A cell is `register`ed (its cgroup id into the program's map) before its payload starts
    and `drain`ed after it ended; only registered cgroups' syscalls are recorded.
    """

    status: str = "unavailable"
    why: str = ""
    attach_ms: float = 0.0
    # How long the run itself waited for the attach (the rest overlapped its setup).
    waited_ms: float = 0.0
    mounted_tracefs: bool = False
    # What this run did with tracefs, for the evidence: "was mounted", "mounted by this run",
    # "mounted and unmounted by this run".
    tracefs: str = ""
    stopped: bool = False
    unparsed: int = 0
    late: int = 0
    # Events bpftrace's buffers lost (its "Lost N events" lines), over the run.
    lost: int = 0
    _proc: subprocess.Popen[str] | None = None
    _cells: dict[int, CellEvents] = field(default_factory=dict)
    _echoes: set[tuple[str, int]] = field(default_factory=set)
    _drops: dict[int, int] = field(default_factory=dict)
    _lost: dict[int, int] = field(default_factory=dict)
    # (tid, key) -> the enter's text or address line that came before its exit line, and
    # the exit's event still waiting for the line that comes after it.
    _early: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    _waiting: dict[tuple[int, int], KernelEvent] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Condition = field(init=False)
    _ready: threading.Event = field(default_factory=threading.Event)
    _stderr: list[str] = field(default_factory=list)
    _readers: list[threading.Thread] = field(default_factory=list)
    _live: set[int] = field(default_factory=set)
    _attach_lock: threading.Lock = field(default_factory=threading.Lock)
    _began: float = 0.0
    _attached_at: float = 0.0
    # SIGINT was sent (`interrupt`): bpftrace is detaching, and `stop` only waits for it.
    _interrupted: bool = False

    def __post_init__(self) -> None:
        """The condition the reader signals on, over the one lock."""
        self._changed = threading.Condition(self._lock)

    @property
    def attached(self) -> bool:
        """Whether the probes are attached and bpftrace still answers."""
        return self.status == "attached" and not self.stopped

    def facts(self) -> dict[str, Any]:
        """The witness's status for the evidence."""
        out: dict[str, Any] = {"status": self.status, "tool": f"bpftrace ({BPFTRACE})"}
        if self.why:
            out["why"] = self.why
        if self.attach_ms:
            out["attach_ms"] = self.attach_ms
            out["waited_ms"] = self.waited_ms
            out["cell_cap"] = CELL_CAP
        if self.unparsed:
            out["unparsed_lines"] = self.unparsed
        if self.late:
            out["late_events"] = self.late
        if self.lost:
            out["lost_events"] = self.lost
        if self.stopped and self.attach_ms:
            out["stopped"] = True
        if self.tracefs:
            out["tracefs"] = self.tracefs
        return out

    def start(
        self, cells_have_cgroups: bool, why_not: str = "", *, wait: bool = True
    ) -> KernelWitness:
        """Mount tracefs if needed and start bpftrace; with `wait`, until its probes attach.

        Without `wait` the status is "attaching" and `wait_attached` (the first `register`
        calls it) waits: bpftrace compiles its program meanwhile, while the run does the rest
        of its setup.

        Args:
            cells_have_cgroups: whether each cell runs in a cgroup of its own (the filter).
            why_not: why they do not, for the reason the evidence carries.
            wait: wait here until the probes are attached.
        """
        self.why = unavailable_reason(cells_have_cgroups, why_not)
        if self.why:
            return self
        self._began = time.monotonic()
        try:
            self._mount_tracefs()
        except OSError as exc:
            self.why = f"cannot mount tracefs at {TRACEFS}: {exc.strerror}"
            return self
        env = {
            **os.environ,
            "BPFTRACE_STRLEN": str(STRLEN),
            "BPFTRACE_PERF_RB_PAGES": str(PERF_RB_PAGES),
        }
        # Its own session: a terminal's Ctrl-C reaches the harness, which stops bpftrace
        # itself; the parent-death signal (host/lifetime.py) covers a killed harness.
        self._proc = subprocess.Popen(
            [BPFTRACE, "-B", "line", "-e", program_text(os.getpid(), _status_offset())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
            **lifetime.popen_kwargs(),
        )
        self._readers = [
            threading.Thread(target=self._read, name="kernel-witness", daemon=True),
            threading.Thread(target=self._read_stderr, name="kernel-witness-err", daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.status = "attaching"
        if wait:
            self.wait_attached()
        return self

    def wait_attached(self) -> bool:
        """Wait (once) until bpftrace says its probes are attached; whether they are."""
        with self._attach_lock:
            if self.status != "attaching":
                return self.attached
            began = time.monotonic()
            proc = self._proc
            ok = self._ready.wait(ATTACH_TIMEOUT_S) and proc is not None and proc.poll() is None
            self.waited_ms = round((time.monotonic() - began) * 1000, 1)
            if not ok:
                self.status = "unavailable"
                self.stop()
                said = [ln.strip() for ln in self._stderr if "RLIMIT_MEMLOCK" not in ln][-2:]
                self.why = "bpftrace did not attach its probes: " + (
                    " / ".join(said) or "no output"
                )
                return False
            self.attach_ms = round((self._attached_at - self._began) * 1000, 1)
            self.status = "attached"
            return True

    def _mount_tracefs(self) -> None:
        if (TRACEFS / "events").is_dir():
            self.tracefs = "was mounted"
            return
        libc = _libc()
        if libc.mount(b"nodev", str(TRACEFS).encode(), b"tracefs", 0, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.mounted_tracefs = True
        self.tracefs = "mounted by this run"

    def _read(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        with contextlib.suppress(OSError, ValueError):
            for line in proc.stdout:
                self.take(line)
        with self._changed:
            self._changed.notify_all()

    def _read_stderr(self) -> None:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return
        with contextlib.suppress(OSError, ValueError):
            for line in proc.stderr:
                if len(self._stderr) < 64:
                    self._stderr.append(line)

    def take(self, line: str) -> None:
        """Take one line of bpftrace's output (the reader thread's; tests feed recorded ones)."""
        got = parse_line(line)
        with self._changed:
            if isinstance(got, KernelEvent):
                self._take_event(got)
            elif got is None:
                self.unparsed += line.startswith("K")
                self._take_lost(lost_count(line))
            elif got[0] in {"text", "addr"}:
                event = self._waiting.pop((got[1], got[2]), None)
                if event is not None:
                    fill_argument(event, got[0], got[3])
                elif len(self._early) < EARLY_CAP:
                    self._early[(got[1], got[2])] = (got[0], got[3])
            elif got[0] == "ready":
                self._attached_at = time.monotonic()
                self._ready.set()
            elif got[0] in {"cell", "mark", "flush"}:
                self._take_echo(*got[:3])

    def _take_event(self, event: KernelEvent) -> None:
        if event.cgroup not in self._live:
            self.late += 1  # read after its cell was drained: counted, not kept
            return
        self._cells.setdefault(event.cgroup, CellEvents()).events.append(event)
        early = self._early.pop((event.tid, event.key), None) if event.entered else None
        if early is not None:
            fill_argument(event, *early)
        elif event.entered and has_argument(event.syscall):
            self._waiting[(event.tid, event.key)] = event

    def _take_lost(self, lost: int) -> None:
        """Count lost events against every live cell: the kernel does not say whose they were."""
        if not lost:
            return
        self.lost += lost
        for cgroup in self._live:
            self._lost[cgroup] = self._lost.get(cgroup, 0) + lost
        self._changed.notify_all()  # a wait for an echo asks again (`_send`)

    def _take_echo(self, echo: str, cgroup: int, drops: int) -> None:
        self._echoes.add((echo, cgroup))
        if echo == "cell":
            # Registered in the kernel now: its events can come only after this line.
            self._live.add(cgroup)
        elif echo == "mark":
            self._drops[cgroup] = drops
        # Only an echo is waited for; events wake nobody (a busy cell prints thousands,
        # and a notify per line doubled the cost of reading them).
        self._changed.notify_all()

    def _send(self, cgroup: int, whence: int, echo: str) -> bool:
        """Tell the program about `cgroup` through the kernel; wait for its echo."""
        if not self.attached or self._proc is None:
            return False
        with self._lock:
            lost = self.lost  # before the marker: a loss after it may have taken its echo
        with contextlib.suppress(OSError):
            os.lseek(-1, cgroup, whence)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        with self._changed:
            while (echo, cgroup) not in self._echoes:
                left = deadline - time.monotonic()
                if left <= 0 or self._proc.poll() is not None:
                    self.status = "failed"
                    self.why = f"bpftrace stopped answering (exit {self._proc.poll()})"
                    return False
                if self.lost != lost:
                    # bpftrace's buffers lost events meanwhile: the echo may be one of them
                    # (measured: a drain timed out so, and the run lost its witness). Asked
                    # again; a second echo of the same marker changes nothing.
                    lost = self.lost
                    with contextlib.suppress(OSError):
                        os.lseek(-1, cgroup, whence)
                self._changed.wait(min(left, RESEND_S))
            self._echoes.discard((echo, cgroup))
        return True

    def events_of(self, cell_cgroup: int) -> list[KernelEvent]:
        """The cell's events read so far, without draining it."""
        with self._lock:
            return list(self._cells.get(cell_cgroup, CellEvents()).events)

    def register(self, cell_cgroup: int) -> bool:
        """Record the cell whose cgroup id is `cell_cgroup` from now on (before its payload)."""
        return self.wait_attached() and self._send(cell_cgroup, REGISTER, "cell")

    def drain(self, cell_cgroup: int) -> CellEvents | None:
        """Stop recording the cell; every event it caused, and how many were dropped.

        Called after the cell's processes ended: the drain marker goes through the kernel
        after their last syscall, so every line of theirs is read before its echo. None when
        the witness is not attached or bpftrace stopped answering (`why` says so).
        """
        # Two echoes: bpftrace reads each CPU's buffer in turn, so the drain's echo may come
        # before a cell's last lines from another CPU's buffer that was ready in the same
        # round; the flush is written after that echo was read, so it comes after them.
        if not (self._send(cell_cgroup, DRAIN, "mark") and self._send(cell_cgroup, FLUSH, "flush")):
            return None
        with self._lock:
            self._live.discard(cell_cgroup)
            got = self._cells.pop(cell_cgroup, CellEvents())
            got.dropped = self._drops.pop(cell_cgroup, 0) + self._lost.pop(cell_cgroup, 0)
            for key in [k for k, e in self._waiting.items() if e.cgroup == cell_cgroup]:
                del self._waiting[key]
        return got

    def interrupt(self) -> None:
        """Ask bpftrace to detach and exit (SIGINT), without waiting: `stop` waits.

        Detaching takes bpftrace about 0.4 s; the session stops the world meanwhile.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None and not self._interrupted:
            self._interrupted = True
            proc.send_signal(signal.SIGINT)

    def stop(self) -> list[str]:
        """Stop bpftrace (its probes go with it) and unmount tracefs if this run mounted it."""
        if self.status == "attaching":
            if self._ready.is_set():
                self.attach_ms = round((self._attached_at - self._began) * 1000, 1)
                self.status = "attached"
            else:
                self.status = "unavailable"
                self.why = "the run ended before bpftrace attached its probes"
        proc, self._proc = self._proc, None
        notes = _end(proc, self._readers, interrupted=self._interrupted) if proc is not None else []
        self.stopped = True
        if self.mounted_tracefs:
            if _libc().umount2(str(TRACEFS).encode(), 0) != 0:
                err = ctypes.get_errno()
                notes.append(f"could not unmount {TRACEFS}: {os.strerror(err)}")
            else:
                self.mounted_tracefs = False
                self.tracefs = "mounted and unmounted by this run"
        return notes


def _end(
    proc: subprocess.Popen[str], readers: list[threading.Thread], *, interrupted: bool = False
) -> list[str]:
    """End bpftrace (SIGINT: it detaches its probes and exits), then its readers and pipes.

    `interrupted`: the SIGINT was sent already (`KernelWitness.interrupt`); one is enough.
    """
    notes = []
    if proc.poll() is None:
        if not interrupted:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)
            notes.append("bpftrace did not stop on SIGINT; killed")
    # The readers end at the pipes' EOF (bpftrace gone); then the pipes are closed.
    for reader in readers:
        reader.join(2.0)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.close()
    return notes


# ---------------------------------------------------------------------------------------------
# The run's one witness (a run is one harness process; the session starts and stops it).

_RUN_WITNESS: KernelWitness | None = None
_RUN_LOCK = threading.Lock()


def start_run(cells_have_cgroups: bool, why_not: str = "") -> KernelWitness:
    """Start this process's witness once (later calls return it); stopped at exit at the latest.

    It attaches in the background: the first cell's `register` waits for it.

    Set SANDBOX_ATTEST_KERNEL_WITNESS=off to run without one (the evidence then says so).
    """
    global _RUN_WITNESS  # noqa: PLW0603  (one per process, like the run cgroup)
    with _RUN_LOCK:
        if _RUN_WITNESS is None or _RUN_WITNESS.stopped or _RUN_WITNESS.status == "failed":
            witness = KernelWitness()
            if os.environ.get(DISABLE_ENV, "").lower() in {"off", "0", "no"}:
                witness.why = f"turned off by {DISABLE_ENV}"
            else:
                witness.start(cells_have_cgroups, why_not, wait=False)
                atexit.register(witness.stop)
            _RUN_WITNESS = witness
        return _RUN_WITNESS


def run_witness() -> KernelWitness | None:
    """This process's witness, if the session started one (attached or not)."""
    return _RUN_WITNESS


def interrupt_run() -> None:
    """Ask this process's witness to stop, without waiting (`stop_run` waits)."""
    with _RUN_LOCK:
        witness = _RUN_WITNESS
    if witness is not None:
        witness.interrupt()


def stop_run() -> list[str]:
    """Stop this process's witness; notes on what could not be undone."""
    with _RUN_LOCK:
        witness = _RUN_WITNESS
    return witness.stop() if witness is not None else []
