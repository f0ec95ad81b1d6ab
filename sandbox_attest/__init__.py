"""sandbox-attest: live escape probes inside sandboxes, judged by host witnesses, signed."""

from __future__ import annotations

from sandbox_attest.errors import (
    BackendError,
    BackendUnavailable,
    ConfigError,
    FixtureError,
    HarnessError,
    ProbeOutputError,
    ReportError,
    SignatureError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "ConfigError",
    "FixtureError",
    "HarnessError",
    "ProbeOutputError",
    "ReportError",
    "SignatureError",
    "__version__",
]
