"""Cell groups: every process a cell's wrapper starts, found by where the harness put it.

The host must judge every process of a cell, not the one that carries the launcher's command
line (a wrapper can start a tight decoy with that argv and run the real payload another way:
issue 23). So each cell's wrapper starts inside a group that the harness made and that the
payload user cannot leave, and the host reads every member at the rendezvous.

Two mechanisms, the first that works here:

- **cgroup** (v2). The v2 hierarchy is found wherever it is mounted (`cgroup2` in
  /proc/self/mountinfo: /sys/fs/cgroup on pure-v2 hosts, /sys/fs/cgroup/unified on hybrid
  ones). Under the harness's own v2 cgroup, one per-run parent (`kiln-worker-<pid>-<tag>`,
  sandbox_attest/host/disguise.py)
  and one child per cell, all made by root with mode 0755. Moving a process needs write access
  to the destination's `cgroup.procs` and to that of the common ancestor, so the payload user
  can neither leave its cell group nor make a group of its own inside it. A child forked by
  any member, setsid or double fork included, is born in the same group.
- **subtree**, where no v2 hierarchy is writable (not root, no cgroup2 mount, a kernel older
  than 5.16). The wrapper is the harness's child; the harness is a child subreaper
  (`PR_SET_CHILD_SUBREAPER`), so a member that double-forks away from its parent reparents to
  the harness, never to init; members are the wrapper and its descendants by the ppid links
  of /proc/*/stat, plus every pid once seen as a member (by start time, so a reused pid is
  not one), and their descendants. Weaker: a process that forks and whose parent exits
  between two readings is reparented before it was ever seen, and is nobody's member.

How a wrapper enters its cgroup, race-free: `subprocess` (3.11) has no `use_cgroup`, so the
harness opens the cell's `cgroup.procs` for writing (as root) before the fork, and the child
writes "0" (itself) into that descriptor in the step between fork and exec that already arms
its parent-death signal (`sandbox_attest.host.lifetime`). The child joins before it runs a single
instruction of the wrapper, so nothing it starts can be born outside. The write happens after
`subprocess` switched to the payload user; the kernel checks a cgroup move against the
credentials of whoever *opened* the file (Linux >= 5.16, "cgroup: Use open-time credentials"),
so root's descriptor works and the payload user never holds one. Not chosen: an exec shim that
writes its own pid (a shell rewrites the environment it passes on: it drops names with dots
and sets PWD, which env_inheritance would read as the sandbox's doing), and posix_spawn (no uid
switch).

A supervisor written in Python (sandlock's SDK runs its seccomp-notify supervisor in the
launcher's own process, unconfined by design) is exempt from judgement on four conditions
together, each one a way a payload could otherwise pass for it: (1) it is the very process the
harness spawned for the cell (its pid *and* start time, recorded by `started`: a decoy forked
later with the same command line is another process); (2) its executable is the interpreter the
script's `#!` names (by inode); (3) its command line runs, in isolated mode (`-I`: no
PYTHONPATH, no user site) and with no option taking a value (`-c`, `-m`, `-W` import code), an
absolute script path that is (4) a file the spec declared in `[detect] executables` (signed by
sha256 in the backend's identity), pinned by (st_dev, st_ino, sha256) before the spawn and
unchanged since, on a path with no symlink and no component the payload user can change
(owned by root or the harness, not writable by others unless sticky). argv words never pin a
script: `python3 probe.py` is the payload. Such a script must never exec the payload in its own
process (the pid would then run the payload's code under the exempt identity): sandlock's
launcher forks it through sandlock. Residual risk: a payload that can ptrace, write the memory
of, or inject into its unconfined supervisor (same uid) runs code there unjudged; that access
is exactly what proc_cross_process and proc_visibility measure, so it shows there as a FAIL.

Leftovers are found through the group too (no run tag in any environment): whatever is still
in a cell's group once its wrapper has exited is a leftover. The per-run parent's path is
journalled (`sandbox_attest.host.journal`), so the next run's sweep (`sandbox_attest.run.sweep`)
kills what a killed run left in it and removes the groups.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import secrets
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.errors import ConfigError
from sandbox_attest.host import disguise, journal, lifetime
from sandbox_attest.host.cgroupfs import (
    cgroup_members,
    kernel_at_least,
    own_v2_dir,
    remove_cgroup_tree,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Iterator, Sequence

CGROUP: Final = "cgroup"
SUBTREE: Final = "subtree"
# The per-run parent's name: the harness's pid and a random tag (a reused pid is a new name).
RUN_PREFIX: Final = disguise.RUN_CGROUP_PREFIX
# The kernel that checks a move against the opener's credentials (see the module docstring).
OPEN_TIME_CREDS: Final = (5, 16)
# Linux <linux/prctl.h>.
PR_SET_CHILD_SUBREAPER: Final = 36
# How long ending a subtree group waits for the members it killed to become reapable.
REAP_WAIT_S: Final = 2.0
# The journal key prefix of a run's cgroup (sandbox_attest.run.sweep reads it back).
JOURNAL_PREFIX: Final = "cgroup-"
# Interpreter options a pinned supervisor script may run under: flags only (none takes a
# value, so none names code or a module to import), and -I (or -E with -s) is required.
SAFE_PYTHON_FLAGS: Final = frozenset("IEsSBuOPq")


@dataclass(frozen=True)
class PinnedScript:
    """A Python supervisor script the spec declared, as it was when the cell was spawned."""

    dev: int
    ino: int
    sha256: str
    interpreter: tuple[int, int]  # (st_dev, st_ino) of the interpreter its #! names


# ---------------------------------------------------------------------------------------------
# The per-run parent (one per harness process).


@dataclass
class _RunCgroup:
    """The run's parent cgroup, or why there is none (`path` None, `why` said)."""

    path: Path | None
    why: str
    journal_key: str = ""
    cells: int = 0


_RUN: _RunCgroup | None = None
_RUN_LOCK = threading.Lock()


def _make_run_cgroup() -> _RunCgroup:  # noqa: PLR0911  (one return per reason it cannot)
    if not sys.platform.startswith("linux"):
        return _RunCgroup(None, "not Linux: no cgroups")
    if os.geteuid() != 0:
        return _RunCgroup(
            None, "the harness is not root: a cgroup the payload user cannot leave needs root"
        )
    if not kernel_at_least(OPEN_TIME_CREDS):
        return _RunCgroup(
            None,
            f"kernel {os.uname().release} checks a cgroup move against the writer, not the "
            "opener (before 5.16): the payload user could not join the group root opened",
        )
    base = own_v2_dir()
    if base is None:
        return _RunCgroup(None, "no cgroup2 mount shows the harness's own cgroup")
    path = base / f"{RUN_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    key = JOURNAL_PREFIX + path.name
    # Journalled before it exists: a run killed right after the mkdir still has it swept.
    try:
        journal.record(key, [], cgroup=str(path))
    except (OSError, ValueError, ConfigError) as exc:
        # Unjournalled, a killed run's group would stay for good: use the subtree instead.
        return _RunCgroup(None, f"cannot journal the run's cgroup ({exc})")
    try:
        path.mkdir(mode=0o755)
    except OSError as exc:
        journal.forget(key)
        return _RunCgroup(None, f"cannot create a cgroup under {base}: {exc.strerror}")
    run = _RunCgroup(path, "", key)
    atexit.register(_close_run, run)
    return run


def _close_run(run: _RunCgroup) -> None:
    if run.path is None:
        return
    notes = remove_cgroup_tree(run.path)
    if not notes:
        with contextlib.suppress(OSError, ValueError, ConfigError):
            journal.forget(run.journal_key)


def run_cgroup() -> tuple[Path | None, str]:
    """This harness process's run cgroup (made on first use), or (None, why there is none)."""
    global _RUN  # noqa: PLW0603  (one per process, made once)
    with _RUN_LOCK:
        if _RUN is None:
            _RUN = _make_run_cgroup()
        return _RUN.path, _RUN.why


def _next_cell_name() -> str:
    with _RUN_LOCK:
        assert _RUN is not None  # noqa: S101  (run_cgroup() made it)
        _RUN.cells += 1
        return f"cell-{_RUN.cells}"


# ---------------------------------------------------------------------------------------------
# Subtree reading (the fallback), also used to list any process's descendants.


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), or None where it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw.rsplit(")", 1)[1].split()


def _parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None if there is no such process."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def parent_links() -> dict[int, list[int]]:
    """Every live process's children, by the ppid in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def ancestors_within(pids: Sequence[int], members: Collection[int]) -> set[int]:
    """Every member above one of `pids` by the ppid links, up to where the chain leaves."""
    found: set[int] = set()
    for pid in pids:
        parent = _parent(pid)
        while parent is not None and parent in members and parent not in found:
            found.add(parent)
            parent = _parent(parent)
    return found


def descendants(roots: Sequence[int], links: dict[int, list[int]] | None = None) -> list[int]:
    """`roots` that still exist and all their descendants, in the order found."""
    links = parent_links() if links is None else links
    seen: list[int] = []
    pending = [r for r in roots if Path(f"/proc/{r}").exists()]
    while pending:
        pid = pending.pop(0)
        if pid in seen:
            continue
        seen.append(pid)
        pending += links.get(pid, [])
    return seen


# How many subtree groups are open: the harness is a child subreaper only while one is, so
# orphans of everything else it runs (and of later, cgroup-judged cells) still go to init,
# where the sweep's own test for an orphan (its parent no longer a Python) looks for them.
_SUBREAPER_USERS = 0
_SUBREAPER_LOCK = threading.Lock()


def _set_subreaper(*, on: bool) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        return f"PR_SET_CHILD_SUBREAPER failed ({os.strerror(ctypes.get_errno())})"
    return ""


def _become_subreaper() -> str:
    """Make this process a child subreaper for one more subtree group; "" or why it could not.

    Pair with `_release_subreaper` when that group closes.
    """
    global _SUBREAPER_USERS  # noqa: PLW0603  (a per-process setting, counted)
    with _SUBREAPER_LOCK:
        trouble = _set_subreaper(on=True) if _SUBREAPER_USERS == 0 else ""
        if not trouble:
            _SUBREAPER_USERS += 1
        return trouble


def _release_subreaper() -> None:
    """One subtree group fewer; the last one out makes this process an ordinary parent."""
    global _SUBREAPER_USERS  # noqa: PLW0603
    with _SUBREAPER_LOCK:
        if _SUBREAPER_USERS == 0:
            return
        _SUBREAPER_USERS -= 1
        if _SUBREAPER_USERS == 0:
            _set_subreaper(on=False)


# ---------------------------------------------------------------------------------------------
# One cell's group.


@dataclass
class CellGroup:
    """The group one cell's wrapper starts in; get one from `open_cell`.

    Attributes:
        mechanism: CGROUP or SUBTREE (see the module docstring).
        path: the cell's cgroup directory (CGROUP), else None.
        why: why the weaker mechanism was used ("" with CGROUP).
        roots: the wrappers started in this group (their host pids).
        supervisors: (st_dev, st_ino) of the executables the backend starts as its wrapper;
            a member running one of them is the sandbox's own process, not the payload.
        supervisor_scripts: Python scripts the spec declared as its wrapper, by absolute
            path; only the spawned root running one is exempt (module docstring).
    """

    mechanism: str
    path: Path | None = None
    why: str = ""
    reaping: bool = False  # this group made the harness a subreaper (`_become_subreaper`)
    roots: list[int] = field(default_factory=list)
    supervisors: set[tuple[int, int]] = field(default_factory=set)
    supervisor_scripts: dict[str, PinnedScript] = field(default_factory=dict)
    _known: dict[int, int | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def describe(self) -> str:
        """Where the group is, in words, for the evidence."""
        if self.mechanism == CGROUP:
            return str(self.path)
        return f"descendants of host pid(s) {self.roots or '(none started)'}"

    def pin_supervisor(self, executable: str, env_path: str | None = None) -> None:
        """Count `executable`, which the spec declares its wrapper runs, as the wrapper's own.

        As `pin_executable`; and a Python script (its `#!` names an interpreter that can run
        Python) is pinned as a supervisor script (`pin_script`), which exempts only the
        spawned root running it (module docstring). Call this for what a spec *declares*
        (`[detect] executables`), never for argv words: those name the payload's script too.
        """
        self.pin_executable(executable, env_path)
        if executable.startswith("/"):
            self.pin_script(executable)

    def pin_script(self, path: str) -> None:
        """Pin Python script `path` by inode and digest, if nothing the payload may change is on it.

        Not pinned (and so judged): a relative path, a symlink anywhere on it, a component
        owned by someone else than root or the harness, or a directory others may write
        without the sticky bit; a file that is not a regular file whose `#!` names a Python.
        """
        path = _lexical(path)
        if _changeable_path(path):
            return
        interpreters = _interpreter_of(path, None)
        if not interpreters or not can_run_python(interpreters[0]):
            return
        try:
            info = Path(path).lstat()
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            python = Path(interpreters[0]).stat()
        except OSError:
            return
        self.supervisor_scripts[path] = PinnedScript(
            info.st_dev, info.st_ino, digest, (python.st_dev, python.st_ino)
        )

    def pin_executable(self, executable: str, env_path: str | None = None) -> None:
        """Count `executable` (found on `env_path` like exec does) as the wrapper's own.

        A script counts by its `#!` interpreter too, since that is what /proc/<pid>/exe shows.
        Never pinned: anything that can run the payload's Python (`can_run_python`), nor the
        dynamic loader (`ld.so PROGRAM` runs any program under the loader's name). A wrapper
        written in Python is therefore judged as its payload is (hostview's docstring), unless
        the spec declared its script (`pin_supervisor`).
        """
        import shutil  # noqa: PLC0415

        if executable.startswith("-") or "=" in executable:
            return
        found = executable if "/" in executable else shutil.which(executable, path=env_path)
        if found is None:
            return
        for path in [found, *_interpreter_of(found, env_path)]:
            try:
                info = Path(path).stat()
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
                continue
            if Path(os.path.realpath(path)).name.startswith("ld-") or can_run_python(path):
                continue
            self.supervisors.add((info.st_dev, info.st_ino))

    def is_supervisor(self, pid: int, ancestors: Collection[int] = ()) -> bool:
        """Whether member `pid` is the sandbox's own process rather than the payload.

        It is when it runs one of the wrapper's pinned executables, or is in `ancestors` (the
        chain above the process carrying the launcher: the wrapper, bwrap, a seccomp
        helper), and in either case runs nothing that can run Python: the payload is Python,
        so a process that could be running it is judged wherever it sits, a copy of the
        interpreter or the loader running one included (`can_run_python`). The one Python
        exempt is the spawned root running a pinned supervisor script (`runs_pinned_script`).
        """
        exe = f"/proc/{pid}/exe"
        try:
            info = Path(exe).stat()
            target = str(Path(exe).readlink())
        except OSError:
            return False  # unreadable: judged, never exempted
        if Path(target).name.startswith("ld-") or can_run_python(exe):
            return self.runs_pinned_script(pid, (info.st_dev, info.st_ino))
        return (info.st_dev, info.st_ino) in self.supervisors or pid in ancestors

    def runs_pinned_script(self, pid: int, exe: tuple[int, int]) -> bool:
        """Whether `pid` is a root the harness spawned, running a pinned script unchanged.

        `exe` is the (st_dev, st_ino) of its executable, read by the caller. Every condition
        of the module docstring; any doubt (a process gone, a file unreadable) is a no.
        """
        with self._lock:
            spawned = pid in self.roots and self._known.get(pid) is not None
            ticks = self._known.get(pid)
        if not spawned or start_ticks(pid) != ticks:
            return False
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        script = _isolated_script(argv)
        script = _lexical(script) if script is not None else None
        pinned = self.supervisor_scripts.get(script) if script else None
        if pinned is None or script is None or pinned.interpreter != exe:
            return False
        if _changeable_path(script):
            return False
        try:
            info = Path(script).lstat()
            digest = hashlib.sha256(Path(script).read_bytes()).hexdigest()
        except OSError:
            return False
        # Read again after the file: a process that exec'd meanwhile is no longer the root.
        return (info.st_dev, info.st_ino, digest) == (pinned.dev, pinned.ino, pinned.sha256) and (
            start_ticks(pid) == ticks
        )

    def spawn_kwargs(self) -> dict[str, Any]:
        """`Popen` keyword arguments that start the child in this group and tie it to us."""
        arm = lifetime.die_with_harness()
        if self.mechanism != CGROUP or self.path is None:
            return {} if arm is None else {"preexec_fn": arm}
        # Opened by root in the parent; the child writes itself in (module docstring). One
        # descriptor per spawn, closed in the parent once the child has exec'd.
        fd = os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        _OPEN_FDS.fd = fd

        def join_then_arm() -> None:
            if arm is not None:
                arm()
            try:
                os.write(fd, b"0")
            except OSError as exc:
                # Outside its group it would be a process nobody judges: refuse to start it.
                raise OSError(exc.errno, "cannot join the cell's cgroup") from None

        return {"preexec_fn": join_then_arm}

    def started(self, pid: int) -> None:
        """Note the wrapper just started (pid); close the spawn's descriptor."""
        self.spawn_failed()
        with self._lock:
            self.roots.append(pid)
            self._known[pid] = start_ticks(pid)

    def spawn_failed(self) -> None:
        """The spawn did not happen: close the descriptor `spawn_kwargs` opened."""
        fd = getattr(_OPEN_FDS, "fd", None)
        if fd is not None:
            _OPEN_FDS.fd = None
            with contextlib.suppress(OSError):
                os.close(fd)

    def pids(self) -> list[int]:
        """Every process in the group now (the harness itself never)."""
        if self.mechanism == CGROUP and self.path is not None:
            found = cgroup_members(self.path)
        else:
            with self._lock:
                known = [p for p, t in self._known.items() if start_ticks(p) == t]
            found = descendants(known)
            with self._lock:
                for pid in found:
                    self._known.setdefault(pid, start_ticks(pid))
        return sorted(p for p in set(found) if p != os.getpid())

    def kill(self, pids: Sequence[int] | None = None) -> None:
        """SIGKILL `pids` (default: every member); members only, whatever they asked."""
        members = set(self.pids())
        for pid in members if pids is None else [p for p in pids if p in members]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        """Wait for members reparented to the harness (subtree mode): no zombie stays ours.

        Only pids once seen as members and now the harness's children (a subreaper adopts
        orphans) are waited for, never a wrapper (its Popen waits for it); bounded, since a
        member that ignores SIGKILL (one we may not signal) never becomes a zombie.
        """
        if self.mechanism == CGROUP:
            return
        with self._lock:
            adopted = [p for p in self._known if p not in self.roots and _parent(p) == os.getpid()]
        deadline = time.monotonic() + REAP_WAIT_S
        while adopted and time.monotonic() < deadline:
            for pid in list(adopted):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    adopted.remove(pid)
            if adopted:
                time.sleep(0.01)

    def close(self, *, kill: bool) -> list[str]:
        """End the group: with `kill`, its members first; notes on what could not go.

        Without `kill`, a group that still has members stays for the run's end (its parent's
        removal kills them), so a leftover that a probe watches is not ended by the harness.
        """
        if self.mechanism != CGROUP or self.path is None:
            if kill:
                self.kill()
            if self.reaping:
                self.reaping = False
                _release_subreaper()
            return []
        if kill:
            return remove_cgroup_tree(self.path)
        if not cgroup_members(self.path):
            with contextlib.suppress(OSError):
                self.path.rmdir()
        return []


# Marks of a program that embeds or links a Python interpreter (CPython's own entry point,
# libpython): such a program could run the payload, so it is never a supervisor.
PYTHON_MARKS: Final = (b"Py_Initialize", b"libpython")
_PY_CACHE: dict[tuple[int, int, int, int], bool] = {}


def can_run_python(path: str) -> bool:
    """Whether the program at `path` embeds or links Python (cached by inode and mtime).

    Unreadable counts as yes: what the host cannot check is judged, never exempted.
    """
    try:
        info = Path(path).stat()
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if key not in _PY_CACHE:
            data = Path(path).read_bytes()
            _PY_CACHE[key] = any(mark in data for mark in PYTHON_MARKS)
    except OSError:
        return True
    return _PY_CACHE[key]


_OPEN_FDS = threading.local()
_CURRENT = threading.local()


def _isolated_script(argv: list[bytes]) -> str | None:
    """The absolute script a Python command line runs in isolated mode, else None.

    `argv` is /proc/<pid>/cmdline split at NULs. Only flag options (SAFE_PYTHON_FLAGS) may
    come before the script, `-I` (or both `-E` and `-s`) among them.
    """
    flags: set[str] = set()
    index = 1
    while index < len(argv):
        word = argv[index].decode(errors="replace")
        if word == "--":
            index += 1
            break
        if not word.startswith("-") or word == "-":
            break
        if not set(word[1:]) <= SAFE_PYTHON_FLAGS:
            return None
        flags |= set(word[1:])
        index += 1
    if index >= len(argv) or not ("I" in flags or {"E", "s"} <= flags):
        return None
    script = argv[index].decode(errors="replace")
    return script if script.startswith("/") else None


def _lexical(path: str) -> str:
    """`path` with its `..` and `.` resolved by name, where that names the same file.

    A spec reaches a helper beside it as `{spec_dir}/../x.py`; the kernel resolves `..` after
    any symlink before it, so the name form is used only where no symlink is on the way
    (its realpath is its normpath); otherwise `path` as it came, which `_changeable_path`
    refuses.
    """
    lexical = os.path.normpath(path)
    return lexical if os.path.realpath(path) == lexical else path


def _changeable_path(path: str) -> bool:
    """Whether anyone but root or the harness could change what `path` names (or it is odd).

    True for a relative path, one that is not its own realpath (a symlink or `..` on it), a
    component not owned by root or the harness, a directory others may write without the
    sticky bit above a component, and anything but a regular file at the end.
    """
    if not path.startswith("/") or os.path.realpath(path) != path:
        return True
    trusted = {0, os.geteuid()}
    parts = Path(path).parts
    parent_open = False  # the directory above lets others replace an entry
    for depth in range(1, len(parts) + 1):
        here = Path(*parts[:depth])
        try:
            info = here.lstat()
        except OSError:
            return True
        if info.st_uid not in trusted or (parent_open and depth > 1):
            return True
        last = depth == len(parts)
        if last:
            return not stat.S_ISREG(info.st_mode) or bool(info.st_mode & 0o022)
        if not stat.S_ISDIR(info.st_mode):
            return True
        parent_open = bool(info.st_mode & 0o022) and not info.st_mode & stat.S_ISVTX
    return True


def _interpreter_of(path: str, env_path: str | None) -> list[str]:
    """The `#!` interpreter of script `path` (and `env NAME`'s NAME, found on `env_path`)."""
    import shutil  # noqa: PLC0415

    try:
        with Path(path).open("rb") as handle:
            head = handle.readline(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    words = head[2:].decode(errors="replace").split()
    if not words:
        return []
    found = [words[0]]
    if Path(words[0]).name == "env":
        name = next((w for w in words[1:] if not w.startswith("-")), None)
        where = shutil.which(name, path=env_path) if name else None
        if where:
            found.append(where)
    return found


def new_cell() -> CellGroup:
    """A fresh group for one cell: a cgroup where one can be made, else a subtree."""
    run, why = run_cgroup()
    if run is not None:
        path = run / _next_cell_name()
        try:
            path.mkdir(mode=0o755)
        except OSError as exc:
            why = f"cannot create the cell's cgroup {path}: {exc.strerror}"
        else:
            info = path.lstat()
            if stat.S_ISDIR(info.st_mode) and info.st_uid == 0:
                return CellGroup(CGROUP, path)
            why = f"{path} is not root's directory"
    trouble = _become_subreaper()
    if trouble:
        return CellGroup(SUBTREE, why=f"{why}; {trouble}")
    return CellGroup(SUBTREE, why=why, reaping=True)


def current() -> CellGroup | None:
    """The group this thread's cell runs in, or None outside any cell."""
    group = getattr(_CURRENT, "group", None)
    return group if isinstance(group, CellGroup) else None


def enter(group: CellGroup) -> CellGroup | None:
    """Make `group` this thread's current one; returns the one it replaces (for `leave`)."""
    previous = current()
    _CURRENT.group = group
    return previous


def leave(previous: CellGroup | None) -> None:
    """Restore the current group `enter` replaced."""
    _CURRENT.group = previous


@contextlib.contextmanager
def open_cell() -> Iterator[CellGroup]:
    """This thread's current group, or a new one for the block (killed and removed after)."""
    group = current()
    if group is not None:
        yield group
        return
    group = new_cell()
    previous = enter(group)
    try:
        yield group
    finally:
        leave(previous)
        group.close(kill=True)


def spawn_kwargs(argv: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """`Popen` kwargs for a sandbox command: in this thread's cell group where there is one.

    Outside any cell it is `lifetime.popen_kwargs()`. Pair with `started(pid)` after the
    Popen (or `spawn_failed()` when it raised).
    """
    group = current()
    if group is None:
        return lifetime.popen_kwargs()
    # Every word of the command line that names an executable: a wrapper may start through
    # another (prlimit ... bwrap ...). Python and the loader are never pinned (pin_supervisor).
    # Executables only: a script named on the command line may be the payload's own.
    for word in argv:
        group.pin_executable(word, (env or {}).get("PATH", os.defpath))
    return group.spawn_kwargs()


def started(pid: int) -> None:
    """The sandbox command started as `pid` (see `spawn_kwargs`)."""
    group = current()
    if group is not None:
        group.started(pid)


def spawn_failed() -> None:
    """The sandbox command did not start (see `spawn_kwargs`)."""
    group = current()
    if group is not None:
        group.spawn_failed()
