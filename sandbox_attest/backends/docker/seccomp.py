"""Our seccomp profile for docker: docker's own denials, as a short deny list, plus ours.

Docker's default profile (moby/profiles `seccomp/default.json`) is an allowlist: everything it
does not name returns EPERM. Under it the `proc_syscall_surface` probe still reached
io_uring_setup, ioctl TIOCSTI and AF_VSOCK/AF_NETLINK sockets, because the default allows all
of them. This profile turns the logic around so a reviewer can read it against the probes:
`defaultAction` allows, and every entry below refuses something, with the reason beside it.

It keeps every refusal the default profile makes for a container with no capabilities (we run
with `cap_drop=["ALL"]`, so none of its capability-gated entries ever applies), read off the
kernel's syscall table minus the default allowlist:

- mounts and namespaces (mount, umount2, pivot_root, chroot, unshare, setns, the fsopen/
  move_mount API), `clone` with any namespace flag, and `clone3` answered ENOSYS (its flags
  sit behind a pointer seccomp cannot read, so the C library falls back to `clone`);
- the machine and the kernel (reboot, kexec_*, *_module, swapon/off, acct, syslog, the time
  setters, iopl/ioperm, quotactl, sethostname, the NUMA policy calls, the obsolete
  `_sysctl`/`sysfs`/`ustat`/`uselib`/`nfsservctl`);
- other processes (kcmp, pidfd_getfd, process_madvise) and file handles (open_by_handle_at);
- `personality` with any value but the five docker allows.

On top of those we also refuse what the probe and bubblewrap's filter refuse
(`sandbox_attest/backends/seccomp.py`: io_uring, the keyrings, bpf, perf_event_open, userfaultfd,
sockets of any family but unix/inet/inet6, ioctl TIOCSTI and TIOCLINUX), and ptrace,
process_vm_readv/writev and name_to_handle_at, which current docker allows on kernels >= 4.8
(nothing a payload needs).

Two things an allowlist does that a deny list cannot: a syscall added to the kernel after this
list is allowed until it is named here, and compat ABIs are refused only by leaving them out of
`architectures` (x86_64 and aarch64 only: i386, x32 and arm32 calls fail the arch check). We do
not copy the default's `adjtimex`/`clock_adjtime` entries: it allows them (reading the clock
needs them; setting it needs CAP_SYS_TIME, which we drop).

Arguments. The kernel truncates `int`/`unsigned int` arguments (socket family, ioctl request,
personality) to 32 bits, but seccomp compares all 64: an equality on the full value is bypassed
by setting a high bit. Every equality below is therefore SCMP_CMP_MASKED_EQ on the low 32 bits
(in the OCI format, `value` is the mask and `valueTwo` the datum). Conditions in one entry are
ANDed, separate entries ORed, and runc splits an entry with two conditions on the same argument
into separate (ORed) rules, so every entry here has at most one condition.
"""

from __future__ import annotations

import errno
import json
from typing import Any, Final

from sandbox_attest.backends.seccomp import (
    AF_INET,
    AF_INET6,
    AF_UNIX,
    ARCHES,
    EPERM,
    TIOCLINUX,
    TIOCSTI,
)

LOW32: Final = 0xFFFFFFFF

# The docker default profile's refusals for a container without capabilities, grouped.
MOUNT_AND_NAMESPACES: Final = (
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr",
    "mount_setattr",
)  # fmt: skip
MACHINE_AND_KERNEL: Final = (
    "reboot", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "swapon", "swapoff", "acct", "syslog", "vhangup",
    "settimeofday", "stime", "clock_settime", "clock_settime64",
    "iopl", "ioperm", "quotactl", "quotactl_fd", "lookup_dcookie",
    "sethostname", "setdomainname", "fanotify_init",
    "lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules",
    "get_mempolicy", "set_mempolicy", "set_mempolicy_home_node", "mbind", "migrate_pages",
    "move_pages", "_sysctl", "sysfs", "ustat", "uselib", "nfsservctl",
)  # fmt: skip
OTHER_PROCESSES: Final = ("kcmp", "pidfd_getfd", "process_madvise", "open_by_handle_at")
# Allowed by current docker on kernels >= 4.8; refused here (no payload needs them).
TRACING: Final = ("ptrace", "process_vm_readv", "process_vm_writev", "name_to_handle_at")


def _shared_denied() -> tuple[str, ...]:
    """The names bubblewrap's filter refuses outright, from its own tables (not copied)."""
    return tuple(sorted({name for table in ARCHES.values() for name in table.denied}))


# clone(2) flags that create a namespace (linux/sched.h); docker's default allows clone only
# when none is set (mask 0x7E020000).
CLONE_NAMESPACE_FLAGS: Final = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# personality(2) values docker allows: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32 and
# the query 0xffffffff. Every other value (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC...) is refused.
PERSONALITY_ALLOWED: Final = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
_PER_QUERY_BIT: Final = 1 << 31
_PER_FREE_BITS: Final = 0x8 | 0x20000  # the bits the allowed values other than the query use
# Families socket(2)/socketpair(2) may use, as bubblewrap's filter allows.
SOCKET_FAMILIES: Final = (AF_UNIX, AF_INET, AF_INET6)
ARCHITECTURES: Final = ("SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64")


def _errno(names: list[str] | tuple[str, ...], why: str, code: int = EPERM) -> dict[str, Any]:
    return {"names": list(names), "action": "SCMP_ACT_ERRNO", "errnoRet": code, "comment": why}


def _when(
    name: str, index: int, mask: int, datum: int, why: str, code: int = EPERM
) -> dict[str, Any]:
    """Refuse `name` when `(args[index] & mask) == datum`."""
    arg = {"index": index, "value": mask, "valueTwo": datum, "op": "SCMP_CMP_MASKED_EQ"}
    return _errno([name], why, code) | {"args": [arg]}


def _personality_rules() -> list[dict[str, Any]]:
    """Refuse every personality value outside PERSONALITY_ALLOWED, one condition per rule.

    With the query bit (31) clear, an allowed value has no bit set outside bits 3 and 17; with
    it set, only the query itself (all 32 bits) is allowed. So: refuse "bit b set and bit 31
    clear" for every other b < 31, and "bit 31 set and bit c clear" for every c < 31.
    """
    why = "personality: only the values docker allows"
    rules = [
        _when("personality", 0, _PER_QUERY_BIT | 1 << b, 1 << b, why)
        for b in range(31)
        if not _PER_FREE_BITS & 1 << b
    ]
    rules += [
        _when("personality", 0, _PER_QUERY_BIT | 1 << c, _PER_QUERY_BIT, why) for c in range(31)
    ]
    return rules


def _socket_rules(name: str) -> list[dict[str, Any]]:
    """Refuse `name` (socket/socketpair) for every family outside SOCKET_FAMILIES."""
    why = f"{name}: families other than unix/inet/inet6 (vsock, netlink, packet...)"
    top = max(SOCKET_FAMILIES)
    below = [f for f in range(top) if f not in SOCKET_FAMILIES]
    rules = [_when(name, 0, LOW32, family, why) for family in below]
    # Above the highest allowed family: one comparison over the whole 64-bit value (a set high
    # bit only makes it larger, so nothing slips under it).
    arg = {"index": 0, "value": top, "op": "SCMP_CMP_GT"}
    return [*rules, _errno([name], why) | {"args": [arg]}]


def profile() -> dict[str, Any]:
    """The profile as plain data (what goes into the identity and, as JSON, to the engine)."""
    syscalls = [
        _errno(MOUNT_AND_NAMESPACES, "mounts and namespaces (docker default)"),
        _errno(MACHINE_AND_KERNEL, "the machine and the kernel (docker default)"),
        _errno(OTHER_PROCESSES, "other processes and file handles (docker default)"),
        _errno(TRACING, "tracing other processes (allowed by docker >= 4.8 kernels; not here)"),
        _errno(_shared_denied(), "kernel attack surface (as bubblewrap's filter)"),
        _errno(
            ["clone3"],
            "clone3: its flags are behind a pointer; ENOSYS makes libc fall back to clone",
            errno.ENOSYS,
        ),
    ]
    syscalls += [
        _when("clone", 0, flag, flag, f"clone with {name} (docker default)")
        for name, flag in CLONE_NAMESPACE_FLAGS.items()
    ]
    syscalls += _personality_rules()
    syscalls += _socket_rules("socket") + _socket_rules("socketpair")
    syscalls.append(_when("ioctl", 1, LOW32, TIOCSTI, "ioctl TIOCSTI: typing into a terminal"))
    syscalls.append(
        _when("ioctl", 1, LOW32, TIOCLINUX, "ioctl TIOCLINUX: pasting into a VT console")
    )
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": list(ARCHITECTURES),
        "syscalls": syscalls,
    }


def profile_json() -> str:
    """The profile as the JSON text `security_opt=["seccomp=<json>"]` takes."""
    return json.dumps(profile(), sort_keys=True, separators=(",", ":"))


def summary() -> list[str]:
    """What the profile refuses, in one line per group, for the identity and the report."""
    return [
        f"mounts and namespaces: {', '.join(MOUNT_AND_NAMESPACES)}",
        f"machine and kernel: {', '.join(MACHINE_AND_KERNEL)}",
        f"other processes: {', '.join(OTHER_PROCESSES + TRACING)}",
        f"kernel attack surface: {', '.join(_shared_denied())}",
        "clone3 (ENOSYS); clone with " + "|".join(CLONE_NAMESPACE_FLAGS),
        f"personality other than {', '.join(hex(v) for v in PERSONALITY_ALLOWED)}",
        "socket/socketpair families other than unix/inet/inet6",
        "ioctl TIOCSTI and TIOCLINUX",
        f"any architecture but {', '.join(ARCHITECTURES)} (i386, x32, arm32)",
    ]
