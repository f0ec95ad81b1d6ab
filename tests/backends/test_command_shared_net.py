"""Cells of a harness-unix wrapper that shares the harness's network namespace take turns.

Each cell's shim listens on 127.0.0.1:SHIM_PORT; in one shared namespace a long probe's shim
held it past the next cell's wait, and that cell was ERROR (issue 27). The availability check
sees the shared namespace, and such a wrapper's cells hold one lock while they run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.command.backend import CommandBackend

ARTIFACTS = Path(__file__).resolve().parents[1] / "data" / "artifacts"


def available(name: str) -> CommandBackend:
    """The backend of `tests/data/artifacts/<name>`, its availability asked."""
    backend = CommandBackend.from_path(ARTIFACTS / name)
    avail = backend.availability()
    assert avail.ok, avail.reason
    return backend


def test_shared_namespace_harness_unix_cells_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two cells of the shared-network harness-unix wrapper never run at once."""
    backend = available("wrap_shared_net_unix.toml")
    assert backend.shares_harness_network
    active, most = 0, 0
    guard = threading.Lock()

    def fake_run(_request: Any) -> None:
        nonlocal active, most
        with guard:
            active += 1
            most = max(most, active)
        time.sleep(0.2)
        with guard:
            active -= 1

    monkeypatch.setattr(backend, "_run", fake_run)
    cells = [threading.Thread(target=backend.run, args=(None,)) for _ in range(3)]
    for cell in cells:
        cell.start()
    for cell in cells:
        cell.join()
    assert most == 1


def test_harness_tcp_wrapper_cells_run_side_by_side() -> None:
    """A wrapper with no shim inside (harness-tcp) takes no turn, shared namespace or not."""
    backend = available("wrap_checks_its_args.toml")
    assert backend.shares_harness_network
    assert isinstance(backend.cell_lock(), contextlib.nullcontext)
