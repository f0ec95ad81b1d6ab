"""Backends: the sandboxes the harness can run probes in, created by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox_attest.backends.base import (
    SHIM_PORT,
    START_MARKER,
    Availability,
    Backend,
    DeclaredClaims,
    EgressMode,
    EgressRoute,
    Identity,
    ProbeRequest,
    ProbeRun,
)
from sandbox_attest.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "SHIM_PORT",
    "START_MARKER",
    "Availability",
    "Backend",
    "DeclaredClaims",
    "EgressRoute",
    "Identity",
    "MissingBackend",
    "ProbeRequest",
    "ProbeRun",
    "create_backend",
    "register_spec",
]

# Specs given by path (`--backend-spec FILE`), by the name inside them: the session creates
# backends by name, so a spec outside matrix/backends/ is registered here first.
_REGISTERED_SPECS: dict[str, Path] = {}


def register_spec(path: Path) -> str:
    """Load a command-wrapper spec from `path` and make its name creatable; returns the name.

    Raises:
        ConfigError: the spec is invalid (the message names the file, the key and the fix), or
            another spec file is already registered under its name.
    """
    from sandbox_attest.backends.command.spec_load import load_spec  # noqa: PLC0415

    spec = load_spec(path)
    earlier = _REGISTERED_SPECS.get(spec.name)
    # One name, one spec: which file ran must never depend on the order they were given in.
    if earlier is not None and earlier.resolve() != path.resolve():
        raise ConfigError(
            f"{path}: [backend] name: {spec.name!r} is already the name of the spec {earlier}; "
            "give one of them another name"
        )
    _REGISTERED_SPECS[spec.name] = path
    return spec.name


class MissingBackend:
    """Stands in for a backend whose code cannot load here; always unavailable, never runs."""

    egress_mode: EgressMode = "shim"

    def __init__(self, name: str, reason: str) -> None:
        """Remember why the backend cannot be created."""
        self.name = name
        self.reason = reason

    def availability(self) -> Availability:
        """Unavailable, with the reason and its fix."""
        return Availability(ok=False, reason=self.reason, identity=None)

    def run(self, request: ProbeRequest) -> ProbeRun:  # noqa: ARG002  (the protocol's shape)
        """Never runs: an unavailable backend must not fall back to anything."""
        raise ConfigError(f"backend {self.name} is unavailable: {self.reason}")


def create_backend(name: str) -> Backend:  # noqa: PLR0911  (one return per backend kind)
    """A backend instance by its matrix name, or a command-wrapper spec by name or path.

    A name that is not built in resolves to a spec registered with `register_spec`, then to
    `matrix/backends/<name>.toml`; a path ending in `.toml` loads that spec file.

    Import errors (an optional extra not installed) become a MissingBackend whose
    availability names the extra to install, so the run reports UNAVAILABLE instead of
    crashing or skipping.
    """
    if name == "none":
        from sandbox_attest.backends.none import NoneBackend  # noqa: PLC0415

        return NoneBackend()
    if name == "bubblewrap":
        from sandbox_attest.backends.bubblewrap import BubblewrapBackend  # noqa: PLC0415

        return BubblewrapBackend()
    if name == "docker":
        try:
            from sandbox_attest.backends.docker.backend import DockerBackend  # noqa: PLC0415
        except ImportError as exc:
            return MissingBackend(
                name,
                f"the docker backend needs the docker SDK ({exc}); "
                "pip install 'sandbox-attest[docker]'",
            )
        return DockerBackend()
    if name == "seatbelt":
        from sandbox_attest.backends.seatbelt import SeatbeltBackend  # noqa: PLC0415

        return SeatbeltBackend()
    if name == "appcontainer":
        from sandbox_attest.backends.appcontainer import AppContainerBackend  # noqa: PLC0415

        return AppContainerBackend()
    # Not a built-in: a command-wrapper spec, registered by path, named in matrix/backends/,
    # or a path to a spec file.
    from sandbox_attest.backends.command.backend import CommandBackend  # noqa: PLC0415
    from sandbox_attest.backends.command.spec import BUILTIN_BACKENDS  # noqa: PLC0415
    from sandbox_attest.backends.command.spec_load import (  # noqa: PLC0415
        available_specs,
        looks_like_path,
        resolve_spec,
        specs_dir,
    )

    spec_path = _REGISTERED_SPECS.get(name) or resolve_spec(name)
    if spec_path is not None:
        return CommandBackend.from_path(spec_path)
    if looks_like_path(name):
        raise ConfigError(f"backend spec {name} not found; pass the path of an existing .toml")
    specs = ", ".join(available_specs()) or "none yet"
    raise ConfigError(
        f"unknown backend {name!r}; built in: {', '.join(BUILTIN_BACKENDS)}; specs in "
        f"{specs_dir()}: {specs}. For another wrapper put {name}.toml there or pass "
        "--backend-spec FILE"
    )
