"""Run signals raise while cells run, and are only recorded once the report is being written."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator

import pytest

from sandbox_attest.host.lifetime import RunInterrupted, RunSignals

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture
def signals() -> Iterator[RunSignals]:
    """Handlers of a run of their own, put back after the test."""
    handlers = RunSignals()
    handlers.install()
    try:
        yield handlers
    finally:
        handlers.restore()


def test_the_first_signal_cuts_the_running_cells_short(signals: RunSignals) -> None:
    """While cells run, SIGTERM raises RunInterrupted (the cell becomes ERROR, 143)."""
    with pytest.raises(RunInterrupted) as cut:
        signal.raise_signal(signal.SIGTERM)
    assert cut.value.exit_status == 143
    assert signals.caught is cut.value
    signal.raise_signal(signal.SIGHUP)  # a second one is only recorded
    assert signals.later == ["SIGHUP"]


def test_a_signal_while_the_report_is_written_is_recorded_not_raised(
    signals: RunSignals,
) -> None:
    """Once every cell ran, a first SIGTERM must not abandon the report: it is recorded."""
    signals.hold()
    signal.raise_signal(signal.SIGTERM)  # would raise RunInterrupted without hold()
    assert signals.caught is None
    assert signals.later == ["SIGTERM"]


def test_a_new_run_raises_again(signals: RunSignals) -> None:
    """Holding belongs to one run: handlers installed anew raise on the first signal."""
    signals.hold()
    signals.restore()
    signals.install()
    with pytest.raises(RunInterrupted):
        signal.raise_signal(signal.SIGINT)


def test_a_new_run_starts_uncut(signals: RunSignals) -> None:
    """An earlier run's signal is not the next run's: installing anew forgets it."""
    with pytest.raises(RunInterrupted):
        signal.raise_signal(signal.SIGTERM)
    signals.restore()
    signals.install()
    assert signals.caught is None
    assert signals.later == []
