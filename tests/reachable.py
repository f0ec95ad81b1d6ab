"""Scratch directories that the payload user can traverse, for tests that make their own.

A real run's scratch is 0755 (run.session); the payload user (sandbox_attest/host/trust.py)
must reach the worlds, workspaces and task files under it. `tempfile` makes directories 0700.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextlib.contextmanager
def reachable_tempdir(prefix: str) -> Iterator[Path]:
    """A short /tmp directory (unix socket paths are short), 0755, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir="/tmp") as base:
        path = Path(base)
        path.chmod(0o755)
        yield path
