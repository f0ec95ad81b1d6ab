"""What a backend is held to: every claim the probes judge, and where each one comes from.

`sandbox-attest backends` prints this, so a vendor reads the claims as the verdicts will
(declared and implied alike) before any cell runs, and knows which spec line to change.
It reads the backend's declared claims; it judges nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox_attest.claims import claims_of

if TYPE_CHECKING:
    from sandbox_attest.backends.base import DeclaredClaims


def claim_rows(
    declared: DeclaredClaims, spec_sources: dict[str, str] | None, declared_in: str = ""
) -> list[dict[str, str]]:
    """Each claim the probes judge as {claim, value, source}.

    Args:
        declared: the backend's declared claims (its identity's).
        spec_sources: `claim_sources(spec)` for a command spec (file:line, implied, default);
            None for a backend built into the harness, whose claims its own module declares.
        declared_in: that module's file, named as the source of a built-in's claims.
    """
    claims = claims_of(declared)
    sources = spec_sources or {}
    rows: list[dict[str, str]] = []
    values = (
        claims.as_dict() | {"limits": dict(declared.limits)}
        if declared.limits
        else claims.as_dict()
    )
    for name, value in values.items():
        cause = claims.implied_by(name)
        source = sources.get(name) or (
            f"implied by {cause}"
            if cause
            else f"declared in {declared_in or 'its module under sandbox_attest/backends/'}"
        )
        rows.append({"claim": name, "value": _word(value), "source": source})
    return rows


def _word(value: object) -> str:
    """A claim's value in the TOML words a spec uses."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_word(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_word(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)
