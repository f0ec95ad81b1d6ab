"""The release gate: verify a signed report against a trusted key and the release policy.

`verify_report` never stops at the first problem: it collects every reason, so a reviewer
sees the whole picture in one go. It passes only if every check holds:

  1. every line of attestation.intoto.jsonl is a DSSE envelope of type in-toto, signed by
     the trusted key, carrying an in-toto Statement v1 of a predicate type we know;
  2. exactly one test-result and one evidence statement are present;
  3. each statement's subject digests equal the sha256 of evidence.json and junit.xml now;
  4. the gate re-derived from evidence.json with the given policy equals the signed one,
     and is PASSED or WARNED;
  5. the statement was derived with the very policy given (same sha256: no downgrade), and
     every leg and probe that policy requires is present and PASS;
  6. the signer is not the untrusted per-machine key, unless explicitly allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.attest import ATTESTATION_NAME, EVIDENCE_NAME, JUNIT_NAME, UNTRUSTED_LOCAL_NOTE, dsse
from harness.attest.policy import Gate, cell_leg, evaluate, missing_legs
from harness.attest.statement import (
    EVIDENCE_PREDICATE,
    TEST_RESULT_PREDICATE,
    default_platform,
    parse_evidence,
    parse_statement,
    sha256_hex,
)
from harness.errors import ReportError, SignatureError

if TYPE_CHECKING:
    from pathlib import Path

    from harness.attest.keys import TrustedKey
    from harness.attest.policy import Policy


@dataclass
class Verification:
    """The outcome of verifying one report directory.

    Attributes:
        report_dir: the directory verified.
        reasons: every reason it does not verify; empty means it verifies.
        gate: the gate re-derived from the evidence (None if the evidence was unreadable).
        evidence: the parsed evidence (None if unreadable).
        legs: the (platform, backend) legs the evidence covers.
        signer: the signed evidence predicate's `signer` block.
        attestation_sha256: digest of attestation.intoto.jsonl (for merge subjects).
    """

    report_dir: Path
    reasons: list[str] = field(default_factory=list)
    gate: Gate | None = None
    evidence: dict[str, Any] | None = None
    legs: set[tuple[str, str]] = field(default_factory=set)
    signer: dict[str, Any] = field(default_factory=dict)
    attestation_sha256: str = ""

    @property
    def ok(self) -> bool:
        """True only when no reason was found."""
        return not self.reasons


def _read(path: Path, v: Verification, why: str) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError as exc:
        v.reasons.append(f"{path.name} is missing or unreadable ({exc.strerror}); {why}")
        return None


def _statements(
    raw: bytes, trusted: TrustedKey, v: Verification
) -> dict[str, list[dict[str, Any]]]:
    """Steps 1-2: every envelope verifies; group the statements by predicate type."""
    found: dict[str, list[dict[str, Any]]] = {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        v.reasons.append(f"{ATTESTATION_NAME} is not UTF-8 text; it was corrupted")
        return found
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        v.reasons.append(f"{ATTESTATION_NAME} is empty: the report was never signed")
    for number, line in lines:
        where = f"{ATTESTATION_NAME} line {number}"
        try:
            envelope = dsse.Envelope.from_json(line, where=where)
            payload = dsse.verify(envelope, trusted.public_key, trusted.keyid)
            stmt = parse_statement(payload, where)
        except SignatureError as exc:
            v.reasons.append(f"{where}: signature check failed: {exc}")
            continue
        except ReportError as exc:
            v.reasons.append(str(exc))
            continue
        found.setdefault(str(stmt["predicateType"]), []).append(stmt)
    for ptype in (TEST_RESULT_PREDICATE, EVIDENCE_PREDICATE):
        count = len(found.get(ptype, []))
        if count != 1 and not (count == 0 and v.reasons):
            v.reasons.append(
                f"{ATTESTATION_NAME} holds {count} statements of type {ptype}; exactly one "
                "is expected"
            )
    return found


def _check_subjects(stmt: dict[str, Any], files: dict[str, bytes | None], v: Verification) -> None:
    """Step 3: the signed digests equal the files' digests now."""
    signed = {str(s.get("name")): s.get("digest", {}) for s in stmt["subject"]}
    kind = "test-result" if stmt["predicateType"] == TEST_RESULT_PREDICATE else "evidence"
    for name, data in files.items():
        if name not in signed:
            v.reasons.append(f"the {kind} statement does not name {name} as a subject")
            continue
        if data is None:
            continue
        want = str(signed[name].get("sha256", ""))
        have = sha256_hex(data)
        if want != have:
            v.reasons.append(
                f"{name} does not match its signed digest in the {kind} statement (signed "
                f"sha256 {want[:16]}..., file has {have[:16]}...): the file was changed "
                "after signing"
            )


def _policy_digest(stmt: dict[str, Any]) -> str:
    for item in stmt["predicate"].get("configuration") or []:
        if isinstance(item, dict) and item.get("name") == "policy":
            return str((item.get("digest") or {}).get("sha256", ""))
    return ""


def _check_gate(
    result_stmt: dict[str, Any] | None,
    evidence: dict[str, Any],
    policy: Policy,
    v: Verification,
) -> None:
    """Steps 4-5: re-derive the gate from the evidence and compare it to the signed one."""
    platform = default_platform(evidence)
    cells = evidence["cells"]
    v.legs = {cell_leg(c, platform) for c in cells}
    gate = evaluate(
        cells, policy, default_platform=platform, complete=evidence.get("complete") is True
    )
    v.gate = gate
    v.reasons.extend(gate.problems)
    if gate.result == "FAILED" and not gate.problems:
        v.reasons.append("the gate re-derived from the evidence is FAILED")
    if result_stmt is None:
        return
    predicate = result_stmt["predicate"]
    signed_digest = _policy_digest(result_stmt)
    if signed_digest != policy.sha256:
        v.reasons.append(
            f"policy mismatch: the statement was derived with policy sha256 "
            f"{signed_digest[:16] or '<none>'}..., but --policy {policy.path} has "
            f"{policy.sha256[:16]}... (a downgraded or different policy); verify with the "
            "policy the release requires"
        )
    if predicate.get("result") != gate.result:
        v.reasons.append(
            f"the signed result is {predicate.get('result')!r} but the evidence gives "
            f"{gate.result!r} under {policy.path}"
        )
    for key, mine in (
        ("passedTests", gate.passed),
        ("warnedTests", gate.warned),
        ("failedTests", gate.failed),
    ):
        if sorted(predicate.get(key) or []) != sorted(mine):
            v.reasons.append(f"the signed {key} differ from the ones the evidence gives")


def _check_evidence_statement(
    stmt: dict[str, Any], evidence: dict[str, Any], allow_untrusted_local: bool, v: Verification
) -> None:
    """The evidence predicate agrees with evidence.json and its signer is acceptable."""
    predicate = stmt["predicate"]
    signed = {str(c.get("cellId")): c.get("verdict") for c in predicate.get("cells") or []}
    actual = {str(c.get("cell_id")): c.get("verdict") for c in evidence["cells"]}
    if signed != actual:
        v.reasons.append("the signed evidence predicate's cells differ from evidence.json")
    signer = predicate.get("signer")
    v.signer = signer if isinstance(signer, dict) else {}
    if v.signer.get("trust") == "untrusted-local" and not allow_untrusted_local:
        v.reasons.append(
            f"{UNTRUSTED_LOCAL_NOTE} (keyid {v.signer.get('keyid')}): a per-machine key "
            "proves only that this machine signed it; sign with --key or "
            "$SANDBOX_ATTEST_SIGNING_KEY, or, to accept it, pass that key as --trusted-key "
            "together with --allow-untrusted-local"
        )


def verify_report(
    report_dir: Path,
    trusted: TrustedKey,
    policy: Policy,
    *,
    allow_untrusted_local: bool = False,
    require_all_legs: bool = True,
) -> Verification:
    """Verify one report directory (see the module docstring for the checks).

    Args:
        report_dir: holds attestation.intoto.jsonl, evidence.json and junit.xml.
        trusted: the only key whose signatures count.
        policy: the release policy to hold the evidence to.
        allow_untrusted_local: accept a report signed by a per-machine key (which must also
            be `trusted`).
        require_all_legs: every leg the policy names must be in this report; `merge` turns
            this off per leg and checks the union instead.

    Returns:
        The verification; `ok` is True only if every check held.
    """
    v = Verification(report_dir)
    if not report_dir.is_dir():
        v.reasons.append(f"{report_dir} is not a directory; pass a report directory")
        return v
    raw = _read(report_dir / ATTESTATION_NAME, v, "sign the report first")
    evidence_bytes = _read(report_dir / EVIDENCE_NAME, v, "the run wrote no evidence")
    junit_bytes = _read(report_dir / JUNIT_NAME, v, "the run wrote no junit.xml")
    statements = _statements(raw, trusted, v) if raw is not None else {}
    if raw is not None:
        v.attestation_sha256 = sha256_hex(raw)
    files = {EVIDENCE_NAME: evidence_bytes, JUNIT_NAME: junit_bytes}
    for group in statements.values():
        for stmt in group:
            _check_subjects(stmt, files, v)
    if evidence_bytes is not None:
        try:
            v.evidence = parse_evidence(evidence_bytes, EVIDENCE_NAME)
        except ReportError as exc:
            v.reasons.append(str(exc))
    if v.evidence is not None:
        results = statements.get(TEST_RESULT_PREDICATE, [])
        _check_gate(results[0] if results else None, v.evidence, policy, v)
        for stmt in statements.get(EVIDENCE_PREDICATE, [])[:1]:
            _check_evidence_statement(stmt, v.evidence, allow_untrusted_local, v)
        if require_all_legs:
            v.reasons.extend(
                f"missing leg {leg}: the policy requires it, but the report has no cells for it"
                for leg in missing_legs(policy, v.legs)
            )
    return v
