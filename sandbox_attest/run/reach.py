"""Before any cell: can the payload user reach everything a backend will run and bind?

A sandbox is judged by what it takes away from the payload user. If that user cannot even
reach the interpreter, the payload files or the scratch directory, every cell fails on file
modes instead (bwrap's "Can't find source path ...: Permission denied", once per cell), and
nothing about the sandbox is learnt. So a run starts with one check, made by a child running
*as the payload user* (root's `os.access` says yes to everything, and mode bits miss ACLs and
mount options), and stops with one line naming the path, why, and the fix.

What the check covers:
  - the payload interpreter (sandbox_attest/host/interpreter.py picks one the user can run) and
    every directory a backend binds for it;
  - the temp directory the run's scratch (cells, workspaces, the CA bundle) is made in;
  - the payload files that ship with the harness (`probes/`, the egress shim). Root often
    installs the harness where only root can enter (pipx under /root/.local); then these are
    copied, once per run, into the scratch (`stage_payload_files`), a root-owned 0755 tree
    the payload user can read and not change, and every reader follows the copy
    (`sandbox_attest.paths.use_payload_copy`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from sandbox_attest.backends.base import shim_path
from sandbox_attest.errors import ConfigError
from sandbox_attest.host import lifetime
from sandbox_attest.host.interpreter import PayloadInterpreter, payload_interpreter
from sandbox_attest.host.trust import PayloadUser
from sandbox_attest.paths import payload_copy, probes_dir, use_payload_copy

__all__ = ["Need", "Problem", "check_as", "preflight", "stage_payload_files"]

# What the payload user must be able to do with a path:
#   exec    run it (the interpreter)
#   dir     list and enter it (a bound directory: its files are opened by name inside)
#   read    read it (a payload file)
#   search  enter it (the temp directory: the scratch below it is made 0755 by the harness)
Need = Literal["exec", "dir", "read", "search"]
# Run by the payload interpreter as the payload user: for each (path, need), the errno name
# of the first refusal, or nothing. Stdlib-only and 3.8-compatible, like the payloads.
_CHECK: Final = """
import errno, json, os, sys
wanted = {"exec": os.X_OK, "dir": os.R_OK | os.X_OK, "read": os.R_OK, "search": os.X_OK}
found = []
for path, need in json.loads(sys.stdin.read()):
    try:
        os.stat(path)
        if not os.access(path, wanted[need]):
            found.append([path, need, "EACCES"])
    except OSError as exc:
        found.append([path, need, errno.errorcode.get(exc.errno, str(exc.errno))])
print(json.dumps(found))
"""
CHECK_TIMEOUT_S: Final = 30.0
# The copy of the payload files inside a run's scratch; a name any program could use.
COPY_NAME: Final = "lib"


@dataclass(frozen=True)
class Problem:
    """One path the payload user cannot use as a backend needs: what, why, and the fix."""

    path: Path
    need: Need
    error: str
    what: str

    def line(self, user: PayloadUser) -> str:
        """The one line a run stops with."""
        return (
            f"the payload user {user.name} (uid {user.uid}) cannot {_VERB[self.need]} "
            f"{self.what} {self.path} ({self.error}): "
            + explain(self.path, user, self.need, _ELSEWHERE.get(self.need, ""))
        )


_VERB: Final = {"exec": "run", "dir": "enter", "read": "read", "search": "enter"}
# The permission bits `path` itself needs for each Need (every parent needs search: x).
_BITS: Final = {"exec": "x", "read": "r", "dir": "rx", "search": "x"}
# The fix besides chmod: only the temp directory ("search") is chosen by the environment.
_ELSEWHERE: Final = {"search": "set TMPDIR to a directory others can enter"}


def check_as(user: PayloadUser, python: str, items: list[tuple[Path, Need, str]]) -> list[Problem]:
    """Ask a child running `python` as `user` which of `items` it cannot use.

    Args:
        user: the payload user.
        python: an interpreter `user` can run (the payload interpreter).
        items: (path, what the user must do with it, what it is, in words).

    Raises:
        ConfigError: the checking child itself could not run or answer.
    """
    what = {str(path): (need, name) for path, need, name in items}
    try:
        done = subprocess.run(
            [python, "-c", _CHECK],
            input=json.dumps([[p, n] for p, (n, _) in what.items()]),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            **user.popen_kwargs(),
            **lifetime.popen_kwargs(),
        )
        found = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise ConfigError(
            f"could not check, as the payload user {user.name}, what it can reach "
            f"({type(exc).__name__}: {exc}); check that {user.name} can run {python}"
        ) from exc
    return [Problem(Path(p), what[p][0], error, what[p][1]) for p, _, error in found]


def explain(path: Path, user: PayloadUser, need: Need = "read", elsewhere: str = "") -> str:
    """Why `user` cannot get at `path`, read from modes and owners (root can stat them all).

    Args:
        path: what the user was refused.
        user: the payload user.
        need: what the user must do with `path` itself (its parents must all be searchable).
        elsewhere: the other fix, after "chmod": where to put it instead.
    """
    elsewhere = elsewhere or "install the harness where others can traverse (a venv under /opt)"
    groups = {user.gid, *user.groups}
    for directory in [*reversed(path.parents), path]:
        try:
            st = directory.stat()
        except OSError as exc:
            return f"{directory} cannot be examined ({exc.strerror}); check that it exists"
        shift = 6 if st.st_uid == user.uid else 3 if st.st_gid in groups else 0
        who = "u" if shift == 6 else "g" if shift == 3 else "o"
        for letter in "x" if directory != path else _BITS[need]:
            bit = (4 if letter == "r" else 1) << shift
            if not st.st_mode & bit:
                return (
                    f"{directory} is mode {stat.S_IMODE(st.st_mode):o}, owner {_owner(st)}, "
                    f"which gives {user.name} no {'read' if letter == 'r' else 'search'} "
                    f"permission; fix: chmod {who}+{letter} {directory}, or {elsewhere}"
                )
    return (
        "its modes allow it, so an ACL, a mount option (noexec) or an LSM refuses it; "
        f"fix that, or {elsewhere}"
    )


def _owner(st: os.stat_result) -> str:
    import grp  # noqa: PLC0415  (POSIX only; this module runs where uids are separated)
    import pwd  # noqa: PLC0415

    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user}:{group}"


def payload_files() -> list[tuple[Path, Need, str]]:
    """The files that ship with the harness and run inside every sandbox."""
    probes = probes_dir()
    items: list[tuple[Path, Need, str]] = [(probes, "dir", "the payload directory")]
    items += [(p, "read", "the payload") for p in sorted(probes.glob("*.py"))]
    items.append((shim_path(), "read", "the egress shim"))
    return items


@dataclass(frozen=True)
class Preflight:
    """What the check found: the interpreter, and whether the payload files need a copy."""

    python: PayloadInterpreter
    copy_needed: list[Problem]


_checked: dict[int | None, Preflight] = {}


def preflight(user: PayloadUser | None) -> Preflight:
    """Check, as `user`, everything a backend will run and bind before any cell starts.

    Checked once per user and process: the CLI asks before pytest starts (so a failure is one
    line and exit 2), the session asks again and gets the same answer.

    Returns:
        The interpreter, and the payload files `user` cannot read, which the run copies into
        its scratch (`stage_payload_files`) instead of failing.

    Raises:
        ConfigError: no interpreter `user` can run, or a path it must reach that no copy can
            fix (an interpreter's directory, the temp directory); one line with the fix.
    """
    key = user.uid if user is not None else None
    if key in _checked:
        return _checked[key]
    python = payload_interpreter(user)
    if user is None:
        _checked[key] = Preflight(python, [])
        return _checked[key]
    items: list[tuple[Path, Need, str]] = [(Path(python.path), "exec", "the payload interpreter")]
    items += [(p, "dir", "the payload interpreter's directory") for p in python.bind_paths()]
    items.append((Path(tempfile.gettempdir()), "search", "the temp directory (the run's scratch)"))
    copyable = payload_files()
    problems = check_as(user, python.path, items + copyable)
    # A payload file out of reach is copied into the scratch; anything else stops the run.
    fatal = [p for p in problems if p.path not in {path for path, _, _ in copyable}]
    if fatal:
        more = f" (and {len(fatal) - 1} more)" if len(fatal) > 1 else ""
        raise ConfigError(fatal[0].line(user) + more)
    _checked[key] = Preflight(python, [p for p in problems if p not in fatal])
    return _checked[key]


def stage_payload_files(scratch: Path, found: Preflight) -> Path | None:
    """Copy the payload files into `scratch` when `found` says the user cannot read them.

    The copy is root's, 0755/0644: the payload user reads it and changes none of it. From
    here on `probes_dir()` and `shim_path()` name the copy (sandbox_attest.paths).

    Returns:
        The copy's root, or None when the installed files are readable (nothing copied).
    """
    if not found.copy_needed:
        return None
    source_probes, source_shim = probes_dir(), shim_path()
    root = scratch / COPY_NAME
    root.mkdir(mode=0o755)
    shutil.copytree(source_probes, root / "probes", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(source_shim, root / "shim.py")
    # Explicit modes, never the umask's: the payload user reads every file and enters
    # every directory of the copy, and owns none of it.
    for dirpath, _, filenames in os.walk(root):
        Path(dirpath).chmod(0o755)
        for name in filenames:
            (Path(dirpath) / name).chmod(0o644)
    use_payload_copy(root)
    return root


def unstage() -> None:
    """Point the readers back at the installed files (the run's scratch is going away)."""
    if payload_copy() is not None:
        use_payload_copy(None)
