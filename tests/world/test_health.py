"""When `World.check_health` probes the fixtures, and when an earlier check is enough.

A cell needs fixtures found up after its payload ended: a fixture that dies stays dead, so a
check that began after that instant covers the whole payload. One check serves every call
that asks no more than that (the same cell's witness reads, the other worker's cell), where
each call used to probe (3.6 probes a cell, 10 ms each under one lock).
"""

from __future__ import annotations

import threading
import time

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.world.core import ANY_CHECK, World


class _Probed:
    """Stands in for `World.problems`: counts the probes, answers what it is told."""

    def __init__(self) -> None:
        self.calls = 0
        self.answer: list[str] = []

    def __call__(self) -> list[str]:
        self.calls += 1
        return list(self.answer)


def _world(monkeypatch: pytest.MonkeyPatch) -> tuple[World, _Probed]:
    """A World with only its health state, its fixtures replaced by `_Probed`."""
    world = World.__new__(World)
    world._fault = None
    world._stopped = False
    world._up_at = None
    world._health_lock = threading.Lock()
    probed = _Probed()
    monkeypatch.setattr(world, "problems", probed)
    return world, probed


def test_a_check_after_the_payload_serves_later_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that began after `since` is enough; one from before it is not."""
    world, probed = _world(monkeypatch)
    ended = time.monotonic()
    world.check_health(since=ended)
    world.check_health(since=ended)
    world.check_health(since=ANY_CHECK)
    assert probed.calls == 1
    world.check_health(since=time.monotonic())
    assert probed.calls == 2


def test_no_since_always_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Called without `since`, it probes now, as before."""
    world, probed = _world(monkeypatch)
    world.check_health()
    world.check_health()
    assert probed.calls == 2


def test_the_first_call_probes_even_for_any_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """No check has found the fixtures up yet: ANY_CHECK probes."""
    world, probed = _world(monkeypatch)
    world.check_health(since=ANY_CHECK)
    assert probed.calls == 1


def test_a_fault_found_is_kept_and_never_cached_as_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed check records no 'up' instant, and every later call raises its fault."""
    world, probed = _world(monkeypatch)
    probed.answer = ["the DNS fixture (127.0.0.1:53) was stopped; rerun"]
    with pytest.raises(FixtureError, match="DNS fixture"):
        world.check_health(since=time.monotonic())
    probed.answer = []
    for since in (None, ANY_CHECK, time.monotonic()):
        with pytest.raises(FixtureError, match="DNS fixture"):
            world.check_health(since=since)
    assert probed.calls == 1
