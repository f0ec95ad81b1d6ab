"""Merge signed legs (platform x backend) from a CI matrix into one signed release decision.

The `--expect-legs` file lists the legs the release needs, as TOML:

    [[leg]]
    platform = "linux"
    backend = "bubblewrap"

Each leg directory is verified on its own (signature, digests, re-derived gate, policy for
the legs it holds); then the union must contain every expected leg exactly once and satisfy
the whole policy. Only then is one test-result statement written over all legs. A leg that
fails, a duplicate leg or a missing one refuses the merge and writes nothing.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.attest import (
    ATTESTATION_NAME,
    EVIDENCE_NAME,
    JUNIT_NAME,
    write_envelopes,
    write_signing_sidecar,
)
from harness.attest.policy import CARRIER_KEY, evaluate, missing_legs
from harness.attest.sigstore import sign_keyless
from harness.attest.statement import (
    TEST_RESULT_PREDICATE,
    default_platform,
    statement,
    statement_bytes,
    test_result_predicate,
)
from harness.attest.verify import Verification, verify_report
from harness.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from harness.attest.keys import SigningKey, TrustedKey
    from harness.attest.policy import Policy

_LEG_KEYS = frozenset({"platform", "backend"})


@dataclass(frozen=True)
class ExpectedLegs:
    """The legs a release needs; `sha256` is over the file's bytes."""

    path: str
    sha256: str
    legs: tuple[tuple[str, str], ...]


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
    for i, table in enumerate(tables, start=1):
        where = f"{path}, [[leg]] #{i}"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: must be a table")
        bad = sorted(set(table) - _LEG_KEYS)
        if bad:
            raise ConfigError(
                f"{where}: unknown key {bad[0]!r}; allowed keys are backend, platform"
            )
        platform, backend = table.get("platform"), table.get("backend")
        if (
            not isinstance(platform, str)
            or not platform
            or not isinstance(backend, str)
            or not backend
        ):
            raise ConfigError(f"{where}: platform and backend must both be non-empty strings")
        if (platform, backend) in legs:
            raise ConfigError(f"{where}: leg {platform}/{backend} is listed twice")
        legs.append((platform, backend))
    return ExpectedLegs(str(path), hashlib.sha256(raw).hexdigest(), tuple(legs))


@dataclass
class MergeResult:
    """The outcome of a merge: every reason it was refused, or the statement it wrote."""

    reasons: list[str] = field(default_factory=list)
    legs: dict[tuple[str, str], Path] = field(default_factory=dict)
    result: str = ""
    attestation: Path | None = None

    @property
    def ok(self) -> bool:
        """True when the merge was written."""
        return not self.reasons


CONTROL_BACKEND = "none"


def _collect_legs(
    verifications: Sequence[Verification], expected: ExpectedLegs, out: MergeResult
) -> set[tuple[str, str]]:
    """Fill `out.legs`, refusing duplicates, unexpected and missing legs.

    Every CI leg also runs the control backend `none` on its machine; unless the expect-legs
    file lists a `none` leg itself, those control cells ride along with their leg instead of
    counting as legs (so two Linux legs do not collide on linux/none).

    Returns:
        The control legs carried that way (they still count as present for the policy).
    """
    control_is_leg = any(b == CONTROL_BACKEND for _, b in expected.legs)
    carried: set[tuple[str, str]] = set()
    for v in verifications:
        for leg in sorted(v.legs):
            if leg[1] == CONTROL_BACKEND and not control_is_leg:
                carried.add(leg)
            elif leg in out.legs:
                out.reasons.append(
                    f"duplicate leg {leg[0]}/{leg[1]}: both {out.legs[leg]} and {v.report_dir} "
                    "hold it; pass each leg's report once"
                )
            elif leg not in expected.legs:
                out.reasons.append(
                    f"unexpected leg {leg[0]}/{leg[1]} in {v.report_dir}: add it to "
                    f"{expected.path} or leave that directory out"
                )
            else:
                out.legs[leg] = v.report_dir
    for leg in expected.legs:
        if leg not in out.legs:
            out.reasons.append(
                f"missing leg {leg[0]}/{leg[1]}: {expected.path} expects it but no leg "
                "directory holds it (did that CI job fail to upload its report?)"
            )
    return carried


def _merged_cells(
    verifications: Sequence[Verification], carried: set[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Every leg's cells with their platform filled in and carried control cells tagged."""
    cells: list[dict[str, Any]] = []
    for index, v in enumerate(verifications, start=1):
        evidence = v.evidence or {}
        platform = default_platform(evidence)
        for c in evidence.get("cells", []):
            cell = {**c, "platform": c.get("platform") or platform}
            if (cell["platform"], cell.get("backend")) in carried:
                cell[CARRIER_KEY] = f"{index:02d}-{v.report_dir.name}"
            cells.append(cell)
    return cells


def merge_legs(
    leg_dirs: Sequence[Path],
    *,
    expected: ExpectedLegs,
    trusted: TrustedKey,
    policy: Policy,
    key: SigningKey,
    out_dir: Path,
    allow_untrusted_local: bool = False,
    env: Mapping[str, str] | None = None,
) -> MergeResult:
    """Verify every leg and, if all hold, write one signed statement over all of them.

    Returns:
        The merge result; `attestation` is set only when the merge was written.
    """
    merged = MergeResult()
    if not leg_dirs:
        merged.reasons.append("no leg directories given")
        return merged
    if len({d.resolve() for d in leg_dirs}) != len(leg_dirs):
        merged.reasons.append("the same leg directory was passed twice")
    verifications = [
        verify_report(
            d, trusted, policy, allow_untrusted_local=allow_untrusted_local, require_all_legs=False
        )
        for d in leg_dirs
    ]
    for v in verifications:
        merged.reasons.extend(f"leg {v.report_dir} does not verify: {r}" for r in v.reasons)
    carried = _collect_legs(verifications, expected, merged)
    cells = _merged_cells(verifications, carried)
    gate = evaluate(cells, policy, default_platform="unknown", qualify=True)
    merged.result = gate.result
    merged.reasons.extend(f"merged: {p}" for p in gate.problems)
    merged.reasons.extend(
        f"merged: missing leg {leg}: the policy requires it"
        for leg in missing_legs(policy, set(merged.legs) | carried)
    )
    if not merged.ok:
        return merged
    subjects: list[dict[str, Any]] = []
    config: list[dict[str, Any]] = [
        {"name": "policy", "uri": policy.path, "digest": {"sha256": policy.sha256}},
        {"name": "expect-legs", "uri": expected.path, "digest": {"sha256": expected.sha256}},
    ]
    for index, v in enumerate(verifications, start=1):
        prefix = f"legs/{index:02d}-{v.report_dir.name}"
        for name in (EVIDENCE_NAME, JUNIT_NAME, ATTESTATION_NAME):
            digest = hashlib.sha256((v.report_dir / name).read_bytes()).hexdigest()
            subjects.append({"name": f"{prefix}/{name}", "digest": {"sha256": digest}})
        for platform, backend in sorted(v.legs - carried):
            config.append(
                {
                    "name": f"leg:{platform}/{backend}",
                    "digest": {"sha256": v.attestation_sha256},
                    "annotations": {
                        "dir": str(v.report_dir),
                        "runId": str((v.evidence or {}).get("run_id", "")),
                        "signerKeyid": str(v.signer.get("keyid", "")),
                    },
                }
            )
    payload = statement_bytes(
        statement(subjects, TEST_RESULT_PREDICATE, test_result_predicate(gate, config))
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.attestation = out_dir / ATTESTATION_NAME
    write_envelopes(merged.attestation, [payload], key)
    decision = sign_keyless([payload], out_dir, os.environ if env is None else env)
    write_signing_sidecar(out_dir, key, decision, gate)
    return merged
