"""Local socket capabilities, host side: what an unconfined payload user could open here.

ICMP echo, raw and packet sockets are judged without a host listener (nothing is sent); the
host control measures which of them the payload user can create when nothing confines it, so a
sandbox is credited only with denials it could have caused. Shared by the probes that attempt
them; it imports nothing from the area modules.
"""

from __future__ import annotations

import errno

from sandbox_attest.catalog.spec import HOST_TIMEOUT_S
from sandbox_attest.host import as_user
from sandbox_attest.host.trust import PayloadUser, measure_as

# The attempts with no host listener: judged by the payload's report and its namespace.
LOCAL_CAPABILITIES = ("icmp-echo", "raw-socket", "packet-socket")


def host_capabilities() -> dict[str, str]:
    """What THIS host process can do of the local capabilities: "ok" or the errno name."""
    return as_user.local_capabilities()


def payload_capabilities(user: PayloadUser | None) -> dict[str, str]:
    """`host_capabilities()` as the payload user (unconfined): what a sandbox could take away.

    The harness may be root; the payload never is, so root's raw sockets say nothing about
    what the payload could do on an open host.
    """
    if user is None:
        return host_capabilities()
    # The child imports host/as_user.py alone (stdlib): about 20 ms, where this module, with
    # the catalogue behind it, cost the child 350 to 430 ms in every net_ipv6_udp_icmp cell.
    found, why = measure_as(user, as_user.__name__, "local_capabilities", HOST_TIMEOUT_S * 3)
    if why:
        return dict.fromkeys(LOCAL_CAPABILITIES, f"unmeasured ({why})")
    return {str(k): str(v) for k, v in found.items()}


def errno_name(exc: OSError) -> str:
    """`EPERM` for an OSError carrying errno 1, else its class name."""
    return errno.errorcode.get(exc.errno or -1, type(exc).__name__)
