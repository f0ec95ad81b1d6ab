"""A run's backends: each one created and asked whether it runs here, recorded, and closed.

Every backend is asked before any cell starts (`ask_backends`), so an UNAVAILABLE one is
known, with its reason, when the first item reports; the evidence records each answer
(`backend_record`), and the run closes each at its end (`close_backends`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox_attest.backends import Backend, create_backend
from sandbox_attest.errors import HarnessError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox_attest.backends.base import Availability
    from sandbox_attest.run.matrix import Matrix


def ask_backends(
    matrix: Matrix, names: list[str]
) -> tuple[dict[str, Backend], dict[str, Availability]]:
    """Create the control leg's backend and each of `names`, and ask each whether it runs here.

    Returns:
        The backends by name, control leg first, and each one's answer.
    """
    backends: dict[str, Backend] = {}
    availability: dict[str, Availability] = {}
    for name in [matrix.control, *[n for n in names if n != matrix.control]]:
        backend = create_backend(name)
        backends[name] = backend
        availability[name] = backend.availability()
    return backends, availability


def backend_record(matrix: Matrix, name: str, avail: Availability) -> dict[str, Any]:
    """One backend as the evidence records it: its answer, its identity, why it is in the set."""
    return {
        "name": name,
        "available": avail.ok,
        "reason": avail.reason,
        "identity": avail.identity.as_dict() if avail.identity else None,
        # In the set to show a verdict (matrix.toml's `demonstration`): a reader must not
        # take its FAIL for news about the sandbox (issue 29).
        **({"demonstration": demo} if (demo := demonstration(matrix, name)) else {}),
    }


def demonstration(matrix: Matrix, name: str) -> str:
    """Why `name` is in the matrix as a demonstration, or "" (also for a spec's backend)."""
    return next((row.demonstration for row in matrix.backends if row.name == name), "")


def close_backends(backends: Mapping[str, Backend]) -> None:
    """Close every backend that holds something of the run's; a failure is said, not raised."""
    for backend in backends.values():
        # Backends that create engine objects (docker's per-run image tag) remove them.
        close = getattr(backend, "close", None)
        if callable(close):
            try:
                close()
            except (HarnessError, OSError) as exc:
                print(f"sandbox-attest: cleanup of backend {backend.name} failed: {exc}")
