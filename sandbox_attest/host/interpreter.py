"""The Python every payload runs on: one the payload user can start, chosen once per run.

The payloads (`probes/*.py`, the launcher, the in-sandbox shims) are stdlib-only and run on
3.8+, so they need no part of the harness's own installation. The harness's interpreter is
the first choice, because that is what a clone's venv gives and what every earlier report
recorded. But root installs Python tools where only root can enter: pipx under
`/root/.local`, a pyenv Python under `/root`, a venv in a `mktemp -d` directory. The payload
user cannot execute an interpreter there, and every cell would end in ERROR ("Can't find
source path ...: Permission denied") measuring file modes instead of the sandbox. So the
harness asks, by starting each candidate *as the payload user* (`os.access` as root says yes
to everything), and takes the first one that starts, is 3.8+ and has the stdlib modules the
payloads import: its own interpreter, then the system's `/usr/bin/python3`, then a `python3`
or `python3.X` on a sane PATH. Which one ran, and why the ones before it did not, goes into
the evidence (`run_facts.payload_interpreter`) and each backend's identity (`{python}`).

What this does not do: it does not make the harness's own package reachable. Host-side
measurements that import the harness as the payload user go through
`sandbox_attest.host.trust.measure_as`, which copes with an unreachable install on its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from sandbox_attest.errors import ConfigError
from sandbox_attest.host import lifetime
from sandbox_attest.host.trust import PayloadUser, payload_user

__all__ = [
    "MIN_VERSION",
    "PayloadInterpreter",
    "bind_paths_of",
    "candidates",
    "payload_interpreter",
    "run_interpreter",
]

# The oldest Python the payloads are written for (ARCHITECTURE.md: "stdlib-only, 3.8+").
MIN_VERSION: Final = (3, 8)
# Where a system Python is looked for when the harness's own is out of reach: the PATH every
# payload gets (sandbox_attest.payload.payload_env), never the harness's own PATH, which may
# lead into the same unreachable installation (pipx's ~/.local/bin).
SANE_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
# Newest first: a `python3` link is tried before these, so they matter only where it is missing.
VERSIONED_NAMES: Final = tuple(f"python3.{minor}" for minor in range(14, MIN_VERSION[1] - 1, -1))
# Every stdlib module a payload, the launcher or the shim imports; an interpreter without one
# of them (a stripped ssl, a build without ctypes) would make probes fail to make their attempt.
PAYLOAD_MODULES: Final = (
    "base64",
    "ctypes",
    "errno",
    "fcntl",
    "hashlib",
    "hmac",
    "http.client",
    "json",
    "platform",
    "resource",
    "runpy",
    "select",
    "signal",
    "socket",
    "ssl",
    "stat",
    "struct",
    "subprocess",
    "urllib.parse",
)
# Run by each candidate as the payload user: what it is, and which payload modules it lacks.
# Kept 3.8-compatible and stdlib-only, as the payloads themselves are.
_DESCRIBE: Final = """
import importlib, importlib.util, json, os, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(name + " (" + type(exc).__name__ + ")")
print(json.dumps({
    "version": list(sys.version_info[:3]),
    "executable": sys.executable,
    "realpath": os.path.realpath(sys.executable),
    "prefix": sys.prefix,
    "base_prefix": getattr(sys, "base_prefix", sys.prefix),
    "pip": importlib.util.find_spec("pip") is not None,
    "missing": missing,
}))
"""
# A healthy interpreter answers in well under a second; a cold disk or a loaded CI runner
# may take a few.
DESCRIBE_TIMEOUT_S: Final = 30.0

Source = Literal["harness", "system", "path"]


@dataclass(frozen=True)
class PayloadInterpreter:
    """The interpreter every payload of this run starts with, as the payload user saw it.

    No public constructor: get one from `payload_interpreter()`.

    Attributes:
        path: argv[0] of every payload (lexical: a venv's `bin/python` stays itself).
        realpath: where that path resolves.
        version: "3.11.2".
        prefixes: `sys.prefix` and `sys.base_prefix` as the interpreter reported them.
        source: "harness" (the harness's own), "system" (/usr/bin/python3) or "path" (found
            on SANE_PATH).
        pip: whether `python -m pip` can work (pkg_pip_install needs it).
        reason: why this one was chosen, in words.
        rejected: each candidate tried before it, with why it was passed over.
    """

    path: str
    realpath: str
    version: str
    prefixes: tuple[str, ...]
    source: Source
    pip: bool
    reason: str
    rejected: tuple[str, ...] = field(default=())

    def bind_paths(self) -> list[Path]:
        """What a sandbox must show the payload, read-only, for this interpreter to run."""
        return bind_paths_of(self.path, self.realpath, self.prefixes)

    def as_dict(self) -> dict[str, Any]:
        """The choice as it goes into the evidence (`run_facts.payload_interpreter`)."""
        return {
            "path": self.path,
            "realpath": self.realpath,
            "version": self.version,
            "prefixes": list(self.prefixes),
            "source": self.source,
            "pip": self.pip,
            "reason": self.reason,
            "rejected": list(self.rejected),
            "harness_executable": sys.executable,
        }


def bind_paths_of(path: str, realpath: str, prefixes: tuple[str, ...]) -> list[Path]:
    """The interpreter by its lexical and its resolved location, deduplicated.

    A venv's `bin/python` is a symlink into the base installation: the sandbox needs the venv
    (lexical path, pyvenv.cfg, site-packages with pip) and the base prefix it resolves into.
    Paths under /usr are left out because every backend binds /usr already, and a path nested
    in another one of the set is left out because its parent's bind carries it.
    """
    exe = Path(path)
    found = {exe.parent, Path(realpath).parent}
    for prefix in prefixes:
        found |= {Path(prefix), Path(os.path.realpath(prefix))}
    kept = sorted(p for p in found if not p.is_relative_to("/usr"))
    return [p for p in kept if not any(p != q and p.is_relative_to(q) for q in kept)]


def candidates() -> list[tuple[str, Source]]:
    """The interpreters to try, in order, each once: the harness's, the system's, then PATH's."""
    found: list[tuple[str, Source]] = [(sys.executable, "harness"), ("/usr/bin/python3", "system")]
    for name in ("python3", *VERSIONED_NAMES):
        where = shutil.which(name, path=SANE_PATH)
        if where is not None:
            found.append((where, "path"))
    seen: set[str] = set()
    unique = []
    for path, source in found:
        if path and path not in seen:
            seen.add(path)
            unique.append((path, source))
    return unique


def describe_as(python: str, user: PayloadUser | None) -> tuple[dict[str, Any] | None, str]:
    """Start `python` as `user` and ask what it is; (its answer, "") or (None, why not).

    Run with the environment and working directory a payload gets (a minimal PATH, `/`), so
    the answer is what a payload will find, not what the harness's environment would add.
    """
    try:
        done = subprocess.run(
            [python, "-c", _DESCRIBE, *PAYLOAD_MODULES],
            capture_output=True,
            text=True,
            timeout=DESCRIBE_TIMEOUT_S,
            check=False,
            cwd="/",
            env={"PATH": SANE_PATH, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
            **(user.popen_kwargs() if user is not None else {}),
            **lifetime.popen_kwargs(),
        )
    except subprocess.TimeoutExpired:
        return None, f"did not answer within {DESCRIBE_TIMEOUT_S:.0f} s"
    except OSError as exc:
        # What the kernel said to exec as that user: EACCES for a 0700 directory on the way.
        return None, f"cannot be started: {exc.strerror or exc} (errno {exc.errno})"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return None, f"failed to start: {said[0][-300:]}"
    try:
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"printed no description (stdout {done.stdout[-200:]!r})"
    if not isinstance(facts, dict):
        return None, f"printed no description (stdout {done.stdout[-200:]!r})"
    return facts, ""


def _judge(facts: dict[str, Any]) -> str:
    """Why an interpreter that started cannot run the payloads, or "" when it can."""
    version = tuple(int(v) for v in facts.get("version", [0, 0])[:2])
    if version < MIN_VERSION:
        found = ".".join(str(v) for v in facts.get("version", []))
        return f"is Python {found}, older than the payloads' {MIN_VERSION[0]}.{MIN_VERSION[1]}"
    missing = facts.get("missing") or []
    if missing:
        return f"lacks stdlib modules the payloads import: {', '.join(missing)}"
    return ""


def _chosen(
    python: str, source: Source, facts: dict[str, Any], rejected: list[str]
) -> PayloadInterpreter:
    version = ".".join(str(v) for v in facts["version"])
    if source == "harness":
        reason = "the harness's own interpreter, which the payload user can run"
    else:
        # The first refusal is the harness's own interpreter's (candidates() starts there).
        before = rejected[0] if rejected else f"{sys.executable}: not tried"
        reason = (
            f"the payload user cannot use the harness's interpreter ({before}); {python} is "
            f"the first Python {MIN_VERSION[0]}.{MIN_VERSION[1]}+ it can run"
        )
    prefixes = tuple(dict.fromkeys((str(facts["prefix"]), str(facts["base_prefix"]))))
    return PayloadInterpreter(
        path=python,
        realpath=str(facts.get("realpath") or os.path.realpath(python)),
        version=version,
        prefixes=prefixes,
        source=source,
        pip=bool(facts.get("pip")),
        reason=reason,
        rejected=tuple(rejected),
    )


def choose(
    user: PayloadUser | None, tried: list[tuple[str, Source]] | None = None
) -> PayloadInterpreter:
    """Try `tried` (default: `candidates()`) as `user`, in order; the first that can run payloads.

    Among those that can, one with pip is preferred to an earlier one without (pkg_pip_install
    runs `python -m pip` and would otherwise be unable to make its attempt); the harness's own
    interpreter is never passed over for pip alone, so a clone's venv keeps its behaviour.

    Raises:
        ConfigError: no candidate can run the payloads as `user`; the message names each
            candidate with its reason and the fix.
    """
    rejected: list[str] = []
    fallback: PayloadInterpreter | None = None
    for python, source in tried if tried is not None else candidates():
        facts, why = describe_as(python, user)
        if facts is not None:
            why = _judge(facts)
        if why:
            rejected.append(f"{python}: {why}")
            continue
        assert facts is not None  # noqa: S101  (why is "" only when facts were read)
        picked = _chosen(python, source, facts, rejected)
        if picked.pip or source == "harness":
            return picked
        fallback = fallback or picked
        rejected.append(f"{python}: has no pip; looking for one that has")
    if fallback is not None:
        return fallback
    who = f"the payload user {user.name} (uid {user.uid})" if user else "this user"
    raise ConfigError(
        f"no Python {MIN_VERSION[0]}.{MIN_VERSION[1]}+ that {who} can run was found ("
        + "; ".join(rejected)
        + "); install the system's (Debian/Ubuntu: apt-get install python3), or install "
        "the harness where others can traverse (a venv under /opt, chmod o+x on its parents)"
    )


def _unseparated() -> PayloadInterpreter:
    """The harness's own interpreter, where payloads run as the harness's own uid."""
    return PayloadInterpreter(
        path=sys.executable,
        realpath=os.path.realpath(sys.executable),
        version=".".join(str(v) for v in sys.version_info[:3]),
        prefixes=tuple(dict.fromkeys((sys.prefix, sys.base_prefix))),
        source="harness",
        pip=_has_pip(),
        reason="payloads run as the harness's own uid, which runs this interpreter already",
    )


def _has_pip() -> bool:
    import importlib.util  # noqa: PLC0415  (only for the unseparated case)

    return importlib.util.find_spec("pip") is not None


_lock = threading.Lock()
_cache: dict[int | None, PayloadInterpreter] = {}


def payload_interpreter(user: PayloadUser | None) -> PayloadInterpreter:
    """The interpreter for payloads run as `user` (None: as the harness's own uid).

    Chosen once per user and process (a few short children at the first call), then cached:
    every backend, host baseline and identity of a run names the same one.

    Raises:
        ConfigError: no interpreter the payload user can run (see `choose`).
    """
    key = user.uid if user is not None else None
    with _lock:
        if key not in _cache:
            _cache[key] = choose(user) if user is not None else _unseparated()
        return _cache[key]


def run_interpreter() -> PayloadInterpreter:
    """`payload_interpreter` of this run's payload user (`host.trust.payload_user`)."""
    return payload_interpreter(payload_user())


def forget() -> None:
    """Drop the cached choices (tests that change what a user can reach call this)."""
    with _lock:
        _cache.clear()
