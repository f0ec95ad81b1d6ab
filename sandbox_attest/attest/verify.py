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
     ran (`_check_sandboxes`);
  4. the gate re-derived from evidence.json with the given policy equals the signed one (and
     each backend's, `backend_gate`, its statement's), and is PASSED or WARNED;
  5. the statement was derived with the very policy given (same sha256: no downgrade), and
     every leg and probe that policy requires is present and PASS;
  6. the trusted key is not a per-machine key (its keyid is not in this machine's
     untrusted-keys registry), unless explicitly allowed; the signed `signer.trust` field
     is never read for this, since whoever holds a local key can sign any payload;
  7. the signed run finished no longer ago than `max_age` and not in the future;
  8. with `expect_commit`, the signed harness commit matches and the checkout was clean;
  9. the signed trust-domains fact is measured (per backend, `sandbox_attest.run.separation`),
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
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import (
    ATTESTATION_NAME,
    EVIDENCE_NAME,
    backend_gate,
    dsse,
)
from sandbox_attest.attest.keys import read_untrusted_keyids, untrusted_registry_path
from sandbox_attest.attest.legs import Combined, ExpectedLegs, combine, leg_digests
from sandbox_attest.attest.statement import (
    CONTROL_ROLE,
    EVIDENCE_PREDICATE,
    REPORT_ROLE,
    SANDBOX_ENTRY,
    TEST_RESULT_PREDICATE,
    VSA_PREDICATE,
    backend_records,
    parse_evidence,
    parse_statement,
    sandbox_subjects,
    sha256_hex,
)
from sandbox_attest.attest.subjects import (
    ALL_SUBJECTS,
    ALLURE_DIR,
    ALLURE_SUBJECT,
    FILE_SUBJECTS,
    RELEASE_SUBJECTS,
    read_tree,
    tree_digest_of,
)
from sandbox_attest.attest.summary import check_summary
from sandbox_attest.errors import ConfigError, ReportError, SignatureError
from sandbox_attest.report.policy import (
    CONTROL_BACKEND,
    Gate,
    cell_leg,
    claim_problems,
    default_platform,
    gate_for,
    leg_claims,
    missing_legs,
)
from sandbox_attest.report.signature import UNTRUSTED_LOCAL_NOTE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox_attest.attest.keys import TrustedKey
    from sandbox_attest.report.policy import Policy

# Every subject of a leg report that a merge signs and copies under legs/NN-<dir>/.
LEG_FILES = (*ALL_SUBJECTS, ATTESTATION_NAME)
LEGS_DIR = "legs"
_LEG_SUBJECT = re.compile(
    r"legs/(?P<label>[0-9]{2,}-[^/]+)/(?P<file>" + "|".join(re.escape(f) for f in LEG_FILES) + ")"
)
RUN_SIGNS = "`sandbox-attest run` signs a report at its end; re-run it"
DEFAULT_MAX_AGE = timedelta(days=30)
# Clocks of CI runners and laptops drift; more than this ahead is a wrong clock or a forgery.
FUTURE_SKEW = timedelta(minutes=5)
_DURATION = re.compile(r"(?P<n>[0-9]+)(?P<unit>[smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def parse_max_age(text: str) -> timedelta | None:
    """A `--max-age` value: `30d`, `12h`, `90m`, `45s`, `2w`; `0` or `none` turn it off.

    Raises:
        ConfigError: anything else, naming the accepted forms.
    """
    value = text.strip().lower()
    if value in {"0", "none"}:
        return None
    match = _DURATION.fullmatch(value)
    if match is None or int(match["n"]) == 0:
        raise ConfigError(
            f"--max-age {text!r} is not a duration; use a number with s, m, h, d or w "
            "(e.g. 30d, 12h), or `none` to skip the freshness check"
        )
    return timedelta(**{_UNITS[match["unit"]]: int(match["n"])})


def parse_commit(text: str) -> str:
    """An `--expect-commit` value: 7 to 40 hex digits (a prefix of the commit), lowercased.

    Raises:
        ConfigError: not 7 to 40 hex digits.
    """
    value = text.strip().lower()
    if not _COMMIT.fullmatch(value):
        raise ConfigError(
            f"--expect-commit {text!r} is not a commit; pass 7 to 40 hex digits, e.g. "
            "`--expect-commit $(git rev-parse HEAD)`"
        )
    return value


def format_duration(delta: timedelta) -> str:
    """A duration the way `--max-age` is written: whole days, else hours, minutes, seconds."""
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds}s"


@dataclass(frozen=True)
class Checks:
    """What a report is held to besides the trusted key and the policy.

    Attributes:
        max_age: the oldest a signed `finishedAt` may be (None: not checked, and said so).
        expect_commit: a commit (prefix) the signed harness commit must start with.
        untrusted_keyids: keyids of per-machine keys; None reads this user's registry
            (`keys.untrusted_registry_path(os.environ)`) when first needed.
        now: the time to judge freshness against (default: the clock, in UTC).
    """

    max_age: timedelta | None = DEFAULT_MAX_AGE
    expect_commit: str | None = None
    untrusted_keyids: frozenset[str] | None = None
    now: datetime | None = None

    def untrusted(self) -> frozenset[str]:
        """The untrusted keyids: the given set, or this user's registry.

        Raises:
            ConfigError: the registry is unsafe to believe (see `keys.read_untrusted_keyids`).
        """
        if self.untrusted_keyids is not None:
            return self.untrusted_keyids
        return read_untrusted_keyids(untrusted_registry_path(os.environ))


@dataclass(frozen=True)
class SandboxResult:
    """One backend's signed test-result statement, checked against the signed evidence.

    Attributes:
        backend: the backend's name.
        control: the statement is the control leg's (it attests no sandbox).
        subjects: the signed subjects (name, sha256): what the backend ran.
        result: the signed result (PASSED, WARNED or FAILED).
        passed: the signed passedTests (this backend's cells).
        finished_at: when the run that tested it finished (signed).
        leg: the merged leg label it came from ("" for a single report).
    """

    backend: str
    control: bool
    subjects: tuple[tuple[str, str], ...]
    result: str
    passed: tuple[str, ...]
    finished_at: str
    leg: str = ""


PRE_ISSUE_30_NOTE = (
    "this report was signed before issue 30: its test-result statement's subject is the "
    "report files, not the sandbox under test (verify --subject cannot find a sandbox in it)"
)


@dataclass
class Verification:
    """The outcome of verifying one report directory.

    Attributes:
        report_dir: the directory verified.
        reasons: every reason it does not verify; empty means it verifies.
        notes: checks that were skipped on request (e.g. `--max-age none`), for the output.
        gate: the gate re-derived from the evidence (None if the evidence was unreadable).
        evidence: the parsed evidence (None if unreadable).
        legs: the (platform, backend) legs the evidence covers.
        signer: the signed `signer` block, for display only: no decision reads it.
        untrusted_local: the verifying key is a per-machine key (from the registry).
        attestation_sha256: digest of attestation.intoto.jsonl (for merge subjects).
        files: the exact bytes that were verified, by subject path (allure-results/ files as
            `allure-results/<rel>`, plus attestation.intoto.jsonl): a merge signs and copies
            these, never a re-read that could have been swapped since.
        digests: each name of `LEG_FILES` -> the sha256 computed from `files`.
        harness: the signed harness facts (`version`, `commit`, `dirty`, `probesSha256`).
        finished_at: the signed `finishedAt` ("" if none was signed).
        trust_domains: the signed trust-domains fact ({} if none).
        world: the signed world fact ({} if none was recorded).
        leg_results: for a merged release, each leg's own verification with its label.
        claims: each backend's signed claims (backend name -> claims), for display and for
            the policy's `claims` requirements.
        sandboxes: each backend's signed test-result statement about the sandbox it tested
            (empty for a report signed before issue 30, whose subject is the report files).
    """

    report_dir: Path
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gate: Gate | None = None
    evidence: dict[str, Any] | None = None
    legs: set[tuple[str, str]] = field(default_factory=set)
    signer: dict[str, Any] = field(default_factory=dict)
    untrusted_local: bool = False
    attestation_sha256: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    harness: dict[str, Any] = field(default_factory=dict)
    finished_at: str = ""
    trust_domains: dict[str, Any] = field(default_factory=dict)
    world: dict[str, Any] = field(default_factory=dict)
    leg_results: list[tuple[str, Verification]] = field(default_factory=list)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    sandboxes: list[SandboxResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True only when no reason was found."""
        return not self.reasons


def _read(path: Path, v: Verification, why: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                v.reasons.append(f"{path.name} is not a regular file; {why}")
                return None
            return handle.read()
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
    found: dict[str, list[dict[str, Any]]],
    wanted: Sequence[str],
    v: Verification,
    *,
    many: Sequence[str] = (),
) -> None:
    """Step 2: exactly one statement of each wanted type (and of no other).

    A type in `many` may appear more than once (one test-result statement per backend);
    how many is checked against the evidence by `_check_sandboxes`.
    """
    for ptype in sorted(set(found) | set(wanted)):
        count = len(found.get(ptype, []))
        want = 1 if ptype in wanted else 0
        if ptype in many and count >= 1:
            continue
        if count != want and not (count == 0 and v.reasons):
            v.reasons.append(
                f"{ATTESTATION_NAME} holds {count} statements of type {ptype}; exactly {want} "
                "expected"
            )


def _check_key_trust(
    trusted: TrustedKey, checks: Checks, allow_untrusted_local: bool, v: Verification, what: str
) -> None:
    """Step 6: is the key whose signatures verified a per-machine one? Decided by the key.

    Only the trusted key's signatures are accepted (step 1), so its keyid is the verified
    signer's; the registry on this machine says whether it is a per-machine key.
    """
    v.untrusted_local = trusted.keyid in checks.untrusted()
    if v.untrusted_local and not allow_untrusted_local:
        v.reasons.append(
            f"{what} {UNTRUSTED_LOCAL_NOTE} (keyid {trusted.keyid} is listed in this "
            "machine's untrusted-keys registry): a per-machine key proves only that this "
            "machine signed it, whatever the signed payload says about its trust; sign with "
            "--key or $SANDBOX_ATTEST_SIGNING_KEY, or, to accept it, pass that key as "
            "--trusted-key together with --allow-untrusted-local"
        )


def _read_subjects(report_dir: Path, v: Verification) -> dict[str, str | None]:
    """Read every subject once into `v.files`; their digests now (None: unreadable)."""
    digests: dict[str, str | None] = {}
    for name in FILE_SUBJECTS:
        data = _read(report_dir / name, v, "the run writes it; re-run with this version")
        if data is not None:
            v.files[name] = data
        digests[name] = None if data is None else sha256_hex(data)
    try:
        tree = read_tree(report_dir / ALLURE_DIR)
    except ReportError as exc:
        v.reasons.append(str(exc))
        digests[ALLURE_SUBJECT] = None
    else:
        v.files.update({f"{ALLURE_SUBJECT}{rel}": data for rel, data in tree.items()})
        digests[ALLURE_SUBJECT] = tree_digest_of(tree)
    v.digests.update({k: d for k, d in digests.items() if d is not None})
    return digests


def _is_sandbox_statement(stmt: dict[str, Any]) -> bool:
    """A test-result statement about a sandbox (issue 30): it names its `sandbox` entry."""
    return stmt["predicateType"] == TEST_RESULT_PREDICATE and any(
        c.get("name") == SANDBOX_ENTRY for c in _config(stmt)
    )


def _check_subjects(stmt: dict[str, Any], digests: dict[str, str | None], v: Verification) -> None:
    """Step 3: the statement covers every report file, and each signed digest equals it now.

    A sandbox statement pins the report files in its configuration (role `REPORT_ROLE`); an
    evidence statement, and a test-result statement from before issue 30, as subjects.
    """
    if _is_sandbox_statement(stmt):
        entries = [c for c in _config(stmt) if _role(c) == REPORT_ROLE]
        signed = {str(c.get("name")): c.get("digest") or {} for c in entries}
    else:
        signed = {str(s.get("name")): s.get("digest", {}) for s in stmt["subject"]}
    kind = "test-result" if stmt["predicateType"] == TEST_RESULT_PREDICATE else "evidence"
    for name in ALL_SUBJECTS:
        if name not in signed:
            v.reasons.append(
                f"the attestation does not cover {name} (the {kind} statement names no such "
                "subject): it was signed by an older sandbox-attest; re-run with this version"
            )
            continue
        have = digests.get(name)
        if have is None:
            continue
        want = str(signed[name].get("sha256", ""))
        if want != have:
            v.reasons.append(
                f"{name} does not match its signed digest in the {kind} statement (signed "
                f"sha256 {want[:16]}..., file has {have[:16]}...): the file was changed "
                "after signing"
            )


def _config(stmt: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in stmt["predicate"].get("configuration") or [] if isinstance(c, dict)]


def _role(entry: dict[str, Any]) -> str:
    annotations = entry.get("annotations")
    return str(annotations.get("role", "")) if isinstance(annotations, dict) else ""


def _config_item(stmt: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in _config(stmt) if c.get("name") == name), None)


def _annotations(stmt: dict[str, Any], name: str) -> dict[str, Any]:
    item = _config_item(stmt, name) or {}
    annotations = item.get("annotations")
    return dict(annotations) if isinstance(annotations, dict) else {}


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


def _signed_backend(stmt: dict[str, Any]) -> tuple[str, str]:
    """The backend a sandbox statement is about, and its signed role."""
    annotations = (_config_item(stmt, SANDBOX_ENTRY) or {}).get("annotations") or {}
    return str(annotations.get("backend", "")), str(annotations.get("role", ""))


def _subject_pairs(subjects: Sequence[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (str(s.get("name", "")), str((s.get("digest") or {}).get("sha256", "")))
            for s in subjects
        )
    )


def _check_run_result(
    stmts: Sequence[dict[str, Any]],
    evidence_stmts: Sequence[dict[str, Any]],
    policy: Policy,
    v: Verification,
) -> None:
    """The sandbox statements name the policy given, and the run's signed result holds."""
    digests = {_digest(_config_item(s, "policy")) for s in stmts}
    if digests != {policy.sha256}:
        listed = ", ".join(sorted(d[:16] + "..." for d in digests if d)) or "<none>"
        v.reasons.append(
            f"policy mismatch: the statements were derived with policy sha256 {listed}, but "
            f"--policy {policy.path} has {policy.sha256[:16]}... (a downgraded or different "
            "policy); verify with the policy the release requires"
        )
    for stmt in evidence_stmts:
        gate = stmt["predicate"].get("gate")
        signed_result = gate.get("result") if isinstance(gate, dict) else None
        if v.gate is not None and signed_result != v.gate.result:
            v.reasons.append(
                f"the signed run result is {signed_result!r} but the evidence gives "
                f"{v.gate.result!r} under {policy.path}"
            )


def _check_one_sandbox(
    stmt: dict[str, Any],
    record: dict[str, Any],
    evidence: dict[str, Any],
    policy: Policy,
    v: Verification,
) -> SandboxResult:
    """One backend's statement: role, subjects = what it ran, result = the re-derived one."""
    name, role = _signed_backend(stmt)
    control = name == CONTROL_BACKEND
    if (role == CONTROL_ROLE) != control:
        v.reasons.append(
            f"the statement for backend {name} says its role is {role!r}; only the control "
            f"leg `{CONTROL_BACKEND}` is the control"
        )
    signed = _subject_pairs(stmt["subject"])
    ran = _subject_pairs(sandbox_subjects(record))
    if signed != ran:
        extra = [f"{n} ({d[:16]}...)" for n, d in signed if (n, d) not in ran]
        v.reasons.append(
            f"the statement for backend {name} names subject(s) "
            f"{', '.join(extra) or 'fewer than it ran'} that are not the executables the "
            "signed evidence says it ran: a subject digest that does not match what ran, "
            "or a statement for another binary"
        )
    gate = backend_gate(evidence, policy, name)
    predicate = stmt["predicate"]
    if predicate.get("result") != gate.result:
        v.reasons.append(
            f"the signed result for backend {name} is {predicate.get('result')!r} but the "
            f"evidence gives {gate.result!r} under {policy.path}"
        )
    for key, mine in (
        ("passedTests", gate.passed),
        ("warnedTests", gate.warned),
        ("failedTests", gate.failed),
    ):
        if sorted(predicate.get(key) or []) != sorted(mine):
            v.reasons.append(f"the signed {key} of backend {name} differ from the evidence")
    return SandboxResult(
        backend=name,
        control=control,
        subjects=signed,
        result=str(predicate.get("result", "")),
        passed=tuple(str(t) for t in predicate.get("passedTests") or []),
        finished_at=str(_annotations(stmt, "run").get("finishedAt", "")),
    )


def _check_sandboxes(
    stmts: Sequence[dict[str, Any]],
    evidence_stmts: Sequence[dict[str, Any]],
    evidence: dict[str, Any],
    policy: Policy,
    v: Verification,
) -> None:
    """Steps 3-5 for the sandbox statements (issue 30): one per backend the evidence records.

    Each statement's subjects must be exactly what the signed evidence says its backend ran
    (a digest that is not the executable that ran, or a statement for another binary, is
    refused), its role must be the control's only for the control leg, and its result and
    test lists must be the ones `backend_gate` re-derives under `policy`.
    """
    _check_run_result(stmts, evidence_stmts, policy, v)
    records = {str(r.get("name", "")): r for r in backend_records(evidence)}
    seen: set[str] = set()
    for stmt in stmts:
        name, _ = _signed_backend(stmt)
        record = records.get(name)
        if record is None:
            v.reasons.append(
                f"a test-result statement is about backend {name!r}, which the signed evidence "
                "does not record: it is a statement for another run's sandbox"
            )
        elif name in seen:
            v.reasons.append(f"backend {name} has two test-result statements; exactly one expected")
        else:
            seen.add(name)
            v.sandboxes.append(_check_one_sandbox(stmt, record, evidence, policy, v))
    v.reasons.extend(
        f"backend {name} has no test-result statement: the attestation leaves it out"
        for name in sorted(set(records) - seen)
    )


def _check_evidence_statement(
    stmt: dict[str, Any], evidence: dict[str, Any], v: Verification
) -> None:
    """The evidence predicate agrees with evidence.json; its signer block is kept for display."""
    predicate = stmt["predicate"]
    signed = {str(c.get("cellId")): c.get("verdict") for c in predicate.get("cells") or []}
    actual = {str(c.get("cell_id")): c.get("verdict") for c in evidence["cells"]}
    if signed != actual:
        v.reasons.append("the signed evidence predicate's cells differ from evidence.json")
    signer = predicate.get("signer")
    v.signer = dict(signer) if isinstance(signer, dict) else {}
    world = predicate.get("world")
    if isinstance(world, dict) and not v.world:
        v.world = dict(world)


def _check_fresh(finished_at: str, checks: Checks, v: Verification, what: str) -> None:
    """Step 7: the signed finishedAt is no older than max_age and not in the future."""
    if checks.max_age is None:
        v.notes.append(f"freshness of {what} not checked (--max-age none)")
        return
    try:
        finished = datetime.fromisoformat(finished_at)
    except ValueError:
        v.reasons.append(
            f"{what} has no signed finishedAt (got {finished_at!r}): it was signed by an "
            "older sandbox-attest; re-run with this version, or pass --max-age none"
        )
        return
    if finished.tzinfo is None:
        finished = finished.replace(tzinfo=UTC)
    now = checks.now or datetime.now(UTC)
    age = now - finished
    if -age > FUTURE_SKEW:
        v.reasons.append(
            f"{what} finished at {finished_at}, {format_duration(-age)} in the future: the "
            "signing machine's clock is wrong or the time was forged; fix the clock and re-run"
        )
    elif age > checks.max_age:
        v.reasons.append(
            f"{what} is {format_duration(age)} old (finished {finished_at}), older than "
            f"--max-age {format_duration(checks.max_age)}; re-run the matrix, or pass a longer "
            "--max-age (e.g. --max-age 90d) or --max-age none"
        )


def _check_commit(harness: dict[str, Any], checks: Checks, v: Verification, what: str) -> None:
    """Step 8: the signed harness commit starts with --expect-commit, from a clean checkout."""
    want = checks.expect_commit
    if want is None:
        return
    commit = harness.get("commit")
    if not isinstance(commit, str) or not commit:
        v.reasons.append(
            f"{what} records no harness commit (installed from a wheel, or git was "
            f"unavailable), so --expect-commit {want} cannot hold; run the harness from a "
            "checkout of that commit"
        )
    elif not commit.lower().startswith(want):
        v.reasons.append(
            f"{what} was made by harness commit {commit}, not --expect-commit {want}; "
            "re-run from that commit, or expect the commit that was tested"
        )
    elif harness.get("dirty") is not False:
        state = "had uncommitted changes" if harness.get("dirty") else "has unknown cleanliness"
        v.reasons.append(
            f"{what}: harness commit {commit} matches --expect-commit, but the checkout "
            f"{state}, so what ran is not that commit; re-run from a clean checkout"
        )


SHARED_FLAG = "--allow-shared-trust-domain"


def _check_trust_domains(v: Verification, allow_shared: bool) -> None:
    """Step 9: the signed trust-domains fact was measured, holds, and says separated.

    Read from the signed test-result statement (`v.trust_domains`), never from
    evidence.json's copy; re-derived from the signed cells (`separation.recheck`).
    """
    from sandbox_attest.run import separation  # noqa: PLC0415  (only verify re-derives it)

    domains = v.trust_domains
    if v.evidence is not None and domains.get("measured") is True:
        v.reasons.extend(separation.recheck(domains, v.evidence.get("cells") or []))
    if domains.get("measured") is not True or not isinstance(domains.get("backends"), dict):
        problem = (
            "the report's trust domains were declared, not measured (it was signed by a "
            "sandbox-attest from before issue 23, which never read who its sandboxed processes "
            "ran as)"
        )
    else:
        h_uid, h_gid = domains.get("harness_uid"), domains.get("harness_gid")
        ids = (h_uid, h_gid) if isinstance(h_uid, int) and isinstance(h_gid, int) else None
        separated, why = separation.decide(domains["backends"], ids)
        if separated and domains.get("separated") is True:
            return
        problem = (
            "the run's trust domains were NOT separated: "
            f"{why or domains.get('reason') or 'no reason recorded'}; code under test could "
            "read the signing key and forge what was signed"
        )
    if allow_shared:
        v.notes.append(f"{problem} (accepted with {SHARED_FLAG})")
        return
    v.reasons.append(
        f"{problem}; a release comes from a run as root with a payload user (no spec with "
        f'[run] user = "root"); re-run so, or pass {SHARED_FLAG} to accept it'
    )


def _record_pins(stmt: dict[str, Any], checks: Checks, v: Verification, what: str) -> None:
    """Read the signed harness, run time, trust domains and world; check time and commit."""
    v.harness = _annotations(stmt, "harness")
    v.finished_at = str(_annotations(stmt, "run").get("finishedAt", ""))
    v.trust_domains = _annotations(stmt, "trust-domains")
    v.world = _annotations(stmt, "world")
    _check_fresh(v.finished_at, checks, v, what)
    _check_commit(v.harness, checks, v, what)


def _sandbox_statements(
    statements: dict[str, list[dict[str, Any]]], v: Verification
) -> list[dict[str, Any]]:
    """Step 2 for one run: the sandbox statements (issue 30), or a note for an older report."""
    results = statements.get(TEST_RESULT_PREDICATE, [])
    sandbox_stmts = [s for s in results if _is_sandbox_statement(s)]
    if results and not sandbox_stmts:
        v.notes.append(PRE_ISSUE_30_NOTE)
    many = (TEST_RESULT_PREDICATE,) if sandbox_stmts else ()
    _check_counts(statements, (TEST_RESULT_PREDICATE, EVIDENCE_PREDICATE), v, many=many)
    if sandbox_stmts and len(sandbox_stmts) != len(results):
        v.reasons.append(
            "the report mixes test-result statements about sandboxes with one about its "
            "report files; it was not signed by one sandbox-attest run"
        )
    return sandbox_stmts


def _check_judged(
    statements: dict[str, list[dict[str, Any]]],
    sandbox_stmts: list[dict[str, Any]],
    evidence: dict[str, Any],
    policy: Policy,
    v: Verification,
) -> None:
    """Steps 4-5 over the verified evidence: gate, sandbox statements, claims, cells."""
    results = statements.get(TEST_RESULT_PREDICATE, [])
    _check_gate(results[0] if results and not sandbox_stmts else None, evidence, policy, v)
    evidence_stmts = statements.get(EVIDENCE_PREDICATE, [])[:1]
    if sandbox_stmts:
        _check_sandboxes(sandbox_stmts, evidence_stmts, evidence, policy, v)
    # The claims are read from the evidence whose bytes the signature covers: a leg is
    # held to what its backend's signed identity says it promised.
    v.claims = leg_claims(evidence)
    v.reasons.extend(claim_problems(policy, v.claims, v.legs))
    for stmt in evidence_stmts:
        _check_evidence_statement(stmt, evidence, v)


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
    sandbox_stmts = _sandbox_statements(statements, v)
    digests = _read_subjects(v.report_dir, v)
    for group in statements.values():
        for stmt in group:
            _check_subjects(stmt, digests, v)
    if results:
        _record_pins(results[0], checks, v, "the report")
    evidence_bytes = v.files.get(EVIDENCE_NAME)
    if evidence_bytes is not None:
        try:
            v.evidence = parse_evidence(evidence_bytes, EVIDENCE_NAME)
        except ReportError as exc:
            v.reasons.append(str(exc))
    if v.evidence is not None:
        _check_judged(statements, sandbox_stmts, v.evidence, policy, v)
    if results:
        _check_trust_domains(v, allow_shared_trust_domain)
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
    raw = _read(report_dir / ATTESTATION_NAME, v, RUN_SIGNS)
    statements = _statements(raw, trusted, v) if raw is not None else {}
    if raw is not None:
        v.attestation_sha256 = sha256_hex(raw)
        v.files[ATTESTATION_NAME] = raw
        v.digests[ATTESTATION_NAME] = v.attestation_sha256
    merged = _merged_statement(statements)
    if merged is not None:
        if accept_merged:
            _check_key_trust(trusted, checks, allow_untrusted_local, v, "the merge is")
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
    _check_key_trust(trusted, checks, allow_untrusted_local, v, "the report is")
    _verify_single(
        statements,
        policy,
        require_all_legs,
        checks,
        v,
        allow_shared_trust_domain=allow_shared_trust_domain,
    )
    return v


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
        data = _read(v.report_dir / name, v, "`sandbox-attest merge` writes it; re-run it")
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
    item = _config_item(stmt, "expect-legs") or {}
    found: dict[str, list[tuple[str, str]]] = {"leg:": [], "informational-leg:": []}
    for entry in _config(stmt):
        name = str(entry.get("name", ""))
        for prefix, legs in found.items():
            platform, slash, backend = name.removeprefix(prefix).partition("/")
            if name.startswith(prefix) and slash and platform and backend:
                legs.append((platform, backend))
    if not found["leg:"]:
        v.reasons.append("the merged statement names no leg:PLATFORM/BACKEND; it merged nothing")
    return ExpectedLegs(
        str(item.get("uri", "expect-legs")),
        _digest(item),
        tuple(found["leg:"]),
        tuple(found["informational-leg:"]),
    )


def _merged_signer(stmt: dict[str, Any], v: Verification) -> None:
    """Keep the merged statement's signer entry for display; trust is decided by the key."""
    signer = _config_item(stmt, "signer")
    if signer is None:
        v.reasons.append("the merged statement names no signer; re-run `sandbox-attest merge`")
        return
    v.signer = {"keyid": _digest(signer), **(signer.get("annotations") or {})}


def _check_merged_harness(
    stmt: dict[str, Any], combined: Combined, checks: Checks, v: Verification
) -> None:
    """The merge's signed harness commit and probes digest are the ones every leg signed."""
    _record_pins(stmt, checks, v, "the merge")
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
    _check_counts(statements, wanted, v)
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
        _compare_signed(stmt, combined.gate, policy, v)
    for summary in summaries[:1]:
        v.reasons.extend(
            check_summary(
                summary, combined, policy, legs_dir=LEGS_DIR, attestation=ATTESTATION_NAME
            )
        )
    signed_legs = {
        str(c["name"]): _digest(c) for c in _config(stmt) if str(c["name"]).startswith("leg:")
    }
    if signed_legs != leg_digests(combined):
        v.reasons.append(
            "the merged statement's leg:PLATFORM/BACKEND entries differ from the legs the "
            "copies hold"
        )
