"""What was tested: the harness's own commit and digests, and the executables a backend runs.

A signature over "PASSED" is only worth something if it says *what* passed. This module
pins the harness (version, git commit and dirtiness of the checkout it was imported from,
a digest of the package's files and one of the probes it runs) and, for backends, the exact
executables behind an argv[0] (resolved on the PATH the backend uses, followed through
symlinks, hashed, and for a `#!` script its interpreter too).

It does not judge any of this: the statement records it and `verify --expect-commit` checks
it. A wheel install has no git checkout, so `commit` and `dirty` are None there; the digests
still pin the installed bytes.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import sandbox_attest
from sandbox_attest import __version__
from sandbox_attest.paths import probes_dir

# The whole package, wherever this module sits in it (a module one floor down once digested
# only its own floor, host/, when the package moved into floors).
_PACKAGE_DIR = Path(sandbox_attest.__file__).resolve().parent
# Byte-compiled caches differ per interpreter and are not what was imported from; _data is
# the wheel's copy of probes/, fixtures/ and matrix/, each pinned on its own (probes here,
# matrix and policy as the run's inputs).
_SKIP_NAMES = frozenset({"__pycache__", "_data"})
_SKIP_SUFFIXES = (".pyc", ".pyo")
GIT_TIMEOUT_S = 10.0
# A shebang line longer than this is not one the kernel would honour (BINPRM_BUF_SIZE).
_SHEBANG_MAX = 256
NOT_FOUND = "not found on PATH"


def tree_digest(root: Path) -> str:
    """Hex sha256 over the regular files under `root` (caches and `_data` left out).

    The lines `sha256(content) <TAB> relative/path <LF>`, sorted by path, are hashed once,
    the same line format as `sandbox_attest.attest.subjects.tree_sha256`. Symlinks are followed
    neither as directories nor as files: a link is recorded as `link:<target>` in place of a
    content digest, so repointing one changes the digest. A missing root digests as empty.
    """
    entries: list[tuple[str, str]] = []
    if not root.is_dir():
        return hashlib.sha256(b"").hexdigest()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_NAMES)
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                entries.append((rel, f"link:{path.readlink()}"))
            elif stat.S_ISREG(mode) and not name.endswith(_SKIP_SUFFIXES):
                entries.append((rel, file_sha256(path)))
    text = "".join(f"{digest}\t{rel}\n" for rel, digest in sorted(entries))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _git(root: Path, *args: str) -> str | None:
    """The stdout of `git -C root ARGS`, or None when git is missing, fails or hangs."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run(
            [git, "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            # No pager, no prompts, no system or user config that could rewrite the answer.
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_facts(root: Path) -> tuple[str | None, bool | None]:
    """The HEAD commit of the git checkout whose top level is `root`, and whether it is dirty.

    "Dirty" means uncommitted changes to tracked files (`git status --porcelain
    --untracked-files=no`): a stray untracked file is not part of what was imported.

    Returns:
        (commit, dirty); (None, None) when `root` is not the top of a checkout (a wheel in
        site-packages, even one inside some other repository's venv), or git is unusable.
    """
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root.resolve():
        return None, None
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return head.strip(), (None if status is None else bool(status.strip()))


@functools.cache
def _harness_provenance() -> dict[str, Any]:
    commit, dirty = git_facts(_PACKAGE_DIR.parent)
    return {
        "version": __version__,
        "commit": commit,
        "dirty": dirty,
        "package_sha256": tree_digest(_PACKAGE_DIR),
        "probes_sha256": tree_digest(probes_dir()),
    }


def harness_provenance() -> dict[str, Any]:
    """The harness that ran: version, git commit and dirtiness, package and probes digests.

    Computed once per process (the files do not change during a run) and returned as a
    fresh copy, so a caller editing it cannot change what the next caller sees.

    Returns:
        `{"version", "commit", "dirty", "package_sha256", "probes_sha256"}`; `commit` and
        `dirty` are None for a wheel install (no checkout).
    """
    return copy.deepcopy(_harness_provenance())


def _shebang(path: Path) -> list[str] | None:
    """The words of a `#!` first line, or None when the file is not a script."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_SHEBANG_MAX)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
    return line.split() or None


def _env_program(words: list[str]) -> str | None:
    """The program `#!/usr/bin/env [-S] [-i] [NAME=V] PROG ...` runs, or None."""
    for word in words[1:]:
        if word.startswith("-") or "=" in word:
            continue
        return word
    return None


def executable_facts(argv0: str, path_env: str) -> dict[str, Any]:
    """What runs when `argv0` is executed with PATH=`path_env`: where it is and its sha256.

    1. resolve `argv0` on `path_env` (`shutil.which`; a name with a slash is taken as is);
    2. follow symlinks (`os.path.realpath`), so a repointed link changes the facts;
    3. hash the file; for a `#!` script, the interpreter's facts too, once (an interpreter
       that is itself a script is hashed but not followed further). `#!/usr/bin/env NAME`
       resolves NAME on the same PATH, as env would.

    Args:
        argv0: the program as a backend puts it in argv[0].
        path_env: the PATH the backend runs it with.

    Returns:
        `{"argv0", "path", "realpath", "sha256"}` plus `"interpreter": {...}` for a script
        (with `"via": "/usr/bin/env"` when env picks it); or `{"argv0", "error"}` when it is
        not found or unreadable.
    """
    return _facts(argv0, path_env, follow=True)


def _facts(argv0: str, path_env: str, *, follow: bool) -> dict[str, Any]:
    found = shutil.which(argv0, path=path_env)
    if found is None:
        return {"argv0": argv0, "error": NOT_FOUND}
    real = os.path.realpath(found)
    try:
        digest = file_sha256(Path(real))
    except OSError as exc:
        return {"argv0": argv0, "error": f"cannot read {real}: {exc.strerror}"}
    facts: dict[str, Any] = {"argv0": argv0, "path": found, "realpath": real, "sha256": digest}
    words = _shebang(Path(real)) if follow else None
    if words:
        if Path(words[0]).name == "env":
            program = _env_program(words)
            if program is not None:
                interpreter = _facts(program, path_env, follow=False)
                interpreter["via"] = words[0]
                facts["interpreter"] = interpreter
        else:
            facts["interpreter"] = _facts(words[0], path_env, follow=False)
    return facts
