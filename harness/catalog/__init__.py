"""The probe catalogue, host side: what each probe expects, plants, controls and concludes.

Each payload in `probes/` runs inside the sandbox and only reports what it saw. Its spec here
runs on the host; one module per area (net, dns, ipc, fs, pkg) keeps each reading next to its
own helpers, and `harness.catalog.base` holds the protocol and the readings they share.
"""

from __future__ import annotations

from harness.catalog import host, net_wide, proc
from harness.catalog.base import (
    CellContext,
    ProbeSpec,
    WitnessRecordsLike,
    WorldLike,
    probe_path,
)
from harness.catalog.dns import DnsResolution
from harness.catalog.fs import FsWriteOutside
from harness.catalog.ipc import IpcUnixSocketEscape
from harness.catalog.net import NetDeniedHost, NetDirectEgress, NetTransfer18MiB
from harness.catalog.pkg import PkgPipInstall

__all__ = [
    "PROBES",
    "CellContext",
    "FsWriteOutside",
    "ProbeSpec",
    "WitnessRecordsLike",
    "WorldLike",
    "probe_path",
]

_SPECS: tuple[ProbeSpec, ...] = (
    NetDeniedHost(),
    NetDirectEgress(),
    DnsResolution(),
    IpcUnixSocketEscape(),
    FsWriteOutside(),
    NetTransfer18MiB(),
    PkgPipInstall(),
    *net_wide.SPECS,
    *host.SPECS,
    *proc.SPECS,
)
PROBES: dict[str, ProbeSpec] = {spec.id: spec for spec in _SPECS}
