"""Faults a test injects into a running world from outside: the DNS fixture and the origins.

The egress proxy is a process of its own, so a test kills it by pid. The DNS fixture and the
origins are threads of the harness, which nothing outside can stop; for them a test sets
`$SANDBOX_ATTEST_TEST_FAULTS` to a directory before it starts the run, and creates a file in
it while a cell runs:

| file                      | what the world does                                        |
| ---                       | ---                                                        |
| `dns-stop`                | stops the DNS fixture (what a crashed resolver looks like) |
| `origins-stop-accepting`  | closes every origin's listener (connect refused)           |
| `origins-stop-answering`  | origins accept, and never answer                            |

Each file is renamed to `<name>.done` once the fault is in place, so the test knows when.

Why this is safe to ship: it is inert unless the variable is set in the *harness's* own
environment, which nothing sandboxed can write (payloads get a scrubbed environment built
from nothing, and run as another uid). The directory must belong to the harness's euid and
be writable by nobody else, or the world refuses to start: otherwise the payload user could
create the trigger files itself. What this does not do: it never touches the proxy, the
listeners or the daemons, and it injects each fault at most once.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from sandbox_attest.errors import FixtureError

FAULTS_ENV: Final = "SANDBOX_ATTEST_TEST_FAULTS"
# Short: a test injects a fault while one cell runs, and the cell lasts about a second.
_POLL_S: Final = 0.01


def fault_dir() -> Path | None:
    """The directory named by `$SANDBOX_ATTEST_TEST_FAULTS`, or None when it is not set.

    Raises:
        FixtureError: it is set but names no directory of the harness's euid that only it
            can write. The world then refuses to start (every cell ERROR, saying this): a
            directory the payload user could write would let a payload inject the faults,
            and a test that set the variable must learn why its fault never came.
    """
    value = os.environ.get(FAULTS_ENV)
    if not value:
        return None
    path = Path(value)
    try:
        info = path.stat()
    except OSError as exc:
        raise FixtureError(
            f"{FAULTS_ENV}={value} is not usable ({exc.strerror}); unset it (it is a test hook)"
        ) from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise FixtureError(
            f"{FAULTS_ENV}={value} must be a directory of uid {os.geteuid()} that no one else "
            "can write; make it with mode 0700, or unset the variable (it is a test hook)"
        )
    return path


class FaultHook:
    """A thread that injects the faults named by trigger files; see the module docstring.

    No public constructor use outside the world: `start_world` makes one when `fault_dir()`
    names a directory, and `stop` ends it with the world.
    """

    def __init__(self, directory: Path, actions: dict[str, Callable[[], None]]) -> None:
        """Watch `directory` for the files named by `actions`' keys."""
        self.directory = directory
        self.actions = dict(actions)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="world-faults", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; safe to call twice."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _watch(self) -> None:
        while not self._stop.wait(_POLL_S):
            for name in list(self.actions):
                trigger = self.directory / name
                if not trigger.exists():
                    continue
                action = self.actions.pop(name)
                try:
                    action()
                finally:
                    with contextlib.suppress(OSError):
                        trigger.rename(self.directory / f"{name}.done")
