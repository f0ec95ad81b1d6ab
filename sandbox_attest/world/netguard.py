"""The guard on lab addresses: nothing sends to one from outside the lab that made it.

The lab (sandbox_attest/world/lab.py) assigns 198.18.0.0/15 and 2001:db8::/32 to interfaces of
network namespaces the harness created and that have no route out. Inside them those addresses are
the harness's own fixture hosts. Anywhere else they are somebody else's network (a benchmark lab, a
documentation example that a real router may route), so a packet sent there from the real host
namespace would leave the machine. Every piece of harness code that dials a world address calls
`check_destination` first; it refuses a lab address unless the calling thread is in a namespace a
lab of this process registered.

Stdlib only: the egress proxy (its own process) imports it too.
"""

from __future__ import annotations

import ipaddress
import threading
from pathlib import Path

LAB_NETWORKS = (ipaddress.ip_network("198.18.0.0/15"), ipaddress.ip_network("2001:db8::/32"))

_lock = threading.Lock()
_lab_namespaces: set[str] = set()


class OutsideLabError(RuntimeError):
    """A send to a lab address from a namespace no lab of this process made: refused."""


def is_lab_address(host: str) -> bool:
    """Whether `host` is an address literal inside the lab's ranges (a name is not)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return any(address in network for network in LAB_NETWORKS)


def current_netns() -> str:
    """The calling thread's network namespace, as `net:[inode]` (setns is per thread)."""
    return str(Path("/proc/thread-self/ns/net").readlink())


def register_lab_namespaces(*namespaces: str) -> None:
    """Mark namespaces (`net:[inode]`) as a lab's own: sends to lab addresses may go there."""
    with _lock:
        _lab_namespaces.update(namespaces)


def check_destination(host: str) -> None:
    """Refuse to send to `host` if it is a lab address and this thread is outside the lab.

    Raises:
        OutsideLabError: naming the address, this thread's namespace and the fix.
    """
    if not is_lab_address(host):
        return
    try:
        here = current_netns()
    except OSError:
        here = "unknown"
    with _lock:
        inside = here in _lab_namespaces
    if not inside:
        raise OutsideLabError(
            f"refusing to send to lab address {host} from network namespace {here}, which "
            "no lab of this process created: outside the lab that address may be routed off "
            "this machine. Start the world inside the lab (sandbox-attest run does), or use "
            "the loopback world"
        )
