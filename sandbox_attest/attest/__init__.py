"""Signed attestations of a run: DSSE envelopes over in-toto statements, verify and merge.

`sign_judged` is the one signing path: it takes the exact bytes the session judged (evidence,
junit, the two rendered views), re-derives the gate from them, writes every file itself into
the report directory (`reportfs`), and signs their digests. A run reaches it through the
separate signer process (`sandbox_attest.attest.signer`), which alone holds the key; `sign_report`
renders every view from a finished directory's evidence.json with `report.build`, as a run
does, and signs it in-process (tests, benchmarks, re-signing). Imports flow one way: this
package reads `report/` (the gate, the views' bytes, the report directory's files); nothing
in `report/` imports it.
`verify_report` and `merge_legs` are the release gate (`sandbox-attest verify` / `merge`,
wired by `sandbox_attest.cli.release.register`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import dsse, sigstore, subjects
from sandbox_attest.attest.keys import (
    SigningKey,
    TrustedKey,
    keyid_of,
    load_signing_key,
    load_trusted_key,
    public_key_dict,
)
from sandbox_attest.attest.statement import (
    EVIDENCE_PREDICATE,
    TEST_RESULT_PREDICATE,
    backend_records,
    ci_url,
    configuration,
    evidence_predicate,
    parse_evidence,
    report_entries,
    report_subjects,
    sandbox_entry,
    sandbox_result_predicate,
    sandbox_subjects,
    statement,
    statement_bytes,
)
from sandbox_attest.errors import ConfigError, ReportError
from sandbox_attest.report import files as reportfs
from sandbox_attest.report.build import render_views, write_allure
from sandbox_attest.report.policy import (
    CONTROL_BACKEND,
    Gate,
    Policy,
    default_platform,
    gate_for,
    load_policy,
)
from sandbox_attest.report.signature import ED25519_ONLY, UNTRUSTED_LOCAL_NOTE, SignerFacts
from sandbox_attest.verdict import Verdict

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

ATTESTATION_NAME = "attestation.intoto.jsonl"
SIGNING_NAME = "signing.json"  # unsigned sidecar: who signed, trust, sigstore outcome
EVIDENCE_NAME = subjects.EVIDENCE
JUNIT_NAME = subjects.JUNIT
HTML_NAME = subjects.HTML
SUMMARY_NAME = subjects.SUMMARY

__all__ = [
    "ATTESTATION_NAME",
    "SIGNING_NAME",
    "SignedReport",
    "SigningKey",
    "TrustedKey",
    "keyid_of",
    "load_signing_key",
    "load_trusted_key",
    "policy_from_evidence",
    "sign_judged",
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


def _required_anywhere(
    cells: Sequence[Mapping[str, Any]], policy: Policy | None, platform: str
) -> bool:
    """Some cell is marked required by the run, or the policy requires one of their legs."""
    legs = policy.legs() if policy is not None else set()
    return any(
        c.get("required") is True
        or (str(c.get("platform") or platform), str(c.get("backend"))) in legs
        for c in cells
    )


def backend_gate(evidence: Mapping[str, Any], policy: Policy | None, backend: str) -> Gate:
    """The gate one backend's test-result statement signs: its cells, with the control's.

    A sandbox is judged by its own cells and by the control leg that makes its PASSes mean
    something (a broken control fails it), never by another sandbox's cells: a docker FAIL
    says nothing about a bwrap build. A backend that neither the policy nor the run required
    (an optional wrapper of the default set) is judged as if named with `--backend`: every
    cell of it that applies here must PASS. Judged by the policy alone it would always be
    FAILED ("nothing required of it"), whatever its cells showed. The control leg's own
    statement carries the whole run's result, since the control attests no sandbox. The test
    lists hold only this backend's cells. Signer and `verify` both call this, so they agree.
    """
    cells = evidence["cells"]
    mine = [c for c in cells if str(c.get("backend", "")) == backend]
    own = {str(c.get("cell_id", "")) for c in mine}
    if backend == CONTROL_BACKEND:
        gate = gate_for(evidence, policy)
    else:
        if not _required_anywhere(mine, policy, default_platform(evidence)):
            mine = [
                {**c, "required": True} if c.get("verdict") != Verdict.NOT_APPLICABLE else c
                for c in mine
            ]
        control = [c for c in cells if str(c.get("backend", "")) == CONTROL_BACKEND]
        gate = gate_for({**evidence, "cells": [*control, *mine]}, policy)
    return Gate(
        gate.result,
        tuple(t for t in gate.passed if t in own),
        tuple(t for t in gate.warned if t in own),
        tuple(t for t in gate.failed if t in own),
        gate.problems,
    )


def sandbox_payloads(
    evidence: Mapping[str, Any],
    policy: Policy | None,
    reports: Sequence[Mapping[str, Any]],
    env: Mapping[str, str],
) -> list[bytes]:
    """One test-result statement per backend, about the sandbox it tested (issue 30).

    Each names as subjects what that backend ran (`statement.sandbox_subjects`); its
    configuration pins the run (`statement.configuration`), the report files (`reports`,
    from `statement.report_entries`) and which backend it is, and `url` is the CI run.
    """
    config = configuration(evidence, policy.sha256 if policy else None)
    url = ci_url(env)
    out: list[bytes] = []
    for record in backend_records(evidence):
        name = str(record.get("name", ""))
        entries = [*config, *reports, sandbox_entry(record, name == CONTROL_BACKEND)]
        gate = backend_gate(evidence, policy, name)
        out.append(
            statement_bytes(
                statement(
                    sandbox_subjects(record),
                    TEST_RESULT_PREDICATE,
                    sandbox_result_predicate(gate, entries, url),
                )
            )
        )
    return out


def signer_info(key: SigningKey) -> dict[str, str]:
    """What the signed evidence predicate records about its signer."""
    return {"keyid": key.keyid, "trust": key.trust, "source": key.source.split(":", 1)[0]}


@dataclass(frozen=True)
class SignedReport:
    """What `sign_judged` did: the attestation's path, the gate it signed, keyless's outcome."""

    attestation: Path
    gate: Gate
    sigstore: sigstore.SigstoreDecision


def envelope_lines(payloads: Sequence[bytes], key: SigningKey) -> bytes:
    """Each payload signed into its own DSSE envelope, one JSON line each."""
    lines = [dsse.sign(p, key.private_key, key.keyid).to_json() for p in payloads]
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _open_dir(path: Path) -> int:
    # Merge writes into a directory it made itself a moment ago (0700, its own), so only the
    # no-follow open matters here; report directories get `reportfs.open_report_dir`'s checks.
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))


def write_envelopes(path: Path, payloads: Sequence[bytes], key: SigningKey) -> None:
    """Sign each payload into its own envelope; write them one per line (`reportfs.write_new`)."""
    fd = _open_dir(path.parent)
    try:
        reportfs.write_new(fd, path.name, envelope_lines(payloads, key))
    finally:
        os.close(fd)


def signing_sidecar(key: SigningKey, decision: sigstore.SigstoreDecision, gate: Gate) -> bytes:
    """signing.json's bytes: who signed, the public key, the sigstore outcome and the gate."""
    data = {
        **signer_info(key),
        "public_key": public_key_dict(key.public_key),
        "note": UNTRUSTED_LOCAL_NOTE if key.trust == "untrusted-local" else "",
        "sigstore": {"status": decision.status, "reason": decision.reason},
        "gate": gate.result,
    }
    return (json.dumps(data, indent=2) + "\n").encode("utf-8")


def write_signing_sidecar(
    report_dir: Path, key: SigningKey, decision: sigstore.SigstoreDecision, gate: Gate
) -> None:
    """Write signing.json: the facts report.html and summary.md show about the signature."""
    fd = _open_dir(report_dir)
    try:
        reportfs.write_new(fd, SIGNING_NAME, signing_sidecar(key, decision, gate))
    finally:
        os.close(fd)


def judged_gate(
    report_dir: Path,
    files: Mapping[str, bytes],
    policy: Policy | None,
    expected_gate: str | None,
) -> tuple[dict[str, Any], Gate]:
    """Steps 1 and 2 of `sign_judged`: the evidence handed over and the gate it gives.

    Raises:
        ReportError: a file is missing, evidence.json is malformed, or the gates differ.
    """
    missing = [name for name in subjects.FILE_SUBJECTS if name not in files]
    if missing:
        raise ReportError(
            f"cannot sign {report_dir}: {missing[0]} was not handed to the signer; a signature "
            f"must cover {', '.join(subjects.ALL_SUBJECTS)}"
        )
    evidence = parse_evidence(files[EVIDENCE_NAME], f"{report_dir / EVIDENCE_NAME}")
    gate = gate_for(evidence, policy)
    if expected_gate is not None and gate.result != expected_gate:
        raise ReportError(
            f"refusing to sign {report_dir}: the session judged the gate {expected_gate}, but "
            f"the evidence handed to the signer gives {gate.result}"
            + (f" ({gate.problems[0]})" if gate.problems else "")
            + "; the evidence changed between judging and signing, so nothing is signed "
            "(re-run into a new --out directory, and report it if it happens again)"
        )
    return evidence, gate


def run_payloads(
    evidence: Mapping[str, Any],
    policy: Policy | None,
    gate: Gate,
    key: SigningKey,
    report_files: Mapping[str, bytes],
    allure: str,
    env: Mapping[str, str],
) -> list[bytes]:
    """Step 5's statements: one test-result statement per backend, then the evidence one."""
    return [
        *sandbox_payloads(evidence, policy, report_entries(report_files, allure), env),
        statement_bytes(
            statement(
                report_subjects(report_files, allure),
                EVIDENCE_PREDICATE,
                evidence_predicate(evidence, signer_info(key), gate),
            )
        ),
    ]


def sign_judged(
    report_dir: Path,
    dir_fd: int,
    key: SigningKey,
    files: Mapping[str, bytes],
    *,
    policy: Policy | None,
    expected_gate: str | None,
    env: Mapping[str, str],
    keyless_refused: str = "",
) -> SignedReport:
    """Sign the bytes that were judged, writing every file of the report from them.

    Steps:
      1. parse `files["evidence.json"]` and re-derive the gate from it with `policy`;
      2. refuse when that gate differs from `expected_gate` (the session's own), so the
         console and the signed statement can never say different things;
      3. write evidence.json, junit.xml, report.html and summary.md from `files` with
         `reportfs.write_new` (new temp file, no-follow, rename), so what is on disk is what
         is signed, whatever was planted in the directory before;
      4. digest allure-results/ (`subjects.tree_sha256`, through the directory descriptor);
      5. sign one test-result statement per backend (subjects: what it ran; the report
         files' digests in its configuration) and the evidence statement (subjects: the
         report files) from the bytes held here, write attestation.intoto.jsonl and its
         key-based Sigstore bundles, attempt keyless Sigstore, then write signing.json.

    Args:
        report_dir: the report directory (for messages, and where `dir_fd` came from).
        dir_fd: from `reportfs.open_report_dir(report_dir)`.
        key: the signing key.
        files: the exact bytes of every name in `subjects.FILE_SUBJECTS`.
        policy: the policy the gate is derived with (None: the cells judged alone).
        expected_gate: the gate result the session decided, or None to accept the derived one
            (re-signing a directory, where no session judged).
        env: the environment for Sigstore's ambient-token check.
        keyless_refused: why keyless signing must not vouch for this run ("" to decide from
            `env`): a run whose trust domains were not separated gets no identity either.

    Returns:
        The attestation's path, the signed gate and the Sigstore outcome.

    Raises:
        ReportError: a file is missing, evidence.json is malformed, the gates differ, or a
            file cannot be written.
    """
    evidence, gate = judged_gate(report_dir, files, policy, expected_gate)
    for name in subjects.FILE_SUBJECTS:
        reportfs.write_new(dir_fd, name, files[name])
    here = reportfs.dir_path(dir_fd, report_dir)
    allure = subjects.tree_sha256(here / subjects.ALLURE_DIR)
    report_files = {n: files[n] for n in subjects.FILE_SUBJECTS}
    payloads = run_payloads(evidence, policy, gate, key, report_files, allure, env)
    envelopes = envelope_lines(payloads, key)
    reportfs.write_new(dir_fd, ATTESTATION_NAME, envelopes)
    if keyless_refused:
        decision = sigstore.SigstoreDecision(
            attempt=False, status=ED25519_ONLY, reason=keyless_refused
        )
    else:
        decision = sigstore.sign_keyless(payloads, dir_fd, env)
    # The same envelopes as Sigstore bundles naming the key, beside any keyless ones: a
    # Sigstore client verifies them with the public key alone (reports/README.md).
    reportfs.write_new(dir_fd, sigstore.KEY_BUNDLES_NAME, sigstore.key_bundles(envelopes))
    reportfs.write_new(dir_fd, SIGNING_NAME, signing_sidecar(key, decision, gate))
    return SignedReport(report_dir / ATTESTATION_NAME, gate, decision)


def sign_report(
    report_dir: Path,
    key: SigningKey,
    *,
    policy: Policy | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Sign a finished report directory in this process: render every view, then sign.

    Reads evidence.json once (a regular file, never through a link) and renders junit.xml,
    allure-results/, report.html and summary.md from it through the one verdict mapping
    (`report.outcomes`), exactly as a run's session does, then hands them to `sign_judged`.
    The views on disk before are replaced, never signed: a stale or planted junit.xml cannot
    say something the signed gate does not. Other files already in allure-results/ are left
    in place and covered by its tree digest, as every file there is; re-sign into a fresh
    directory to leave them out. A run does not call this: its
    signer process signs from memory. Use it for tests, benchmarks and re-signing a
    directory you trust. It cannot know the required cells a run never reached (a
    session's `missing_required`), only those the policy names.

    Args:
        report_dir: the run's directory holding evidence.json.
        key: from `load_signing_key`.
        policy: the release policy the gate is derived with; by default the one evidence.json
            names, if it is still on disk unchanged (else the cells are judged alone).
        env: the environment for Sigstore's ambient-token check (default: os.environ).

    Returns:
        The path of attestation.intoto.jsonl.

    Raises:
        ReportError: evidence.json is missing or malformed, or a view cannot be written.
        ConfigError: the directory is not the harness's own, or is writable by others.
    """
    env = os.environ if env is None else env
    dir_fd = reportfs.open_report_dir(report_dir)
    try:
        evidence_bytes = reportfs.read_regular(dir_fd, EVIDENCE_NAME)
        evidence = parse_evidence(evidence_bytes, str(report_dir / EVIDENCE_NAME))
        if policy is None:
            policy = policy_from_evidence(evidence)
        facts = SignerFacts.of(key.keyid, key.trust, sigstore.decide(env))
        views = render_views(evidence, facts, policy)
        write_allure(reportfs.dir_path(dir_fd, report_dir), views)
        files = {EVIDENCE_NAME: evidence_bytes, **views.files}
        signed = sign_judged(
            report_dir, dir_fd, key, files, policy=policy, expected_gate=None, env=env
        )
    finally:
        os.close(dir_fd)
    return signed.attestation
