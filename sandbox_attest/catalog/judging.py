"""The shared decision table of a negative probe (ARCHITECTURE "Which witness decides").

A host witness that saw the escape wins over the payload; a refusal counts only beside a held
control.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_attest.catalog.attempts import attempts_summary
from sandbox_attest.catalog.controls import failed_checks
from sandbox_attest.catalog.spec import ClaimsLike
from sandbox_attest.verdict import Assessment, Escape, Expectation


def host_namespace(kind: str) -> str | None:
    """The host's own namespace id (`net:[...]`), to compare with what the payload saw."""
    try:
        return str(Path(f"/proc/self/ns/{kind}").readlink())
    except OSError:
        return None


def private_namespace_reason(report: dict[str, Any], kind: str) -> str | None:
    """A reason phrase when the payload ran in a namespace other than the host's, else None."""
    theirs = report.get("facts", {}).get(f"{kind}ns")
    ours = host_namespace(kind)
    if theirs and ours and theirs != ours:
        return f"payload's {kind} namespace {theirs} is not the host's {ours}"
    return None


def judge_escape(observed: str, seen: bool, private: str | None, reasons: list[str]) -> Escape:
    """The shared decision table of a negative probe (ARCHITECTURE "Which witness decides")."""
    if seen:
        return "escaped"
    if observed == "refused":
        return "refused"
    if observed == "error":
        # decide() says "the attempt could not be made"; the payload summary says why.
        return "undecided"
    if private is not None:
        reasons.append(f"the success stayed inside the sandbox: {private}")
        return "contained"
    reasons.append("the payload reports success but no host witness saw it")
    return "disagree"


def conclude(
    escape: Escape,
    observed: Any,
    reasons: list[str],
    *,
    host_control: dict[str, Any],
    witness: dict[str, Any],
    inside: list[dict[str, Any]] | None = None,
    inside_ok: bool | None = None,
    inside_failed: str | None = None,
    host_failed: str = "host control failed",
    controls: dict[str, Any] | None = None,
) -> Assessment:
    """The assessment once the escape is read: both controls must hold for it to count.

    `inside` is the payload's in-sandbox control attempts (None: the probe has none, only the
    host control counts) and `inside_ok` whether they held (required with `inside`). The
    messages and the recorded controls follow from them; `inside_failed`, `host_failed` and
    `controls` override them for callers that word their controls differently. `controls_ok`
    is the in-sandbox control AND the host control, the one rule every assessor shares.
    """
    if inside is not None and inside_ok is None:
        msg = "conclude: `inside` was given without `inside_ok` (whether those controls held)"
        raise TypeError(msg)
    inside_held = True if inside_ok is None else inside_ok
    host_ok = bool(host_control.get("ok"))
    if not inside_held:
        reasons.append(
            inside_failed or f"in-sandbox control failed: {attempts_summary(inside or [])}"
        )
    if not host_ok:
        reasons.append(f"{host_failed}: {failed_checks(host_control)}")
    if controls is None:
        controls = (
            {"host": host_control} if inside is None else {"inside": inside, "host": host_control}
        )
    return Assessment(
        escape=escape,
        controls_ok=inside_held and host_ok,
        reasons=reasons,
        observed=observed,
        witness=witness,
        control=controls,
    )


def expect_confined_network(declared: ClaimsLike) -> Expectation:
    """Denied unless the backend claims an open network."""
    return "denied" if declared.network != "open" else "allowed"


def expect_capability(declared: ClaimsLike) -> Expectation:
    """Allowed unless the backend claims no network at all."""
    return "denied" if declared.network == "none" else "allowed"


def capability_escape(observed: str, seen: bool, reasons: list[str]) -> Escape:
    """A capability counts only when the payload and the host witness both saw it."""
    if observed == "succeeded" and seen:
        return "escaped"
    if observed == "refused" and not seen:
        return "refused"
    if observed == "error" and not seen:
        return "undecided"
    reasons.append("payload and origin log tell different stories")
    return "disagree"


def expect_fs_confined(declared: ClaimsLike) -> Expectation:
    """Denied where the backend claims writes limited to the workspace."""
    # "workspace" promises the workspace is the payload's only writable grant. Every backend
    # that makes that promise builds the view by granting paths (bwrap binds, docker mounts,
    # seatbelt's profile), so the host's secret folders, its scratch dirs and the host side of
    # the egress route are outside the view too; the open control leg promises nothing.
    return "denied" if declared.filesystem == "workspace" else "allowed"
