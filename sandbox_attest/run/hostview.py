"""The host's view of a confined payload: read from /proc while the payload waits.

A payload's report travels through the wrapper's stdout, which the wrapper can rewrite; these
readings do not. Every payload starts through `probes/_launch.py`, which writes a ready file
into its workspace and waits (a few seconds at most) for a go file. Meanwhile the runner reads
what the kernel says about every process of the cell's group (sandbox_attest/host/cellgroup.py: the
cgroup or process subtree the wrapper started in, which the payload user cannot leave), never
only the one whose command line names the launcher (a wrapper can start a decoy with that
name), and then lets it go on; it keeps reading members that join or change until the run
ends (`Rendezvous`):

- every namespace id, compared with the harness's own;
- `status`: CapEff/CapPrm/CapBnd/CapAmb, NoNewPrivs, Seccomp and Seccomp_filters, Uid/Gid;
- the uid map; the network namespace's interfaces and IPv4 routes (a default route is a path
  out, seen without a packet sent); the mount table's size and its writable mounts;
- the names (never the values) of its environment variables, and its open descriptors, each
  also by the identity of the object it holds (sandbox_attest/run/fdview.py);
- its resource limits (`/proc/<pid>/limits`: processes, open files, file size, address
  space) and the pids and memory limits of its cgroup and every cgroup above it;
- the paths a probe asks about (`look`): whether each is in the payload's own view of the
  filesystem, and whether it is there as the host's own inode or as another file.

How a path is looked at without the host reading its own files by mistake: see
sandbox_attest/run/pathview.py.

Named hostview, not inspect, so it never shadows the standard library's `inspect`.

What it does not do: judge. Assessors read it (`CellContext.host_view`). Where the host
cannot see the process (macOS, Windows, a container in another pid namespace the host cannot
map, a wrapper that never ran the payload) the view says so and the cell falls back to the
payload's report.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.host import cellgroup, disguise
from sandbox_attest.run.fdview import fd_identities
from sandbox_attest.run.pathview import errno_name, looked

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

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
LAUNCHER: Final = "main.py"  # probes/_launch.py as staged (sandbox_attest.payload.STAGED_LAUNCHER)
# How often the host looks for processes that join the cell after the rendezvous.
LATER_POLL_S: Final = 0.02
# How long the runner looks for the payload once its ready file appears.
FIND_S: Final = 2.0
# The payload waits at most this long for the go file (probes/_launch.py reads it from the
# task): a host that never answers slows a cell, never hangs it.
RENDEZVOUS_S: Final = 5.0
# The rows of /proc/<pid>/limits the host reads, by the kernel's own names.
LIMIT_ROWS: Final = ("Max processes", "Max open files", "Max file size", "Max address space")
# The cgroup files that cap what `LIMIT_ROWS` caps per process, for the whole group: by
# their v2 name, with the v1 controller and file that hold the same cap.
CGROUP_FILES: Final = {
    "pids.max": ("pids", "pids.max"),
    "memory.max": ("memory", "memory.limit_in_bytes"),
}
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
# `read_cgroup_limits`'s "cgroup" entry for a hierarchy where the process is in the
# harness's own group.
HARNESS_OWN_GROUP: Final = "(the harness's own group)"
# v1 writes "no limit" as a page-rounded 2**63 - 1; anything this large caps nothing.
CGROUP_UNLIMITED: Final = 2**62


def workspace_rendezvous(name: str, said: str, uid: int | None) -> dict[str, Any]:
    """What the host read of the launcher's ready file: the payload's own word on the host's disk.

    The file is named for the cell's nonce and landed in the workspace on the host, so
    something inside the sandbox ran the launcher with this cell's task. It is the one trace
    of the payload a sandbox with its own kernel leaves the host (`kernel = "own"`: no host
    process to read), which is why it is recorded even where the host read a process too.
    `pid` is the launcher's pid as its own kernel numbers it (under gVisor, not a host pid);
    `uid` the file's owner on the host: the host user the payload's writes land as, whatever
    it is inside (None: the host could not read the file as a regular file).
    """
    return {"seen": True, "file": name, "pid": said.strip()[:32], "uid": uid}


def _ready_file(path: Path) -> tuple[str, int | None]:
    """The ready file's first bytes and owner, never through a link the payload made.

    Root reads it: O_NOFOLLOW refuses a symlink to a host file, O_NONBLOCK a FIFO left to hang
    the host, and anything but a regular file is read as nothing, with no owner.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "", None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "", None
        return os.read(fd, 64).decode(errors="replace"), info.st_uid
    except OSError:
        return "", None
    finally:
        os.close(fd)


def ready_name(nonce: str) -> str:
    """The file the launcher writes into the workspace when it waits."""
    return disguise.ready_name(nonce)


def go_name(nonce: str) -> str:
    """The file the runner writes into the workspace to let the payload go on."""
    return disguise.go_name(nonce)


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


def _limit(value: str) -> int | None:
    return None if value == "unlimited" else int(value) if value.isdigit() else None


def read_limits(pid: int) -> dict[str, dict[str, int | None]]:
    """The soft and hard values of `LIMIT_ROWS` in /proc/<pid>/limits; None is unlimited."""
    found: dict[str, dict[str, int | None]] = {}
    for line in _read(Path(f"/proc/{pid}/limits")).splitlines():
        for row in LIMIT_ROWS:
            if line.startswith(row + " "):
                values = line[len(row) :].split()
                if len(values) >= 2:  # soft, hard (then units)
                    found[row] = {"soft": _limit(values[0]), "hard": _limit(values[1])}
    return found


def _cgroup_paths(pid: int) -> dict[str, str]:
    """`pid`'s cgroup path per v1 controller, and under "" its v2 (unified) path."""
    paths: dict[str, str] = {}
    for line in _read(Path(f"/proc/{pid}/cgroup")).splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:  # hierarchy-id:controllers:path
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _tightest(base: Path, group: str, name: str) -> int | str | None:
    """The smallest `name` from `group` up to `base`; None: no group caps it; str: unreadable.

    v2 writes "max" for no cap, v1 a number near 2**63; both are None here.
    """
    if ".." in Path(group).parts:
        # The group sits outside the host's cgroup namespace: no file of it is visible here.
        return f"unreadable: cgroup {group} is outside the host's cgroup view"
    where = base / group.lstrip("/")
    if not where.is_dir():
        return f"unreadable: no {where} on the host"
    ours = _own_group(base)
    tightest: int | None = None
    while True:
        if where == ours or where in ours.parents:
            # From the harness's own group up, the chain is the same for every cell of the
            # run and out of any sandbox's reach: read once (`_tightest_from`).
            above = _tightest_from(where, base, name)
            if above is None or tightest is None:
                return tightest if above is None else above
            return min(tightest, above)
        tightest = _tighter(tightest, _read(where / name))
        if where == base or base not in where.parents:
            return tightest
        where = where.parent


def _tighter(tightest: int | None, text: str) -> int | None:
    """`tightest` lowered to the cap `text` holds, if it holds one below CGROUP_UNLIMITED."""
    text = text.strip()
    if text.isdigit() and int(text) < CGROUP_UNLIMITED:
        return int(text) if tightest is None else min(tightest, int(text))
    return tightest


def _own_group(base: Path) -> Path:
    """The harness's own cgroup under `base` (a v1 controller's mount, or the v2 root)."""
    controller = "" if base == CGROUP_ROOT else base.name
    return base / _cgroup_paths(os.getpid()).get(controller, "/nowhere").lstrip("/")


@functools.lru_cache(maxsize=64)
def _tightest_from(where: Path, base: Path, name: str) -> int | None:
    """The smallest `name` from `where` (the harness's own group or above) up to `base`.

    Read once per process: a host may nest its own processes deep (a VM agent here moved
    every command one `runtime/` level further down the v1 memory hierarchy, 300 levels by
    mid-session), and walking them for every cell held each payload 50 ms at its
    rendezvous. Neither the payload nor its sandbox can write these groups' limits.
    """
    tightest: int | None = None
    while True:
        tightest = _tighter(tightest, _read(where / name))
        if where == base or base not in where.parents:
            return tightest
        where = where.parent


def read_cgroup_limits(pid: int) -> dict[str, Any]:
    """The pids and memory caps of `pid`'s cgroup: the tightest of its group and those above.

    A cgroup's limit binds every group below it, so the payload's effective cap is the
    smallest one on the way up. Keys are "pids.max" and "memory.max" (bytes) whether the
    controller is v1 (pids/, memory/ memory.limit_in_bytes) or v2: an int, None where no
    group on the way caps it, or "unreadable: why" where the host cannot see the group
    (a container's group outside the host's cgroup namespace). `cgroup` holds the paths.
    """
    paths = _cgroup_paths(pid)
    if not paths:
        return {}
    ours = _cgroup_paths(os.getpid())
    # A group the payload shares with the harness is said so, not spelled out: a host may
    # nest its own processes hundreds of levels deep (3 KB a path here, once per process of
    # every cell), and which group the harness is in says nothing about the sandbox.
    shown = {c: HARNESS_OWN_GROUP if ours.get(c) == p != "/" else p for c, p in paths.items()}
    result: dict[str, Any] = {"cgroup": shown}
    for name, (controller, v1_name) in CGROUP_FILES.items():
        if controller in paths:
            result[name] = _tightest(CGROUP_ROOT / controller, paths[controller], v1_name)
        elif "" in paths:
            result[name] = _tightest(CGROUP_ROOT, paths[""], name)
        else:
            result[name] = f"unreadable: no {controller} controller for pid {pid}"
    return result


def read_process(pid: int, look: Sequence[str] = ()) -> dict[str, Any]:
    """What the host sees of `pid` (see the module docstring); never raises.

    `look` are host paths to look for in the payload's view (`look_at`), at most MAX_LOOK;
    their readings are under "looked", and a longer list is cut with a note.
    """
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
    fds = _fds(proc)
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
        "fd_ids": fd_identities(proc, fds),
        "limits": read_limits(pid),
        "cgroup_limits": read_cgroup_limits(pid),
        **looked(pid, look),
    }


def _link(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:
        return ""


def is_launcher(pid: int, task_path: Path) -> bool:
    """Whether `pid`'s command line is the launcher's for this task (`find_payloads`' test)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    wanted = str(task_path).encode()
    return len(argv) >= 4 and argv[1].endswith(LAUNCHER.encode()) and argv[3] == wanted


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.split() if x.isdigit()]


def summarize(reading: dict[str, Any], role: str, when: str) -> dict[str, Any]:
    """One `processes` entry from a reading: who it is and what the kernel says it holds.

    `uids` and `gids` are (real, effective, saved, fs) as /proc/<pid>/status lists them;
    `namespaces` the kinds it shares with the harness; `role` "payload" (judged) or
    "supervisor" (one of the wrapper's own executables); `when` "rendezvous" or "later".
    """
    status = reading.get("status") or {}
    entry: dict[str, Any] = {
        "pid": reading.get("pid"),
        "comm": reading.get("comm", ""),
        "role": role,
        "when": when,
        "launcher": bool(reading.get("launcher")),
    }
    if reading.get("unread"):
        entry["unread"] = reading["unread"]
        return entry
    entry |= {
        "uids": _ids(str(status.get("Uid", ""))),
        "gids": _ids(str(status.get("Gid", ""))),
        "cap_eff": status.get("CapEff", ""),
        "cap_prm": status.get("CapPrm", ""),
        "no_new_privs": status.get("NoNewPrivs", ""),
        "seccomp": status.get("Seccomp", ""),
        "seccomp_filters": status.get("Seccomp_filters", ""),
        "namespaces": list(reading.get("shared_with_harness") or []),
    }
    if "fds" in reading:
        entry["fds"] = len(reading["fds"]) if isinstance(reading["fds"], dict) else 0
    return entry


def read_brief(pid: int, *, environ: bool = False) -> dict[str, Any]:
    """Status and namespaces only; with `environ`, also its variable names and descriptors.

    A supervisor's reading (it runs none of the payload), and that of a process that joins
    the cell after the rendezvous (read while it runs, so only what can decide a verdict on
    its own: credentials, filters, namespaces, and what env_inheritance looks for).
    """
    proc = Path(f"/proc/{pid}")
    ours = {kind: _link(Path(f"/proc/self/ns/{kind}")) for kind in NAMESPACES}
    theirs = {kind: _link(proc / "ns" / kind) for kind in NAMESPACES}
    status = {}
    for line in _read(proc / "status").splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            status[key] = " ".join(value.split())
    brief: dict[str, Any] = {
        "pid": pid,
        "namespaces": theirs,
        "shared_with_harness": sorted(k for k in NAMESPACES if theirs[k] and theirs[k] == ours[k]),
        "status": status,
    }
    if environ:
        brief["env_names"] = _env_names(proc)
        brief["fds"] = _fds(proc)
        brief["fd_ids"] = fd_identities(proc, brief["fds"])
    return brief


def _env_names(proc: Path) -> list[str]:
    try:
        raw = (proc / "environ").read_bytes()
    except OSError as exc:
        return [f"unreadable: {exc.strerror}"]
    return sorted({i.split(b"=", 1)[0].decode(errors="replace") for i in raw.split(b"\0") if i})


def _fds(proc: Path) -> dict[str, str]:
    try:
        return {
            fd.name: _link(fd) for fd in sorted((proc / "fd").iterdir(), key=lambda p: int(p.name))
        }
    except OSError as exc:
        return {"error": exc.strerror or "unreadable"}


def _unread(pid: int) -> str:
    """Why `pid`'s status cannot be read ("" when it can): gone, or refused, by errno name."""
    try:
        Path(f"/proc/{pid}/status").read_bytes()
    except FileNotFoundError:
        return "exited before the host read it"
    except ProcessLookupError:
        return "exited before the host read it"
    except OSError as exc:
        return f"unreadable: {errno_name(exc)}"
    return ""


def _fingerprint(reading: dict[str, Any]) -> tuple[str, ...]:
    """What of a reading can make a process worse than it was: credentials, filters, sharing.

    Empty where there is no status (the process is gone): that is no change to read again.
    """
    status = reading.get("status") or {}
    if not status:
        return ()
    fields = ("Uid", "Gid", "CapEff", "CapPrm", "NoNewPrivs", "Seccomp", "Seccomp_filters")
    return (
        *(str(status.get(k, "")) for k in fields),
        ",".join(reading.get("shared_with_harness") or []),
    )


def _exiting(pid: int) -> bool:
    """Whether `pid` is exiting or a zombie: no executable any more (root can read any live one)."""
    try:
        Path(f"/proc/{pid}/exe").readlink()
    except OSError:
        return True
    return False


def _comm(pid: int) -> str:
    return _read(Path(f"/proc/{pid}/comm")).strip()


@dataclass
class Rendezvous:
    """Watches one cell's workspace for the launcher, reads every process of the cell, lets it go.

    Start it before the backend runs, `finish()` after; `view` holds the readings, and
    `held_ms` how long the payload waited for them once the host saw its ready file.

    Which processes: `start` opens the cell's group (sandbox_attest/host/cellgroup.py) and makes it
    this thread's current one, so the backend starts its wrapper inside it. At the rendezvous
    the host reads every member, and keeps reading each new member until `finish`: a wrapper
    may start the real payload after a decoy took the rendezvous. A member that runs one of
    the wrapper's own executables (bwrap, a spec's `[detect] executables`) or sits above the
    launcher's process (srt's shell, bwrap, its seccomp helper), and runs nothing that can
    run Python, is recorded as a supervisor (`CellGroup.is_supervisor`); every other member
    is judged, and the worst decides: the top of the view
    is the launcher's reading, `others` holds every other judged member (the assessors' loop,
    `catalog.spec.host_processes`), and `processes` one summary per member (`summarize`), a
    member the host could not read named with why. Where the group holds no member at all
    (a backend whose payload the harness does not start, such as docker's daemon-made
    containers), the launcher's command line is the only way to find it, and `mechanism` says
    so.

    Attributes:
        look: host paths the cell's spec asks about in the payload's view (`look_at`).
        hooks: readings a spec takes itself while the payload waits, by name: each is
            called with the payload's host pid and its result stored under its name (None:
            no reading, nothing stored); one that raises is recorded as not seen, with why,
            and never stops the others.
    """

    workspace: Path
    task_path: Path
    nonce: str
    look: Sequence[str] = ()
    hooks: Mapping[str, Callable[[int], dict[str, Any] | None]] = field(default_factory=dict)
    view: dict[str, Any] = field(default_factory=dict)
    group: cellgroup.CellGroup | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _ready_at: float = 0.0
    _previous: cellgroup.CellGroup | None = None
    # pid -> (its executable, the fingerprint of its last reading; None for a supervisor).
    _seen: dict[int, tuple[str, tuple[str, ...] | None]] = field(default_factory=dict)
    _later: list[dict[str, Any]] = field(default_factory=list)
    _later_summaries: list[dict[str, Any]] = field(default_factory=list)
    _launchers: list[int] = field(default_factory=list)

    def start(self) -> None:
        """Open the cell's group, then begin watching in a background thread."""
        if self.group is None:
            self.group = cellgroup.new_cell()
        self._previous = cellgroup.enter(self.group)
        self._thread = threading.Thread(target=self._watch, name="rendezvous", daemon=True)
        self._thread.start()

    def finish(self) -> dict[str, Any]:
        """Stop watching, close the group; the view, or why there is none."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(FIND_S + 1.0)
        cellgroup.leave(self._previous)
        if not self.view:
            self.view = {"seen": False, "why": "the payload never reached the rendezvous"}
        if self.group is not None:
            self.view.setdefault("mechanism", self.group.mechanism)
            self.view.setdefault("group", self.group.describe())
            if self.group.why:
                self.view.setdefault("group_why", self.group.why)
            if self._later_summaries:
                self.view.setdefault("processes", []).extend(self._later_summaries)
                if self.view.get("seen"):
                    self.view.setdefault("others", []).extend(self._later)
            # Members left now are the backend's to judge as leftovers (command wrappers sweep
            # their own); the group goes at the run's end if it cannot go now.
            self.view.setdefault("notes", []).extend(self.group.close(kill=False))
            if not self.view["notes"]:
                del self.view["notes"]
        return self.view

    def _release(self) -> None:
        # How long the host held the payload, from its ready file to the go: what a cell
        # pays for the readings (bench/bench_matrix.py prints it).
        self.view["held_ms"] = round((time.monotonic() - self._ready_at) * 1000, 1)
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
                self._ready_at = time.monotonic()
                break
            time.sleep(0.005)
        else:
            self._watch_later()
            return
        said, owner = _ready_file(ready)
        members = self.group.pids() if self.group is not None else []
        if members:
            self._read_group(members)
        else:
            self._read_by_command_line()
        self.view["workspace_rendezvous"] = workspace_rendezvous(ready.name, said, owner)
        self._release()
        self._watch_later()

    def _classify(self, pid: int, ancestors: set[int]) -> str:
        group = self.group
        if group is not None and group.is_supervisor(pid, ancestors):
            return "supervisor"
        return "payload"

    def _read_one(self, pid: int, role: str, *, later: bool = False) -> dict[str, Any]:
        """One member's reading, or a named reason it has none.

        Full for a judged member at the rendezvous; brief for a supervisor, and for a member
        that joins later (`read_brief`: it runs meanwhile, and may be one of many a probe
        forks; its credentials, filters, namespaces and environ are what can decide).
        """
        comm = _comm(pid)
        if role != "payload":
            reading = read_brief(pid)
        elif later:
            # The look paths too: a judged process's view of the filesystem is judged like
            # the launcher's (fs assessors read `looked` on every process).
            reading = read_brief(pid, environ=True) | looked(pid, self.look)
        else:
            reading = read_process(pid, self.look)
        reading["comm"] = comm
        reading["role"] = role
        if not reading.get("status"):
            reading["unread"] = _unread(pid) or "its status listed nothing the host reads"
        elif _exiting(pid):
            # Between releasing its memory and its namespaces an exiting process shows no
            # executable but still the namespaces it is leaving: a reading of nothing it can
            # still do, and one that would judge bwrap's own exit as a payload's (a race).
            reading["unread"] = "exited before the host read it"
        return reading

    def _read_group(self, members: list[int]) -> None:
        """Read every member at the rendezvous; the worst of the judged ones will decide."""
        self._launchers = [pid for pid in members if is_launcher(pid, self.task_path)]
        above = cellgroup.ancestors_within(self._launchers, members)
        readings = []
        for pid in members:
            role = self._classify(pid, above)
            reading = self._read_one(pid, role)
            reading["launcher"] = pid in self._launchers
            self._remember(pid, _link(Path(f"/proc/{pid}/exe")), reading)
            readings.append(reading)
        summaries = [summarize(r, str(r["role"]), "rendezvous") for r in readings]
        judged = [r for r in readings if r["role"] == "payload"]
        # Exited members are recorded in `processes` and nowhere else: a process gone before
        # the rendezvous took its reading holds nothing at it. Refused readings stay judged
        # with an empty status, which no assessor reads as confined.
        judged = [r for r in judged if not str(r.get("unread", "")).startswith("exited")]
        if not judged:
            self.view = {
                "seen": False,
                "why": "every process of the cell's group at the rendezvous is the wrapper's "
                "own or gone: the payload ran somewhere the host cannot read",
                "processes": summaries,
            }
            return
        launchers = [r for r in judged if r.get("launcher")]
        primary = launchers[0] if launchers else judged[0]
        self.view = {"seen": True, **primary}
        self.view |= self._run_hooks(int(primary["pid"]))
        self.view["others"] = [r for r in judged if r is not primary]
        self.view["processes"] = summaries
        self.view["mechanism"] = self.group.mechanism if self.group is not None else ""
        if not launchers:
            self.view.setdefault("notes", []).append(
                "no process of the cell's group carries the launcher's command line: the "
                "wrapper ran the payload another way"
            )
        elif len(launchers) > 1:
            self.view.setdefault("notes", []).append(
                f"{len(launchers)} processes carry this cell's launcher and task: "
                "a wrapper may be running decoys"
            )

    def _watch_later(self) -> None:
        """Until `finish`, keep reading the cell's group: new members, and changed ones.

        A wrapper may hand the rendezvous to a decoy and start the real payload after it, or
        turn a process that was read into another (exec keeps the pid: a shell read as the
        wrapper's becomes the payload), or a judged process may gain what it lacked (a user
        namespace of its own brings every capability in it). Each is read (and judged) when
        the host sees it: a member that appears, a member whose executable changed, and a
        judged member whose credentials, filters or namespaces changed (`_fingerprint`). A
        change that lives less than one poll is missed: the rendezvous, not this, is where
        the payload waits to be read.
        """
        if self.group is None:
            return
        while not self._stop.wait(LATER_POLL_S):
            members = self.group.pids()
            for pid in members:
                exe = _link(Path(f"/proc/{pid}/exe"))
                if not exe or self._unchanged(pid, exe):
                    continue  # no executable: exiting (`_exiting`), nothing left to judge
                above = cellgroup.ancestors_within(self._launchers, members)
                self._read_later(pid, exe, self._classify(pid, above))

    def _unchanged(self, pid: int, exe: str) -> bool:
        """Whether `pid` is the process the host last read, holding what it held then."""
        known = self._seen.get(pid)
        if known is None or known[0] != exe:
            return False
        return known[1] is None or _fingerprint(read_brief(pid)) in (known[1], ())

    def _read_later(self, pid: int, exe: str, role: str) -> None:
        """Read one member after the rendezvous and keep it (judged ones in `others` too)."""
        reading = self._read_one(pid, role, later=True)
        if str(reading.get("unread", "")).startswith("exited"):
            return
        self._remember(pid, exe, reading)
        self._later_summaries.append(summarize(reading, role, "later"))
        if role == "payload":
            self._later.append(reading)

    def _remember(self, pid: int, exe: str, reading: dict[str, Any]) -> None:
        """Note what the host last read of `pid` (only judged members are re-read)."""
        judged = reading.get("role") == "payload"
        self._seen[pid] = (exe, _fingerprint(reading) if judged else None)

    def _read_by_command_line(self) -> None:
        """The fallback: find the payload by the launcher's command line (see the class doc)."""
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
            return
        # A process gone before it was read shows nothing; it is no reading at all.
        views = [v for v in (read_process(pid, self.look) for pid in pids) if v["status"]]
        if not views:
            self.view = {"seen": False, "why": "the payload exited before the host read it"}
            return
        self.view = {"seen": True, **views[0], "mechanism": "launcher command line"}
        self.view |= self._run_hooks(int(views[0]["pid"]))
        self.view["processes"] = [summarize(v, "payload", "rendezvous") for v in views]
        if len(views) > 1:
            self.view["others"] = views[1:]
            self.view.setdefault("notes", []).append(
                f"{len(views)} processes carry this cell's launcher and task: "
                "a wrapper may be running decoys"
            )

    def _run_hooks(self, pid: int) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for name, hook in self.hooks.items():
            try:
                reading = hook(pid)
            except Exception as exc:  # a spec's reading must not end the view
                results[name] = {"seen": False, "why": f"{type(exc).__name__}: {exc}"}
                continue
            # None: the spec takes no reading of its own (SpecBase.at_rendezvous); nothing
            # is stored under its name, as if it had no hook.
            if reading is not None:
                results[name] = reading
        return results
