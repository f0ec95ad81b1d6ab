"""The checks `verify` runs on a signed report, and what they found (`Verification`).

Each `check_*` function adds every reason it finds to a `Verification` and never stops at
the first: `sandbox_attest.attest.verify` calls them in order (its docstring numbers the
steps, and each function here names the step it is). What a report is held to besides the
key and the policy is `Checks`; one backend's signed statement, checked, is a
`SandboxResult`. Nothing here knows about merged releases or legs (`attest.legs`), so legs,
summary and verify all import this module and it imports none of them.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import ATTESTATION_NAME, backend_gate, dsse
from sandbox_attest.attest.keys import read_untrusted_keyids, untrusted_registry_path
from sandbox_attest.attest.statement import (
    CONTROL_ROLE,
    EVIDENCE_PREDICATE,
    REPORT_ROLE,
    SANDBOX_ENTRY,
    TEST_RESULT_PREDICATE,
    backend_records,
    parse_statement,
    sandbox_subjects,
    sha256_hex,
)
from sandbox_attest.attest.subjects import (
    ALL_SUBJECTS,
    ALLURE_DIR,
    ALLURE_SUBJECT,
    FILE_SUBJECTS,
    read_tree,
    tree_digest_of,
)
from sandbox_attest.errors import ConfigError, ReportError, SignatureError
from sandbox_attest.host import separation
from sandbox_attest.report.policy import (
    CONTROL_BACKEND,
    Gate,
    cell_leg,
    claim_problems,
    default_platform,
    gate_for,
    leg_claims,
)
from sandbox_attest.report.signature import UNTRUSTED_LOCAL_NOTE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandbox_attest.attest.keys import TrustedKey
    from sandbox_attest.report.policy import Policy

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


def read_regular_file(path: Path, v: Verification, why: str) -> bytes | None:
    """`path`'s bytes, never through a link; None (and a reason naming `why`) otherwise."""
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


def verified_statements(
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


def check_counts(
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


def check_key_trust(
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


def read_subjects(report_dir: Path, v: Verification) -> dict[str, str | None]:
    """Read every subject once into `v.files`; their digests now (None: unreadable)."""
    digests: dict[str, str | None] = {}
    for name in FILE_SUBJECTS:
        data = read_regular_file(
            report_dir / name, v, "the run writes it; re-run with this version"
        )
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
        c.get("name") == SANDBOX_ENTRY for c in configuration_entries(stmt)
    )


def check_subjects(stmt: dict[str, Any], digests: dict[str, str | None], v: Verification) -> None:
    """Step 3: the statement covers every report file, and each signed digest equals it now.

    A sandbox statement pins the report files in its configuration (role `REPORT_ROLE`); an
    evidence statement, and a test-result statement from before issue 30, as subjects.
    """
    if _is_sandbox_statement(stmt):
        entries = [c for c in configuration_entries(stmt) if _role(c) == REPORT_ROLE]
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


def configuration_entries(stmt: dict[str, Any]) -> list[dict[str, Any]]:
    """The statement's configuration entries (ResourceDescriptors), malformed ones left out."""
    return [c for c in stmt["predicate"].get("configuration") or [] if isinstance(c, dict)]


def _role(entry: dict[str, Any]) -> str:
    annotations = entry.get("annotations")
    return str(annotations.get("role", "")) if isinstance(annotations, dict) else ""


def configuration_item(stmt: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The statement's configuration entry named `name`, if any."""
    return next((c for c in configuration_entries(stmt) if c.get("name") == name), None)


def _annotations(stmt: dict[str, Any], name: str) -> dict[str, Any]:
    item = configuration_item(stmt, name) or {}
    annotations = item.get("annotations")
    return dict(annotations) if isinstance(annotations, dict) else {}


def entry_sha256(item: dict[str, Any] | None) -> str:
    """The sha256 an entry's digest records ("" if none)."""
    return str(((item or {}).get("digest") or {}).get("sha256", ""))


def compare_signed(
    result_stmt: dict[str, Any], gate: Gate, policy: Policy, v: Verification
) -> None:
    """The signed policy digest, result and test lists equal the re-derived ones."""
    predicate = result_stmt["predicate"]
    signed_digest = entry_sha256(configuration_item(result_stmt, "policy"))
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
        compare_signed(result_stmt, gate, policy, v)


def _signed_backend(stmt: dict[str, Any]) -> tuple[str, str]:
    """The backend a sandbox statement is about, and its signed role."""
    annotations = (configuration_item(stmt, SANDBOX_ENTRY) or {}).get("annotations") or {}
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
    digests = {entry_sha256(configuration_item(s, "policy")) for s in stmts}
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


def check_trust_domains(v: Verification, allow_shared: bool) -> None:
    """Step 9: the signed trust-domains fact was measured, holds, and says separated.

    Read from the signed test-result statement (`v.trust_domains`), never from
    evidence.json's copy; re-derived from the signed cells (`separation.recheck`).
    """
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


def record_pins(stmt: dict[str, Any], checks: Checks, v: Verification, what: str) -> None:
    """Read the signed harness, run time, trust domains and world; check time and commit."""
    v.harness = _annotations(stmt, "harness")
    v.finished_at = str(_annotations(stmt, "run").get("finishedAt", ""))
    v.trust_domains = _annotations(stmt, "trust-domains")
    v.world = _annotations(stmt, "world")
    _check_fresh(v.finished_at, checks, v, what)
    _check_commit(v.harness, checks, v, what)


def sandbox_statements(
    statements: dict[str, list[dict[str, Any]]], v: Verification
) -> list[dict[str, Any]]:
    """Step 2 for one run: the sandbox statements (issue 30), or a note for an older report."""
    results = statements.get(TEST_RESULT_PREDICATE, [])
    sandbox_stmts = [s for s in results if _is_sandbox_statement(s)]
    if results and not sandbox_stmts:
        v.notes.append(PRE_ISSUE_30_NOTE)
    many = (TEST_RESULT_PREDICATE,) if sandbox_stmts else ()
    check_counts(statements, (TEST_RESULT_PREDICATE, EVIDENCE_PREDICATE), v, many=many)
    if sandbox_stmts and len(sandbox_stmts) != len(results):
        v.reasons.append(
            "the report mixes test-result statements about sandboxes with one about its "
            "report files; it was not signed by one sandbox-attest run"
        )
    return sandbox_stmts


def check_judged(
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
