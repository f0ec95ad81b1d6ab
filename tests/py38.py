"""Finding a Python 3.8 interpreter for the tests that run in-sandbox scripts on it.

The shim and the probes promise Python 3.8+; the project's own venv is 3.11. Where this
machine has a working 3.8 (a pyenv build, or python3.8 on PATH), those scripts also run on it.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest


@functools.cache
def _find() -> str | None:
    candidates = [str(p) for p in sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8"))]
    on_path = shutil.which("python3.8")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        # A pyenv shim on PATH may exist yet refuse to run: ask the interpreter itself.
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 8))"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if probe.stdout.strip() == "True":
            return candidate
    return None


def python38() -> str:
    """Path of a working Python 3.8 interpreter, or skip the test saying none was found."""
    found = _find()
    if found is None:
        pytest.skip(
            "no working Python 3.8 here (a pyenv 3.8 build or python3.8 on PATH); the static "
            "3.8 checks in tests/unit/test_in_sandbox_scripts.py still ran"
        )
    return found
