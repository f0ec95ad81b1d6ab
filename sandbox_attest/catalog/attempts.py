"""The payload's report read as attempts: by role, summarised, tabled against the host's view."""

from __future__ import annotations

from typing import Any

from sandbox_attest.catalog.spec import ProbeSpec


def attempts_by_role(report: dict[str, Any], role: str, prefix: str = "") -> list[dict[str, Any]]:
    """The report's attempts in `role` (escape, control...) whose `what` starts with `prefix`."""
    return [
        a
        for a in report.get("attempts", [])
        if isinstance(a, dict)
        and a.get("role") == role
        and str(a.get("what", "")).startswith(prefix)
    ]


def observed_outcome(attempts: list[dict[str, Any]]) -> Any:
    """The payload's side in one word: any success wins, then refusals, else error."""
    outcomes = {a.get("outcome") for a in attempts}
    if "succeeded" in outcomes:
        return "succeeded"
    if outcomes == {"refused"}:
        return "refused"
    return "error"


# How much of a failed attempt's own explanation a reason carries: enough to name the cause
# ("No module named pip", "socket() refused: EPERM"), short enough to keep a verdict one line.
SUMMARY_DETAIL_CHARS = 80


def attempts_summary(attempts: list[dict[str, Any]]) -> str:
    """Each attempt as `what outcome (errno|status)`, plus a short detail when it failed."""
    parts = []
    for a in attempts:
        fact = a.get("errno") or a.get("status") or ""
        part = f"{a.get('what')} {a.get('outcome')}{f' ({fact})' if fact else ''}"
        detail = " ".join(str(a.get("detail") or "").split())
        if a.get("outcome") != "succeeded" and detail:
            part += f": {detail[:SUMMARY_DETAIL_CHARS]}"
        parts.append(part)
    return ", ".join(parts) or "no attempts reported"


def all_succeeded(attempts: list[dict[str, Any]], count: int | None = None) -> bool:
    """Every attempt succeeded (and, if given, there were exactly `count` of them)."""
    if count is not None and len(attempts) != count:
        return False
    return bool(attempts) and all(a.get("outcome") == "succeeded" for a in attempts)


def attempts_of(*groups: tuple[str, tuple[str, ...]] | str) -> frozenset[str]:
    """Attempt names: plain names, and `(key, ops)` pairs spelled `key:op` as payloads do."""
    names: set[str] = set()
    for group in groups:
        if isinstance(group, str):
            names.add(group)
        else:
            key, ops = group
            names |= {f"{key}:{op}" for op in ops}
    return frozenset(names)


def report_mismatch(spec: ProbeSpec, task: dict[str, Any], report: dict[str, Any]) -> str | None:
    """The one check that a report lists exactly the attempts `spec`'s payload makes for `task`.

    The runner calls it on every parsed report before any assessor reads it, so no probe can
    skip it; a mismatch is the cell's ERROR reason.
    """
    attempts = report.get("attempts")
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        return "report does not match probe: its attempts are not a list of objects"
    return spec.attempt_table(task).mismatch(attempts)


def refusal_summary(attempts: list[dict[str, Any]]) -> str:
    """The refused attempts in one phrase: how many, and with which errnos."""
    refused = [a for a in attempts if a.get("outcome") == "refused"]
    errnos = sorted({str(a.get("errno")) for a in refused})
    return f"{len(refused)} of {len(attempts)} attempts refused ({','.join(errnos) or '-'})"
