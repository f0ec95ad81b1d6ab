"""Witness sockets: listening unix sockets the harness plants beside the host's real ones.

`ipc_unix_socket_escape` asks a class question: can the payload reach *any* unix socket the
host keeps, not only the fixture daemon's? The host cannot watch a real daemon (dbus,
containerd, systemd) for the payload's connections, so beside each one it plants a socket of
its own, named with the cell's nonce, and listens. A witness that hears the nonce (or accepts
a connection from the payload's side during the cell) proves the directory it sits in is
visible and connectable from inside, whatever the payload's report says.

Where witnesses go (`socket_dirs`): every directory under `/run` and `/var/run` that holds a
socket (found by a walk bounded in depth, directory count and time), `$XDG_RUNTIME_DIR`, `/tmp`
and the directories directly under it that hold one, and one abstract name (the abstract
namespace has no directories; `abstract_names` lists what the host has there). The harness's
own world and cell scratch are never witness sites: they are the egress route and the fixture
daemon, which the probe judges by their own witnesses.

Each witness is `0666` and the harness's: connectable by the payload uid wherever the
directory lets it search, removable only by the harness. What `plant` is about to make is
journalled through `run.sweep` first, so a killed run's witnesses are swept by the next.

A busy host (issue 24, part 3): directories under /tmp and /run come and go, and many are
private to another program. A witness goes only where the payload user can search
(`reachable_dirs`, asked as that user), and each directory is held by the harness's own
descriptor from plant time, so a directory its owner removed or replaced during the cell is
told apart from one the sandbox touched (`WitnessSockets.moved`): such a site is dropped from
the cell and listed, never a silent witness that fails the control.

What it does not do: talk back. A witness reads one short line and closes; it never answers,
so nothing inside can use it as a channel.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.catalog.canary import call_as, site_moved
from sandbox_attest.host import as_user, disguise
from sandbox_attest.host import journal as sweep
from sandbox_attest.host.safefs import Identity, SafeDir, UnsafePathError, open_dir

# The file name of a path witness and the abstract witness's name; the payload sends its
# nonce only to sockets whose name starts with the prefix (probes/ipc_unix_socket_escape.py).
WITNESS_PREFIX: Final = disguise.WITNESS_PREFIX
ABSTRACT_PREFIX: Final = disguise.ABSTRACT_WITNESS_PREFIX
# The runtime trees: each (root, depth). /var/run is usually a symlink to /run; the walk
# deduplicates by resolved path, so each directory is planted once.
RUNTIME_ROOTS: Final = (("/run", 4), ("/var/run", 4))
TMP_ROOT: Final = ("/tmp", 1)  # noqa: S108  (the host's shared /tmp is the point here)
# Bounds of the host's walk: a host with thousands of containers must not stall a cell.
MAX_DIRS_VISITED: Final = 2000
MAX_WITNESS_DIRS: Final = 64
WALK_S: Final = 1.5
# A connection's line is read for at most this long; the payload sends it at once.
READ_S: Final = 0.5
LINE_MAX: Final = 512
# AF_UNIX's sun_path cap, less room for the NUL: longer paths are bound through a dir fd.
_UNIX_PATH_MAX: Final = 100
# How long the payload user's reach (a search, a connect per witness) may take: one child.
REACH_S: Final = 15.0

if TYPE_CHECKING:
    from sandbox_attest.host.trust import PayloadUser


def witness_name(nonce: str) -> str:
    """The file name of the cell's witness socket in each directory."""
    return f"{WITNESS_PREFIX}{nonce}.sock"


def abstract_witness(nonce: str) -> str:
    """The cell's abstract witness name (without the leading NUL)."""
    return f"{ABSTRACT_PREFIX}{nonce}"


def _holds_socket(directory: str) -> tuple[bool, list[str]]:
    """Whether `directory` holds a socket (not ours), and its subdirectories (not followed)."""
    found, subdirs = False, []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if stat.S_ISDIR(mode):
                    subdirs.append(entry.path)
                elif stat.S_ISSOCK(mode) and not entry.name.startswith(WITNESS_PREFIX):
                    found = True
    except OSError:
        return False, []
    return found, subdirs


def _is_under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def walk_socket_dirs(
    root: str, depth: int, *, exclude: tuple[str, ...] = (), deadline: float | None = None
) -> list[str]:
    """Directories under `root` (itself included) that hold a socket, breadth first, bounded.

    Symlinks are not followed below the root; the root itself is resolved. Directories
    under `exclude` (resolved paths) are neither listed nor entered.
    """
    start = os.path.realpath(root)
    if not Path(start).is_dir():
        return []
    end = deadline if deadline is not None else time.monotonic() + WALK_S
    found: list[str] = []
    level, visited = [start], 0
    for _ in range(depth + 1):
        below: list[str] = []
        for directory in level:
            if visited >= MAX_DIRS_VISITED or time.monotonic() > end:
                return found
            visited += 1
            if _is_under(directory, exclude):
                continue
            holds, subdirs = _holds_socket(directory)
            if holds:
                found.append(directory)
            below.extend(subdirs)
        level = below
    return found


def socket_dirs(*, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """Every directory where the host keeps sockets that the harness can find (see module).

    /tmp and $XDG_RUNTIME_DIR are always included (when they exist), socket or not: a
    sandbox that shows the host's /tmp shows whatever socket lands there next.
    """
    excluded = tuple(os.path.realpath(p) for p in exclude)
    deadline = time.monotonic() + WALK_S
    ordered: dict[str, None] = {}
    for root, depth in RUNTIME_ROOTS:
        ordered |= dict.fromkeys(walk_socket_dirs(root, depth, exclude=excluded, deadline=deadline))
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    always = [TMP_ROOT[0], *([xdg] if xdg else [])]
    for directory in always:
        real = os.path.realpath(directory)
        if Path(real).is_dir() and not _is_under(real, excluded):
            ordered[real] = None
    tmp_root, tmp_depth = TMP_ROOT
    ordered |= dict.fromkeys(
        walk_socket_dirs(tmp_root, tmp_depth, exclude=excluded, deadline=deadline)
    )
    return [Path(d) for d in list(ordered)[:MAX_WITNESS_DIRS]]


def sockets_in(directories: list[Path]) -> dict[Identity, str]:
    """Every unix socket directly in each directory, (st_dev, st_ino) -> its host path.

    Only lstat, nothing followed or connected: the host's own sockets, by identity, for the
    walk of a payload's view to find wherever a sandbox put them. The harness's witnesses
    are left out (they are listed by `WitnessSockets.identities`).
    """
    found: dict[Identity, str] = {}
    for directory in dict.fromkeys(directories):
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
        except OSError:
            continue
        for entry in listed:
            if entry.name.startswith(WITNESS_PREFIX):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISSOCK(st.st_mode):
                    found.setdefault((st.st_dev, st.st_ino), entry.path)
    return found


def reachable_dirs(dirs: list[Path], user: PayloadUser | None) -> tuple[list[Path], dict[str, str]]:
    """The directories the payload user can search unconfined, and why each other one is not.

    A witness in another program's private directory (a browser's 0700 one in /tmp) could
    never hear an unconfined payload, so a refusal there proves nothing: it is not planted.
    Asked as the payload user itself (`call_as`), never computed from mode bits.

    Returns:
        (the reachable directories in order, {witness path: reason} for the others).
    """
    answer, why = call_as(user, as_user.__name__, "searchable", [str(d) for d in dirs], REACH_S)
    if why:
        # Unknown reach plants everywhere: the host control then drops what it cannot reach.
        return list(dirs), {}
    kept = [d for d in dirs if not answer.get(str(d))]
    skipped = {
        str(d): "gone before the witness was planted (its owner removed it)"
        if answer[str(d)] == "ENOENT"
        else f"the payload user cannot search it unconfined ({answer[str(d)]})"
        for d in dirs
        if answer.get(str(d))
    }
    return kept, skipped


def abstract_names(proc_net_unix: str = "/proc/net/unix") -> list[str]:
    """The listening abstract socket names in `proc_net_unix` (the reader's net namespace).

    The kernel shows an abstract name with a leading `@` and its NULs as `@`; a listening
    socket has `__SO_ACCEPTCON` (0x10000) in its flags.
    """
    names: list[str] = []
    try:
        lines = Path(proc_net_unix).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return names
    for line in lines[1:]:
        fields = line.split(None, 7)
        if len(fields) < 8 or not fields[7].startswith("@"):
            continue
        with contextlib.suppress(ValueError):
            if int(fields[3], 16) & 0x10000:
                names.append(fields[7][1:])
    return sorted(set(names))


def bind_unix(address: str) -> socket.socket:
    """A listening AF_UNIX stream socket at `address` (a path, or NUL + an abstract name).

    A path too long for sun_path is bound through a descriptor of its directory, so long
    runtime paths still get a witness.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if address.startswith("\0") or len(os.fsencode(address)) < _UNIX_PATH_MAX:
            sock.bind(address)
        else:
            path = Path(address)
            dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock.bind(f"/proc/self/fd/{dir_fd}/{path.name}")
            finally:
                os.close(dir_fd)
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class WitnessSockets:
    """The cell's witness sockets and what they heard. Plant, then `start`, then `stop`.

    Attributes:
        nonce: the cell's nonce; a line carrying it is the payload's.
        dirs: the directories to plant a path witness in.
        sites: exact paths to plant a witness at, by their own names (see the field).
        abstract: whether to plant the abstract witness (Linux only).
        journal_key: the sweep journal entry that lists the planted paths.
    """

    nonce: str
    dirs: list[Path]
    abstract: bool = True
    journal_key: str = ""
    # Exact socket paths to plant beside the nonce-named ones: where a login session's
    # daemons keep theirs (`$XDG_RUNTIME_DIR/bus`, the ssh-agent's), by their own names.
    sites: list[Path] = field(default_factory=list)
    planted: dict[str, socket.socket] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    # Witness sites the host control dropped: {witness: why} (its owner moved the directory,
    # or the payload user cannot reach it unconfined). Judged by nothing but a nonce heard.
    dropped: dict[str, str] = field(default_factory=dict)
    # Each path witness's directory, held open from plant time, and the witness's identity.
    _sites: dict[str, tuple[SafeDir, Identity]] = field(default_factory=dict)
    _log: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # Wakes the listener at once on stop: a select timeout alone cost every cell ~0.1 s.
    _wake: tuple[socket.socket, socket.socket] | None = None
    _phase: str = "cell"

    def plant(self) -> None:
        """Journal every path, then bind each witness; a directory that refuses is skipped.

        A refusal (a read-only /run, a directory the harness may not write) is recorded in
        `skipped` with its errno: the witness set says where it could not look. Each path
        witness is bound through a descriptor of its directory, opened without following a
        symlink and held until `stop`: `moved` compares it with what the path names later.
        """
        paths = [*(d / witness_name(self.nonce) for d in self.dirs), *self.sites]
        self.journal_key = f"socket-witness-{self.nonce}"
        sweep.record(self.journal_key, paths)
        for path in paths:
            try:
                self._plant_at(path)
            except (OSError, UnsafePathError) as exc:
                why = os.strerror(exc.errno or 0) if isinstance(exc, OSError) else ""
                self.skipped[str(path)] = why or str(exc)
        if self.abstract:
            address = "\0" + abstract_witness(self.nonce)
            try:
                sock = bind_unix(address)
            except OSError as exc:
                self.skipped[_shown(address)] = os.strerror(exc.errno or 0) or repr(exc)
            else:
                sock.setblocking(False)  # noqa: FBT003  (the socket API's own positional flag)
                self.planted[_shown(address)] = sock

    def _plant_at(self, path: Path) -> None:
        """Bind one path witness through its directory's descriptor; keep both."""
        site = open_dir(path.parent)
        sock: socket.socket | None = None
        try:
            sock = bind_unix(f"/proc/self/fd/{site.fd}/{path.name}")
            ident = _socket_identity(site, path.name)
            # Connecting needs write permission on the socket inode: open to every uid, as a
            # daemon socket meant for ordinary users is; the directory decides. `expect`
            # refuses anything but the socket just bound.
            site.chmod(path.name, 0o666, expect=ident)
        except (OSError, UnsafePathError):
            if sock is not None:
                sock.close()
            site.close()
            raise
        sock.setblocking(False)  # noqa: FBT003  (the socket API's own positional flag)
        self.planted[str(path)] = sock
        self._sites[str(path)] = (site, ident)

    def identities(self) -> dict[str, Identity]:
        """Each planted path witness's (st_dev, st_ino), by its host path.

        What the host's walk of a payload's view matches (host/viewwalk.py): a witness bound
        in at another inside path is still this socket.
        """
        return {address: ident for address, (_, ident) in self._sites.items()}

    def moved(self, address: str) -> str:
        """Why the directory of a path witness is no longer the one planted in, or "".

        Its owner removed it, or replaced it (renamed away, or removed and made again under
        the same name): the host's change, never the sandbox's. An abstract witness has no
        directory.
        """
        held = self._sites.get(address)
        return site_moved(held[0]) if held is not None else ""

    def replaced(self, address: str) -> str:
        """Why a path witness is not the socket planted, in a directory that stayed, or ""."""
        held = self._sites.get(address)
        if held is None:
            return ""
        site, ident = held
        now = site.entry(Path(address).name)
        if now is None:
            return f"{address} is gone from its directory"
        if (now.st_dev, now.st_ino) != ident:
            return f"{address} is another object now (inode {now.st_ino})"
        return ""

    def start(self) -> None:
        """Listen on every planted witness in one background thread."""
        self._wake = socket.socketpair()
        self._thread = threading.Thread(
            target=self._serve, name=f"socket-witness-{self.nonce}", daemon=True
        )
        self._thread.start()

    def enter_control(self) -> None:
        """From now on connections are the host control's, not the cell's."""
        with self._lock:
            self._phase = "host-control"

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        for address, sock in self.planted.items():
            selector.register(sock, selectors.EVENT_READ, address)
        if self._wake is not None:
            selector.register(self._wake[1], selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=1.0):
                    if key.data is None:  # the wake-up: stop() was called
                        continue
                    listener: socket.socket = key.fileobj  # type: ignore[assignment]  # registered above
                    with contextlib.suppress(OSError):
                        conn, _ = listener.accept()
                        self._hear(str(key.data), conn)
        finally:
            selector.close()

    def _hear(self, address: str, conn: socket.socket) -> None:
        """Record who connected and the one line it sent, then close."""
        with conn:
            pid = uid = gid = None
            with contextlib.suppress(OSError):
                raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                pid, uid, gid = struct.unpack("3i", raw)
            with self._lock:
                phase = self._phase
            data = b""
            conn.setblocking(True)  # noqa: FBT003  (the socket API's own positional flag)
            conn.settimeout(READ_S)
            deadline = time.monotonic() + READ_S
            with contextlib.suppress(OSError):
                while b"\n" not in data and len(data) < LINE_MAX and time.monotonic() < deadline:
                    chunk = conn.recv(LINE_MAX - len(data))
                    if not chunk:
                        break
                    data += chunk
        text = data.decode("latin-1")
        entry = {
            "witness": address,
            "phase": phase,
            "peer": {"pid": pid, "uid": uid, "gid": gid},
            "line": text[:LINE_MAX],
            "time": time.time(),
        }
        with self._lock:
            self._log.append(entry)

    def records(self) -> list[dict[str, Any]]:
        """Every connection heard so far, in order."""
        with self._lock:
            return list(self._log)

    def heard(self, nonce: str, phase: str = "cell") -> list[dict[str, Any]]:
        """The connections of `phase` whose line carried `nonce`."""
        return [e for e in self.records() if e["phase"] == phase and nonce in e["line"]]

    def stop(self) -> list[str]:
        """Stop listening, close and remove every witness, forget the journal entry.

        Returns:
            The witness paths removed from the host.
        """
        self._stop.set()
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[0].send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._wake is not None:
            for end in self._wake:
                end.close()
            self._wake = None
        removed: list[str] = []
        for address, sock in self.planted.items():
            sock.close()
            held = self._sites.pop(address, None)
            if held is None:
                continue
            site, ident = held
            # Only our own socket, by identity, through the directory held since plant time:
            # a payload or the directory's owner may have put something else at the name.
            with contextlib.suppress(OSError, UnsafePathError):
                if site.unlink(Path(address).name, expect=ident):
                    removed.append(address)
            site.close()
        self.planted.clear()
        if self.journal_key:
            sweep.forget(self.journal_key)
        return removed


def _socket_identity(site: SafeDir, name: str) -> Identity:
    """The identity of the socket at `name` in `site`, or UnsafePathError naming what is there."""
    made = site.entry(name)
    if made is None or not stat.S_ISSOCK(made.st_mode):
        msg = f"{site.shown}/{name} is not the socket just bound there"
        raise UnsafePathError(msg)
    return (made.st_dev, made.st_ino)


def _shown(address: str) -> str:
    """An address as the evidence shows it: abstract names with `@` for the NUL, as Linux."""
    return "@" + address[1:] if address.startswith("\0") else address


def remove_nonce_files(directories: list[Path], nonce: str) -> list[str]:
    """Remove every entry carrying `nonce` in its name from each directory; never follows links.

    What a leaky cell may leave on the host (`rogue-<nonce>.sock`, `shim-<nonce>.py`, a
    witness) goes, whatever it is; a directory is never entered.

    Returns:
        The paths removed.
    """
    removed: list[str] = []
    for directory in dict.fromkeys(directories):
        # Through the directory's descriptor (sandbox_attest/host/safefs.py): /tmp and /run dirs
        # are other users' to change, and a directory swapped for a symlink is not entered.
        try:
            place = open_dir(Path(directory))
        except (OSError, UnsafePathError):
            continue
        with place:
            names = [n for n in os.listdir(place.fd) if nonce in n]  # noqa: PTH208  (an fd)
            for name in names:
                with contextlib.suppress(OSError, UnsafePathError):
                    now = place.entry(name)
                    if now is not None and not stat.S_ISDIR(now.st_mode):
                        place.unlink(name, expect=(now.st_dev, now.st_ino))
                        removed.append(str(Path(directory) / name))
    return removed
