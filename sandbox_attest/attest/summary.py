"""The release decision as a SLSA verification summary (issue 30), written by `merge`.

`merge` decides a release over verified legs; this module turns that decision into a
`https://slsa.dev/verification_summary/v1` statement, so tools that read VSAs (policy engines,
`cosign verify-attestation --type`) can look the release up by a sandbox's digest:

- subjects: every executable, image and spec the legs' sandboxes ran (their test-result
  statements' subjects, the control leg's left out: it attests no sandbox);
- `policy`: the release policy file's path and sha256;
- `inputAttestations`: each copied leg's attestation.intoto.jsonl with its sha256;
- `verificationResult`: PASSED (a merge is written only when the release holds);
- `verifiedLevels`: the claims that held, one value per claim and leg, as
  `sandbox-attest/<platform>/<backend>/<claim>=<value>`. SLSA v1 lets users add their own
  values and forbids only ones starting with `SLSA_`; this decision evaluates no SLSA build
  level, so it names none.

`verify` of a merged directory re-derives every field but `timeVerified` from the legs it
verified (`check_summary`), so a summary that claims more than the legs show is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox_attest.attest.statement import VSA_PREDICATE, verification_summary

if TYPE_CHECKING:
    from sandbox_attest.attest.legs import Combined
    from sandbox_attest.report.policy import Policy

LEVEL_PREFIX = "sandbox-attest"


def summary_subjects(combined: Combined) -> list[dict[str, Any]]:
    """The sandboxes the release decided on: every non-control leg statement's subjects."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    holders = set(combined.legs.values())
    for label, leg in combined.verifications:
        if label not in holders:
            continue
        for sandbox in leg.sandboxes:
            if sandbox.control:
                continue
            for name, digest in sandbox.subjects:
                found.setdefault((name, digest), {"name": name, "digest": {"sha256": digest}})
    return [found[k] for k in sorted(found)]


def summary_levels(combined: Combined) -> list[str]:
    """`verifiedLevels`: each leg's claims that held, `sandbox-attest/<p>/<b>/<claim>=<v>`."""
    by_label = dict(combined.verifications)
    levels: list[str] = []
    for (platform, backend), label in sorted(combined.legs.items()):
        claims = by_label[label].claims.get(backend) or {}
        levels.extend(
            f"{LEVEL_PREFIX}/{platform}/{backend}/{claim}={value}"
            for claim, value in sorted(claims.items())
        )
        levels.append(f"{LEVEL_PREFIX}/{platform}/{backend}/policy=PASSED")
    return levels


def summary_inputs(combined: Combined, legs_dir: str, attestation: str) -> list[dict[str, Any]]:
    """`inputAttestations`: every copied leg's attestation, by its path in the release."""
    deciding = set(combined.legs.values())
    return [
        {"uri": f"{legs_dir}/{label}/{attestation}", "digest": {"sha256": leg.attestation_sha256}}
        for label, leg in combined.verifications
        # Informational legs are merged and shown, but the decision did not rest on them.
        if label in deciding
    ]


def summary_version(combined: Combined) -> str:
    """The harness version the deciding legs signed (`combine` refused differing commits)."""
    deciding = set(combined.legs.values())
    for label, leg in combined.verifications:
        if label in deciding:
            return str(leg.harness.get("version", "unknown"))
    return "unknown"


def summary_statement(
    combined: Combined,
    policy: Policy,
    *,
    legs_dir: str,
    attestation: str,
    version: str,
    time_verified: str,
) -> dict[str, Any]:
    """The verification summary statement of a written merge."""
    subjects = summary_subjects(combined) or [
        # Legs from before issue 30 name no sandbox: the summary is then about the release.
        {"name": "release", "digest": {"sha256": policy.sha256}}
    ]
    return verification_summary(
        subjects,
        verifier_version=version,
        time_verified=time_verified,
        policy={"uri": policy.path, "digest": {"sha256": policy.sha256}},
        inputs=summary_inputs(combined, legs_dir, attestation),
        result=combined.gate.result if combined.gate else "FAILED",
        levels=summary_levels(combined),
    )


def check_summary(
    stmt: dict[str, Any],
    combined: Combined,
    policy: Policy,
    *,
    legs_dir: str,
    attestation: str,
) -> list[str]:
    """Every way a signed summary differs from the one the verified legs give (none: [])."""
    predicate = stmt.get("predicate") or {}
    want = summary_statement(
        combined,
        policy,
        legs_dir=legs_dir,
        attestation=attestation,
        version=summary_version(combined),
        time_verified=str(predicate.get("timeVerified", "")),
    )
    if stmt.get("predicateType") != VSA_PREDICATE:
        return [f"the release summary's predicateType is not {VSA_PREDICATE}"]
    problems = []
    if stmt.get("subject") != want["subject"]:
        problems.append(
            "the release summary's subjects are not the sandboxes the verified legs ran"
        )
    problems.extend(
        f"the release summary's {key} differs from what the verified legs give; re-run "
        "`sandbox-attest merge`"
        for key in (
            "verifier",
            "policy",
            "inputAttestations",
            "verificationResult",
            "verifiedLevels",
        )
        if predicate.get(key) != want["predicate"][key]
    )
    return problems
