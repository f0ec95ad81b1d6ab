"""run_process when the process group cannot be killed: say so, and never hang."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from sandbox_attest.backends import process


def test_group_we_may_not_signal_is_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PermissionError from killpg (a setuid wrapper) lands in the run's notes."""

    def refuse(pgid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "killpg", refuse)
    run = process.run_process("c", [sys.executable, "-c", "pass"], {}, tmp_path, 30)
    assert any("could not SIGKILL process group" in note for note in run.notes), run.notes


# The Popen of the wrapper left behind is collected while its child still runs: expected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_unkillable_wrapper_does_not_hang_the_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper that survives SIGKILL of its group is left behind after KILL_WAIT_S."""
    sent: list[int] = []

    def ignore(pgid: int, sig: int) -> None:  # the wrapper is out of our reach
        sent.append(pgid)

    monkeypatch.setattr(os, "killpg", ignore)
    monkeypatch.setattr(process, "KILL_WAIT_S", 0.5)
    wrapper_s = 60  # how long the wrapper lives unless killed
    argv = [sys.executable, "-c", f"import time; time.sleep({wrapper_s})"]
    start = time.monotonic()
    try:
        run = process.run_process("c", argv, {}, tmp_path, 0.5)
    finally:
        monkeypatch.undo()
        for pgid in sent:  # the test's own child: really kill it now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    # Not a speed budget: a run_process that waited for the wrapper would take wrapper_s.
    assert time.monotonic() - start < wrapper_s, "run_process waited for the unkillable wrapper"
    assert run.timed_out
    assert any("still running" in note for note in run.notes), run.notes
