"""Local socket capabilities, host side: what an unconfined payload user could open here.

ICMP echo, raw and packet sockets are judged without a host listener (nothing is sent); the
host control measures which of them the payload user can create when nothing confines it, so a
sandbox is credited only with denials it could have caused. Shared by the probes that attempt
them; it imports nothing from the area modules.
"""

from __future__ import annotations

import errno
import socket

from sandbox_attest.catalog.spec import HOST_TIMEOUT_S
from sandbox_attest.host.trust import PayloadUser, measure_as

# The attempts with no host listener: judged by the payload's report and its namespace.
LOCAL_CAPABILITIES = ("icmp-echo", "raw-socket", "packet-socket")


def host_capabilities() -> dict[str, str]:
    """What THIS host process can do of the local capabilities: "ok" or the errno name."""
    found: dict[str, str] = {}
    kinds = {
        "icmp-echo": ("AF_INET", socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
        "raw-socket": ("AF_INET", socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "packet-socket": ("AF_PACKET", socket.SOCK_RAW, 0),
    }
    for what, (family_name, kind, proto) in kinds.items():
        family = getattr(socket, family_name, None)
        if family is None:
            found[what] = "EAFNOSUPPORT"
            continue
        try:
            socket.socket(family, kind, proto).close()  # created and closed: nothing sent
        except OSError as exc:
            found[what] = errno_name(exc)
        else:
            found[what] = "ok"
    return found


def payload_capabilities(user: PayloadUser | None) -> dict[str, str]:
    """`host_capabilities()` as the payload user (unconfined): what a sandbox could take away.

    The harness may be root; the payload never is, so root's raw sockets say nothing about
    what the payload could do on an open host.
    """
    if user is None:
        return host_capabilities()
    found, why = measure_as(user, __name__, "host_capabilities", HOST_TIMEOUT_S * 3)
    if why:
        return dict.fromkeys(LOCAL_CAPABILITIES, f"unmeasured ({why})")
    return {str(k): str(v) for k, v in found.items()}


def errno_name(exc: OSError) -> str:
    """`EPERM` for an OSError carrying errno 1, else its class name."""
    return errno.errorcode.get(exc.errno or -1, type(exc).__name__)
