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

A merged release directory (written by `merge`: one test-result statement whose configuration
names an `expect-legs` file, and each leg's three files copied under `legs/NN-<dir>/`) is
verified as a whole: its envelope against the trusted key, every subject digest against the
copy under the directory, every copied leg on its own, and the combined gate re-derived by
`verify_legs` (the function `merge` decided it with) against the signed one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.attest import (
    ATTESTATION_NAME,
    EVIDENCE_NAME,
    JUNIT_NAME,
    UNTRUSTED_LOCAL_NOTE,
    dsse,
    gate_for,
)
from harness.attest.legs import Combined, ExpectedLegs, combine, leg_digests
from harness.attest.policy import Gate, cell_leg, missing_legs
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
    from collections.abc import Sequence
    from pathlib import Path

    from harness.attest.keys import TrustedKey
    from harness.attest.policy import Policy

# The three files of a leg report that a merge signs and copies under legs/NN-<dir>/.
LEG_FILES = (EVIDENCE_NAME, JUNIT_NAME, ATTESTATION_NAME)
LEGS_DIR = "legs"
_LEG_SUBJECT = re.compile(
    r"legs/(?P<label>[0-9]{2,}-[^/]+)/(?P<file>evidence\.json|junit\.xml|attestation\.intoto\.jsonl)"
)
RUN_SIGNS = "`sandbox-attest run` signs a report at its end; re-run it"


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
        files: the exact bytes that were verified, by file name: a merge signs and copies
            these, never a re-read that could have been swapped since.
    """

    report_dir: Path
    reasons: list[str] = field(default_factory=list)
    gate: Gate | None = None
    evidence: dict[str, Any] | None = None
    legs: set[tuple[str, str]] = field(default_factory=set)
    signer: dict[str, Any] = field(default_factory=dict)
    attestation_sha256: str = ""
    files: dict[str, bytes] = field(default_factory=dict)

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
    return found


def _check_counts(
    found: dict[str, list[dict[str, Any]]], wanted: Sequence[str], v: Verification
) -> None:
    """Step 2: exactly one statement of each wanted type (and of no other)."""
    for ptype in sorted(set(found) | set(wanted)):
        count = len(found.get(ptype, []))
        want = 1 if ptype in wanted else 0
        if count != want and not (count == 0 and v.reasons):
            v.reasons.append(
                f"{ATTESTATION_NAME} holds {count} statements of type {ptype}; exactly {want} "
                "expected"
            )


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


def _config(stmt: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in stmt["predicate"].get("configuration") or [] if isinstance(c, dict)]


def _config_item(stmt: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in _config(stmt) if c.get("name") == name), None)


def _digest(item: dict[str, Any] | None) -> str:
    return str(((item or {}).get("digest") or {}).get("sha256", ""))


def _compare_signed(
    result_stmt: dict[str, Any], gate: Gate, policy: Policy, v: Verification
) -> None:
    """The signed policy digest, result and test lists equal the re-derived ones."""
    predicate = result_stmt["predicate"]
    signed_digest = _digest(_config_item(result_stmt, "policy"))
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


def _check_gate(
    result_stmt: dict[str, Any] | None,
    evidence: dict[str, Any],
    policy: Policy,
    v: Verification,
) -> None:
    """Steps 4-5: re-derive the gate from the evidence and compare it to the signed one."""
    v.legs = {cell_leg(c, default_platform(evidence)) for c in evidence["cells"]}
    gate = gate_for(evidence, policy)
    v.gate = gate
    v.reasons.extend(gate.problems)
    if gate.result == "FAILED" and not gate.problems:
        v.reasons.append("the gate re-derived from the evidence is FAILED")
    if result_stmt is not None:
        _compare_signed(result_stmt, gate, policy, v)


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


def _verify_single(
    statements: dict[str, list[dict[str, Any]]],
    policy: Policy,
    allow_untrusted_local: bool,
    require_all_legs: bool,
    v: Verification,
) -> None:
    """Steps 2-6 for one run's report: evidence.json and junit.xml beside the envelopes."""
    report_dir = v.report_dir
    _check_counts(statements, (TEST_RESULT_PREDICATE, EVIDENCE_PREDICATE), v)
    evidence_bytes = _read(report_dir / EVIDENCE_NAME, v, "the run wrote no evidence")
    junit_bytes = _read(report_dir / JUNIT_NAME, v, "the run wrote no junit.xml")
    files = {EVIDENCE_NAME: evidence_bytes, JUNIT_NAME: junit_bytes}
    v.files.update({name: data for name, data in files.items() if data is not None})
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


def verify_report(
    report_dir: Path,
    trusted: TrustedKey,
    policy: Policy,
    *,
    allow_untrusted_local: bool = False,
    require_all_legs: bool = True,
    accept_merged: bool = True,
) -> Verification:
    """Verify one report directory, or a merged release (see the module docstring).

    Args:
        report_dir: holds attestation.intoto.jsonl, evidence.json and junit.xml (or, merged,
            attestation.intoto.jsonl and legs/).
        trusted: the only key whose signatures count.
        policy: the release policy to hold the evidence to.
        allow_untrusted_local: accept a report signed by a per-machine key (which must also
            be `trusted`).
        require_all_legs: every leg the policy names must be in this report; `merge` turns
            this off per leg and checks the union instead.
        accept_merged: False when verifying one leg of a merge: a merged directory is no leg.

    Returns:
        The verification; `ok` is True only if every check held.
    """
    v = Verification(report_dir)
    if not report_dir.is_dir():
        v.reasons.append(f"{report_dir} is not a directory; pass a report directory")
        return v
    raw = _read(report_dir / ATTESTATION_NAME, v, RUN_SIGNS)
    statements = _statements(raw, trusted, v) if raw is not None else {}
    if raw is not None:
        v.attestation_sha256 = sha256_hex(raw)
        v.files[ATTESTATION_NAME] = raw
    merged = _merged_statement(statements)
    if merged is not None:
        if accept_merged:
            _verify_merged(merged, statements, trusted, policy, allow_untrusted_local, v)
        else:
            v.reasons.append(
                "this is a merged release, not one leg's report; pass the leg directories "
                "that were merged"
            )
        return v
    _verify_single(statements, policy, allow_untrusted_local, require_all_legs, v)
    return v


def verify_legs(
    labelled_dirs: Sequence[tuple[str, Path]],
    expected: ExpectedLegs,
    trusted: TrustedKey,
    policy: Policy,
    *,
    allow_untrusted_local: bool,
) -> Combined:
    """Verify each leg on its own, then combine them (see `harness.attest.legs.combine`).

    The one path from leg directories to a release decision: `merge` signs what this returns,
    and `verify` of a merged directory re-runs it over the copies and compares.

    Args:
        labelled_dirs: (label `NN-<dirname>`, leg directory), in merge order.
        expected: the legs the release needs.
        trusted: the key every leg must be signed with.
        policy: the release policy.
        allow_untrusted_local: accept legs signed by a per-machine key.
    """
    labelled = [
        (
            label,
            verify_report(
                d,
                trusted,
                policy,
                allow_untrusted_local=allow_untrusted_local,
                require_all_legs=False,
                accept_merged=False,
            ),
        )
        for label, d in labelled_dirs
    ]
    return combine(labelled, expected, policy)


def _merged_statement(statements: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The test-result statement of a merge (it names an expect-legs file), if this is one."""
    for stmt in statements.get(TEST_RESULT_PREDICATE, []):
        if _config_item(stmt, "expect-legs") is not None:
            return stmt
    return None


def _signed_legs(
    stmt: dict[str, Any], v: Verification
) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The leg labels in signed order, and each label's signed file -> sha256."""
    labels: list[str] = []
    digests: dict[str, dict[str, str]] = {}
    for item in stmt["subject"]:
        name = str(item.get("name"))
        match = _LEG_SUBJECT.fullmatch(name)
        if match is None:
            v.reasons.append(
                f"the merged statement names subject {name!r}; only legs/NN-<dir>/<file> of "
                f"{', '.join(LEG_FILES)} is expected"
            )
            continue
        label = match["label"]
        if label not in digests:
            labels.append(label)
            digests[label] = {}
        digests[label][match["file"]] = str(item["digest"].get("sha256", ""))
    for label in labels:
        absent = [f for f in LEG_FILES if f not in digests[label]]
        if absent:
            v.reasons.append(f"the merged statement does not name {LEGS_DIR}/{label}/{absent[0]}")
    return labels, digests


def _expected_from(stmt: dict[str, Any], v: Verification) -> ExpectedLegs:
    """The expected legs, rebuilt from the signed `expect-legs` and `leg:P/B` entries."""
    item = _config_item(stmt, "expect-legs") or {}
    legs: list[tuple[str, str]] = []
    for entry in _config(stmt):
        platform, slash, backend = str(entry.get("name", "")).removeprefix("leg:").partition("/")
        if str(entry.get("name", "")).startswith("leg:") and slash and platform and backend:
            legs.append((platform, backend))
    if not legs:
        v.reasons.append("the merged statement names no leg:PLATFORM/BACKEND; it merged nothing")
    return ExpectedLegs(str(item.get("uri", "expect-legs")), _digest(item), tuple(legs))


def _check_merged_signer(
    stmt: dict[str, Any], allow_untrusted_local: bool, v: Verification
) -> None:
    signer = _config_item(stmt, "signer")
    if signer is None:
        v.reasons.append("the merged statement names no signer; re-run `sandbox-attest merge`")
        return
    v.signer = {"keyid": _digest(signer), **(signer.get("annotations") or {})}
    if v.signer.get("trust") == "untrusted-local" and not allow_untrusted_local:
        v.reasons.append(
            f"the merge is {UNTRUSTED_LOCAL_NOTE} (keyid {v.signer['keyid']}); merge with --key "
            "or $SANDBOX_ATTEST_SIGNING_KEY, or, to accept it, pass that key as --trusted-key "
            "together with --allow-untrusted-local"
        )


def _verify_merged(
    stmt: dict[str, Any],
    statements: dict[str, list[dict[str, Any]]],
    trusted: TrustedKey,
    policy: Policy,
    allow_untrusted_local: bool,
    v: Verification,
) -> None:
    """Verify a merged release directory: copies, each leg, and the re-derived combined gate."""
    _check_counts(statements, (TEST_RESULT_PREDICATE,), v)
    _check_merged_signer(stmt, allow_untrusted_local, v)
    labels, digests = _signed_legs(stmt, v)
    legs_dir = v.report_dir / LEGS_DIR
    on_disk = {p.name for p in legs_dir.iterdir()} if legs_dir.is_dir() else set()
    v.reasons.extend(
        f"{LEGS_DIR}/{name} is not named by the signed statement; remove it"
        for name in sorted(on_disk - set(labels))
    )
    combined = verify_legs(
        [(label, legs_dir / label) for label in labels],
        _expected_from(stmt, v),
        trusted,
        policy,
        allow_untrusted_local=allow_untrusted_local,
    )
    # The bytes each leg's verification read are the ones compared: no second read to swap.
    for label, leg in combined.verifications:
        for name, want in digests[label].items():
            data = leg.files.get(name)
            if data is not None and sha256_hex(data) != want:
                v.reasons.append(
                    f"{LEGS_DIR}/{label}/{name} does not match its signed digest in the merged "
                    "statement: the copy was changed after the merge"
                )
    v.reasons.extend(combined.reasons)
    v.legs = set(combined.legs) | combined.carried
    v.gate = combined.gate
    if combined.gate is not None:
        _compare_signed(stmt, combined.gate, policy, v)
    signed_legs = {
        str(c["name"]): _digest(c) for c in _config(stmt) if str(c["name"]).startswith("leg:")
    }
    if signed_legs != leg_digests(combined):
        v.reasons.append(
            "the merged statement's leg:PLATFORM/BACKEND entries differ from the legs the "
            "copies hold"
        )
