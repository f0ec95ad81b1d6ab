"""Backends: the sandboxes the harness can run probes in, created by name."""

from __future__ import annotations

from harness.backends.base import (
    SHIM_PORT,
    START_MARKER,
    Availability,
    Backend,
    DeclaredPolicy,
    EgressRoute,
    Identity,
    ProbeRequest,
    ProbeRun,
)
from harness.errors import ConfigError

__all__ = [
    "SHIM_PORT",
    "START_MARKER",
    "Availability",
    "Backend",
    "DeclaredPolicy",
    "EgressRoute",
    "Identity",
    "MissingBackend",
    "ProbeRequest",
    "ProbeRun",
    "create_backend",
]


class MissingBackend:
    """Stands in for a backend whose code cannot load here; always unavailable, never runs."""

    egress_mode = "shim"

    def __init__(self, name: str, reason: str) -> None:
        """Remember why the backend cannot be created."""
        self.name = name
        self.reason = reason

    def availability(self) -> Availability:
        """Unavailable, with the reason and its fix."""
        return Availability(False, self.reason, None)

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Never runs: an unavailable backend must not fall back to anything."""
        raise ConfigError(f"backend {self.name} is unavailable: {self.reason}")


def create_backend(name: str) -> Backend:
    """A backend instance by its matrix name.

    Import errors (an optional extra not installed) become a MissingBackend whose
    availability names the extra to install, so the run reports UNAVAILABLE instead of
    crashing or skipping.
    """
    if name == "none":
        from harness.backends.none import NoneBackend  # noqa: PLC0415

        return NoneBackend()
    if name == "bubblewrap":
        from harness.backends.bubblewrap import BubblewrapBackend  # noqa: PLC0415

        return BubblewrapBackend()
    if name == "docker":
        try:
            from harness.backends.docker import DockerBackend  # noqa: PLC0415
        except ImportError as exc:
            return MissingBackend(name, f"the docker backend needs the docker SDK ({exc}); "
                                  "pip install 'sandbox-attest[docker]'")
        return DockerBackend()
    if name == "seatbelt":
        from harness.backends.seatbelt import SeatbeltBackend  # noqa: PLC0415

        return SeatbeltBackend()
    if name == "appcontainer":
        from harness.backends.appcontainer import AppContainerBackend  # noqa: PLC0415

        return AppContainerBackend()
    raise ConfigError(f"unknown backend {name!r}; known: none, bubblewrap, docker, seatbelt, "
                      "appcontainer (or a command-wrapper spec with --backend-spec FILE)")
