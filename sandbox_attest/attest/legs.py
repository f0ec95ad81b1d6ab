"""The legs of a release: the --expect-legs file, and combining verified legs into one gate.

`merge` and `verify` (of a merged directory) both call `combine`, so the gate a merge signs
is re-derived by the very same code that decided it.

The `--expect-legs` file lists the legs the release needs, as TOML:

    [[leg]]
    platform = "linux"
    backend = "bubblewrap"

    [[leg]]
    platform = "darwin"
    backend = "seatbelt"
    informational = true

An informational leg is merged and shown but never decides the release: it may be missing or
fail to verify (a leg that cannot separate trust domains signs with its run's per-machine
key, which the release key's verification refuses), and that is a note, not a refusal; its
cells stay out of the merged gate.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandbox_attest.errors import ConfigError
from sandbox_attest.report.policy import (
    CARRIER_KEY,
    CONTROL_BACKEND,
    Gate,
    default_platform,
    evaluate,
    missing_legs,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from sandbox_attest.attest.verification import Verification
    from sandbox_attest.report.evidence import CellEntry
    from sandbox_attest.report.policy import Policy

_LEG_KEYS = frozenset({"platform", "backend", "informational"})


@dataclass(frozen=True)
class ExpectedLegs:
    """The legs a release needs; `sha256` is over the file's bytes.

    `informational` legs are merged and shown when present and verified, never required.
    """

    path: str
    sha256: str
    legs: tuple[tuple[str, str], ...]
    informational: tuple[tuple[str, str], ...] = ()


def _leg_table(table: object, where: str) -> tuple[tuple[str, str], bool]:
    """One [[leg]] table: its (platform, backend) and whether it is informational.

    Raises:
        ConfigError: not a table, an unknown key, or a value of the wrong type.
    """
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    bad = sorted(set(table) - _LEG_KEYS)
    if bad:
        raise ConfigError(
            f"{where}: unknown key {bad[0]!r}; allowed keys are backend, informational, platform"
        )
    platform, backend = table.get("platform"), table.get("backend")
    if not isinstance(platform, str) or not platform or not isinstance(backend, str) or not backend:
        raise ConfigError(f"{where}: platform and backend must both be non-empty strings")
    flag = table.get("informational", False)
    if not isinstance(flag, bool):
        raise ConfigError(f"{where}: informational must be true or false")
    return (platform, backend), flag


def load_expected_legs(path: Path) -> ExpectedLegs:
    """Load an --expect-legs file (`[[leg]] platform = ".." backend = ".."`).

    Raises:
        ConfigError: unreadable, not TOML, unknown keys, duplicates, or no legs at all.
    """
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read --expect-legs {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    unknown = sorted(set(data) - {"leg"})
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; the file holds only [[leg]] tables")
    tables = data.get("leg", [])
    if not isinstance(tables, list) or not tables:
        raise ConfigError(
            f"{path}: no legs; add [[leg]] tables with platform and backend, one per CI leg "
            "(an empty expectation would let a merge of nothing pass)"
        )
    legs: list[tuple[str, str]] = []
    informational: list[tuple[str, str]] = []
    for i, table in enumerate(tables, start=1):
        leg, flag = _leg_table(table, f"{path}, [[leg]] #{i}")
        if leg in legs or leg in informational:
            raise ConfigError(f"{path}, [[leg]] #{i}: leg {leg[0]}/{leg[1]} is listed twice")
        (informational if flag else legs).append(leg)
    if not legs:
        raise ConfigError(
            f"{path}: every leg is informational; a release needs at least one leg that "
            "decides it (drop `informational = true` from one)"
        )
    return ExpectedLegs(
        str(path), hashlib.sha256(raw).hexdigest(), tuple(legs), tuple(informational)
    )


@dataclass
class Combined:
    """Verified legs combined: every reason they do not make a release, and the merged gate.

    Attributes:
        reasons: every refusal (a leg that does not verify, duplicate, unexpected or missing
            legs, the merged gate's problems); empty means the legs make a release.
        legs: each expected leg -> the label of the leg report holding it.
        carried: control legs (`none`) riding along with the leg that ran them.
        gate: the gate over every leg's cells under the policy.
        verifications: each leg's own verification, with its label, in merge order.
        harness_mismatch: the legs' signed harness commits or probes digests differ.
        informational: each informational leg present -> the label of its report (its cells
            are shown, never in `gate`).
        notes: what an informational leg lacks (missing, does not verify), for the output.
    """

    reasons: list[str] = field(default_factory=list)
    legs: dict[tuple[str, str], str] = field(default_factory=dict)
    carried: set[tuple[str, str]] = field(default_factory=set)
    gate: Gate | None = None
    verifications: list[tuple[str, Verification]] = field(default_factory=list)
    harness_mismatch: bool = False
    informational: dict[tuple[str, str], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _check_same_harness(labelled: Sequence[tuple[str, Verification]], out: Combined) -> None:
    """Refuse legs made by different harnesses: one release tested one commit with one probes.

    Legs from two commits would combine into a decision no single version of the harness
    made. The signed facts are compared (commit None, a wheel install, is a value too).
    """
    for key, what in (("commit", "harness commits"), ("probesSha256", "probes digests")):
        values = {label: v.harness.get(key) for label, v in labelled}
        if len(set(values.values())) > 1:
            out.harness_mismatch = True
            listed = "; ".join(f"{label}: {value or 'none'}" for label, value in values.items())
            out.reasons.append(
                f"the legs were signed with different {what} ({listed}); run every leg "
                "from the same commit of sandbox-attest"
            )


def _collect_legs(
    labelled: Sequence[tuple[str, Verification]], expected: ExpectedLegs, out: Combined
) -> None:
    """Fill `out.legs` and `out.carried`, refusing duplicates, unexpected and missing legs.

    Every CI leg also runs the control backend `none` on its machine; unless the expect-legs
    file lists a `none` leg itself, those control cells ride along with their leg instead of
    counting as legs (so two Linux legs do not collide on linux/none). Carried control legs
    still count as present for the policy.
    """
    control_is_leg = any(b == CONTROL_BACKEND for _, b in expected.legs)
    for label, v in labelled:
        for leg in sorted(v.legs):
            if leg[1] == CONTROL_BACKEND and not control_is_leg:
                out.carried.add(leg)
            elif leg in out.legs:
                out.reasons.append(
                    f"duplicate leg {leg[0]}/{leg[1]}: both {out.legs[leg]} and {label} "
                    "hold it; pass each leg's report once"
                )
            elif leg not in expected.legs:
                out.reasons.append(
                    f"unexpected leg {leg[0]}/{leg[1]} in {label}: add it to "
                    f"{expected.path} or leave that directory out"
                )
            else:
                out.legs[leg] = label
    for leg in expected.legs:
        if leg not in out.legs:
            out.reasons.append(
                f"missing leg {leg[0]}/{leg[1]}: {expected.path} expects it but no leg "
                "directory holds it (did that CI job fail to upload its report?)"
            )


def _merged_cells(labelled: Sequence[tuple[str, Verification]], out: Combined) -> list[CellEntry]:
    """The cells of the legs each report was credited with, platform filled in.

    A duplicate or unexpected leg is already a refusal on its own; its cells are left out so
    the one real reason is not buried under a repeat of every cell it holds. Carried control
    cells are tagged with their carrier (`evaluate` names them `...@<label>`).
    """
    cells: list[CellEntry] = []
    for label, v in labelled:
        evidence = v.evidence or {}
        platform = default_platform(evidence)
        read: list[CellEntry] = evidence.get("cells", [])  # checked by `parse_cells`
        for c in read:
            cell: CellEntry = {**c, "platform": c.get("platform") or platform}
            leg = (str(cell["platform"]), str(cell.get("backend", "")))
            if leg in out.carried:
                cell[CARRIER_KEY] = label
            elif out.legs.get(leg) != label:
                continue
            cells.append(cell)
    return cells


def _is_informational(v: Verification, expected: ExpectedLegs) -> bool:
    """The report holds informational legs only (besides its control cells)."""
    confined = {leg for leg in v.legs if leg[1] != CONTROL_BACKEND}
    return bool(confined) and confined <= set(expected.informational)


def _set_aside_informational(
    labelled: Sequence[tuple[str, Verification]], expected: ExpectedLegs, out: Combined
) -> list[tuple[str, Verification]]:
    """Record the informational leg reports in `out`; return the ones that decide the release.

    Whether a report is informational is read from its cells even when its signature does
    not verify; that is safe because an informational report never counts: a required leg
    still has to be present in a verified report of its own.
    """
    deciding: list[tuple[str, Verification]] = []
    for label, v in labelled:
        if not _is_informational(v, expected):
            deciding.append((label, v))
            continue
        for leg in sorted(v.legs):
            if leg[1] != CONTROL_BACKEND:
                out.informational[leg] = label
        gate = v.gate.result if v.gate is not None else "unknown"
        state = "verifies" if v.ok else "does NOT verify with the release key"
        out.notes.append(
            f"informational leg {label} ({state}; its own gate {gate}): merged and shown, "
            "not part of the release decision"
        )
        out.notes.extend(f"informational leg {label}: {r}" for r in v.reasons)
    for platform, backend in expected.informational:
        if (platform, backend) not in out.informational:
            out.notes.append(
                f"informational leg {platform}/{backend} is missing (not required for a release)"
            )
    if labelled and not deciding:
        out.reasons.append(
            f"only informational legs were given; {expected.path} lists the legs that decide "
            "a release"
        )
    return deciding


def combine(
    labelled: Sequence[tuple[str, Verification]], expected: ExpectedLegs, policy: Policy
) -> Combined:
    """Combine verified legs: same harness -> collect legs -> merged cells -> evaluate -> missing.

    Args:
        labelled: each leg's verification with its label (`NN-<dirname>`, which names its
            copy under `legs/` in a merged directory and tags its control cells).
        expected: the legs the release needs.
        policy: the release policy, judged over the union of all legs.
    """
    out = Combined(verifications=list(labelled))
    if not labelled:
        out.reasons.append("no leg directories given")
    deciding = _set_aside_informational(labelled, expected, out)
    for label, v in deciding:
        out.reasons.extend(f"leg {label} does not verify: {r}" for r in v.reasons)
    _check_same_harness(deciding, out)
    _collect_legs(deciding, expected, out)
    out.gate = evaluate(
        _merged_cells(deciding, out), policy, default_platform="unknown", qualify=True
    )
    out.reasons.extend(f"merged: {p}" for p in out.gate.problems)
    if out.gate.result == "FAILED" and not out.gate.problems:
        out.reasons.append("merged: the gate over all legs is FAILED")
    out.reasons.extend(
        f"merged: missing leg {leg}: the policy requires it"
        for leg in missing_legs(policy, set(out.legs) | out.carried)
    )
    return out


def leg_label(index: int, name: str) -> str:
    """The label of the `index`th leg (from 1): `NN-<dirname>`, its directory under legs/."""
    return f"{index:02d}-{name}"


def leg_digests(combined: Combined) -> dict[str, str]:
    """`leg:PLATFORM/BACKEND` -> sha256 of the attestation of the leg report holding it."""
    by_label = dict(combined.verifications)
    return {
        f"leg:{platform}/{backend}": by_label[label].attestation_sha256
        for (platform, backend), label in sorted(combined.legs.items())
    }
