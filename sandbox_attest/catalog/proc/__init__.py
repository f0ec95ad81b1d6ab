"""Process and kernel probes (issue 8), host side; all five are Linux-only.

Visibility of host processes, privileges, namespace escape, syscall surface and resource
limits: one module per mechanism, `visibility`, `privileges`, `namespace`, `syscall_surface`
and `limits`, over what they share: `anchor` (the planted host process), `baseline` (the host
control that runs the payload unsandboxed, and how a self-reported probe is judged) and
`readings` (the host's reading of the payload's processes, in words).

Two kinds of witness are used. Where the host can see an escape, it does: a harness-planted
"anchor" process records in a host file whenever something ptraces it and carries a secret in
its environment that exists nowhere else; a canary directory and a read-only-bound task
directory get a nonce file only if a namespace escape worked; the direct-egress listener logs
a connection made from the host's network namespace. Where nothing on the host can see it
(the capabilities a process holds, whether a syscall reaches its kernel handler, how far a
fork loop got), the payload's report is the evidence. That is acceptable only in one
direction: a report *against* the sandbox ("I hold CapEff", "keyctl reached the kernel") is
believed, because no payload gains anything by forging one; a refusal is believed only when
the same file run unsandboxed on the host (the host control) shows the attempt succeeding
there, so the refusal means something.

Every payload is safe unsandboxed as root (the control leg runs them so): signal 0 only,
ptrace only PTRACE_SEIZE of the anchor, mounts only inside a private mount namespace, syscalls
only with arguments the kernel rejects, loops bounded by `BOUNDS`.

Re-exported here, so that `from sandbox_attest.catalog import proc` keeps reaching them: the
names the catalogue (`SPECS`), the tests (the limits' tables, `SECRET_VAR`) and the refusing-
kernel plugin of tests/integration/test_nonroot.py (`setns_control_refused`, `NEEDS_ROOT`,
`ProcNamespaceEscape`) used from the single module this package was.
"""

from __future__ import annotations

from typing import Final

from sandbox_attest.catalog.proc.anchor import SECRET_VAR
from sandbox_attest.catalog.proc.limits import (
    BOUNDS,
    HOST_COUNTS,
    LIMIT_ERRNOS,
    ResourceLimits,
    ResourceLimitsSpec,
    declared_limits,
    unapplied_limits,
)
from sandbox_attest.catalog.proc.namespace import (
    NEEDS_ROOT,
    ProcNamespaceEscape,
    setns_control_refused,
)
from sandbox_attest.catalog.proc.privileges import ProcPrivileges
from sandbox_attest.catalog.proc.syscall_surface import ProcSyscallSurface
from sandbox_attest.catalog.proc.visibility import ProcVisibility
from sandbox_attest.catalog.spec import ProbeSpec

__all__ = [
    "BOUNDS",
    "HOST_COUNTS",
    "LIMIT_ERRNOS",
    "LINUX_ONLY_REASON",
    "NEEDS_ROOT",
    "SECRET_VAR",
    "SPECS",
    "ProcNamespaceEscape",
    "ProcPrivileges",
    "ProcSyscallSurface",
    "ProcVisibility",
    "ResourceLimits",
    "ResourceLimitsSpec",
    "declared_limits",
    "setns_control_refused",
    "unapplied_limits",
]

# For the matrix rows: every probe here reads /proc, Linux namespaces or Linux syscalls.
LINUX_ONLY_REASON: Final = (
    "reads /proc and uses Linux namespaces, ptrace and syscall numbers; "
    "macOS and Windows get their own process probes"
)

SPECS: tuple[ProbeSpec, ...] = (
    ProcVisibility(),
    ProcPrivileges(),
    ProcNamespaceEscape(),
    ProcSyscallSurface(),
    ResourceLimitsSpec(),
)
