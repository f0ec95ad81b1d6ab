"""The host's view of a confined payload: read from /proc while the payload waits.

A payload's report travels through the wrapper's stdout, which the wrapper can rewrite; these
readings do not. Every payload starts through `probes/_launch.py`, which writes a ready file
into its workspace and waits (a few seconds at most) for a go file. Meanwhile the runner finds
the payload's host pid (the process whose command line names the launcher and this cell's
task file), reads what the kernel says about it, and then lets it go on:

- every namespace id, compared with the harness's own;
- `status`: CapEff/CapPrm/CapBnd/CapAmb, NoNewPrivs, Seccomp and Seccomp_filters, Uid/Gid;
- the uid map; the network namespace's interfaces and IPv4 routes (a default route is a path
  out, seen without a packet sent); the mount table's size and its writable mounts;
- the names (never the values) of its environment variables, and its open descriptors.

Named hostview, not inspect, so it never shadows the standard library's `inspect`.

What it does not do: judge. Assessors read it (`CellContext.host_view`). Where the host
cannot see the process (macOS, Windows, a container in another pid namespace the host cannot
map, a wrapper that never ran the payload) the view says so and the cell falls back to the
payload's report.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

NAMESPACES: Final = ("net", "mnt", "pid", "user", "ipc", "uts", "cgroup")
STATUS_FIELDS: Final = (
    "Uid",
    "Gid",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
)
LAUNCHER: Final = "_launch.py"
# How long the runner looks for the payload once its ready file appears.
FIND_S: Final = 2.0
# The payload waits at most this long for the go file (probes/_launch.py reads it from the
# task): a host that never answers slows a cell, never hangs it.
RENDEZVOUS_S: Final = 5.0


def ready_name(nonce: str) -> str:
    """The file the launcher writes into the workspace when it waits."""
    return f".sandbox-attest-ready-{nonce}"


def go_name(nonce: str) -> str:
    """The file the runner writes into the workspace to let the payload go on."""
    return f".sandbox-attest-go-{nonce}"


def supported() -> bool:
    """Whether this host can read other processes through /proc (Linux)."""
    return sys.platform.startswith("linux") and Path("/proc/self/ns/net").exists()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def find_payloads(task_path: Path) -> list[int]:
    """Host pids whose command line IS the launcher: `python _launch.py PROBE TASK`.

    The launcher must be the interpreter's script (argv[1]) and the task its second
    argument: a wrapper's own command line (bwrap ... -- python _launch.py ...) carries the
    same words later on, and is the wrapper, not the payload.
    """
    wanted = str(task_path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 4 and argv[1].endswith(LAUNCHER.encode()) and argv[3] == wanted:
            found.append(int(entry.name))
    return sorted(found)


def _routes(text: str) -> list[dict[str, str]]:
    """IPv4 routes from /proc/<pid>/net/route, addresses in dotted form."""

    def dotted(hex_le: str) -> str:
        raw = bytes.fromhex(hex_le)[::-1]
        return ".".join(str(b) for b in raw)

    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8:
            routes.append(
                {
                    "dev": fields[0],
                    "destination": dotted(fields[1]),
                    "gateway": dotted(fields[2]),
                    "mask": dotted(fields[7]),
                }
            )
    return routes


def _interfaces(text: str) -> list[str]:
    return [ln.split(":")[0].strip() for ln in text.splitlines()[2:] if ":" in ln]


def read_process(pid: int) -> dict[str, Any]:
    """What the host sees of `pid` (see the module docstring); never raises."""
    proc = Path(f"/proc/{pid}")
    ours = {kind: _link(Path(f"/proc/self/ns/{kind}")) for kind in NAMESPACES}
    theirs = {kind: _link(proc / "ns" / kind) for kind in NAMESPACES}
    status = {}
    for line in _read(proc / "status").splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            status[key] = " ".join(value.split())
    mounts = _read(proc / "mountinfo").splitlines()
    writable = sorted(
        {
            ln.split()[4]
            for ln in mounts
            if len(ln.split()) > 5 and ln.split()[5].split(",")[0] == "rw"
        }
    )
    try:
        env_names = sorted(
            {
                item.split(b"=", 1)[0].decode(errors="replace")
                for item in (proc / "environ").read_bytes().split(b"\0")
                if item
            }
        )
    except OSError as exc:
        env_names = [f"unreadable: {exc.strerror}"]
    try:
        fds = {
            fd.name: _link(fd) for fd in sorted((proc / "fd").iterdir(), key=lambda p: int(p.name))
        }
    except OSError as exc:
        fds = {"error": exc.strerror or "unreadable"}
    routes = _routes(_read(proc / "net" / "route"))
    return {
        "pid": pid,
        "namespaces": theirs,
        "shared_with_harness": sorted(k for k in NAMESPACES if theirs[k] and theirs[k] == ours[k]),
        "status": status,
        "uid_map": _read(proc / "uid_map").split("\n")[0].split(),
        "interfaces": _interfaces(_read(proc / "net" / "dev")),
        "routes": routes,
        "default_routes": [r for r in routes if r["destination"] == "0.0.0.0"],
        "mounts": len(mounts),
        "writable_mounts": writable[:50],
        "env_names": env_names,
        "fds": fds,
    }


def _link(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:
        return ""


@dataclass
class Rendezvous:
    """Watches one cell's workspace for the launcher, reads the payload, lets it go.

    Start it before the backend runs, `finish()` after; `view` holds the readings.
    """

    workspace: Path
    task_path: Path
    nonce: str
    view: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin watching in a background thread."""
        self._thread = threading.Thread(target=self._watch, name="rendezvous", daemon=True)
        self._thread.start()

    def finish(self) -> dict[str, Any]:
        """Stop watching; the view, or why there is none."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(FIND_S + 1.0)
        if not self.view:
            self.view = {"seen": False, "why": "the payload never reached the rendezvous"}
        return self.view

    def _release(self) -> None:
        go = self.workspace / go_name(self.nonce)
        try:
            fd = os.open(go, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            os.close(fd)
        except OSError:
            self.view.setdefault("notes", []).append(f"could not write {go.name}")

    def _watch(self) -> None:
        ready = self.workspace / ready_name(self.nonce)
        while not self._stop.is_set():
            if ready.exists():
                break
            time.sleep(0.005)
        else:
            return
        pids: list[int] = []
        deadline = time.monotonic() + FIND_S
        while not pids and time.monotonic() < deadline:
            pids = find_payloads(self.task_path)
            if not pids:
                time.sleep(0.01)
        if not pids:
            self.view = {
                "seen": False,
                "why": "the payload reached the rendezvous, but no host process with its "
                "command line is visible (another pid namespace the host cannot map?)",
            }
        else:
            # A process gone before it was read shows nothing; it is no reading at all.
            views = [v for v in (read_process(pid) for pid in pids) if v["status"]]
            if not views:
                self.view = {"seen": False, "why": "the payload exited before the host read it"}
                self._release()
                return
            self.view = {"seen": True, **views[0]}
            if len(views) > 1:
                self.view["others"] = views[1:]
                self.view.setdefault("notes", []).append(
                    f"{len(views)} processes carry this cell's launcher and task: "
                    "a wrapper may be running decoys"
                )
        self._release()
