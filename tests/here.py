"""What this machine lets a probe judge: the tests ask it the way a real run does.

A real run marks a cell NOT_APPLICABLE where its probe's spec says this host cannot judge it
(`not_applicable_here`, applied by `sandbox_attest.run.runner.applicable_here`): dev_access where
no device beyond the harmless set opens for the payload user (a machine without udev's 0666
/dev/fuse and /dev/net/tun), proc_namespace_escape where setns is refused. Tests that drive the
runner directly build their cells through `cell_here`, so they hold the harness to what it
does on this machine instead of to what an earlier machine happened to offer.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.report.policy import load_policy
from sandbox_attest.run.matrix import Cell, ProbeRow

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path


@functools.cache
def not_judgeable_here(probe: str) -> str | None:
    """Why this host cannot judge `probe` (its spec's own words), or None where it can.

    Cached: dev_access measures the payload user's devices with a child process each time.
    """
    check = getattr(PROBES[probe], "not_applicable_here", None)
    reason = check() if callable(check) else None
    return None if reason is None else str(reason)


def cell_here(backend: str, probe: str, timeout: float) -> Cell:
    """A matrix cell as a run on this host makes it: NOT_APPLICABLE where it cannot judge."""
    return Cell(backend, ProbeRow(probe, timeout), not_judgeable_here(probe))


def skip_unless_policy_judged_here(policy: Path, platform: str, backends: Iterable[str]) -> None:
    """Skip, naming the probe and why, where `policy` requires a probe this host cannot judge.

    Its cells are NOT_APPLICABLE here on every leg, so no run here can meet such a policy: a
    test that expects the gate PASSED asks the machine for something it does not have.
    """
    legs = set(backends)
    for requirement in load_policy(policy).requirements:
        if requirement.platform != platform or requirement.backend not in legs:
            continue
        for probe in requirement.probes:
            reason = not_judgeable_here(probe)
            if reason is not None:
                pytest.skip(
                    f"{policy.name} requires {probe} on {platform}/{requirement.backend}, "
                    f"which this machine cannot judge: {reason}"
                )


def policy_judged_here(policy: Path, dest: Path) -> Path:
    """`policy`, less the probes this host cannot judge, each excluded with the host's reason.

    For a test of what a whole run does (its exit, its signed gate): where this machine cannot
    judge a probe the policy requires, the run is held to the rest instead of skipped, so the
    test still runs here. Returns `policy` itself where nothing needs leaving out.
    """
    unjudged = {p: r for p in PROBES if (r := not_judgeable_here(p)) is not None}
    if not unjudged:
        return policy
    text = policy.read_text()
    for probe in unjudged:
        text = text.replace(f'  "{probe}",\n', "")
    for probe, reason in unjudged.items():
        text += (
            f'\n[[exclude]]\nplatform = "*"\nbackend = "*"\nprobe = "{probe}"\n'
            f"reason = {json.dumps('this host: ' + reason)}\n"
        )
    dest.write_text(text)
    still = [p for r in load_policy(dest).requirements for p in r.probes if p in unjudged]
    assert not still, f"{dest} still requires {still}: the shipped policy's layout changed"
    return dest
