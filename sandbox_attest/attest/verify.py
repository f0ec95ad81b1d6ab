"""The release gate: verify a signed report against a trusted key and the release policy.

`verify_report` never stops at the first problem: it collects every reason, so a reviewer
sees the whole picture in one go. It passes only if every check holds:

  1. every line of attestation.intoto.jsonl is a DSSE envelope of type in-toto, signed by
     the trusted key, carrying an in-toto Statement v1 of a predicate type we know;
  2. one test-result statement per backend of the evidence (issue 30; a report from before
     it has one, about its report files, and a note says so) and one evidence statement;
  3. each statement covers every report file in `subjects.ALL_SUBJECTS` (the evidence
     statement as subjects, a test-result statement in its configuration), and each signed
     digest equals the digest of that file (allure-results/: its tree digest) now; each
     test-result statement's subjects are exactly what the signed evidence says its backend
     ran (`verification.check_sandboxes`);
  4. the gate re-derived from evidence.json with the given policy equals the signed one (and
     each backend's, `backend_gate`, its statement's), and is PASSED or WARNED;
  5. the statement was derived with the very policy given (same sha256: no downgrade), and
     every leg and probe that policy requires is present and PASS;
  6. the trusted key is not a per-machine key (its keyid is not in this machine's
     untrusted-keys registry), unless explicitly allowed; the signed `signer.trust` field
     is never read for this, since whoever holds a local key can sign any payload;
  7. the signed run finished no longer ago than `max_age` and not in the future;
  8. with `expect_commit`, the signed harness commit matches and the checkout was clean;
  9. the signed trust-domains fact is measured (per backend, `sandbox_attest.host.separation`),
     follows from the signed cells, and says separated, unless explicitly allowed
     (`allow_shared_trust_domain`): a run in which sandboxed code ran as root or as the
     harness's uid could read the key and forge what was signed.

A merged release directory (written by `merge`: one test-result statement whose configuration
names an `expect-legs` file, every subject of each leg copied under `legs/NN-<dir>/`, and the
release's own report.html and summary.md beside legs/) is verified as a whole: its envelope
against the trusted key, every subject digest against the copy under the directory (the
release pages too), every copied leg on its own, the combined gate re-derived by
`verify_legs` (the function `merge` decided it with) against the signed one, and the release's
verification summary against the one the verified legs give (`summary.check_summary`).

The checks themselves, and the `Verification` they fill, are in `attest.verification`; this
module is the order they run in.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import ATTESTATION_NAME, EVIDENCE_NAME
from sandbox_attest.attest.legs import Combined, ExpectedLegs, combine, leg_digests
from sandbox_attest.attest.statement import (
    TEST_RESULT_PREDICATE,
    VSA_PREDICATE,
    parse_evidence,
    sha256_hex,
)
from sandbox_attest.attest.subjects import ALL_SUBJECTS, RELEASE_SUBJECTS
from sandbox_attest.attest.summary import check_summary
from sandbox_attest.attest.verification import (
    RUN_SIGNS,
    Checks,
    Verification,
    check_counts,
    check_judged,
    check_key_trust,
    check_subjects,
    check_trust_domains,
    compare_signed,
    configuration_entries,
    configuration_item,
    entry_sha256,
    read_regular_file,
    read_subjects,
    record_pins,
    sandbox_statements,
    verified_statements,
)
from sandbox_attest.errors import ReportError
from sandbox_attest.report.policy import missing_legs

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from sandbox_attest.attest.keys import TrustedKey
    from sandbox_attest.report.policy import Policy

# Every subject of a leg report that a merge signs and copies under legs/NN-<dir>/.
LEG_FILES = (*ALL_SUBJECTS, ATTESTATION_NAME)
LEGS_DIR = "legs"
_LEG_SUBJECT = re.compile(
    r"legs/(?P<label>[0-9]{2,}-[^/]+)/(?P<file>" + "|".join(re.escape(f) for f in LEG_FILES) + ")"
)


def verify_report(
    report_dir: Path,
    trusted: TrustedKey,
    policy: Policy,
    *,
    allow_untrusted_local: bool = False,
    require_all_legs: bool = True,
    accept_merged: bool = True,
    checks: Checks | None = None,
    allow_shared_trust_domain: bool = False,
) -> Verification:
    """Verify one report directory, or a merged release (see the module docstring).

    Args:
        report_dir: holds attestation.intoto.jsonl and every subject (or, merged,
            attestation.intoto.jsonl and legs/).
        trusted: the only key whose signatures count.
        policy: the release policy to hold the evidence to.
        allow_untrusted_local: accept a report signed by a per-machine key (which must also
            be `trusted`).
        require_all_legs: every leg the policy names must be in this report; `merge` turns
            this off per leg and checks the union instead.
        accept_merged: False when verifying one leg of a merge: a merged directory is no leg.
        checks: freshness, expected commit and the untrusted-key registry (default:
            `Checks()`, i.e. 30 days, any commit, this user's registry).
        allow_shared_trust_domain: accept a run whose trust domains were not separated (or
            not measured); a note says so.

    Returns:
        The verification; `ok` is True only if every check held.

    Raises:
        ConfigError: this user's untrusted-keys registry is unsafe to believe.
    """
    checks = checks or Checks()
    v = Verification(report_dir)
    if not report_dir.is_dir():
        v.reasons.append(f"{report_dir} is not a directory; pass a report directory")
        return v
    raw = read_regular_file(report_dir / ATTESTATION_NAME, v, RUN_SIGNS)
    statements = verified_statements(raw, trusted, v) if raw is not None else {}
    if raw is not None:
        v.attestation_sha256 = sha256_hex(raw)
        v.files[ATTESTATION_NAME] = raw
        v.digests[ATTESTATION_NAME] = v.attestation_sha256
    merged = _merged_statement(statements)
    if merged is not None:
        if accept_merged:
            check_key_trust(trusted, checks, allow_untrusted_local, v, "the merge is")
            _verify_merged(
                merged,
                statements,
                trusted,
                policy,
                allow_untrusted_local,
                checks,
                v,
                allow_shared_trust_domain=allow_shared_trust_domain,
            )
        else:
            v.reasons.append(
                "this is a merged release, not one leg's report; pass the leg directories "
                "that were merged"
            )
        return v
    check_key_trust(trusted, checks, allow_untrusted_local, v, "the report is")
    _verify_single(
        statements,
        policy,
        require_all_legs,
        checks,
        v,
        allow_shared_trust_domain=allow_shared_trust_domain,
    )
    return v


def _verify_single(
    statements: dict[str, list[dict[str, Any]]],
    policy: Policy,
    require_all_legs: bool,
    checks: Checks,
    v: Verification,
    *,
    allow_shared_trust_domain: bool = False,
) -> None:
    """Steps 2-8 for one run's report: every subject beside the envelopes."""
    results = statements.get(TEST_RESULT_PREDICATE, [])
    sandbox_stmts = sandbox_statements(statements, v)
    digests = read_subjects(v.report_dir, v)
    for group in statements.values():
        for stmt in group:
            check_subjects(stmt, digests, v)
    if results:
        record_pins(results[0], checks, v, "the report")
    evidence_bytes = v.files.get(EVIDENCE_NAME)
    if evidence_bytes is not None:
        try:
            v.evidence = parse_evidence(evidence_bytes, EVIDENCE_NAME)
        except ReportError as exc:
            v.reasons.append(str(exc))
    if v.evidence is not None:
        check_judged(statements, sandbox_stmts, v.evidence, policy, v)
    if results:
        check_trust_domains(v, allow_shared_trust_domain)
        if require_all_legs:
            v.reasons.extend(
                f"missing leg {leg}: the policy requires it, but the report has no cells for it"
                for leg in missing_legs(policy, v.legs)
            )


def verify_legs(
    labelled_dirs: Sequence[tuple[str, Path]],
    expected: ExpectedLegs,
    trusted: TrustedKey,
    policy: Policy,
    *,
    allow_untrusted_local: bool,
    checks: Checks | None = None,
    allow_shared_trust_domain: bool = False,
) -> Combined:
    """Verify each leg on its own, then combine them (see `sandbox_attest.attest.legs.combine`).

    The one path from leg directories to a release decision: `merge` signs what this returns,
    and `verify` of a merged directory re-runs it over the copies and compares.

    Args:
        labelled_dirs: (label `NN-<dirname>`, leg directory), in merge order.
        expected: the legs the release needs.
        trusted: the key every leg must be signed with.
        policy: the release policy.
        allow_untrusted_local: accept legs signed by a per-machine key.
        checks: held by every leg (freshness, commit, registry).
        allow_shared_trust_domain: accept legs whose trust domains were not separated.
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
                checks=checks,
                allow_shared_trust_domain=allow_shared_trust_domain,
            ),
        )
        for label, d in labelled_dirs
    ]
    return combine(labelled, expected, policy)


def _merged_statement(statements: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The test-result statement of a merge (it names an expect-legs file), if this is one."""
    for stmt in statements.get(TEST_RESULT_PREDICATE, []):
        if configuration_item(stmt, "expect-legs") is not None:
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
        if name in RELEASE_SUBJECTS:
            continue  # the release's own pages: `_check_release_pages`
        match = _LEG_SUBJECT.fullmatch(name)
        if match is None:
            v.reasons.append(
                f"the merged statement names subject {name!r}; only "
                f"{', '.join(RELEASE_SUBJECTS)} and legs/NN-<dir>/<file> of "
                f"{', '.join(LEG_FILES)} are expected"
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
            v.reasons.append(
                f"the merged statement does not cover {LEGS_DIR}/{label}/{absent[0]}: it was "
                "merged by an older sandbox-attest; re-run `sandbox-attest merge`"
            )
    return labels, digests


def _check_release_pages(stmt: dict[str, Any], v: Verification) -> None:
    """The release's report.html and summary.md are signed, and unchanged since the merge."""
    signed = {str(s.get("name")): s.get("digest") or {} for s in stmt["subject"]}
    for name in RELEASE_SUBJECTS:
        if name not in signed:
            v.reasons.append(
                f"the merged statement does not cover the release page {name}: it was merged "
                "by an older sandbox-attest; re-run `sandbox-attest merge`"
            )
            continue
        data = read_regular_file(
            v.report_dir / name, v, "`sandbox-attest merge` writes it; re-run it"
        )
        if data is None:
            continue
        v.files[name] = data
        have = sha256_hex(data)
        v.digests[name] = have
        want = str(signed[name].get("sha256", ""))
        if have != want:
            v.reasons.append(
                f"the release page {name} does not match its signed digest in the merged "
                f"statement (signed sha256 {want[:16]}..., file has {have[:16]}...): it was "
                "changed after the merge; re-run `sandbox-attest merge`"
            )


def _expected_from(stmt: dict[str, Any], v: Verification) -> ExpectedLegs:
    """The expected legs, rebuilt from the signed `expect-legs` and `leg:P/B` entries."""
    item = configuration_item(stmt, "expect-legs") or {}
    found: dict[str, list[tuple[str, str]]] = {"leg:": [], "informational-leg:": []}
    for entry in configuration_entries(stmt):
        name = str(entry.get("name", ""))
        for prefix, legs in found.items():
            platform, slash, backend = name.removeprefix(prefix).partition("/")
            if name.startswith(prefix) and slash and platform and backend:
                legs.append((platform, backend))
    if not found["leg:"]:
        v.reasons.append("the merged statement names no leg:PLATFORM/BACKEND; it merged nothing")
    return ExpectedLegs(
        str(item.get("uri", "expect-legs")),
        entry_sha256(item),
        tuple(found["leg:"]),
        tuple(found["informational-leg:"]),
    )


def _merged_signer(stmt: dict[str, Any], v: Verification) -> None:
    """Keep the merged statement's signer entry for display; trust is decided by the key."""
    signer = configuration_item(stmt, "signer")
    if signer is None:
        v.reasons.append("the merged statement names no signer; re-run `sandbox-attest merge`")
        return
    v.signer = {"keyid": entry_sha256(signer), **(signer.get("annotations") or {})}


def _check_merged_harness(
    stmt: dict[str, Any], combined: Combined, checks: Checks, v: Verification
) -> None:
    """The merge's signed harness commit and probes digest are the ones every leg signed."""
    record_pins(stmt, checks, v, "the merge")
    deciding = set(combined.legs.values())
    legs = [(label, leg) for label, leg in combined.verifications if label in deciding]
    if not legs or combined.harness_mismatch:
        return  # no legs, or `combine` already refused their differing harnesses
    commit, probes = legs[0][1].harness.get("commit"), legs[0][1].harness.get("probesSha256")
    if v.harness.get("commit") != commit or v.harness.get("probesSha256") != probes:
        v.reasons.append(
            f"the merged statement records harness commit {v.harness.get('commit')} and probes "
            f"{str(v.harness.get('probesSha256'))[:16]}..., but its legs were made by commit "
            f"{commit} with probes {str(probes)[:16]}...; re-run `sandbox-attest merge`"
        )


def _verify_merged(
    stmt: dict[str, Any],
    statements: dict[str, list[dict[str, Any]]],
    trusted: TrustedKey,
    policy: Policy,
    allow_untrusted_local: bool,
    checks: Checks,
    v: Verification,
    *,
    allow_shared_trust_domain: bool = False,
) -> None:
    """Verify a merged release directory: copies, each leg, and the re-derived combined gate."""
    summaries = statements.get(VSA_PREDICATE, [])
    if not summaries:
        v.notes.append(
            "this release was merged before issue 30: it carries no verification summary"
        )
    wanted = (TEST_RESULT_PREDICATE, VSA_PREDICATE) if summaries else (TEST_RESULT_PREDICATE,)
    check_counts(statements, wanted, v)
    _merged_signer(stmt, v)
    labels, digests = _signed_legs(stmt, v)
    _check_release_pages(stmt, v)
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
        checks=checks,
        allow_shared_trust_domain=allow_shared_trust_domain,
    )
    v.leg_results = list(combined.verifications)
    # The digests each leg's verification computed from the bytes it read are the ones
    # compared: no second read to swap.
    for label, leg in combined.verifications:
        for name, want in digests[label].items():
            have = leg.digests.get(name)
            if have is not None and have != want:
                v.reasons.append(
                    f"{LEGS_DIR}/{label}/{name} does not match its signed digest in the merged "
                    "statement: the copy was changed after the merge"
                )
    v.reasons.extend(combined.reasons)
    v.notes.extend(combined.notes)
    _check_merged_harness(stmt, combined, checks, v)
    v.legs = set(combined.legs) | combined.carried
    v.gate = combined.gate
    if combined.gate is not None:
        compare_signed(stmt, combined.gate, policy, v)
    for summary in summaries[:1]:
        v.reasons.extend(
            check_summary(
                summary, combined, policy, legs_dir=LEGS_DIR, attestation=ATTESTATION_NAME
            )
        )
    signed_legs = {
        str(c["name"]): entry_sha256(c)
        for c in configuration_entries(stmt)
        if str(c["name"]).startswith("leg:")
    }
    if signed_legs != leg_digests(combined):
        v.reasons.append(
            "the merged statement's leg:PLATFORM/BACKEND entries differ from the legs the "
            "copies hold"
        )
