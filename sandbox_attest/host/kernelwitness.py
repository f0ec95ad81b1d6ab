"""The kernel witness: what the kernel answered each cell's processes, read by eBPF.

A filter sandbox (Landlock and seccomp in the harness's own namespaces) leaves nothing in
`/proc` when it refuses: the payload's word was all a refusal rested on. Where the harness
runs as root on Linux, one `bpftrace` process per run records, for every process of every
cell's cgroup, the syscalls probes care about with their arguments and the kernel's answer
(the return value at `sys_exit`). A refusal is then corroborated by the kernel itself.

Why bpftrace (Debian's 0.17, /usr/bin/bpftrace) rather than hand-written bytecode or a
libbpf binding: the program is a few dozen readable lines that a reviewer can check against
the kernel's tracepoint formats; bpftrace does the verifier-facing work (user-memory reads with
`uptr`, BTF struct access for the cgroup filter, per-CPU output) and is packaged and kept by
the distribution. A Python libbpf binding would need a compiled CO-RE object shipped with the
wheel, and bytecode written by hand is exactly the unreviewable artifact a witness must not be.

What it attaches (measured on 6.18, issue 27's notes in /work/helpers/out/kw.md):

- `tracepoint:raw_syscalls:sys_enter` / `sys_exit`: two probes for every syscall listed in
  `SYSCALLS`, so attaching costs two perf events, not forty. The arguments are kept per thread
  at enter and printed with the return value at exit, one line per syscall, so lines from
  different CPUs never have to be paired in user space.
- The cgroup filter runs in the kernel: a process counts when its cgroup-v2 cgroup's parent
  (or grandparent: a wrapper's own child cgroup) is the run's cgroup
  (`sandbox_attest.host.cellgroup`: one child per cell). The cell is the event's `cgroup`.
- A syscall refused by seccomp (`RET_ERRNO`, or a user-notify supervisor that answers itself)
  never reaches `sys_enter` (the kernel's `syscall_trace_enter` runs seccomp first) but does
  reach `sys_exit` with its errno: such an event has `entered` False and no arguments. That
  is how seccomp's denials show; Landlock's (an LSM hook inside the syscall) show as an
  ordinary entered syscall returning EACCES with its path.
- kfunc/fexit probes on Landlock or seccomp functions were not chosen: bpftrace 0.17 reports
  "kfunc/kretfunc not available for your kernel version" on this kernel, and those functions
  are internal (renamed and inlined between releases).

Volume is bounded in the kernel: at most `CELL_CAP` events per cgroup, the rest counted and
reported as drops. Where no witness can run, `start` says exactly why and the run goes on
with today's readings.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import ipaddress
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sandbox_attest.host import lifetime

BPFTRACE: Final = "/usr/bin/bpftrace"
# The environment variable that turns the witness off for a run (its reason is then this).
DISABLE_ENV: Final = "SANDBOX_ATTEST_KERNEL_WITNESS"
TRACEFS: Final = Path("/sys/kernel/tracing")
# Events kept per cell (cgroup) in the kernel; the rest are counted as drops. A sandlock cell
# (seccomp user-notify supervisor) makes about 5000 before the notify ioctls are left out.
CELL_CAP: Final = 16384
# How long `start` waits for bpftrace to say its probes are attached.
ATTACH_TIMEOUT_S: Final = 20.0
# How long a drain waits for its marker to come back through bpftrace.
DRAIN_TIMEOUT_S: Final = 2.0
# The seccomp user-notify ioctls' type ('!', <linux/seccomp.h>): a supervisor such as
# sandlock's makes thousands per cell (one per notified syscall); they are not recorded.
NOTIF_IOCTL_TYPE: Final = 0x21
# lseek(-1, <cgroup id>, whence) from the harness registers or drains a cell (program_text):
# whence values no kernel defines (SEEK_* stop at 4), so the call is EBADF and nothing else.
REGISTER: Final = 0x4B57
DRAIN: Final = 0x4B4D
# BPFTRACE_STRLEN: bpftrace 0.17's cap; a longer path is cut to its first 199 bytes.
STRLEN: Final = 200

# name -> (x86_64 number, where its string argument is: "a0"/"a1" or "" for none,
#          where its socket address is: "a1"/"a4" or "").
SYSCALLS: Final[dict[str, tuple[int, str, str]]] = {
    "open": (2, "a0", ""),
    "openat": (257, "a1", ""),
    "openat2": (437, "a1", ""),
    "connect": (42, "", "a1"),
    "bind": (49, "", "a1"),
    "sendto": (44, "", "a4"),
    "socket": (41, "", ""),
    "mknod": (133, "a0", ""),
    "mknodat": (259, "a1", ""),
    "ioctl": (16, "", ""),
    "mount": (165, "a1", ""),
    "umount2": (166, "a0", ""),
    "unshare": (272, "", ""),
    "setns": (308, "", ""),
    "ptrace": (101, "", ""),
    "kill": (62, "", ""),
    "tkill": (200, "", ""),
    "tgkill": (234, "", ""),
    "bpf": (321, "", ""),
    "keyctl": (250, "", ""),
    "add_key": (248, "a0", ""),
    "request_key": (249, "a0", ""),
    "perf_event_open": (298, "", ""),
    "userfaultfd": (323, "", ""),
    "memfd_create": (319, "a0", ""),
    "open_by_handle_at": (304, "", ""),
    "process_vm_readv": (310, "", ""),
    "process_vm_writev": (311, "", ""),
    "open_tree": (428, "a1", ""),
    "move_mount": (429, "a1", ""),
    "fsopen": (430, "a0", ""),
    "fsmount": (432, "", ""),
    "fspick": (433, "a1", ""),
    "mount_setattr": (442, "a1", ""),
}
NAMES: Final = {nr: name for name, (nr, _, _) in SYSCALLS.items()}


@dataclass
class KernelEvent:
    """One syscall of a cell's process and the kernel's answer.

    `entered` False: the syscall never reached `sys_enter` (seccomp or a seccomp supervisor
    answered before it began), so its arguments are unknown. `text` is its path (or name)
    argument, `address` its socket address, filled from the enter's own line (`key`).
    """

    cgroup: int
    pid: int
    tid: int
    syscall: str
    ret: int
    entered: bool
    args: tuple[int, int, int, int]
    comm: str
    key: int = 0
    text: str = ""
    address: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str:
        """The errno name of a refusal ("EACCES"), or "" for a success."""
        if self.ret >= 0:
            return ""
        return errno.errorcode.get(-self.ret, f"E{-self.ret}")

    def describe(self) -> str:
        """`openat(/home/u/.ssh/id) -> EACCES`, as a reason reads it."""
        what = self.text or self.address.get("address", "")
        if not self.entered:
            what = "arguments not seen: refused before the syscall began (seccomp)"
        answer = self.error or f"{self.ret}"
        return f"{self.syscall}({what}) -> {answer}"

    def as_dict(self) -> dict[str, Any]:
        """The event as it goes into the evidence."""
        out: dict[str, Any] = {
            "syscall": self.syscall,
            "pid": self.pid,
            "comm": self.comm,
            "ret": self.ret,
            "error": self.error,
            "entered": self.entered,
            "args": list(self.args),
        }
        if self.text:
            out["text"] = self.text
        if self.address:
            out["address"] = self.address
        return out


def program_text(harness_pid: int) -> str:
    """The bpftrace program for one run; the harness names each cell's cgroup to it.

    The harness registers a cell by `lseek(-1, <cgroup id>, REGISTER)` and drains it by
    `lseek(-1, <cgroup id>, DRAIN)`: both are EBADF for the harness (no descriptor -1), and
    the program, matching only the harness's pid and those two `whence` values, adds the id to
    `@cells` (and echoes `KC`) or removes it (and echoes `KM`). The echo is the handshake:
    every event a cell caused before its drain marker is read before the marker itself.
    The syscalls and where their arguments are live in a map filled by `BEGIN`: a `||` chain
    of 34 comparisons, or a cgroup-ancestry filter through `curtask` (BTF), took bpftrace 0.17
    several seconds to compile on this machine; map lookups keep it under one.

    Args:
        harness_pid: the harness's pid (the only one whose lseek registers or drains).
    """
    where = {"": 0, "a0": 1, "a1": 2, "a4": 5}
    fill = " ".join(
        f"@want[{nr}] = {1 + where[text] * 8 + where[addr] * 64};"
        for nr, text, addr in SYSCALLS.values()
    )
    forget = " ".join(f"delete(@{m}[tid]);" for m in ("in", "a0", "a1", "a2", "a3"))
    return f"""\
BEGIN {{ {fill} printf("KR\\n"); }}
tracepoint:syscalls:sys_enter_lseek /pid == {harness_pid} && args->fd == 4294967295/ {{
  if (args->whence == {REGISTER}) {{ @cells[args->offset] = 1; @n[args->offset] = 0;
    printf("KC\\t%lu\\n", args->offset); }}
  if (args->whence == {DRAIN}) {{ delete(@cells[args->offset]);
    printf("KM\\t%lu\\t%lu\\n", args->offset, @drop[args->offset]);
    delete(@n[args->offset]); delete(@drop[args->offset]); }}
}}
tracepoint:raw_syscalls:sys_enter /@want[args->id] && @cells[cgroup]/ {{
  if (args->id == 16 && (args->args[1] >> 8) % 256 == {NOTIF_IOCTL_TYPE}) {{
    @quiet[tid] = 1; return; }}
  if (@n[cgroup] < {CELL_CAP}) {{
    $w = (uint64)@want[args->id];
    $k = nsecs;
    @in[tid] = $k;
    @a0[tid] = args->args[0]; @a1[tid] = args->args[1];
    @a2[tid] = args->args[2]; @a3[tid] = args->args[3];
    $t = ($w / 8) % 8;
    $a = $w / 64;
    if ($t == 1) {{ printf("KS\\t%d\\t%lu\\t%s\\n", tid, $k, str(uptr(args->args[0]))); }}
    if ($t == 2) {{ printf("KS\\t%d\\t%lu\\t%s\\n", tid, $k, str(uptr(args->args[1]))); }}
    if ($a == 2) {{ printf("KA\\t%d\\t%lu\\t%r\\n", tid, $k, buf(uptr(args->args[1]), 28)); }}
    if ($a == 5 && args->args[4] != 0) {{
      printf("KA\\t%d\\t%lu\\t%r\\n", tid, $k, buf(uptr(args->args[4]), 28)); }}
  }}
}}
tracepoint:raw_syscalls:sys_exit /@want[args->id] && @cells[cgroup]/ {{
  if (@quiet[tid]) {{ delete(@quiet[tid]); return; }}
  if (@n[cgroup] >= {CELL_CAP}) {{
    @drop[cgroup] = @drop[cgroup] + 1;
  }} else {{
    @n[cgroup] = @n[cgroup] + 1;
    printf("KE\\t%lu\\t%d\\t%d\\t%ld\\t%ld\\t%lu\\t%lu\\t%lu\\t%lu\\t%lu\\t%s\\n",
      cgroup, pid, tid, args->id, args->ret, @in[tid], @a0[tid], @a1[tid], @a2[tid], @a3[tid],
      comm);
  }}
  {forget}
}}
"""


def parse_line(line: str) -> KernelEvent | tuple[str, int, int, str] | None:  # noqa: PLR0911  (one return per line kind)
    """One line of the program's output, or None for a line that is none of ours.

    Returns an event (`KE`), or a tuple: ("ready", 0, 0, ""), ("cell", cgroup, 0, ""),
    ("mark", cgroup, drops, ""), ("text", tid, key, path) for `KS`, ("addr", tid, key, hex)
    for `KA`. A `KS`/`KA` line belongs to the `KE` line with the same thread and key (the
    enter's timestamp): enter and exit may run on two CPUs, whose lines bpftrace reads in
    no set order, so the pairing is by key, never by order.
    """
    tag, _, rest = line.rstrip("\n").partition("\t")
    try:
        if tag == "KR":
            return ("ready", 0, 0, "")
        if tag == "KC":
            return ("cell", int(rest), 0, "")
        if tag == "KM":
            cell, _, drops = rest.partition("\t")
            return ("mark", int(cell), int(drops or 0), "")
        if tag in {"KS", "KA"}:
            who, stamp, text = rest.split("\t", 2)
            return ("text" if tag == "KS" else "addr", int(who), int(stamp), text)
        parts = rest.split("\t", 10)
        if tag != "KE" or len(parts) != 11:
            return None
        nums = [int(p) for p in parts[:10]]
    except ValueError:
        return None
    cg, pid, tid, nr, ret, key, a0, a1, a2, a3 = nums
    return KernelEvent(
        cgroup=cg,
        pid=pid,
        tid=tid,
        syscall=NAMES.get(nr, f"syscall_{nr}"),
        ret=ret,
        entered=key != 0,
        args=(a0, a1, a2, a3),
        comm=parts[10],
        key=key,
    )


def sockaddr(raw: bytes) -> dict[str, Any]:
    """A `struct sockaddr` the payload passed (its first 28 bytes), as the evidence shows it."""
    if len(raw) < 2:
        return {}
    family = int.from_bytes(raw[:2], "little")
    if family == socket.AF_INET and len(raw) >= 8:
        port = int.from_bytes(raw[2:4], "big")
        ip = str(ipaddress.IPv4Address(raw[4:8]))
        return {"family": "AF_INET", "ip": ip, "port": port, "address": f"{ip}:{port}"}
    if family == socket.AF_INET6 and len(raw) >= 24:
        port = int.from_bytes(raw[2:4], "big")
        ip = str(ipaddress.IPv6Address(raw[8:24]))
        return {"family": "AF_INET6", "ip": ip, "port": port, "address": f"[{ip}]:{port}"}
    if family == socket.AF_UNIX:
        path = raw[2:].split(b"\0", 1)[0].decode("utf-8", "replace")
        return {"family": "AF_UNIX", "address": path or "(abstract or unnamed)"}
    return {"family": family}


def hex_bytes(text: str) -> bytes:
    r"""Bpftrace's `%r` of a buffer (`\x02\x00...`, printable bytes as themselves) as bytes."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text.startswith("\\x", i) and i + 4 <= len(text):
            try:
                out.append(int(text[i + 2 : i + 4], 16))
                i += 4
                continue
            except ValueError:
                pass
        out += text[i].encode("utf-8", "replace")
        i += 1
    return bytes(out)


def cgroup_id(path: Path) -> int:
    """A cgroup-v2 cgroup's id: its directory's inode (what bpftrace's `cgroup` gives)."""
    return path.stat().st_ino


@dataclass
class CellEvents:
    """What the kernel witness saw of one cell: its events, and how many it dropped."""

    events: list[KernelEvent] = field(default_factory=list)
    dropped: int = 0


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
    _proc: subprocess.Popen[str] | None = None
    _cells: dict[int, CellEvents] = field(default_factory=dict)
    _echoes: set[tuple[str, int]] = field(default_factory=set)
    _drops: dict[int, int] = field(default_factory=dict)
    # (tid, key) -> the enter's text or address line that came before its exit line, and
    # the exit's event still waiting for the line that comes after it.
    _early: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    _waiting: dict[tuple[int, int], KernelEvent] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Condition = field(init=False)
    _ready: threading.Event = field(default_factory=threading.Event)
    _stderr: list[str] = field(default_factory=list)
    _readers: list[threading.Thread] = field(default_factory=list)
    _attach_lock: threading.Lock = field(default_factory=threading.Lock)
    _began: float = 0.0
    _attached_at: float = 0.0

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
        env = {**os.environ, "BPFTRACE_STRLEN": str(STRLEN)}
        # Its own session: a terminal's Ctrl-C reaches the harness, which stops bpftrace
        # itself; the parent-death signal (host/lifetime.py) covers a killed harness.
        self._proc = subprocess.Popen(
            [BPFTRACE, "-B", "line", "-e", program_text(os.getpid())],
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
                self._cells.setdefault(got.cgroup, CellEvents()).events.append(got)
                early = self._early.pop((got.tid, got.key), None) if got.entered else None
                if early is not None:
                    _fill(got, *early)
                elif got.entered and _has_text(got.syscall):
                    self._waiting[(got.tid, got.key)] = got
            elif got is None:
                self.unparsed += line.startswith("K")
            elif got[0] in {"text", "addr"}:
                event = self._waiting.pop((got[1], got[2]), None)
                if event is not None:
                    _fill(event, got[0], got[3])
                else:
                    self._early[(got[1], got[2])] = (got[0], got[3])
            elif got[0] == "ready":
                self._attached_at = time.monotonic()
                self._ready.set()
            elif got[0] in {"cell", "mark"}:
                self._echoes.add((got[0], got[1]))
                if got[0] == "mark":
                    self._drops[got[1]] = got[2]
            self._changed.notify_all()

    def _send(self, cgroup: int, whence: int, echo: str) -> bool:
        """Tell the program about `cgroup` through the kernel; wait for its echo."""
        if not self.attached or self._proc is None:
            return False
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
                self._changed.wait(left)
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
        if not self._send(cell_cgroup, DRAIN, "mark"):
            return None
        with self._lock:
            got = self._cells.pop(cell_cgroup, CellEvents())
            got.dropped = self._drops.pop(cell_cgroup, 0)
            for key in [k for k, e in self._waiting.items() if e.cgroup == cell_cgroup]:
                del self._waiting[key]
        return got

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
        notes = _end(proc, self._readers) if proc is not None else []
        self.stopped = True
        if self.mounted_tracefs:
            if _libc().umount2(str(TRACEFS).encode(), 0) != 0:
                err = ctypes.get_errno()
                notes.append(f"could not unmount {TRACEFS}: {os.strerror(err)}")
            else:
                self.mounted_tracefs = False
                self.tracefs = "mounted and unmounted by this run"
        return notes


def _end(proc: subprocess.Popen[str], readers: list[threading.Thread]) -> list[str]:
    """End bpftrace (SIGINT: it detaches its probes and exits), then its readers and pipes."""
    notes = []
    if proc.poll() is None:
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


def _has_text(syscall: str) -> bool:
    _, text, addr = SYSCALLS.get(syscall, (0, "", ""))
    return bool(text or addr)


def _fill(event: KernelEvent, kind: str, value: str) -> None:
    if kind == "text":
        event.text = value
    else:
        event.address = sockaddr(hex_bytes(value))
        if event.address.get("family") == "AF_UNIX":
            event.text = str(event.address.get("address", ""))


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


def stop_run() -> list[str]:
    """Stop this process's witness; notes on what could not be undone."""
    with _RUN_LOCK:
        witness = _RUN_WITNESS
    return witness.stop() if witness is not None else []
