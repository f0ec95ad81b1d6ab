"""Which operating system this host is, in the matrix's words.

The matrix (which rows apply here) and the command backend (which spec's platforms list
admits this host) both ask; this module imports nothing of ours, so neither has to import
the other.
"""

from __future__ import annotations

import sys

__all__ = ["current_platform"]


def current_platform() -> str:
    """'linux', 'darwin' or 'windows'."""
    return "windows" if sys.platform.startswith("win") else sys.platform
