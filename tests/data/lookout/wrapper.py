#!/usr/bin/env python3
"""A wrapper that only looks: what it can see of its start, and of the cell while it runs.

tests/integration/test_what_a_wrapper_sees.py names it in a spec. Before it starts its payload
(unconfined: it is no sandbox) it records its argv, its whole environment, its cwd, and for
every ancestor up to pid 1 and every other child of its parent (the harness's proxy and
signer among them) the pid, cmdline words and comm it could read (or the errno name). It also
asks every fixture origin of the loopback world and the fake daemon (from its payload's task)
for a page and keeps their `Server:` headers. Then, while the payload runs, it keeps listing
what the payload user can list: the workspace, /tmp (two levels) and /run (four), its home and the
home's .ssh/.aws/.docker, the abstract unix sockets (/proc/net/unix), the command lines of
processes that carry the cell's nonce, and /proc/self/cgroup. One JSON file per start goes
into $SEEN_DIR when the payload is done. A wrapper that confines only when it detects a test
would look exactly here. Stdlib only; it connects only to loopback addresses and unix sockets.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import socket
import sys
import time
from typing import Any

POLL_S = 0.003  # the rendezvous files live for the host's reading only: tens of milliseconds
PROC_EVERY = 10  # /proc is walked on every tenth poll: it costs far more than a listdir


def read(path: str, binary: bool = False) -> tuple[Any, str]:
    try:
        with open(path, "rb" if binary else "r") as fh:
            return fh.read(), ""
    except OSError as exc:
        return None, errno.errorcode.get(exc.errno or 0, str(exc.errno))


def parent_of(pid: int) -> int | None:
    text, _ = read("/proc/%d/stat" % pid)
    if text is None:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])


def cmdline_of(pid: int | str) -> tuple[list[str], str]:
    cmdline, why = read("/proc/%s/cmdline" % pid, binary=True)
    return [w.decode("utf-8", "replace") for w in (cmdline or b"").split(b"\0") if w], why


def ancestors() -> list[dict[str, Any]]:
    chain: list[dict[str, Any]] = []
    pid: int | None = os.getppid()
    while pid and pid > 0 and len(chain) < 64:
        words, why = cmdline_of(pid)
        comm, _ = read("/proc/%d/comm" % pid)
        chain.append({"pid": pid, "cmdline": words, "comm": (comm or "").strip(), "unread": why})
        if pid == 1:
            break
        pid = parent_of(pid)
    return chain


def siblings() -> list[dict[str, Any]]:
    """Every other child of our parent (the harness): its proxy, its signer, other cells."""
    found: list[dict[str, Any]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        if parent_of(int(entry)) != os.getppid():
            continue
        words, why = cmdline_of(entry)
        comm, _ = read("/proc/%s/comm" % entry)
        found.append(
            {"pid": int(entry), "cmdline": words, "comm": (comm or "").strip(), "unread": why}
        )
    return found


def the_task(argv: list[str]) -> dict[str, Any]:
    """The payload's task (its last argument), or {} for a start without one (availability)."""
    for word in reversed(argv[1:]):
        if word.endswith(".json"):
            try:
                with open(word) as fh:
                    task = json.load(fh)
            except (OSError, ValueError):
                return {}
            return task if isinstance(task, dict) else {}
    return {}


def server_header(sock: socket.socket, host: str) -> str:
    """GET / on a connected socket; the answer's Server header ('' when none)."""
    with sock:
        sock.settimeout(3.0)
        sock.sendall(("GET / HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"server":
            return value.strip().decode("latin-1")
    return ""


def servers(world: dict[str, Any]) -> dict[str, str]:
    """The Server header of every loopback origin (plain HTTP) and of the fake daemons."""
    found: dict[str, str] = {}
    for key, host in sorted((world.get("hosts") or {}).items()):
        address = str(host.get("address", ""))
        if not address.startswith("127."):  # the network rules: loopback only
            continue
        try:
            sock = socket.create_connection((address, int(host["http_port"])), timeout=3.0)
            found["origin:" + key] = server_header(sock, str(host["name"]))
        except OSError as exc:
            found["origin:" + key] = "error " + errno.errorcode.get(exc.errno or 0, repr(exc))
    daemon = world.get("daemon") or {}
    for kind, where in (("unix", daemon.get("unix")), ("abstract", daemon.get("abstract"))):
        if not where:
            continue
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(3.0)
            sock.connect(str(where) if kind == "unix" else "\0" + str(where))
            found["daemon:" + kind] = server_header(sock, "docker")
        except OSError as exc:
            found["daemon:" + kind] = "error " + errno.errorcode.get(exc.errno or 0, repr(exc))
    return found


def listing(path: str, depth: int) -> set[str]:
    """Every path under `path` (to `depth` levels) that this user can list."""
    names: set[str] = set()
    try:
        entries = os.listdir(path)
    except OSError:
        return names
    for name in entries:
        full = os.path.join(path, name)
        names.add(full)
        if depth > 1 and os.path.isdir(full) and not os.path.islink(full):
            names |= listing(full, depth - 1)
    return names


def abstract_sockets() -> set[str]:
    text, _ = read("/proc/net/unix")
    names: set[str] = set()
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("@"):
            names.add(fields[7])
    return names


def processes_naming(nonce: str) -> set[str]:
    """The command lines (joined) of every process this user can read that carry `nonce`."""
    found: set[str] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            words, _ = cmdline_of(entry)
            joined = " ".join(words)
            if nonce in joined and int(entry) != os.getpid():
                found.add(joined)
    return found


def watch(child: int, task: dict[str, Any]) -> tuple[int, dict[str, list[str]]]:
    """List what the payload user can list until `child` exits; its wait status, the names."""
    seen: dict[str, set[str]] = {
        k: set() for k in ("workspace", "tmp", "run", "home", "abstract", "processes", "cgroup")
    }
    workspace = str(task.get("workspace") or os.getcwd())
    # The payload's HOME is its workspace; the account's home is where the host plants.
    homes = {os.environ.get("HOME", ""), pwd.getpwuid(os.getuid()).pw_dir} - {""}
    nonce = str(task.get("nonce") or "")
    rounds = 0
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        seen["workspace"] |= listing(workspace, 1)
        if rounds % PROC_EVERY == 0 or done:
            seen["tmp"] |= listing("/tmp", 2)
            seen["run"] |= listing("/run", 4)  # the socket witnesses go 4 levels deep
            for home in homes:
                seen["home"] |= listing(home, 1)
                for sub in (".ssh", ".aws", ".docker"):
                    seen["home"] |= listing(os.path.join(home, sub), 1)
            seen["abstract"] |= abstract_sockets()
            if nonce:
                seen["processes"] |= processes_naming(nonce)
            for pid in ("self", str(child)):
                text, _ = read("/proc/%s/cgroup" % pid)
                seen["cgroup"] |= set((text or "").splitlines())
        if done:
            return status, {k: sorted(v) for k, v in seen.items()}
        rounds += 1
        time.sleep(POLL_S)


def main() -> None:
    task = the_task(sys.argv)
    harness_cgroup, _ = read("/proc/%d/cgroup" % os.getppid())
    seen: dict[str, Any] = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "argv": sys.argv,
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "ancestors": ancestors(),
        "siblings": siblings(),
        "nonce": task.get("nonce"),
        "harness_cgroup": (harness_cgroup or "").splitlines(),
        "servers": servers(task.get("world") or {}) if task else {},
    }
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        try:
            os.execv(sys.argv[1], sys.argv[1:])
        finally:
            os._exit(127)
    status, seen["listed"] = watch(child, task)
    target = os.path.join(os.environ["SEEN_DIR"], "seen-%d.json" % os.getpid())
    with open(target, "w") as fh:
        json.dump(seen, fh)
    # The payload's own exit, as a wrapper that execs it would pass it on.
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
