"""Merge signed legs (platform x backend) from a CI matrix into one signed release decision.

Each leg directory is verified on its own (signature, digests, re-derived gate, policy for
the legs it holds, freshness); then the legs must share one harness commit and probes
digest, the union must contain every expected leg (`--expect-legs`, see
`sandbox_attest.attest.legs`) exactly once and satisfy the whole policy. Only then is the release
written: every subject of each leg (evidence.json, junit.xml, report.html, summary.md,
allure-results/ and the attestation) copied to `legs/NN-<dir>/` (the very bytes that were
verified), the release's own report.html and summary.md (every leg's grid side by side,
linking to the legs' pages; `report.views.release`), and one test-result statement signed
over all of them, recording the common commit, which `sandbox-attest verify` checks again. A
leg that fails, a duplicate leg or a missing one refuses the merge and writes nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import (
    ATTESTATION_NAME,
    signer_info,
    sigstore,
    write_envelopes,
    write_signing_sidecar,
)
from sandbox_attest.attest.keys import ENV_VAR
from sandbox_attest.attest.legs import ExpectedLegs, leg_digests, leg_label, load_expected_legs
from sandbox_attest.attest.sigstore import sign_keyless
from sandbox_attest.attest.statement import (
    TEST_RESULT_PREDICATE,
    sha256_hex,
    statement,
    statement_bytes,
    test_result_predicate,
)
from sandbox_attest.attest.subjects import HTML, SUMMARY
from sandbox_attest.attest.summary import summary_statement, summary_version
from sandbox_attest.attest.verification import Checks
from sandbox_attest.attest.verify import LEG_FILES, LEGS_DIR, verify_legs
from sandbox_attest.errors import ConfigError
from sandbox_attest.report import files as reportfs
from sandbox_attest.report.evidence import utc_now
from sandbox_attest.report.policy import CONTROL_BACKEND
from sandbox_attest.report.signature import UNTRUSTED_LOCAL_NOTE, SignerFacts
from sandbox_attest.report.views.release import (
    release_view,
    render_release_html,
    render_release_summary,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from sandbox_attest.attest.keys import SigningKey, TrustedKey
    from sandbox_attest.attest.legs import Combined
    from sandbox_attest.report.policy import Gate, Policy

__all__ = ["ExpectedLegs", "MergeResult", "load_expected_legs", "merge_legs", "release_pages"]


@dataclass
class MergeResult:
    """The outcome of a merge: every reason it was refused, or the statement it wrote."""

    reasons: list[str] = field(default_factory=list)
    legs: dict[tuple[str, str], Path] = field(default_factory=dict)
    result: str = ""
    attestation: Path | None = None
    # What informational legs lack (missing, not verified): shown, never a refusal.
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the merge was written."""
        return not self.reasons


def check_out_dir(out_dir: Path) -> None:
    """Refuse an --out that holds anything: it may be a leg report or an earlier release.

    Raises:
        ConfigError: `out_dir` exists and is not an empty directory.
    """
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(
            f"--out {out_dir} already exists and is not empty (a leg report or an earlier "
            "release would be overwritten); choose an empty --out"
        )


def _write_atomically(out_dir: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh temporary directory beside `out_dir`, then rename it into place.

    A merge that fails half-way leaves nothing at `out_dir`, so a later verify never sees a
    half-written release.

    Raises:
        ConfigError: `out_dir` was filled by someone else meanwhile.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the release from CI's upload user
        check_out_dir(out_dir)
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _harness_entry(signed: Mapping[str, Any]) -> dict[str, Any]:
    """The merge's `harness` entry: the commit and probes digest every leg signed alike."""
    commit = signed.get("commit")
    digest = {"sha256": str(signed.get("probesSha256", ""))}
    if isinstance(commit, str) and commit:
        digest["gitCommit"] = commit
    return {
        "name": "harness",
        "uri": f"pkg:pypi/sandbox-attest@{signed.get('version', 'unknown')}",
        "digest": digest,
        "annotations": {
            "version": signed.get("version"),
            "commit": commit,
            "dirty": signed.get("dirty"),
            "probesSha256": signed.get("probesSha256"),
        },
    }


def _leg_copies(combined: Combined) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """Every leg's files to copy under legs/NN-<dir>/, and their subjects for the statement.

    The bytes `verify_report` checked, not a re-read: a file swapped since is not signed. Each
    copy also gets its envelopes as key-based Sigstore bundles, made from the copied bytes
    (derived, not signed again), so a Sigstore client verifies a leg's statements in its copy
    too (scripts/verify-independently.sh).
    """
    subjects: list[dict[str, Any]] = []
    copies: dict[str, bytes] = {}
    for label, v in combined.verifications:
        copies.update({f"{LEGS_DIR}/{label}/{name}": data for name, data in v.files.items()})
        if ATTESTATION_NAME in v.files:
            bundles = sigstore.key_bundles(v.files[ATTESTATION_NAME])
            copies[f"{LEGS_DIR}/{label}/{sigstore.KEY_BUNDLES_NAME}"] = bundles
        subjects.extend(
            {"name": f"{LEGS_DIR}/{label}/{name}", "digest": {"sha256": v.digests[name]}}
            for name in LEG_FILES
            # An informational leg that failed to verify may lack a file; it decides nothing.
            if name in v.digests
        )
    return subjects, copies


def _informational_entries(combined: Combined) -> list[dict[str, Any]]:
    """An `informational-leg:P/B` entry per informational leg merged (shown, never deciding).

    Each records whether it verified with the release key and its own gate, as the merge saw
    them; `verify` rebuilds the expected legs from these and the `leg:` entries.
    """
    by_label = dict(combined.verifications)
    out: list[dict[str, Any]] = []
    for (platform, backend), label in sorted(combined.informational.items()):
        v = by_label[label]
        out.append(
            {
                "name": f"informational-leg:{platform}/{backend}",
                "digest": {"sha256": v.attestation_sha256},
                "annotations": {
                    "copy": f"{LEGS_DIR}/{label}",
                    "verified": v.ok,
                    "gate": v.gate.result if v.gate is not None else None,
                    "reasons": list(v.reasons),
                },
            }
        )
    return out


def release_pages(
    combined: Combined,
    expected: ExpectedLegs,
    policy: Policy,
    key: SigningKey,
    env: Mapping[str, str],
) -> dict[str, bytes]:
    """The release's report.html and summary.md, rendered from the verified legs.

    From the evidence each leg's verification parsed (the bytes the merge copies), through
    the one verdict mapping, with the merged gate the statement signs.

    Args:
        combined: `verify_legs`'s result, with a gate.
        expected: the legs the release needs (says whether `none` is a leg of its own).
        policy: the release policy.
        key: the key the merge is signed with (the pages say who signs).
        env: the environment for Sigstore's ambient-token check.

    Returns:
        `report.html` and `summary.md` -> their bytes.
    """
    if combined.gate is None:
        msg = "release_pages needs the merged gate; call it after verify_legs succeeded"
        raise ValueError(msg)
    facts = SignerFacts.of(key.keyid, key.trust, sigstore.decide(env))
    view = release_view(
        [(label, v.evidence or {}) for label, v in combined.verifications],
        combined.gate,
        policy,
        facts,
        control_is_leg=any(b == CONTROL_BACKEND for _, b in expected.legs),
    )
    return {
        HTML: render_release_html(view).encode("utf-8"),
        SUMMARY: render_release_summary(view).encode("utf-8"),
    }


def refuse_untrusted_merge_key(key: SigningKey, allow_untrusted_local: bool) -> None:
    """Refuse to sign a merge with the per-machine key unless that was asked for.

    Raises:
        ConfigError: `key` is the untrusted per-machine key and `allow_untrusted_local` is
            not set.
    """
    if key.trust == "untrusted-local" and not allow_untrusted_local:
        raise ConfigError(
            f"no signing key given, so the merge would be {UNTRUSTED_LOCAL_NOTE} "
            f"({key.source.split(':', 1)[-1]}), which proves only that this machine signed it; "
            f"pass --key KEY or set ${ENV_VAR}, or --allow-untrusted-local to accept that"
        )


def _release_entries(
    combined: Combined, expected: ExpectedLegs, policy: Policy, key: SigningKey
) -> list[dict[str, Any]]:
    """The merged statement's policy, expect-legs, harness, run and signer entries."""
    signer = signer_info(key)
    # The harness facts every deciding leg shares (`combine` refused differing ones).
    first = next(v for lb, v in combined.verifications if lb in combined.legs.values()).harness
    return [
        {"name": "policy", "uri": policy.path, "digest": {"sha256": policy.sha256}},
        {"name": "expect-legs", "uri": expected.path, "digest": {"sha256": expected.sha256}},
        _harness_entry(first),
        {
            "name": "run",
            "uri": "urn:sandbox-attest:merge",
            "annotations": {"finishedAt": utc_now()},
        },
        {
            "name": "signer",
            "digest": {"sha256": signer["keyid"]},
            # Information only: verify decides trust from the verifying key, not from this.
            "annotations": {"trust": signer["trust"], "source": signer["source"]},
        },
    ]


def _leg_entries(combined: Combined, dirs: Mapping[str, Path]) -> list[dict[str, Any]]:
    """One `leg:PLATFORM/BACKEND` entry per deciding leg: its digest, copy and signed run."""
    entries: list[dict[str, Any]] = []
    by_label = dict(combined.verifications)
    holder = {f"leg:{p}/{b}": label for (p, b), label in combined.legs.items()}
    for name, digest in leg_digests(combined).items():
        v = by_label[holder[name]]
        entries.append(
            {
                "name": name,
                "digest": {"sha256": digest},
                "annotations": {
                    "dir": str(dirs[holder[name]]),
                    "copy": f"{LEGS_DIR}/{holder[name]}",
                    "runId": str((v.evidence or {}).get("run_id", "")),
                    "signerKeyid": str(v.signer.get("keyid", "")),
                    "commit": v.harness.get("commit"),
                    "finishedAt": v.finished_at,
                },
            }
        )
    return entries


def _release_payloads(
    combined: Combined,
    gate: Gate,
    policy: Policy,
    subjects: list[dict[str, Any]],
    config: list[dict[str, Any]],
) -> list[bytes]:
    """The merged test-result statement, then the release's verification summary."""
    payload = statement_bytes(
        statement(subjects, TEST_RESULT_PREDICATE, test_result_predicate(gate, config))
    )
    # The release decision as a verification summary over the sandboxes (issue 30).
    summary = statement_bytes(
        summary_statement(
            combined,
            policy,
            legs_dir=LEGS_DIR,
            attestation=ATTESTATION_NAME,
            version=summary_version(combined),
            time_verified=utc_now(),
        )
    )
    return [payload, summary]


def _write_release(
    tmp: Path,
    copies: Mapping[str, bytes],
    payloads: list[bytes],
    key: SigningKey,
    env: Mapping[str, str],
    gate: Gate,
) -> None:
    """Write the copies, the envelopes, their key bundles, keyless bundles and signing.json."""
    for path, data in copies.items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_bytes(data)
    write_envelopes(tmp / ATTESTATION_NAME, payloads, key)
    dir_fd = reportfs.open_report_dir(tmp)
    try:
        envelopes = reportfs.read_regular(dir_fd, ATTESTATION_NAME)
        reportfs.write_new(dir_fd, sigstore.KEY_BUNDLES_NAME, sigstore.key_bundles(envelopes))
        decision = sign_keyless(payloads, dir_fd, env)
    finally:
        os.close(dir_fd)
    write_signing_sidecar(tmp, key, decision, gate)


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
    checks: Checks | None = None,
    allow_shared_trust_domain: bool = False,
) -> MergeResult:
    """Verify every leg and, if all hold, write one signed statement over all of them.

    Args:
        leg_dirs: the leg report directories, in the order their copies are numbered.
        expected: the legs the release needs.
        trusted: the key every leg must be signed with.
        policy: the release policy, judged over the union of the legs.
        key: the key the merge is signed with.
        out_dir: an empty or new directory for the release.
        allow_untrusted_local: accept legs, and a merge key, that are per-machine keys.
        env: the environment for Sigstore's ambient-token check (default: os.environ).
        checks: what every leg is held to (freshness, commit, registry); default `Checks()`.
        allow_shared_trust_domain: accept legs whose trust domains were not separated.

    Returns:
        The merge result; `attestation` is set only when the merge was written.

    Raises:
        ConfigError: `out_dir` is not empty (see `check_out_dir`), or `key` is the untrusted
            per-machine key and `allow_untrusted_local` is not set.
    """
    check_out_dir(out_dir)
    refuse_untrusted_merge_key(key, allow_untrusted_local)
    merged = MergeResult()
    if len({d.resolve() for d in leg_dirs}) != len(leg_dirs):
        merged.reasons.append("the same leg directory was passed twice")
    dirs = {leg_label(i, d.name): d for i, d in enumerate(leg_dirs, start=1)}
    combined = verify_legs(
        list(dirs.items()),
        expected,
        trusted,
        policy,
        allow_untrusted_local=allow_untrusted_local,
        checks=checks,
        allow_shared_trust_domain=allow_shared_trust_domain,
    )
    merged.reasons.extend(combined.reasons)
    merged.notes.extend(combined.notes)
    merged.legs = {leg: dirs[label] for leg, label in combined.legs.items()}
    if combined.gate is not None:
        merged.result = combined.gate.result
    if not merged.ok or combined.gate is None:
        return merged
    subjects, copies = _leg_copies(combined)
    env = os.environ if env is None else env
    pages = release_pages(combined, expected, policy, key, env)
    copies.update(pages)
    subjects.extend({"name": n, "digest": {"sha256": sha256_hex(d)}} for n, d in pages.items())
    config = [
        *_release_entries(combined, expected, policy, key),
        *_leg_entries(combined, dirs),
        *_informational_entries(combined),
    ]
    gate = combined.gate
    payloads = _release_payloads(combined, gate, policy, subjects, config)

    def write(tmp: Path) -> None:
        _write_release(tmp, copies, payloads, key, env, gate)

    _write_atomically(out_dir, write)
    merged.attestation = out_dir / ATTESTATION_NAME
    return merged
