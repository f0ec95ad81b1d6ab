"""Suite-wide fixtures: temporary directories the payload user can reach.

As root the harness runs every sandboxed command as its payload user (sandbox_attest/trust.py), the
way a real run does. pytest makes its temporary directories 0700 for the user running the
suite, so a wrapper script, a workspace or a world under `tmp_path` would be out of that
user's reach, and tests would measure file modes instead of sandboxes. A real run's scratch
directory is traversable (0755) for the same reason; these fixtures give tests the same.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest


def _reachable(path: Path, top: Path) -> None:
    """Make `path` and its ancestors up to `top` 0755, and `top`'s parent traversable."""
    current = path
    while current != top and top in current.parents:
        current.chmod(0o755)
        current = current.parent
    top.chmod(0o755)
    # pytest-of-<user>, pytest-N (and xdist's popen-gwN): traversable only, up to the
    # system temp dir; other runs' directories stay unlisted.
    system_tmp = Path(tempfile.gettempdir())
    for ancestor in top.parents:
        if ancestor == system_tmp or system_tmp not in ancestor.parents:
            break
        ancestor.chmod(ancestor.stat().st_mode | 0o711)


class _PayloadReachableFactory:
    """`tmp_path_factory` whose directories the payload user can traverse."""

    def __init__(self, inner: pytest.TempPathFactory) -> None:
        self._inner = inner

    def getbasetemp(self) -> Path:
        base = self._inner.getbasetemp()
        _reachable(base, base)
        return base

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        # (the signature pytest's own tmp_path fixture calls it with)
        path = self._inner.mktemp(basename, numbered=numbered)
        _reachable(path, self.getbasetemp())
        return path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture(scope="session")
def tmp_path_factory(tmp_path_factory: pytest.TempPathFactory) -> pytest.TempPathFactory:
    """Pytest's factory, with every directory it makes reachable by the payload user."""
    return _PayloadReachableFactory(tmp_path_factory)  # type: ignore[return-value]  # a proxy
