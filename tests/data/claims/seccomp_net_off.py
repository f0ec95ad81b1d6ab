"""A seccomp-only network cut, for tests: no namespace at all, a filter refuses the connects.

usage: python3 seccomp_net_off.py [--no-filter] PROGRAM ARGS...

It installs a seccomp filter, then execs PROGRAM, exactly as Codex's seccomp-only mode cuts
the network: the payload keeps the harness's network namespace, and every attempt to reach
anyone is refused in the kernel with EPERM. A classic-BPF filter cannot read the sockaddr a
connect() points to, so it cannot tell AF_INET from AF_UNIX there; it refuses every connect(),
every sendto() that names a destination, sendmsg/sendmmsg (their destination sits behind a
pointer too) and io_uring_setup (a ring could connect without a syscall the filter sees).
Creating a socket stays allowed, so a probe that only reads its own interfaces still runs.

`--no-filter` execs PROGRAM without the filter: the same wrapper, the same claim, no cut. It
is the false claim the live test must FAIL. The layout of `struct seccomp_data` and the
opcodes are the ones sandbox_attest/backends/seccomp.py uses.

Stdlib only: the payload user runs it with the payload's interpreter.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_RET_K = 0x06
ALLOW = 0x7FFF0000
EPERM = 0x00050000 | 1
X32_SYSCALL_BIT = 0x40000000
OFFSET_NR, OFFSET_ARCH = 0, 4
OFFSET_ARG4_LOW, OFFSET_ARG4_HIGH = 16 + 4 * 8, 16 + 4 * 8 + 4

# audit arch, then connect, sendto, sendmsg, sendmmsg, io_uring_setup (the kernel's tables).
ARCHES = {
    "x86_64": (0xC000003E, 42, 44, 46, 307, 425),
    "aarch64": (0xC00000B7, 203, 206, 211, 269, 425),
}


def insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str) -> bytes:
    arch, connect, sendto, sendmsg, sendmmsg, io_uring = ARCHES[machine]
    prog = [
        insn(BPF_LD_W_ABS, OFFSET_ARCH),
        insn(BPF_JEQ_K, arch, 1, 0),
        insn(BPF_RET_K, EPERM),  # another architecture's numbers mean something else
        insn(BPF_LD_W_ABS, OFFSET_NR),
        insn(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        insn(BPF_RET_K, EPERM),
        insn(BPF_JEQ_K, connect, 4, 0),
        insn(BPF_JEQ_K, sendmsg, 3, 0),
        insn(BPF_JEQ_K, sendmmsg, 2, 0),
        insn(BPF_JEQ_K, io_uring, 1, 0),
        insn(BPF_JEQ_K, sendto, 2, 1),
        insn(BPF_RET_K, EPERM),  # connect, sendmsg, sendmmsg, io_uring_setup
        insn(BPF_RET_K, ALLOW),  # any other call
        # sendto: allowed only without a destination (dest_addr, arg 4, is NULL).
        insn(BPF_LD_W_ABS, OFFSET_ARG4_LOW),
        insn(BPF_JEQ_K, 0, 0, 2),
        insn(BPF_LD_W_ABS, OFFSET_ARG4_HIGH),
        insn(BPF_JEQ_K, 0, 1, 0),
        insn(BPF_RET_K, EPERM),
        insn(BPF_RET_K, ALLOW),
    ]
    return b"".join(prog)


def install(machine: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    code = program(machine)
    buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    fprog = SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main(argv: list[str]) -> int:
    args = argv[1:]
    filtered = True
    if args[:1] == ["--no-filter"]:
        filtered, args = False, args[1:]
    if not args:
        sys.stderr.write("usage: seccomp_net_off.py [--no-filter] PROGRAM ARGS...\n")
        return 2
    if filtered:
        machine = platform.machine()
        if machine not in ARCHES:
            # Never run the payload unconfined under a claim of a cut.
            sys.stderr.write("seccomp_net_off: no syscall table for %s\n" % machine)
            return 1
        install(machine)
    os.execvp(args[0], args)  # replaces this process: nothing runs after it


if __name__ == "__main__":
    sys.exit(main(sys.argv))
