"""Trust domains: the uid that sandboxed code runs as, apart from the harness that judges it.

The harness holds what a hostile payload would want: the signing key (in its signer process),
the report directory, and the fixture logs that witness an escape. A payload, or the wrapper
that starts it, running as the harness's own user could read all of them through
`/proc/<ancestor>/environ`, `cmdline` and `cwd`, whatever the wrapper's own environment says.
So where the harness runs as root on Linux, every sandboxed command (the control leg's
payload, bubblewrap, a command wrapper, and the host baselines that stand in for an
unconfined payload) runs as a dedicated unprivileged user, `agent` by default,
created on first use. That is also how real agents run: as an ordinary user.

What this does not do: it does not confine anything. The payload uid can still do whatever an
ordinary user can do on the host; the probes measure what the sandbox takes away from that.
Where the harness is not root (or not on Linux) it cannot switch uid, and the run's measured
trust domains (`sandbox_attest.host.separation.trust_domains`) say so; the signed statement
carries that fact and `verify` prints it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_attest.errors import ConfigError, FixtureError
from sandbox_attest.host import lifetime, safefs

# The default payload user. A system account: no password, its own group. A neutral name,
# as an agent's own account would have: a wrapper reads it (`id`, /etc/passwd), and one named
# for the harness tells the wrapper it is under test (issue 23). "agent" is no account that
# Debian, Ubuntu, Fedora or the common CI images create; one that exists as a person's account
# (uid FIRST_PERSON_UID or above) is refused, never taken over (`payload_user`). An account
# `sandbox-attest` left by earlier versions is no longer used: pass --payload-user
# sandbox-attest to keep it, or remove it (`userdel -r sandbox-attest`).
PAYLOAD_USER = "agent"
# Below this uid an account is a system account (useradd --system; login.defs SYS_UID_MAX).
FIRST_PERSON_UID = 1000
# Its home, owned by it: canaries that stand for "the user's secrets" are planted here, so a
# run never writes fake secrets into a real person's home.
#
# The home is the user's to write (tools keep their caches there), so everything in it may be
# swapped for a symlink at any moment (issue 23). What keeps the harness safe there:
#   - the home's parent is root's and not writable by anyone else (`_ensure_home` refuses to
#     run otherwise), so the home itself cannot be swapped; it is opened with no symlink on
#     the way (`open_home`) and its identity is checked before and after every cell;
#   - the canary dirs in it (~/.ssh, ~/.aws, ~/.docker) are made fresh per cell by the harness,
#     root-owned (the payload user only has to read the canaries in them), and every
#     operation inside goes through sandbox_attest/host/safefs.py, never by path.
# The home is not replaced per run, on purpose: concurrent runs on one machine share the
# account, and a rename under a running run would pull its canaries away mid-cell.
# Neutral too: /etc/passwd shows it to every user (issue 23).
PAYLOAD_HOME = Path("/var/lib/agent/home")
# A shell, because wrappers run commands through the user's shell (firejail does), and with
# nologin they print "This account is currently not available". The account has no password:
# nobody logs in as it; root starts its processes.
PAYLOAD_SHELL = "/bin/sh"
# Override for tests and for hosts that keep their own account: the name of an existing user.
USER_ENV = "SANDBOX_ATTEST_PAYLOAD_USER"


@dataclass(frozen=True)
class PayloadUser:
    """The unprivileged account sandboxed commands run as.

    No public constructor: get one from `payload_user()`.
    """

    name: str
    uid: int
    gid: int
    groups: frozenset[int]
    home: Path

    def popen_kwargs(self) -> dict[str, Any]:
        """`subprocess.Popen` arguments that start a child as this user and nothing more.

        `extra_groups` is set explicitly: without it the child would keep root's
        supplementary groups (docker, disk, ...), which is a privilege the payload must not
        inherit from the harness.
        """
        return {"user": self.uid, "group": self.gid, "extra_groups": sorted(self.groups)}

    def as_dict(self) -> dict[str, Any]:
        """The user as it goes into the evidence."""
        return {
            "name": self.name,
            "uid": self.uid,
            "gid": self.gid,
            "groups": sorted(self.groups),
            "home": str(self.home),
        }


_lock = threading.Lock()
_cached: dict[str, PayloadUser | None] = {}


def separation_possible() -> tuple[bool, str]:
    """Whether this process can run children as another uid, and why not."""
    if not sys.platform.startswith("linux"):
        return False, f"uid separation is implemented on Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, (
            f"the harness runs as uid {os.geteuid()}, not root, so it cannot start sandboxed "
            "commands as another user; they run as the harness's own user"
        )
    return True, ""


def _lookup(name: str) -> PayloadUser:
    # pwd and grp exist on POSIX only; this module is imported on Windows too.
    import grp  # noqa: PLC0415
    import pwd  # noqa: PLC0415

    entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ConfigError(
            f"payload user {name!r} is uid 0; sandboxed commands must run as an unprivileged "
            f"user: unset ${USER_ENV} or name an ordinary account"
        )
    groups = frozenset(g.gr_gid for g in grp.getgrall() if name in g.gr_mem) - {entry.pw_gid}
    return PayloadUser(name, entry.pw_uid, entry.pw_gid, groups, Path(entry.pw_dir))


def _create(name: str) -> None:
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    PAYLOAD_HOME.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    argv = [
        useradd,
        "--system",
        "--user-group",
        "--home-dir",
        str(PAYLOAD_HOME),
        "--create-home",
        "--shell",
        PAYLOAD_SHELL,
        "--comment",
        "agent",  # the GECOS field is world-readable: nothing that names the harness
        name,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    # Exit 9: the name exists already (another run created it a moment ago): fine.
    if done.returncode not in (0, 9):
        raise ConfigError(
            f"could not create the payload user {name!r} ({' '.join(argv)} exited "
            f"{done.returncode}: {done.stderr.strip()}); create it by hand with that command, "
            f"or name an existing unprivileged user in ${USER_ENV}"
        )


def payload_user(name: str | None = None) -> PayloadUser | None:
    """The payload user of this run, created on first use; None where there is no separation.

    Args:
        name: an account to use instead of the default (a spec's `[run] user`); by default
            `$SANDBOX_ATTEST_PAYLOAD_USER` (which `run --payload-user` sets), else `agent`.

    Raises:
        ConfigError: the account is root, or cannot be created; the message names the fix.
    """
    ok, _ = separation_possible()
    if not ok:
        return None
    wanted = name or os.environ.get(USER_ENV) or PAYLOAD_USER
    with _lock:
        if wanted in _cached:
            return _cached[wanted]
        try:
            user = _lookup(wanted)
        except KeyError:
            if wanted != PAYLOAD_USER:
                raise ConfigError(
                    f"payload user {wanted!r} does not exist; create it (useradd --system "
                    f"{wanted}) or unset ${USER_ENV} to use {PAYLOAD_USER!r}"
                ) from None
            _create(wanted)
            user = _lookup(wanted)
        if wanted == PAYLOAD_USER:
            if user.uid >= FIRST_PERSON_UID:
                # A neutral name may be a person's: their home would get our canaries and
                # their shell our setting. Only a system account is taken as ours.
                raise ConfigError(
                    f"an account named {wanted!r} exists with uid {user.uid}, a person's "
                    f"account, not the system account the harness creates; name another "
                    f"payload user with --payload-user NAME (or ${USER_ENV})"
                )
            _ensure_shell(wanted)
        _ensure_home(user)
        _cached[wanted] = user
        return user


def _ensure_shell(name: str) -> None:
    """Our own account keeps a real shell (an earlier version created it with nologin)."""
    import pwd  # noqa: PLC0415  (POSIX only, see _lookup)

    if pwd.getpwnam(name).pw_shell == PAYLOAD_SHELL:
        return
    usermod = shutil.which("usermod") or "/usr/sbin/usermod"
    done = subprocess.run(
        [usermod, "--shell", PAYLOAD_SHELL, name],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if done.returncode != 0:
        raise ConfigError(
            f"could not give the payload user {name!r} the shell {PAYLOAD_SHELL} "
            f"({done.stderr.strip()}); run `usermod --shell {PAYLOAD_SHELL} {name}`"
        )


def _ensure_home(user: PayloadUser) -> None:
    """The home exists, belongs to the user, and only the user (and root) can enter it.

    Its parent must be root's and writable by nobody else: a parent the payload user (or
    anyone) could write would let them swap the home itself, and with it every directory the
    harness opens there. The parent is made (root's, 0755) when it does not exist.

    Raises:
        ConfigError: the parent is not root's, or others may write it; the message names it.
        UnsafePathError: the home, or a directory above it, is a symlink.
    """
    home = user.home
    # Root-only path: /var/lib (or wherever the account's home lives) is root's to write.
    home.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with safefs.open_dir(home.parent, shown=f"the payload home's parent {home.parent}") as up:
        st = os.fstat(up.fd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError(
                f"the payload home's parent {home.parent} is owned by uid {st.st_uid} with mode "
                f"{stat.S_IMODE(st.st_mode):o}; it must be root's and writable by nobody else, "
                f"or the home could be swapped under the harness: chown root {home.parent} && "
                f"chmod go-w {home.parent}, or give the account a home under such a directory"
            )
        if up.entry(home.name) is None:
            up.mkdir(home.name, 0o700, (user.uid, user.gid), shown="the payload home")
            return
        made = up.open_subdir(home.name, shown=f"the payload home {home}")
        if os.fstat(made.fd).st_uid != user.uid:
            os.fchown(made.fd, user.uid, user.gid)
        os.fchmod(made.fd, 0o700)


def open_home(user: PayloadUser | None) -> safefs.SafeDir:
    """The payload home, opened with no symlink on the way (the caller closes it).

    Without separation that is the harness user's own home, where no other user acts.

    Raises:
        UnsafePathError: the home or a directory above it is a symlink (named).
    """
    home = user.home if user is not None else Path.home()
    return safefs.open_dir(home, shown=f"the payload home {home}")


def home_identity(user: PayloadUser | None) -> tuple[safefs.Identity | None, str]:
    """(The payload home's (device, inode), "") or (None, why it could not be opened safely)."""
    try:
        with open_home(user) as home:
            return home.identity(), ""
    except (OSError, safefs.UnsafePathError) as exc:
        return None, str(exc)


def give(path: Path, user: PayloadUser | None, *, recursive: bool = False) -> None:
    """Hand a harness-made path to the payload user (no-op without separation).

    Used for what an unconfined payload must be able to touch (its workspace, the canaries a
    control leg must reach), so that a denial inside a sandbox is the sandbox's doing, not
    file permissions.

    Through descriptors (sandbox_attest/host/safefs.py), because the payload user may be changing
    the tree while root walks it: no component of `path` may be a symlink, nothing below it
    is followed, and a recursive give changes only what the harness itself owns (never a
    hard link nor an object of another user that the payload put there).

    Raises:
        UnsafePathError: a component of `path` is a symlink (named, with its target).
        FileNotFoundError: nothing is at `path`.
    """
    if user is None:
        return
    owner = (user.uid, user.gid)
    with safefs.open_dir(path.parent) as parent:
        st = parent.entry(path.name)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, "nothing to give to the payload user", str(path))
        if not stat.S_ISDIR(st.st_mode):
            parent.chown(path.name, owner, expect=(st.st_dev, st.st_ino))
            return
        top = parent.open_subdir(path.name)
        if top.identity() != (st.st_dev, st.st_ino):
            raise safefs.UnsafePathError(f"{path} was swapped while the harness gave it")
        os.fchown(top.fd, *owner)
        if recursive:
            safefs.chown_tree(top, owner, only_uid=os.geteuid())


def unreachable_by(path: Path, user: PayloadUser | None) -> Path | None:
    """The first directory on the way to `path` that `user` cannot traverse, or None.

    Checked by mode bits (owner, group, other), the way the kernel checks search permission.
    A world or scratch directory under a 0700 parent would make every cell measure file
    modes instead of the sandbox, so the harness refuses to start on one.
    """
    if user is None:
        return None
    groups = {user.gid, *user.groups}
    for directory in [*reversed(path.parents), path]:
        st = directory.stat()
        if st.st_uid == user.uid:
            bit = 0o100
        elif st.st_gid in groups:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            return directory
    return None


def require_reachable(path: Path, user: PayloadUser | None, what: str) -> None:
    """Raise unless `user` can traverse every directory down to `path`.

    Raises:
        FixtureError: naming the blocking directory, its mode, and the fix.
    """
    blocked = unreachable_by(path, user)
    if blocked is not None:
        raise FixtureError(
            f"the payload user cannot reach {what} {path}: {blocked} is not searchable by it "
            f"(mode {blocked.stat().st_mode & 0o777:o}); chmod o+x it, or put {what} under a "
            "directory others can traverse, as `sandbox-attest run` does"
        )


# The measuring child of `measure_as`. It imports the measured module while it is still
# root, then takes the payload user's ids for good (groups, gid, uid: saved ids too, so there
# is no way back) before it calls the function; the credential change clears the parent-death
# signal, so it is armed again (PR_SET_PDEATHSIG = 1), and a parent already gone ends it.
_MEASURE_CODE = """
import ctypes, importlib, json, os, signal, sys
uid, gid, groups, parent, orphaned = sys.argv[1:6]
job = json.load(sys.stdin)
measure = getattr(importlib.import_module(job["module"]), job["function"])
arguments = [job["argument"]] if "argument" in job else []
os.setgroups([int(g) for g in groups.split(",") if g])
os.setresgid(int(gid), int(gid), int(gid))
os.setresuid(int(uid), int(uid), int(uid))
if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_PDEATHSIG) failed after the switch to the payload user")
if os.getppid() != int(parent):
    os._exit(int(orphaned))
print(json.dumps(measure(*arguments)))
"""
# `measure_as`'s default: call the function with no argument at all (None is an argument).
_NO_ARGUMENT: Any = object()


def measure_as(
    user: PayloadUser,
    module: str,
    function: str,
    timeout: float,
    *,
    argument: object = _NO_ARGUMENT,
) -> tuple[Any, str]:
    """Call `module.function()` in a child running as `user`, unconfined; its JSON result.

    What an open host lets the payload user do (write, open a device, make a raw socket) is
    the positive control of several probes, and the harness may be root: so the measurement
    runs as that user, in a child that dies with the harness.

    The child starts as root with the harness's own interpreter and switches to `user` only
    after the import (`_MEASURE_CODE`). Started as `user` it could not run where root
    installed the harness (pipx under /root/.local, a venv in a 0700 directory), and the
    interpreter the payloads use instead (sandbox_attest/host/interpreter.py) cannot import the
    measured modules: they import the harness and its compiled dependencies. What is measured
    is the user's rights, and those are the user's alone once the function runs: its uid and
    gids, no capabilities (a switch away from uid 0 clears them all). The switch also makes
    the child non-dumpable, which hides it from the payload user's ptrace: no measured
    function reads its own /proc entry.

    Args:
        user: who the function runs as.
        module: the module to import (by the child, as root).
        function: its function to call (as `user`).
        timeout: seconds the child may take.
        argument: passed to the function as JSON on stdin, when given.

    Returns:
        (the function's JSON-decoded result, "") or (None, why it could not be measured).
    """
    groups = ",".join(str(g) for g in sorted(user.groups))
    # The module and function go on stdin, not argv: the payload user can read every command
    # line, and `sandbox_attest.<module>` there would tell a wrapper it is under test (issue 23).
    job: dict[str, object] = {"module": module, "function": function}
    if argument is not _NO_ARGUMENT:
        job["argument"] = argument
    argv = [sys.executable, "-c", _MEASURE_CODE]
    argv += [str(user.uid), str(user.gid), groups, str(os.getpid()), str(lifetime.ORPHANED_EXIT)]
    try:
        done = subprocess.run(
            argv,
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
            **lifetime.popen_kwargs(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return json.loads(done.stdout), ""
    except ValueError:
        return None, f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
