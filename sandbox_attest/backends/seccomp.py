"""A small seccomp filter for namespaced backends: refuse the kernel's riskiest doors.

bubblewrap loads a classic-BPF seccomp program from a descriptor (`--seccomp FD`) but ships
none. Namespaces do not narrow the syscall surface: without a filter a sandboxed payload
reaches io_uring, the keyrings, bpf(), TIOCSTI into the controlling terminal, and vsock or
netlink sockets (the `proc_syscall_surface` probe showed all of them), and TIOCLINUX
(`proc_syscall_surface_extended`). The i386 entry (int 0x80, where socketcall hides a socket's
family behind a pointer) fails the architecture check. This program returns
EPERM for those and allows everything else; it is deliberately a short deny list a reviewer
can read against the probe, not a full allowlist.

Layout of the data a filter sees (linux/seccomp.h, `struct seccomp_data`): `nr` at offset 0,
`arch` at 4, `instruction_pointer` at 8, `args[6]` (u64 each) from 16. We compare the low 32
bits of an argument (little-endian), which is where the family, request and flag values live.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass
from typing import Final

from sandbox_attest.errors import BackendUnavailable

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
BPF_LD_W_ABS: Final = 0x20
BPF_JEQ_K: Final = 0x15
BPF_JGE_K: Final = 0x35
BPF_RET_K: Final = 0x06
SECCOMP_RET_ALLOW: Final = 0x7FFF0000
SECCOMP_RET_ERRNO: Final = 0x00050000
EPERM: Final = 1

OFFSET_NR: Final = 0
OFFSET_ARCH: Final = 4
OFFSET_ARG0_LOW: Final = 16
OFFSET_ARG1_LOW: Final = 24

AF_UNIX: Final = 1
AF_INET: Final = 2
AF_INET6: Final = 10
TIOCSTI: Final = 0x5412
# The VT console's multiplexer ioctl: its selection/paste subcodes push text into a console's
# input like TIOCSTI does (CVE-2023-1523's class); proc_syscall_surface_extended found it open.
TIOCLINUX: Final = 0x541C
# x32 syscalls on x86_64 carry this bit; they would bypass every number below.
X32_SYSCALL_BIT: Final = 0x40000000


@dataclass(frozen=True)
class ArchTable:
    """Syscall numbers of one architecture (from the kernel's syscall tables)."""

    audit_arch: int
    denied: dict[str, int]  # refused outright
    socket: int
    socketpair: int
    ioctl: int


ARCHES: Final = {
    "x86_64": ArchTable(
        audit_arch=0xC000003E,
        denied={
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
        },
        socket=41,
        socketpair=53,
        ioctl=16,
    ),
    "aarch64": ArchTable(
        audit_arch=0xC00000B7,
        denied={
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
        },
        socket=198,
        socketpair=199,
        ioctl=29,
    ),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    # struct sock_filter { __u16 code; __u8 jt; __u8 jf; __u32 k; } in native byte order.
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """The filter program for `machine` (default: this one), as bwrap reads it from an fd.

    Raises:
        BackendUnavailable: no syscall table for this architecture (running without the
            filter would silently weaken the sandbox, so the backend must not run).
    """
    machine = machine or platform.machine()
    table = ARCHES.get(machine)
    if table is None:
        raise BackendUnavailable(
            f"no seccomp syscall table for architecture {machine!r}; the bubblewrap backend "
            f"supports {sorted(ARCHES)}"
        )
    deny = SECCOMP_RET_ERRNO | EPERM
    # The program, with jumps written as names resolved below: 1. wrong arch -> deny;
    # 2. x32 numbers -> deny; 3. each denied number -> deny; 4. socket/socketpair with a family
    # other than unix/inet/inet6 -> deny; 5. ioctl TIOCSTI or TIOCLINUX -> deny; 6. allow.
    prog: list[tuple[int, int, str | None, str | None]] = [
        (BPF_LD_W_ABS, OFFSET_ARCH, None, None),
        (BPF_JEQ_K, table.audit_arch, None, "deny"),
        (BPF_LD_W_ABS, OFFSET_NR, None, None),
        (BPF_JGE_K, X32_SYSCALL_BIT, "deny", None),
    ]
    prog += [(BPF_JEQ_K, nr, "deny", None) for nr in sorted(table.denied.values())]
    prog += [
        (BPF_JEQ_K, table.socket, "family", None),
        (BPF_JEQ_K, table.socketpair, "family", None),
        (BPF_JEQ_K, table.ioctl, "ioctl", None),
        (BPF_RET_K, SECCOMP_RET_ALLOW, None, None),
    ]
    labels = {"family": len(prog)}
    prog += [
        (BPF_LD_W_ABS, OFFSET_ARG0_LOW, None, None),
        (BPF_JEQ_K, AF_UNIX, "allow", None),
        (BPF_JEQ_K, AF_INET, "allow", None),
        (BPF_JEQ_K, AF_INET6, "allow", "deny"),
    ]
    labels["ioctl"] = len(prog)
    prog += [
        (BPF_LD_W_ABS, OFFSET_ARG1_LOW, None, None),
        (BPF_JEQ_K, TIOCSTI, "deny", None),
        (BPF_JEQ_K, TIOCLINUX, "deny", "allow"),
    ]
    labels["allow"] = len(prog)
    prog.append((BPF_RET_K, SECCOMP_RET_ALLOW, None, None))
    labels["deny"] = len(prog)
    prog.append((BPF_RET_K, deny, None, None))

    def offset(index: int, target: str | None) -> int:
        # A jump is relative to the next instruction; None falls through.
        return 0 if target is None else labels[target] - index - 1

    return b"".join(
        _insn(code, k, offset(i, jt), offset(i, jf)) for i, (code, k, jt, jf) in enumerate(prog)
    )


def denied_names(machine: str | None = None) -> list[str]:
    """What the filter refuses, for the backend's identity and the report."""
    table = ARCHES.get(machine or platform.machine())
    if table is None:
        return []
    return [
        *sorted(table.denied),
        "socket/socketpair families other than unix/inet/inet6",
        "ioctl TIOCSTI",
        "ioctl TIOCLINUX",
        "x32 syscalls",
        "any other architecture",
    ]
