"""in-toto Statement v1 builders for the predicates sandbox-attest signs, and their parser.

Spec: https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md. A Statement is
`{"_type", "subject": [ResourceDescriptor], "predicateType", "predicate"}`; every subject MUST
carry a digest. Statements are serialized once (`statement_bytes`) and those bytes are what
the DSSE envelope carries: nothing downstream re-dumps them.

A run signs one test-result statement per backend, whose subjects are the sandbox it tested
(`sandbox_subjects`: the executables, image and spec it ran; issue 30) and whose configuration
pins the run and the report files, then one evidence statement whose subjects are the report
files. A merge signs a test-result statement over the legs' copies and a SLSA verification
summary over the sandboxes (`verification_summary`).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest.subjects import ALLURE_SUBJECT, FILE_SUBJECTS
from sandbox_attest.errors import ReportError
from sandbox_attest.report.evidence import parse_cells
from sandbox_attest.report.policy import default_platform

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from sandbox_attest.report.policy import Gate

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
TEST_RESULT_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"
# Our own predicate; documented in reports/README.md ("Attestation predicates").
EVIDENCE_PREDICATE = "https://sandbox-attest.dev/attestation/evidence/v1"
EVIDENCE_SCHEMA = "sandbox-attest/evidence/v1"
# SLSA's verification summary: the release decision of a merge (see `verification_summary`).
VSA_PREDICATE = "https://slsa.dev/verification_summary/v1"
KNOWN_PREDICATES = frozenset({TEST_RESULT_PREDICATE, EVIDENCE_PREDICATE, VSA_PREDICATE})
# The role a report file's entry carries in a test-result `configuration` (issue 30): the
# report files are what the run wrote, not what it tested, so they are no subject there.
REPORT_ROLE = "report file"
SANDBOX_ENTRY = "sandbox"
CONTROL_ROLE = "control leg"
TESTED_ROLE = "sandbox under test"


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

    The cells are checked by `parse_cells`, so every reader gets `CellEntry` values.

    Raises:
        ReportError: not JSON, the wrong schema, `cells` missing, or a cell without a key
            every evidence cell has (naming the file and the key).
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
    evidence["cells"] = parse_cells(evidence.get("cells"), where)
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


def _pinned(value: object) -> str:
    """sha256 over the compact sorted JSON of `value`: the digest of a fact with no file."""
    return sha256_hex(_dumps(value).encode("utf-8"))


def report_subjects(files: Mapping[str, bytes], allure_sha256: str) -> list[dict[str, Any]]:
    """The subjects of one run's statements: every file a person reads, in `ALL_SUBJECTS` order.

    Args:
        files: the exact bytes of each of `subjects.FILE_SUBJECTS`, as they are written.
        allure_sha256: `subjects.tree_sha256` of allure-results/.

    Raises:
        ReportError: one of the files is not given; a signature must cover all of them.
    """
    missing = [name for name in FILE_SUBJECTS if name not in files]
    if missing:
        raise ReportError(
            f"{missing[0]} is not written yet; sign after the run has written "
            f"{', '.join(FILE_SUBJECTS)} and allure-results/"
        )
    out = [subject(name, files[name]) for name in FILE_SUBJECTS]
    out.append({"name": ALLURE_SUBJECT, "digest": {"sha256": allure_sha256}})
    return out


def _harness_entry(harness: Mapping[str, Any]) -> dict[str, Any]:
    """The `harness` configuration entry: package digest, git commit, probes digest."""
    version = str(harness.get("version", "unknown"))
    package = str(harness.get("package_sha256") or "")
    commit = harness.get("commit")
    digest: dict[str, str] = {
        # Evidence from before provenance carries no package digest: pin what it did say.
        "sha256": package or _pinned(dict(harness)),
    }
    if isinstance(commit, str) and commit:
        digest["gitCommit"] = commit
    return {
        "name": "harness",
        "uri": f"pkg:pypi/sandbox-attest@{version}",
        "digest": digest,
        "annotations": {
            "version": version,
            "commit": commit if isinstance(commit, str) and commit else None,
            "dirty": harness.get("dirty") if isinstance(harness.get("dirty"), bool) else None,
            "probesSha256": str(harness.get("probes_sha256") or ""),
        },
    }


def _executables(identity: Mapping[str, Any]) -> dict[str, Any]:
    """argv0 -> `provenance.executable_facts` of a backend identity (empty when absent)."""
    executables = identity.get("executables")
    return dict(executables) if isinstance(executables, dict) else {}


def _backend_entry(backend: Mapping[str, Any]) -> dict[str, Any]:
    """One `backend:NAME` entry whose digest covers the profile, the spec and the executables."""
    identity = backend.get("identity") or {}
    profile = str(identity.get("profile_digest", "")).removeprefix("sha256:")
    executables = _executables(identity)
    spec = str(identity.get("spec_sha256") or "").removeprefix("sha256:")
    if profile:
        # One digest over all three, so a swapped bwrap binary or an edited spec changes the
        # pinned backend even where the argv profile is the same.
        digest = _pinned({"profile_digest": profile, "executables": executables, "spec": spec})
    else:
        # No identity (backend unavailable): pin what the run said about it instead.
        digest = _pinned(dict(backend))
    return {
        "name": f"backend:{backend.get('name', '')}",
        "digest": {"sha256": digest},
        "annotations": {
            "available": bool(backend.get("available")),
            "version": str(identity.get("version", "")),
            "platform": str(identity.get("platform", "")),
            "reason": str(backend.get("reason", "")),
            "profileDigest": profile,
            "specSha256": spec,
            "executables": executables,
        },
    }


def _fact_entry(name: str, fact: Mapping[str, Any]) -> dict[str, Any]:
    """An entry for a recorded fact that is no file (trust domains, world): digest + itself."""
    return {"name": name, "digest": {"sha256": _pinned(dict(fact))}, "annotations": dict(fact)}


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def configuration(evidence: Mapping[str, Any], policy_sha256: str | None) -> list[dict[str, Any]]:
    """The test-result `configuration`: everything that decided what was tested, pinned.

    Entries (each an in-toto ResourceDescriptor; see reports/README.md, "Attestation
    predicates"): `policy` and `matrix` (the input files' paths and digests), `harness`
    (package digest, git commit, dirtiness, probes digest), `run` (run id, startedAt,
    finishedAt: what `verify --max-age` reads), one `backend:NAME` per backend (profile,
    spec and executables under one digest), `trust-domains`, and `world` when recorded.

    Args:
        evidence: the parsed evidence.
        policy_sha256: digest of the policy file the gate was derived with; None falls back
            to the digest the run recorded in evidence.
    """
    inputs = _mapping(evidence.get("inputs"))
    policy = _mapping(inputs.get("policy")) or _mapping(evidence.get("policy"))
    matrix = _mapping(inputs.get("matrix")) or _mapping(evidence.get("matrix"))
    matrix_entry: dict[str, Any] = {
        "name": "matrix",
        "digest": {"sha256": str(matrix.get("sha256", ""))},
    }
    if matrix.get("path"):
        matrix_entry["uri"] = str(matrix["path"])
    config: list[dict[str, Any]] = [
        {
            "name": "policy",
            "uri": str(policy.get("path", "")),
            "digest": {"sha256": policy_sha256 or str(policy.get("sha256", ""))},
        },
        matrix_entry,
        _harness_entry(_mapping(evidence.get("harness"))),
        {
            "name": "run",
            "uri": f"urn:sandbox-attest:run:{evidence.get('run_id', '')}",
            "annotations": {
                "runId": str(evidence.get("run_id", "")),
                "startedAt": str(evidence.get("started_at", "")),
                "finishedAt": str(evidence.get("finished_at", "")),
                "complete": evidence.get("complete") is True,
            },
        },
    ]
    config.extend(_backend_entry(b) for b in evidence.get("backends") or [])
    domains = _mapping(evidence.get("trust_domains")) or {
        "separated": False,
        "reason": "the run recorded no trust domains (a harness from before issue 12)",
    }
    config.append(_fact_entry("trust-domains", domains))
    world = _mapping(evidence.get("world"))
    if world:
        config.append(_fact_entry("world", world))
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
    """Our per-cell evidence predicate (see reports/README.md, "Attestation predicates").

    Besides the cells it repeats the run's pins (harness provenance, inputs, trust domains,
    world, times), so a reader of this statement alone sees what was tested. `signer` is
    information for people; no decision reads it (trust comes from the verifying key).
    """
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
    predicate: dict[str, Any] = {
        "runId": str(evidence.get("run_id", "")),
        "complete": bool(evidence.get("complete")),
        "startedAt": str(evidence.get("started_at", "")),
        "finishedAt": str(evidence.get("finished_at", "")),
        "harnessVersion": str((evidence.get("harness") or {}).get("version", "")),
        "harness": _mapping(evidence.get("harness")),
        "inputs": _mapping(evidence.get("inputs")),
        "trustDomains": _mapping(evidence.get("trust_domains")),
        "platform": evidence.get("platform") or {},
        "signer": dict(signer),
        "gate": {"result": gate.result, "problems": list(gate.problems)},
        "cells": cells,
    }
    world = _mapping(evidence.get("world"))
    if world:
        predicate["world"] = world
    return predicate


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


def report_entries(files: Mapping[str, bytes], allure_sha256: str) -> list[dict[str, Any]]:
    """The report files as test-result `configuration` entries (issue 30).

    The same names and digests `report_subjects` gives, marked with `REPORT_ROLE`: in a
    test-result statement they are what the run wrote, while its subjects are what it tested.

    Raises:
        ReportError: one of `subjects.FILE_SUBJECTS` is not given.
    """
    return [
        {**entry, "annotations": {"role": REPORT_ROLE}}
        for entry in report_subjects(files, allure_sha256)
    ]


def _executable_subjects(
    facts: Mapping[str, Any], out: dict[tuple[str, str], dict[str, Any]], kind: str
) -> None:
    """Add one executable's subject (and its `#!` interpreter's) to `out`, keyed for dedupe."""
    digest = facts.get("sha256")
    name = str(facts.get("realpath") or facts.get("path") or facts.get("argv0") or "")
    if isinstance(digest, str) and digest and name:
        out.setdefault(
            (name, digest),
            {
                "name": name,
                "digest": {"sha256": digest},
                "annotations": {
                    "kind": kind,
                    "argv0": str(facts.get("argv0", "")),
                    "path": str(facts.get("path", "")),
                },
            },
        )
    interpreter = facts.get("interpreter")
    if isinstance(interpreter, dict):
        _executable_subjects(interpreter, out, "executable")


def _image_subject(profile: Mapping[str, Any]) -> dict[str, Any] | None:
    """The container image a docker-shaped backend ran, by its image id (a sha256)."""
    image = profile.get("image")
    if not isinstance(image, dict):
        return None
    image_id = str(image.get("id") or "")
    hex_id = image_id.removeprefix("sha256:")
    if len(hex_id) != 64:
        return None
    return {
        "name": str(image.get("ref") or image_id),
        "digest": {"sha256": hex_id},
        "annotations": {
            "kind": "container image",
            "repoDigests": [str(d) for d in image.get("repo_digests") or []],
        },
    }


def sandbox_subjects(backend: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What one backend's statement is about: the sandbox that was tested (issue 30).

    Every executable the backend ran (its identity's `executables`, with a script's
    interpreter), by sha256 and named by its resolved path; the container image a docker
    backend ran, by image id; and a command spec's bytes. A backend that recorded none of
    these (unavailable here) is named `backend:NAME` by the digest of what the run said about
    it, so the statement still has a subject, and no file can ever match it.
    """
    identity = _mapping(backend.get("identity"))
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for key, facts in _executables(identity).items():
        if isinstance(facts, dict):
            # `{python}` (base.program_facts) is the interpreter every payload runs with: it
            # ran, so it is pinned, but it is not the sandbox.
            kind = "payload interpreter" if key == "{python}" else "executable"
            _executable_subjects(facts, found, kind)
    out = list(found.values())
    image = _image_subject(_mapping(identity.get("profile")))
    if image is not None:
        out.append(image)
    spec = str(identity.get("spec_sha256") or "").removeprefix("sha256:")
    if spec:
        out.append(
            {
                # The identity pins the spec's bytes, not where it was read from: a spec is
                # found by its digest (`verify --subject-digest`, or --subject on the file).
                "name": f"backend-spec:{backend.get('name', '')}",
                "digest": {"sha256": spec},
                "annotations": {"kind": "backend spec"},
            }
        )
    if not out:
        out.append(
            {
                "name": f"backend:{backend.get('name', '')}",
                "digest": {"sha256": _pinned(dict(backend))},
            }
        )
    return out


def backend_records(evidence: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per backend of the run: its evidence record, or a bare one for cells only.

    A cell whose backend has no record still gets a statement (named by that bare record),
    so no judged cell is left out of every test-result statement.
    """
    records = [dict(b) for b in evidence.get("backends") or [] if isinstance(b, dict)]
    named = {str(b.get("name", "")) for b in records}
    for cell in evidence.get("cells") or []:
        name = str(cell.get("backend", ""))
        if name not in named:
            named.add(name)
            records.append({"name": name, "available": False, "reason": "no backend record"})
    return records


def sandbox_entry(backend: Mapping[str, Any], control: bool) -> dict[str, Any]:
    """The `sandbox` configuration entry: which backend this statement tested, in what role."""
    name = str(backend.get("name", ""))
    return {
        "name": SANDBOX_ENTRY,
        "uri": f"urn:sandbox-attest:backend:{name}",
        "annotations": {
            "backend": name,
            "role": CONTROL_ROLE if control else TESTED_ROLE,
            "note": (
                "the unconfined control leg: it shows each probe can see its escape on an "
                "open host, and attests no sandbox"
                if control
                else "the subjects are the executables (and image, spec) this backend ran"
            ),
        },
    }


def ci_url(env: Mapping[str, str]) -> str:
    """The CI run's URL from GitHub's variables, or "" outside such a run."""
    server = env.get("GITHUB_SERVER_URL", "")
    repo = env.get("GITHUB_REPOSITORY", "")
    run_id = env.get("GITHUB_RUN_ID", "")
    if not (server and repo and run_id):
        return ""
    return f"{server.rstrip('/')}/{repo}/actions/runs/{run_id}"


def sandbox_result_predicate(
    gate: Gate, config: Sequence[Mapping[str, Any]], url: str
) -> dict[str, Any]:
    """The test-result predicate of one backend's statement (`url` omitted when "")."""
    predicate = test_result_predicate(gate, config)
    if url:
        predicate["url"] = url
    return predicate


def verification_summary(
    subjects: Sequence[Mapping[str, Any]],
    *,
    verifier_version: str,
    time_verified: str,
    policy: Mapping[str, Any],
    inputs: Sequence[Mapping[str, Any]],
    result: str,
    levels: Sequence[str],
) -> dict[str, Any]:
    """A SLSA verification summary v1 statement over the sandboxes a release decided on.

    `verifiedLevels` carries the claims that held as our own values (`SANDBOX_ATTEST_...`):
    the specification lets users add custom values and forbids only ones starting with
    `SLSA_`, and this decision evaluates no SLSA build level. On FAILED it is `["FAILED"]`.
    """
    return statement(
        subjects,
        VSA_PREDICATE,
        {
            "verifier": {
                "id": "https://github.com/sandbox-attest/sandbox-attest/merge",
                "version": {"sandbox-attest": verifier_version},
            },
            "timeVerified": time_verified,
            "resourceUri": "urn:sandbox-attest:release",
            "policy": dict(policy),
            "inputAttestations": [dict(i) for i in inputs],
            "verificationResult": "PASSED" if result != "FAILED" else "FAILED",
            "verifiedLevels": list(levels) if result != "FAILED" else ["FAILED"],
            "dependencyLevels": {},
            "slsaVersion": "1.0",
        },
    )
