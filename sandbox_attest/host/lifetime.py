"""Children that die with the harness: `PR_SET_PDEATHSIG(SIGKILL)` for every process it starts.

A run starts long-lived helpers (the egress proxy, the `proc_*` anchors, the host baselines,
the payloads). When the harness exits normally it stops them itself; when it is killed
(SIGKILL, the OOM killer, a CI runner that loses patience) nothing of the harness runs any
more, so only the kernel can stop them. `die_with_harness()` returns the `preexec_fn` that
asks it to: in the child, between fork and exec, `prctl(PR_SET_PDEATHSIG, SIGKILL)`, then a
check that the parent is still the one that forked it (had it died in between, the signal
would never come, so the child exits at once instead).

Why `preexec_fn`: Python 3.11's `subprocess` has no other hook between fork and exec. It is
unsafe in a threaded parent only for code that takes locks another thread may hold at fork
time; the child here makes one ctypes call and one `getppid()` on objects built before the
fork, so no import and no lock is involved.

What the kernel does, and the rules that follow from it (tests/unit/test_lifetime.py shows
each):

1. The signal fires when the *thread* that forked the child exits, not only the process. A
   child forked from a worker thread (the cell pool, `RunSession.plan`) dies when that thread
   ends. That is the lifetime we want for per-cell children (anchors, baselines, payloads):
   the pool's threads outlive every cell they run, and the cell stops its children itself.
   A child that must live as long as the run (the proxy, the world) is started from
   the main thread, which is where the session starts the world.
2. The setting survives `execve` of an ordinary binary and the `user=`/`group=` switch that
   `subprocess` makes before calling `preexec_fn` (the switch clears it; it is set after).
   It is cleared by `execve` of a set-uid or file-capability binary: such a wrapper is not
   covered, and its children are the backend's to kill (its process group).
3. It covers the direct child only. Grandchildren that a wrapper starts are covered when the
   wrapper asks for it itself (`bwrap --die-with-parent`) or by their process group being
   killed by the backend; what survives a SIGKILL of the harness is found by the next run's
   sweep (`sandbox_attest.run.sweep`).

What this does not do: it never kills anything itself, and on platforms other than Linux it
returns None (the child is then not tied to the harness; the sweep is the only net there).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Final

# Linux <linux/prctl.h>.
PR_SET_PDEATHSIG: Final = 1
PR_GET_PDEATHSIG: Final = 2
# The child's exit status when its parent was already gone before the signal was armed: it
# must not run on unowned, so it exits before exec (the status is never seen by the harness).
ORPHANED_EXIT: Final = 125


def _prctl() -> Any:
    """The C library's prctl, resolved once in the parent (never in the forked child)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl


_PRCTL: Any = _prctl() if sys.platform.startswith("linux") else None


def die_with_harness() -> Callable[[], None] | None:
    """The `preexec_fn` that makes a child die by SIGKILL when its forking thread ends.

    Build it right before each `Popen` (it captures the current pid, to detect a parent that
    died between fork and prctl). Use `popen_kwargs()` where a dict is handier.

    Returns:
        The function, or None where the kernel has no such setting (not Linux).
    """
    if _PRCTL is None:
        return None
    prctl = _PRCTL
    # Built before the fork: the child only calls, it allocates nothing that needs a lock.
    option = ctypes.c_int(PR_SET_PDEATHSIG)
    value = ctypes.c_ulong(int(signal.SIGKILL))
    zero = ctypes.c_ulong(0)
    parent = os.getpid()

    def arm() -> None:
        if prctl(option, value, zero, zero, zero) != 0:
            # Without the setting the child could outlive a killed harness; refuse to start
            # it rather than run it untied (subprocess raises this in the parent).
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            # The parent died before the setting took: nobody will ever send the signal.
            os._exit(ORPHANED_EXIT)

    return arm


def popen_kwargs() -> dict[str, Any]:
    """`subprocess.Popen` keyword arguments that tie the child's life to the harness.

    Returns:
        `{"preexec_fn": ...}` on Linux, `{}` elsewhere; merge it into the call's kwargs.
    """
    arm = die_with_harness()
    return {} if arm is None else {"preexec_fn": arm}


def own_parent_death_signal() -> int | None:
    """The parent-death signal this process has armed (0: none); None where not Linux.

    The kernel tells only the process itself (`PR_GET_PDEATHSIG`); the tests run it in a child
    to show what `die_with_harness` armed there.
    """
    if _PRCTL is None:
        return None
    got = ctypes.c_int(0)
    if _PRCTL(PR_GET_PDEATHSIG, ctypes.byref(got), 0, 0, 0) != 0:
        return None
    return got.value


# ---------------------------------------------------------------------------------------------
# Signals that end a run: each becomes RunInterrupted, so the run ends as Ctrl-C ends it.

# What `timeout`, a CI cancel and `docker stop` send (SIGTERM), a closed terminal (SIGHUP), and
# Ctrl-C. Each cuts the run short the same way; the exit status says which (128 + number).
RUN_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class RunInterrupted(KeyboardInterrupt):
    """A signal cut the run short; pytest handles it as it handles Ctrl-C.

    Derives from KeyboardInterrupt because pytest (and `subprocess`'s waits) treat that one
    as "stop now, but finish the session": the running cell becomes ERROR, and every
    artefact is still written and signed as incomplete.
    """

    def __init__(self, signum: int) -> None:
        """Keep the signal's number; the message is its name ("SIGTERM")."""
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def signame(self) -> str:
        """The signal's name, as the evidence and the gate line say it."""
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """The shell's convention for a death by this signal: 128 + its number."""
        return 128 + self.signum


class RunSignals:
    """The handlers that turn RUN_SIGNALS into RunInterrupted, installed for one run.

    No public state besides `caught`; get one from `catch_run_signals()`. Only the first
    signal raises: a later one arrives while the run is already writing its artefacts, and
    raising again would abandon the very report the first one was stopping to write. It is
    recorded, and SIGKILL still stops everything at once (the next run sweeps what is left).
    """

    def __init__(self) -> None:
        """Nothing caught yet, nothing installed."""
        self.caught: RunInterrupted | None = None
        self.later: list[str] = []
        self._previous: dict[int, Any] = {}
        self._holding = False

    def _handle(self, signum: int, frame: object) -> None:
        del frame  # the signal API's argument; where the run was cut is in the traceback
        if self.caught is not None or self._holding:
            self.later.append(signal.Signals(signum).name)
            return
        self.caught = RunInterrupted(signum)
        raise self.caught

    def hold(self) -> None:
        """From now on record signals, never raise: every cell ran, the report is being written.

        A first signal that raised inside the writing (stopping the world, signing) would
        abandon the report of a run that had finished judging; it is recorded in `later`.
        """
        self._holding = True

    def install(self) -> None:
        """Install the handlers (main thread only; elsewhere Python refuses, so do nothing)."""
        import threading  # noqa: PLC0415  (only a run installs handlers)

        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        # A new run in this process starts uncut, and raises again until it holds: an
        # earlier run's signal must not end (or mark incomplete) the next one.
        self._holding = False
        self.caught = None
        self.later = []
        for signum in RUN_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before `install`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


_RUN_SIGNALS = RunSignals()


def catch_run_signals() -> RunSignals:
    """The process's run-signal handlers, installed (idempotent: one set per process).

    Returns:
        The handlers; `.caught` is the first signal's RunInterrupted, or None.
    """
    _RUN_SIGNALS.install()
    return _RUN_SIGNALS


def hold_run_signals() -> None:
    """Every cell ran: record run signals from now on instead of raising (`RunSignals.hold`)."""
    _RUN_SIGNALS.hold()


def caught_signal() -> RunInterrupted | None:
    """The signal that cut this process's run short, if any."""
    return _RUN_SIGNALS.caught
