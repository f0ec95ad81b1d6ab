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

from sandbox_attest.host.kernel.program import cgroup_id
from sandbox_attest.host.kernel.witness import (
    KernelWitness,
    interrupt_run,
    run_witness,
    start_run,
    stop_run,
    unavailable_reason,
)

__all__ = [
    "KernelWitness",
    "cgroup_id",
    "interrupt_run",
    "run_witness",
    "start_run",
    "stop_run",
    "unavailable_reason",
]
