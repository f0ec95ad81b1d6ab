"""Reading the world's witness logs for one cell: entries by nonce, polled until they show."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TypeVar

from sandbox_attest.catalog.spec import WitnessRecordsLike, WorldLike

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


T = TypeVar("T")


# Fixture logs are written by server threads; give them this long to show a host control.
WITNESS_WAIT_S = 3.0
# Between two reads of a witness log that has not shown the entry yet. Each read is an
# in-memory filter (the world's fixture check runs once per cell, not per read), so a short
# wait costs little; 50 ms added 25 ms on average to each host control that waited.
POLL_S = 0.01


def entries_with_nonce(entries: list[dict[str, Any]], nonce: str) -> list[dict[str, Any]]:
    """Entries attributed to `nonce` by their `nonce` field or, failing that, their bytes."""
    return [
        e
        for e in entries
        if e.get("nonce") == nonce or (e.get("nonce") is None and nonce in str(e.get("data", "")))
    ]


def dns_hits(entries: list[dict[str, Any]], nonce: str) -> list[dict[str, Any]]:
    """The DNS fixture's log entries whose queried name carries `nonce` (DNS names fold case)."""
    lowered = nonce.lower()
    return [e for e in entries if lowered in str(e.get("name", "")).lower()]


def in_lab_world(extra: Mapping[str, Any]) -> bool:
    """Whether the world (`WorldInfo.extra`) is the lab.

    Only there is the system resolver the DNS fixture, so only there does the fixture's log
    witness a lookup made through the system resolver.
    """
    world = extra.get("world")
    return isinstance(world, dict) and world.get("kind") == "lab"


def poll_until(read: Callable[[], T], found: Callable[[T], bool]) -> T:
    """Call `read` until `found` holds for its result or WITNESS_WAIT_S passes; the last result.

    Witness logs are written by server threads, so a host control's entry may lag its answer.
    """
    deadline = time.monotonic() + WITNESS_WAIT_S
    result = read()
    while not found(result) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        result = read()
    return result


def wait_for_records(
    world: WorldLike, nonce: str, found: Callable[[WitnessRecordsLike], bool]
) -> WitnessRecordsLike:
    """Poll the world's records for `nonce` until `found` holds or WITNESS_WAIT_S passes."""
    return poll_until(lambda: world.records(nonce), found)
