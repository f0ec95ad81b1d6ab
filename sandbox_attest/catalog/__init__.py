"""The probe catalogue, host side: what each probe expects, plants, controls and concludes.

Each payload in `probes/` runs inside the sandbox and only reports what it saw. Its spec here
runs on the host, in the module of its area (the `area` of the spec, and the first word of
its id but for `resource_limits`, a `proc` probe): `net` (a package: `route` through the egress
proxy, `direct` around it), `dns`, `ipc`, `fs`, `dev`, `env`, `proc`, `lifecycle` and `pkg`.
Each keeps its readings next to its own helpers.

A report is believed only as far as the host can check it. Each spec lists the attempts its
payload makes for a task (`attempt_table`), and the runner turns any other report into ERROR
(`report_mismatch`); each spec names the host readings its reading rests on
(`host_readings`, `corroboration`), and on a command wrapper a PASS without one is
INCONCLUSIVE (`sandbox_attest.verdict.believe`).

Imports flow down. The area modules never import one another; what several of them share
lives below them: `base` (the protocol, the cell, the readings every spec uses), `canary`
(host file states), `capabilities` (what an unconfined payload user could open here),
`socket_witness` (witness sockets beside the host's) and `net.witness` (per-cell loopback
listeners). Nothing here imports the runner, the matrix or the backends: the runner, above
both, hands a cell everything a spec needs (tests/unit/test_import_layers.py holds that).
"""

from __future__ import annotations

from sandbox_attest.catalog import machinery, proc, races
from sandbox_attest.catalog.attempts import report_mismatch
from sandbox_attest.catalog.crossproc import ProcCrossProcess
from sandbox_attest.catalog.dev import DevAccess
from sandbox_attest.catalog.dns import DnsResolution
from sandbox_attest.catalog.env import EnvInheritance
from sandbox_attest.catalog.fs import (
    FsLinkEscape,
    FsProtectedInWorkspace,
    FsReadSecrets,
    FsWriteOutside,
)
from sandbox_attest.catalog.handles import FsOpenByHandle
from sandbox_attest.catalog.ipc import IpcProxySocketTamper, IpcUnixSocketEscape
from sandbox_attest.catalog.lifecycle import LifecycleOrphans
from sandbox_attest.catalog.net import (
    NetDeniedHost,
    NetDirectEgress,
    NetHostCanonical,
    NetIpv6UdpIcmp,
    NetLoopbackServices,
    NetPrivateAddress,
    NetProxyConfusion,
    NetProxyEnvOverride,
    NetTransfer18MiB,
)
from sandbox_attest.catalog.net.direct import around_the_proxy
from sandbox_attest.catalog.net.doh import NetDohBypass
from sandbox_attest.catalog.net.ignored import NetProxyIgnored
from sandbox_attest.catalog.net.metadata import NetMetadataService
from sandbox_attest.catalog.net.proxy_dns import NetProxyDnsExfil
from sandbox_attest.catalog.net.rebinding import NetDnsRebinding
from sandbox_attest.catalog.net.relay import NetProxyRelay
from sandbox_attest.catalog.net.smuggling import NetProxySmuggling
from sandbox_attest.catalog.net.socks import NetSocks5
from sandbox_attest.catalog.net.upgrade import NetProxyUpgrade
from sandbox_attest.catalog.pkg import PkgPipInstall
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    InsideRoute,
    ProbeSpec,
    WitnessRecordsLike,
    WorldLike,
    probe_path,
)
from sandbox_attest.catalog.syscalls import SPECS as SYSCALL_SPECS
from sandbox_attest.catalog.tunables import ProcKernelTunables

__all__ = [
    "PROBES",
    "AttemptTable",
    "CellContext",
    "ClaimsLike",
    "FsWriteOutside",
    "InsideRoute",
    "ProbeSpec",
    "WitnessRecordsLike",
    "WorldLike",
    "around_the_proxy",
    "probe_path",
    "report_mismatch",
]

# The order is the catalogue's order in every report: the release core first, then the wider
# catalogue (issue 8), then the process probes.
_SPECS: tuple[ProbeSpec, ...] = (
    NetDeniedHost(),
    NetDirectEgress(),
    DnsResolution(),
    IpcUnixSocketEscape(),
    FsWriteOutside(),
    NetTransfer18MiB(),
    PkgPipInstall(),
    NetHostCanonical(),
    NetProxyConfusion(),
    NetProxyEnvOverride(),
    NetLoopbackServices(),
    NetPrivateAddress(),
    NetIpv6UdpIcmp(),
    FsReadSecrets(),
    FsProtectedInWorkspace(),
    FsLinkEscape(),
    DevAccess(),
    EnvInheritance(),
    IpcProxySocketTamper(),
    LifecycleOrphans(),
    *proc.SPECS,
    *SYSCALL_SPECS,
    *machinery.SPECS,
    *races.SPECS,
    ProcCrossProcess(),
    ProcKernelTunables(),
    FsOpenByHandle(),
    NetProxyDnsExfil(),
    NetSocks5(),
    NetMetadataService(),
    NetProxyIgnored(),
    NetProxySmuggling(),
    NetProxyUpgrade(),
    NetDnsRebinding(),
    NetDohBypass(),
    NetProxyRelay(),
)
PROBES: dict[str, ProbeSpec] = {spec.id: spec for spec in _SPECS}
