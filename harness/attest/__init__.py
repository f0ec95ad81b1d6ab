"""Signed attestations of a run: DSSE envelopes over in-toto statements, verify and merge.

`sign_report` is what a run calls at its end; `verify_report` and `merge_legs` are the release
gate (`sandbox-attest verify` / `merge`, wired by `harness.attest.cli.register`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.attest import dsse, sigstore
from harness.attest.keys import (
    SigningKey,
    TrustedKey,
    keyid_of,
    load_signing_key,
    load_trusted_key,
    public_key_dict,
)
from harness.attest.policy import Gate, Policy, evaluate, load_policy
from harness.attest.statement import (
    EVIDENCE_PREDICATE,
    TEST_RESULT_PREDICATE,
    configuration,
    default_platform,
    evidence_predicate,
    read_evidence,
    statement,
    statement_bytes,
    subject,
    test_result_predicate,
)
from harness.errors import ConfigError, ReportError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

ATTESTATION_NAME = "attestation.intoto.jsonl"
SIGNING_NAME = "signing.json"  # unsigned sidecar: who signed, trust, sigstore outcome
EVIDENCE_NAME = "evidence.json"
JUNIT_NAME = "junit.xml"
UNTRUSTED_LOCAL_NOTE = "signed by an untrusted local key"

__all__ = [
    "ATTESTATION_NAME",
    "SIGNING_NAME",
    "UNTRUSTED_LOCAL_NOTE",
    "SigningKey",
    "TrustedKey",
    "gate_for",
    "keyid_of",
    "load_signing_key",
    "load_trusted_key",
    "policy_from_evidence",
    "sign_report",
    "signer_info",
    "write_envelopes",
]


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def policy_from_evidence(evidence: Mapping[str, Any]) -> Policy | None:
    """The policy the run recorded, if it is still on disk with the same digest."""
    recorded = evidence.get("policy") or {}
    path_text = recorded.get("path")
    if not isinstance(path_text, str) or not path_text:
        return None
    for candidate in (Path(path_text), _repo_root() / path_text):
        if candidate.is_file():
            try:
                policy = load_policy(candidate)
            except ConfigError:
                return None
            # A policy edited since the run is not the one the run was held to.
            return policy if policy.sha256 == recorded.get("sha256") else None
    return None


def gate_for(evidence: Mapping[str, Any], policy: Policy | None) -> Gate:
    """The gate of one run's evidence under `policy` (None: the cells judged alone).

    The one place signer, renderer and verify turn evidence into a gate, so they agree.
    """
    return evaluate(
        evidence["cells"],
        policy,
        default_platform=default_platform(evidence),
        complete=evidence.get("complete") is True,
    )


def signer_info(key: SigningKey) -> dict[str, str]:
    """What the signed evidence predicate records about its signer."""
    return {"keyid": key.keyid, "trust": key.trust, "source": key.source.split(":", 1)[0]}


def write_envelopes(path: Path, payloads: Sequence[bytes], key: SigningKey) -> None:
    """Sign each payload into its own envelope and write them one per line."""
    lines = [dsse.sign(p, key.private_key, key.keyid).to_json() for p in payloads]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_signing_sidecar(
    report_dir: Path, key: SigningKey, decision: sigstore.SigstoreDecision, gate: Gate
) -> None:
    """Write signing.json: the facts report.html and summary.md show about the signature."""
    data = {
        **signer_info(key),
        "public_key": public_key_dict(key.public_key),
        "note": UNTRUSTED_LOCAL_NOTE if key.trust == "untrusted-local" else "",
        "sigstore": {"status": decision.status, "reason": decision.reason},
        "gate": gate.result,
    }
    (report_dir / SIGNING_NAME).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def sign_report(
    report_dir: Path,
    key: SigningKey,
    *,
    policy: Policy | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Sign a finished report: write attestation.intoto.jsonl (and signing.json).

    Two envelopes, one per line: the in-toto test-result statement (the gate) and our
    evidence statement. Both name evidence.json and junit.xml by the sha256 of their bytes
    as they are on disk, read once here; sign after both files are final.

    Args:
        report_dir: the run's directory holding evidence.json and junit.xml.
        key: from `load_signing_key`.
        policy: the release policy the gate is derived with; by default the one evidence.json
            names, if it is still on disk unchanged (else the cells are judged alone).
        env: the environment for Sigstore's ambient-token check (default: os.environ).

    Returns:
        The path of attestation.intoto.jsonl.

    Raises:
        ReportError: evidence.json or junit.xml is missing or malformed.
    """
    evidence_bytes, evidence = read_evidence(report_dir / EVIDENCE_NAME)
    try:
        junit_bytes = (report_dir / JUNIT_NAME).read_bytes()
    except OSError as exc:
        raise ReportError(
            f"{report_dir / JUNIT_NAME}: cannot read ({exc.strerror}); sign after the run "
            "has written junit.xml"
        ) from exc
    if policy is None:
        policy = policy_from_evidence(evidence)
    gate = gate_for(evidence, policy)
    subjects = [subject(EVIDENCE_NAME, evidence_bytes), subject(JUNIT_NAME, junit_bytes)]
    config = configuration(evidence, policy.sha256 if policy else None)
    payloads = [
        statement_bytes(
            statement(subjects, TEST_RESULT_PREDICATE, test_result_predicate(gate, config))
        ),
        statement_bytes(
            statement(
                subjects, EVIDENCE_PREDICATE, evidence_predicate(evidence, signer_info(key), gate)
            )
        ),
    ]
    out = report_dir / ATTESTATION_NAME
    write_envelopes(out, payloads, key)
    decision = sigstore.sign_keyless(payloads, report_dir, os.environ if env is None else env)
    write_signing_sidecar(report_dir, key, decision, gate)
    return out
