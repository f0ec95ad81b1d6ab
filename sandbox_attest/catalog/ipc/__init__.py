"""The ipc probes, host side: unix sockets of the host, and the egress route's own socket.

`unix_socket` (`ipc_unix_socket_escape`) covers the class, not an instance: beside the fixture
daemon and the real Docker socket, every socket the host keeps in its runtime trees gets a
witness socket of this cell (`sandbox_attest.catalog.socket_witness`), and the payload touches
every socket it can see. A witness that hears the nonce is FAIL whatever the payload says; a
real daemon's socket the payload connected to is FAIL where the host finds that very inode at
that path.

`proxy_socket` (`ipc_proxy_socket_tamper`) attacks the route the backend really uses (its
`InsideRoute`). After either probe's cell the harness removes whatever carries the cell's nonce
from every host path the payload could have touched, and the evidence lists what it removed.

The two specs are re-exported here because the catalogue's registry (`catalog/__init__.py`)
imports them by area, as it did when this package was one module; everything else is imported
from its own module.
"""

from __future__ import annotations

from sandbox_attest.catalog.ipc.proxy_socket import IpcProxySocketTamper
from sandbox_attest.catalog.ipc.unix_socket import IpcUnixSocketEscape

__all__ = ["IpcProxySocketTamper", "IpcUnixSocketEscape"]
