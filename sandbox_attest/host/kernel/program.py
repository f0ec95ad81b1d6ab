"""The kernel witness's bpftrace program, and the reading of what it prints.

See sandbox_attest/host/kernel/__init__.py for what is recorded and why this way.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

# Events kept per cell (cgroup) in the kernel; the rest are counted as drops. A sandlock cell
# (seccomp user-notify supervisor) makes about 5000 before the notify ioctls are left out.
CELL_CAP: Final = 16384
# The seccomp user-notify ioctls' type ('!', <linux/seccomp.h>): a supervisor such as
# sandlock's makes thousands per cell (one per notified syscall); they are not recorded.
NOTIF_IOCTL_TYPE: Final = 0x21
# lseek(-1, <cgroup id>, whence) from the harness registers or drains a cell (program_text):
# whence values no kernel defines (SEEK_* stop at 4), so the call is EBADF and nothing else.
REGISTER: Final = 0x4B57
DRAIN: Final = 0x4B4D
# ... and flushes: its echo comes after every line bpftrace read before the drain's echo.
FLUSH: Final = 0x4B46
# x86: `struct thread_info` is task_struct's first member (THREAD_INFO_IN_TASK, since 4.9),
# and its `status` follows `flags` and `syscall_work` (5.11 on; `flags` alone before).
THREAD_INFO_STATUS: Final = 16
THREAD_INFO_STATUS_BEFORE_5_11: Final = 8
TS_COMPAT: Final = 0x0002
# BPFTRACE_STRLEN: bpftrace 0.17's cap; a longer path is cut to its first 199 bytes.
STRLEN: Final = 200
# BPFTRACE_PERF_RB_PAGES: each CPU's output buffer, in pages (bpftrace's default 64). With 64,
# a cell making 2000 recorded calls lost a part of them ("Lost N events") in 3 of 15 cells at
# load 3 on this 2-core machine (ks2's note); 1024 pages (4 MiB a CPU) lost none of 60.
PERF_RB_PAGES: Final = 1024
# bpftrace's own line when a CPU's buffer overflowed: "Lost 779 events".
LOST_PREFIX: Final = "Lost "

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
    "clone3": (435, "", ""),
    "io_uring_setup": (425, "", ""),
    "execveat": (322, "a1", ""),
    "fsmount": (432, "", ""),
    "fspick": (433, "a1", ""),
    "mount_setattr": (442, "a1", ""),
}
NAMES: Final = {nr: name for name, (nr, _, _) in SYSCALLS.items()}
# SIGSYS (x86_64's 31) and the si_code seccomp gives it (SYS_SECCOMP, <asm-generic/siginfo.h>).
SIGSYS: Final = 31
SYS_SECCOMP: Final = 1
# The calls by which a thread can queue itself a signal with any si_code, SYS_SECCOMP too
# (the kernel refuses a forged code only towards another process): rt_sigqueueinfo,
# rt_tgsigqueueinfo and pidfd_send_signal, by their x86_64 and i386 numbers. Each is marked
# while it runs (not recorded): a SIGSYS raised inside one is the thread's own, not seccomp's.
# A number of one table that is another call in the other (i386 129, 297) only marks more
# calls; a seccomp kill never happens inside an entered syscall, so none is mistaken.
QUEUEING: Final = (129, 297, 424, 178, 335)
MARK_ONLY: Final = 512


@dataclass(slots=True)
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
    # A SIGSYS raised in the cell (`syscall` "signal", from a `KG` line): see `sigsys_event`.
    signal: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str:
        """The errno name of a refusal ("EACCES"), or "" for a success.

        A SIGSYS seccomp raised is "SIGSYS" (the kernel's answer was to kill); any other
        SIGSYS (sent by a process, or queued by the thread to itself) answers nothing: "".
        """
        if self.signal:
            return "SIGSYS" if self.signal.get("seccomp") else ""
        if self.ret >= 0:
            return ""
        return errno.errorcode.get(-self.ret, f"E{-self.ret}")

    def describe(self) -> str:
        """`openat(/home/u/.ssh/id) -> EACCES`, as a reason reads it."""
        if self.signal:
            by = "seccomp" if self.signal.get("seccomp") else "not seccomp"
            return f"SIGSYS to {self.signal.get('target')} ({by})"
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
        if self.signal:
            out["signal"] = self.signal
        return out


def sigsys_event(nums: list[int], comm: str) -> KernelEvent:
    """A `KG` line's SIGSYS as an event: ("signal", entered False, `signal` its facts).

    `signal["seccomp"]` is the kernel's own "killed by seccomp": si_code SYS_SECCOMP, raised
    for the thread that was running (seccomp signals `current`, before the syscall begins),
    and not inside a call by which the thread queues itself a signal of any code
    (`QUEUEING`), the one way a process forges that si_code.
    """
    cg, pid, tid, target, code, group, result, queued = nums
    facts = {
        "sig": SIGSYS,
        "code": code,
        "target": target,
        "group": bool(group),
        "result": result,
        "queued_by_itself": bool(queued),
        "seccomp": code == SYS_SECCOMP and target == tid and not queued,
    }
    return KernelEvent(
        cg, pid, tid, "signal", 0, entered=False, args=(0, 0, 0, 0), comm=comm, signal=facts
    )


def program_text(harness_pid: int, status_offset: int = THREAD_INFO_STATUS) -> str:
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
        status_offset: where `thread_info.status` is in `task_struct` (see THREAD_INFO_STATUS).
    """
    where = {"": 0, "a0": 1, "a1": 2, "a4": 5}
    fill = " ".join(
        f"@want[{nr}] = {1 + where[text] * 8 + where[addr] * 64};"
        for nr, text, addr in SYSCALLS.values()
    ) + "".join(f" @want[{nr}] = {MARK_ONLY};" for nr in QUEUEING)
    forget = " ".join(f"delete(@{m}[tid]);" for m in ("in", "a0", "a1", "a2", "a3"))
    # raw_syscalls fire for 32-bit (int 0x80) syscalls too, numbered from the i386 table:
    # i386's 257 is not openat. TS_COMPAT in thread_info.status marks them; they are left out
    # (read by offset, not through BTF: curtask's BTF costs bpftrace a second of compiling).
    native = f"(*(uint32 *)((uint64)curtask + {status_offset}) & {TS_COMPAT}) == 0"
    return f"""\
BEGIN {{ {fill} printf("KR\\n"); }}
tracepoint:syscalls:sys_enter_lseek /pid == {harness_pid} && args->fd == 4294967295/ {{
  if (args->whence == {REGISTER}) {{ @cells[args->offset] = 1; @n[args->offset] = 0;
    printf("KC\\t%lu\\n", args->offset); }}
  if (args->whence == {DRAIN}) {{ delete(@cells[args->offset]);
    printf("KM\\t%lu\\t%lu\\n", args->offset, @drop[args->offset]);
    delete(@n[args->offset]); delete(@drop[args->offset]); }}
  if (args->whence == {FLUSH}) {{ printf("KF\\t%lu\\n", args->offset); }}
}}
tracepoint:raw_syscalls:sys_enter /@want[args->id] && @cells[cgroup]/ {{
  if (@want[args->id] == {MARK_ONLY}) {{ @queue[tid] = 1; return; }}
  if (!({native})) {{ return; }}
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
  if (@want[args->id] == {MARK_ONLY}) {{ delete(@queue[tid]); return; }}
  if (!({native})) {{ return; }}
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
tracepoint:signal:signal_generate /args->sig == {SIGSYS} && @cells[cgroup]/ {{
  if (@n[cgroup] >= {CELL_CAP}) {{ @drop[cgroup] = @drop[cgroup] + 1; return; }}
  @n[cgroup] = @n[cgroup] + 1;
  printf("KG\\t%lu\\t%d\\t%d\\t%d\\t%d\\t%d\\t%d\\t%d\\t%s\\n", cgroup, pid, tid, args->pid,
    args->code, args->group, args->result, @queue[tid], comm);
}}
"""


# The program's echoes that carry one number (or none): their tuple's name.
ECHOES: Final = {"KR": "ready", "KC": "cell", "KF": "flush"}


def parse_line(line: str) -> KernelEvent | tuple[str, int, int, str] | None:  # noqa: PLR0911  (one return per line kind)
    """One line of the program's output, or None for a line that is none of ours.

    Returns an event (`KE`; or `KG`, a SIGSYS: `sigsys_event`), or a tuple: ("ready", 0, 0,
    ""), ("cell", cgroup, 0, ""), ("mark", cgroup, drops, ""), ("flush", cgroup, 0, ""),
    ("text", tid, key, path) for `KS`, ("addr", tid, key, hex) for `KA`. A `KS`/`KA` line
    belongs to the `KE` line with the same thread and key (the enter's timestamp): enter and
    exit may run on two CPUs, whose lines bpftrace reads in no set order, so the pairing is by
    key, never by order.
    """
    tag, _, rest = line.rstrip("\n").partition("\t")
    try:
        if tag == "KE":  # the most frequent line first
            parts = rest.split("\t", 10)
            if len(parts) != 11:  # ten numbers and the command name
                return None
            nums = [int(p) for p in parts[:10]]
        elif tag == "KG":
            parts = rest.split("\t", 8)
            if len(parts) != 9:  # eight numbers and the command name
                return None
            return sigsys_event([int(p) for p in parts[:8]], parts[8])
        elif tag in ECHOES:  # KR (no number), KC, KF
            return (ECHOES[tag], int(rest or 0), 0, "")
        elif tag == "KM":
            cell, _, drops = rest.partition("\t")
            return ("mark", int(cell), int(drops or 0), "")
        elif tag in {"KS", "KA"}:
            who, stamp, text = rest.split("\t", 2)
            return ("text" if tag == "KS" else "addr", int(who), int(stamp), text)
        else:
            return None
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
    """What the kernel witness saw of one cell: its events, and how many it dropped.

    `dropped` counts the events past the cell's cap (in the kernel) and the events bpftrace's
    per-CPU buffers lost while the cell was live ("Lost N events": the kernel does not say
    whose they were, so each live cell counts them): either way not seen is not never.
    """

    events: list[KernelEvent] = field(default_factory=list)
    dropped: int = 0


def has_argument(syscall: str) -> bool:
    """Whether the program prints an argument line (path or address) for `syscall`."""
    _, text, addr = SYSCALLS.get(syscall, (0, "", ""))
    return bool(text or addr)


def fill_argument(event: KernelEvent, kind: str, value: str) -> None:
    """Give `event` its enter's argument line: a path ("text") or a socket address ("addr")."""
    if kind == "text":
        event.text = value
    else:
        event.address = sockaddr(hex_bytes(value))
        if event.address.get("family") == "AF_UNIX":
            event.text = str(event.address.get("address", ""))


def lost_count(line: str) -> int:
    """N for bpftrace's "Lost N events" line; 0 for any other line."""
    if not line.startswith(LOST_PREFIX):
        return 0
    words = line.split()
    if len(words) == 3 and words[2] == "events" and words[1].isdigit():
        return int(words[1])
    return 0
