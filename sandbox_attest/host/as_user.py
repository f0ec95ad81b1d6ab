"""What the payload user can do unconfined, measured in a child running as that user.

The host controls of several probes ask the payload user's own reach (`measure_as`, through
the catalog's `call_as`): can it write in each planted dir, search each witness's directory,
connect to each witness socket. The child imports the module it is told to, then switches
to that user; so these functions live here, on the standard library alone: importing them
costs the child about 20 ms, where a catalog module with the harness behind it cost 350 to
430 ms, once per cell and probe (issue 28: the default matrix's time).

Every function here runs as the payload user, never as root (tests/unit/test_safefs_only.py
lists `write_each` for that reason), and never follows a symlink at a name it creates.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Any, Final

# A witness's connection is given this long to connect and take the line.
CONNECT_S: Final = 2.0
# AF_UNIX's sun_path cap, less room for the NUL: longer paths are reached through a dir fd.
UNIX_PATH_MAX: Final = 100


def write_each(request: dict[str, Any]) -> dict[str, str]:
    """Create, read back and remove a nonce file in each directory.

    `request` is `{"dirs": {key: path}, "nonce": str}`. Never follows a symlink at the name.

    Returns:
        {key: ""} where it worked, else {key: the errno name (or what went wrong)}; a refusal
        by the place itself (its owner closed it to this user) is "place:<errno>".
    """
    nonce = str(request["nonce"])
    name = f"host-control-{nonce}.txt"
    result: dict[str, str] = {}
    for key, directory in dict(request["dirs"]).items():
        path = Path(directory) / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(nonce)
            same = path.read_text() == nonce
            path.unlink()
            result[key] = "" if same else "read back other bytes"
        except OSError as exc:
            failed = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            # Whose refusal: the place's (its owner closed it to this user: "place:EACCES")
            # or the canary dir's, which is the harness's planted object in a place still open.
            place = Path(directory).parent
            result[key] = failed if os.access(place, os.W_OK | os.X_OK) else f"place:{failed}"
    return result


def local_capabilities() -> dict[str, str]:
    """Which sockets with no host listener this process may create: "ok" or the errno name.

    ICMP echo, raw and packet sockets (catalog/capabilities.py: LOCAL_CAPABILITIES), each
    created and closed at once: nothing is sent.
    """
    kinds = {
        "icmp-echo": ("AF_INET", socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
        "raw-socket": ("AF_INET", socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "packet-socket": ("AF_PACKET", socket.SOCK_RAW, 0),
    }
    found: dict[str, str] = {}
    for what, (family_name, kind, proto) in kinds.items():
        family = getattr(socket, family_name, None)
        if family is None:
            found[what] = "EAFNOSUPPORT"
            continue
        try:
            socket.socket(family, kind, proto).close()
        except OSError as exc:
            found[what] = errno.errorcode.get(exc.errno or -1, type(exc).__name__)
        else:
            found[what] = "ok"
    return found


def searchable(paths: list[str]) -> dict[str, str]:
    """Each directory: "" where this process may search it, else why.

    `os.access` with the real uid checks search permission on every component of the path,
    which is what a connect to a socket in it needs first. A directory gone since the walk
    (its owner removed it) is "ENOENT", not a refusal.
    """
    return {
        p: "" if os.access(p, os.X_OK) else "EACCES" if os.path.lexists(p) else "ENOENT"
        for p in paths
    }


def connect_each(request: dict[str, Any]) -> dict[str, str]:
    """Connect to each witness and send `line`; "" or the errno name, by address.

    `request` is `{"addresses": [...], "line": str}`; an address starting with `@` is
    abstract. A long path goes through a descriptor of its directory, as the witness's bind
    does.
    """
    line = str(request["line"]).encode()
    result: dict[str, str] = {}
    for address in request["addresses"]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dir_fd = None
        try:
            sock.settimeout(CONNECT_S)
            target = "\0" + address[1:] if address.startswith("@") else address
            if not address.startswith("@") and len(os.fsencode(address)) >= UNIX_PATH_MAX:
                dir_fd = os.open(Path(address).parent, os.O_RDONLY | os.O_DIRECTORY)
                target = f"/proc/self/fd/{dir_fd}/{Path(address).name}"
            sock.connect(target)
            sock.sendall(line)
            result[address] = ""
        except OSError as exc:
            result[address] = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        finally:
            sock.close()
            if dir_fd is not None:
                os.close(dir_fd)
    return result
