"""in-toto Statement v1 builders for the two predicates a report carries, and their parser.

Spec: https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md. A Statement is
`{"_type", "subject": [ResourceDescriptor], "predicateType", "predicate"}`; every subject MUST
carry a digest. Statements are serialized once (`statement_bytes`) and those bytes are what
the DSSE envelope carries: nothing downstream re-dumps them.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from harness.errors import ReportError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from harness.attest.policy import Gate

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
TEST_RESULT_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"
# Our own predicate; documented in reports/README.md ("Attestation predicates").
EVIDENCE_PREDICATE = "https://sandbox-attest.dev/attestation/evidence/v1"
EVIDENCE_SCHEMA = "sandbox-attest/evidence/v1"
KNOWN_PREDICATES = frozenset({TEST_RESULT_PREDICATE, EVIDENCE_PREDICATE})


def sha256_hex(data: bytes) -> str:
    """Lowercase hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def subject(name: str, data: bytes) -> dict[str, Any]:
    """A ResourceDescriptor naming a file by its sha256 over the exact bytes on disk."""
    return {"name": name, "digest": {"sha256": sha256_hex(data)}}


def statement(
    subjects: Sequence[Mapping[str, Any]], predicate_type: str, predicate: Mapping[str, Any]
) -> dict[str, Any]:
    """An in-toto Statement v1 object."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": list(subjects),
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def statement_bytes(stmt: Mapping[str, Any]) -> bytes:
    """Serialize a statement once (sorted keys, no whitespace, UTF-8) for signing.

    Not OLPC canonical JSON: that leaves control characters raw inside strings, which is not
    valid JSON, and evidence carries stderr with newlines. The bytes are signed as they are,
    so no canonical form is needed to verify them.
    """
    return _dumps(stmt).encode("utf-8")


def _dumps(value: object) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def parse_evidence(data: bytes, where: str) -> dict[str, Any]:
    """Parse evidence.json bytes and check the shape scripts rely on.

    Raises:
        ReportError: not JSON, the wrong schema, or `cells` missing.
    """
    try:
        evidence = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(
            f"{where}: not valid JSON ({exc}); the file is truncated or was edited"
        ) from exc
    if not isinstance(evidence, dict):
        raise ReportError(f"{where}: evidence must be a JSON object")
    if evidence.get("schema") != EVIDENCE_SCHEMA:
        raise ReportError(
            f"{where}: schema is {evidence.get('schema')!r}, expected {EVIDENCE_SCHEMA!r}"
        )
    cells = evidence.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise ReportError(f"{where}: `cells` must be a list of objects")
    return evidence


def read_evidence(path: Path) -> tuple[bytes, dict[str, Any]]:
    """Read evidence.json: its exact bytes (for digests) and the parsed object.

    Raises:
        ReportError: missing, unreadable or malformed.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReportError(
            f"{path}: cannot read ({exc.strerror}); is this a report directory?"
        ) from exc
    return data, parse_evidence(data, str(path))


def default_platform(evidence: Mapping[str, Any]) -> str:
    """The run's platform name (`platform.system`), used for cells that do not name one."""
    platform = evidence.get("platform")
    if isinstance(platform, dict):
        return str(platform.get("system", "unknown")).lower()
    return "unknown"


def configuration(evidence: Mapping[str, Any], policy_sha256: str | None) -> list[dict[str, Any]]:
    """The test-result `configuration`: policy, matrix, harness version, backend identities.

    Args:
        evidence: the parsed evidence.
        policy_sha256: digest of the policy file the gate was derived with; None falls back
            to the digest the run recorded in evidence.
    """
    policy = evidence.get("policy") or {}
    matrix = evidence.get("matrix") or {}
    harness = evidence.get("harness") or {}
    version = str(harness.get("version", "unknown"))
    config: list[dict[str, Any]] = [
        {
            "name": "policy",
            "uri": str(policy.get("path", "")),
            "digest": {"sha256": policy_sha256 or str(policy.get("sha256", ""))},
        },
        {"name": "matrix", "digest": {"sha256": str(matrix.get("sha256", ""))}},
        {
            "name": "harness",
            "uri": f"pkg:pypi/sandbox-attest@{version}",
            "digest": {"sha256": sha256_hex(version.encode("utf-8"))},
            "annotations": {"version": version},
        },
    ]
    for backend in evidence.get("backends") or []:
        identity = backend.get("identity") or {}
        digest = str(identity.get("profile_digest", "")).removeprefix("sha256:")
        if not digest:
            # No identity (backend unavailable): pin what the run said about it instead.
            digest = sha256_hex(_dumps(backend).encode("utf-8"))
        config.append(
            {
                "name": f"backend:{backend.get('name', '')}",
                "digest": {"sha256": digest},
                "annotations": {
                    "available": bool(backend.get("available")),
                    "version": str(identity.get("version", "")),
                    "platform": str(identity.get("platform", "")),
                    "reason": str(backend.get("reason", "")),
                },
            }
        )
    return config


def test_result_predicate(gate: Gate, config: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The in-toto test-result v0.1 predicate for a gate."""
    return {
        "result": gate.result,
        "configuration": [dict(c) for c in config],
        "passedTests": list(gate.passed),
        "warnedTests": list(gate.warned),
        "failedTests": list(gate.failed),
    }


def evidence_predicate(
    evidence: Mapping[str, Any], signer: Mapping[str, str], gate: Gate
) -> dict[str, Any]:
    """Our per-cell evidence predicate (see reports/README.md, "Attestation predicates")."""
    platform = default_platform(evidence)
    cells = [
        {
            "cellId": str(c.get("cell_id", "")),
            "backend": str(c.get("backend", "")),
            "probe": str(c.get("probe", "")),
            "platform": str(c.get("platform") or platform),
            "verdict": str(c.get("verdict", "")),
            "reason": str(c.get("reason", "")),
            "expected": c.get("expected"),
            "observed": c.get("observed"),
            "witness": c.get("witness") or {},
            "control": c.get("control") or {},
        }
        for c in evidence.get("cells") or []
    ]
    return {
        "runId": str(evidence.get("run_id", "")),
        "complete": bool(evidence.get("complete")),
        "harnessVersion": str((evidence.get("harness") or {}).get("version", "")),
        "platform": evidence.get("platform") or {},
        "signer": dict(signer),
        "gate": {"result": gate.result, "problems": list(gate.problems)},
        "cells": cells,
    }


def parse_statement(payload: bytes, where: str) -> dict[str, Any]:
    """Parse a verified payload into a Statement and check its frame.

    Raises:
        ReportError: not JSON, not Statement v1, no subjects with digests, or a predicate
            type sandbox-attest does not know.
    """
    try:
        stmt = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{where}: the payload is not JSON ({exc})") from exc
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        got = stmt.get("_type") if isinstance(stmt, dict) else type(stmt).__name__
        raise ReportError(f"{where}: _type is {got!r}, expected {STATEMENT_TYPE!r}")
    subjects = stmt.get("subject")
    if (
        not isinstance(subjects, list)
        or not subjects
        or not all(isinstance(s, dict) and isinstance(s.get("digest"), dict) for s in subjects)
    ):
        raise ReportError(f"{where}: the statement has no subjects with digests")
    ptype = stmt.get("predicateType")
    if ptype not in KNOWN_PREDICATES:
        raise ReportError(
            f"{where}: unknown predicateType {ptype!r}; sandbox-attest knows "
            f"{', '.join(sorted(KNOWN_PREDICATES))}"
        )
    if not isinstance(stmt.get("predicate"), dict):
        raise ReportError(f"{where}: predicate must be an object")
    return stmt
