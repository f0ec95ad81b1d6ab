#!/usr/bin/env python3
"""A deliberately leaky wrapper: a private network namespace plus a slirp-style gateway.

The payload gets a network namespace of its own (a user namespace too, so no privilege is
needed) whose `lo` carries one more address, 198.18.99.15, the way slirp4netns or pasta give
a sandbox an address of its own. Connections the payload makes to that address at the port
the task's witness uses are relayed, by this wrapper outside the namespace, to the same port
on the harness side's loopback: the classic gateway that maps a sandbox's address to the
host's services. net_direct_egress must FAIL on it, naming the address the host saw.

Test data (tests/integration/test_lab_gateway.py); stdlib only; never dials anything but the
namespace's own address (inside) and 127.0.0.1 (outside).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import threading

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
OWN_ADDRESS = "198.18.99.15"


def witness_port(payload: list[str]) -> int | None:
    """The witness's TCP port from the payload's task file (its last argument), or None.

    None for a command that is not a probe with a task (the harness's availability check).
    """
    try:
        with open(payload[-1]) as fh:
            task = json.load(fh)
        return int(task["targets"]["tcp"].rpartition(":")[2])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def child(payload: list[str], port: int | None, channel: socket.socket) -> None:
    uid, gid = os.getuid(), os.getgid()
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        os._exit(90)
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write("0 %d 1" % uid)
    with open("/proc/self/gid_map", "w") as fh:
        fh.write("0 %d 1" % gid)
    for args in (["link", "set", "lo", "up"], ["addr", "add", OWN_ADDRESS + "/32", "dev", "lo"]):
        subprocess.run(["ip", *args], check=True)
    if port is not None:
        listener = socket.create_server((OWN_ADDRESS, port))
        socket.send_fds(channel, [b"L"], [listener.fileno()])
        listener.close()
    channel.close()
    os.execvp(payload[0], payload)


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def relay(listener: socket.socket, port: int, done: threading.Event) -> None:
    """Accept in the payload's namespace; dial the harness side's loopback; copy both ways.

    Until `done` (the payload exited), then once more for what is still queued, and every
    copy towards the host is finished before this returns: a gateway delivers what the
    sandbox sent before it ended. Without that the wrapper, exiting with its payload, cut a
    relay a busy host had not yet scheduled, and the hole went unseen by the host.
    """
    copies: list[threading.Thread] = []
    listener.settimeout(0.05)
    while True:
        finishing = done.is_set()
        try:
            inner, _ = listener.accept()
        except TimeoutError:
            if finishing:
                break
            continue
        except OSError:
            break
        inner.settimeout(None)
        try:
            outer = socket.create_connection(("127.0.0.1", port), 3)
        except OSError:
            inner.close()
            continue
        towards_host = threading.Thread(target=pump, args=(inner, outer), daemon=True)
        towards_host.start()
        copies.append(towards_host)
        threading.Thread(target=pump, args=(outer, inner), daemon=True).start()
    for copy in copies:
        copy.join(10)


def main(argv: list[str]) -> int:
    payload = argv[1:]
    port = witness_port(payload)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        child(payload, port, theirs)
    theirs.close()
    done = threading.Event()
    relaying = None
    if port is not None:
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        listener = socket.socket(fileno=fds[0])
        relaying = threading.Thread(target=relay, args=(listener, port, done), daemon=True)
        relaying.start()
    _, status = os.waitpid(pid, 0)
    done.set()
    if relaying is not None:
        relaying.join(15)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
