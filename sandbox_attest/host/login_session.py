"""The login session an ordinary agent user has: its runtime directory and an ssh-agent's.

An agent runs as an ordinary user with a login session, and the unix sockets a careless
sandbox exposes are that session's: `$XDG_RUNTIME_DIR` (`/run/user/<uid>`, 0700 and the
user's, where the D-Bus session bus, gpg-agent, rootless docker and podman keep their sockets)
and the ssh-agent socket `SSH_AUTH_SOCK` names (`/tmp/ssh-XXXXXXXXXX/agent.<pid>`, in a 0700
directory of the user's, as ssh-agent makes it). The payload user is a system account with
no session at all, so without this the class goes untested.

`open_session` makes what a login would: the runtime directory and the ssh-agent directory,
each 0700 and owned by the payload user, made by root through directory descriptors
(sandbox_attest/host/safefs.py: the user owns them and can change what is in them). It says
where the session's daemons keep their sockets (`LoginSession.sites`); the catalogue plants
its witness sockets there. `close` removes what it made, and the journal (host/journal.py)
names it first, so a killed run's session is swept by the next. One run holds a user's session
at a time (a lock in the harness's state dir), since the daemons' socket names are fixed.

What it does not do: start any real daemon, or listen. It makes places, nothing more.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sandbox_attest.host import journal
from sandbox_attest.host.safefs import SafeDir, UnsafePathError, open_dir

if TYPE_CHECKING:
    from sandbox_attest.host.trust import PayloadUser

RUN: Final = Path("/run")
RUNTIME_PARENT: Final = "user"
TMP: Final = Path("/tmp")  # noqa: S108  (ssh-agent's own place for its socket directory)
# Where a session's daemons keep their sockets, relative to $XDG_RUNTIME_DIR, and what each is.
RUNTIME_SOCKETS: Final[dict[str, str]] = {
    "bus": "D-Bus session bus",
    "gnupg/S.gpg-agent": "gpg-agent",
    "docker.sock": "rootless docker",
    "podman/podman.sock": "rootless podman",
}
SSH_AGENT: Final = "ssh-agent"
# The session's socket names are fixed, so two runs on one host (as root) would fight over
# them: one run holds a user's session at a time, by a lock in the harness's journal dir
# (root's 0700: never in the runtime dir, which the payload user owns). Another run waits
# this long for it, then goes on without a session, and says so.
LOCK_WAIT_S: Final = 30.0


# The session open in this process, if any: a command wrapper is started with an agent's
# environment, and an agent's has the session's variables (`current_env`).
_current: list[LoginSession] = []


def current_env() -> dict[str, str]:
    """The open session's XDG_RUNTIME_DIR and SSH_AUTH_SOCK, or nothing when none is open.

    A command wrapper's environment is an agent's (backends/command/env.py), and an agent
    started from a login has these; a sandbox that passes them on and exposes what they name
    is what ipc_unix_socket_escape looks for.
    """
    return _current[-1].env() if _current else {}


class SessionBusyError(OSError):
    """Another live run holds this user's login session."""


def _lock(uid: int, wait: float) -> int:
    """The held lock on `uid`'s session (an fd to close to release it).

    Raises:
        SessionBusyError: another run held it for all of `wait` seconds.
    """
    # The journal's directory: made 0700 and checked to be the harness's alone. The sweep
    # reads only its *.json entries.
    path = journal.journal_dir() / f".login-session-{uid}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                msg = f"another run holds the login session of uid {uid} (lock {path})"
                raise SessionBusyError(msg) from None
            time.sleep(0.05)
        else:
            return fd


@dataclass
class LoginSession:
    """One payload user's session: where it is, its environment, where its daemons listen.

    No public constructor: get one from `open_session`; `close` it when the run is done.

    Attributes:
        runtime: the runtime directory (`$XDG_RUNTIME_DIR`).
        ssh_sock: the ssh-agent socket path (`$SSH_AUTH_SOCK`).
        journal_key: the journal entry naming everything made.
    """

    runtime: Path
    ssh_sock: Path
    journal_key: str
    lock_fd: int = -1
    # The directories made, deepest first, each with the SafeDir of its parent.
    _made: list[tuple[SafeDir, str]] = field(default_factory=list)
    _open: list[SafeDir] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """The variables a login session gives: XDG_RUNTIME_DIR and SSH_AUTH_SOCK."""
        return {"XDG_RUNTIME_DIR": str(self.runtime), "SSH_AUTH_SOCK": str(self.ssh_sock)}

    def sites(self) -> dict[Path, str]:
        """Each socket path of the session's daemons -> what daemon keeps it there."""
        found = {self.runtime / rel: what for rel, what in RUNTIME_SOCKETS.items()}
        found[self.ssh_sock] = SSH_AGENT
        return found

    def close(self) -> list[str]:
        """Remove the directories this session made (once empty), and its journal entry.

        Returns:
            The directories removed. One something else still uses is kept, and named in
            nothing: the sweep of a later run tries again only if the journal entry stays.
        """
        removed: list[str] = []
        for parent, name in self._made:
            with contextlib.suppress(OSError, UnsafePathError):
                if parent.rmdir(name):
                    removed.append(f"{parent.path}/{name}")
        for place in reversed(self._open):
            place.close()
        self._made.clear()
        self._open.clear()
        journal.forget(self.journal_key)
        _current[:] = [other for other in _current if other is not self]
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # releases the session for another run
            self.lock_fd = -1
        return removed

    def make(self, user: PayloadUser, subdirs: list[str], ssh_dir: Path) -> None:
        """Make the runtime directory, its daemons' subdirectories and the ssh-agent directory.

        Called once, by `open_session`; what it made is what `close` removes.
        """
        owner = (user.uid, user.gid)
        run = open_dir(RUN)
        self._open.append(run)
        parent, made = _ensure_dir(run, RUNTIME_PARENT, 0o755, None)
        self._open.append(parent)
        runtime, made_runtime = _ensure_dir(parent, str(user.uid), 0o700, owner)
        self._open.append(runtime)
        # Removed deepest first: the ssh-agent dir, the daemons' dirs, the runtime dir, /run/user.
        later = [(run, RUNTIME_PARENT)] if made else []
        later = [(parent, str(user.uid))] * made_runtime + later
        for name in subdirs:
            child, made_child = _ensure_dir(runtime, name, 0o700, owner)
            self._open.append(child)
            if made_child:
                later.insert(0, (runtime, name))
        _clear_stale(runtime, [name for name in RUNTIME_SOCKETS if "/" not in name])
        for name in subdirs:
            sockets = [Path(rel).name for rel in RUNTIME_SOCKETS if str(Path(rel).parent) == name]
            _clear_stale(runtime.children[name], sockets)
        tmp = open_dir(TMP)
        self._open.append(tmp)
        agent = tmp.mkdir(ssh_dir.name, 0o700, owner)
        self._open.append(agent)
        later.insert(0, (tmp, ssh_dir.name))
        self._made.extend(later)


def _ensure_dir(
    parent: SafeDir, name: str, mode: int, owner: tuple[int, int] | None
) -> tuple[SafeDir, bool]:
    """The directory `name` in `parent`, made with mode and owner if absent; (it, made?).

    One already there is used only if it is a directory with that owner and no more access
    than `mode` gives: a session the user already has is its own, never loosened.

    Raises:
        UnsafePathError: something else is at `name` (a symlink, another user's directory).
    """
    with contextlib.suppress(FileExistsError):
        return parent.mkdir(name, mode, owner), True
    child = parent.open_subdir(name)
    st = os.fstat(child.fd)
    want_uid = owner[0] if owner is not None else os.geteuid()
    if st.st_uid != want_uid or stat.S_IMODE(st.st_mode) & ~mode:
        child.close()
        msg = (
            f"{child.shown} is already there, owned by uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}: not a session directory the harness may use"
        )
        raise UnsafePathError(msg)
    return child, False


def _clear_stale(place: SafeDir, names: list[str]) -> None:
    """Remove a socket left at a daemon's name (a killed run's, or one the user put there).

    Only while this run holds the session's lock: no live run listens there then. Never a
    directory, never followed (safefs).
    """
    for name in names:
        st = place.entry(name)
        if st is not None and stat.S_ISSOCK(st.st_mode):
            place.unlink(name, expect=(st.st_dev, st.st_ino))


def session_dirs() -> list[Path]:
    """The ssh-agent and runtime directories of the sessions this process holds open.

    They are the harness's fixtures: a cell's own witness planted in one (it holds a socket,
    so a walk for socket directories finds it) kept the directory from being removed when
    the session closed before that cell ended, and left `/tmp/ssh-*` behind.
    """
    return [d for session in list(_current) for d in (session.ssh_sock.parent, session.runtime)]


def open_session(user: PayloadUser, wait: float = LOCK_WAIT_S) -> LoginSession:
    """Make the payload user's login session (see the module docstring), holding its lock.

    Raises:
        SessionBusyError: another run held the session for `wait` seconds.
        OSError, UnsafePathError: a place could not be made safely (the caller says why).
    """
    lock_fd = _lock(user.uid, wait)
    runtime = RUN / RUNTIME_PARENT / str(user.uid)
    ssh_dir = TMP / f"ssh-{secrets.token_hex(5)}"
    ssh_sock = ssh_dir / f"agent.{os.getpid()}"
    session = LoginSession(
        runtime, ssh_sock, f"login-session-{user.uid}-{secrets.token_hex(4)}", lock_fd
    )
    subdirs = sorted({str(Path(rel).parent) for rel in RUNTIME_SOCKETS} - {"."})
    try:
        # Journalled first, deepest first: a killed run's sweep removes its ssh-agent socket,
        # then every directory that is empty (one the user really had is never empty). The
        # daemons' sockets keep fixed names another live run may hold by then, so the sweep
        # is not told them: the next run to hold the lock clears them (`_clear_stale`).
        journal.record(
            session.journal_key,
            [session.ssh_sock],
            dirs=(*(runtime / d for d in subdirs), ssh_dir, runtime),
        )
        session.make(user, subdirs, ssh_dir)
    except BaseException:
        session.close()
        raise
    _current.append(session)
    return session
