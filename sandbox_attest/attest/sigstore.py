"""Optional keyless Sigstore signing of the same statement bytes the Ed25519 envelope carries.

Keyless signing needs an ambient OIDC identity (GitHub Actions with `id-token: write`, or an
explicit `SIGSTORE_ID_TOKEN`) and the `sigstore` package; it also talks to Fulcio and Rekor.
Without any of these the report is Ed25519-only, and says so: it never fails a run, because
the Ed25519 signature is the one `verify` checks. `verify` does not check Sigstore bundles
(that needs the network); use `sigstore verify identity` on `attestation.sigstore.jsonl`.

Whatever happens to keyless signing, `key_bundles` writes the Ed25519 envelopes as Sigstore
bundles with public-key verification material (`attestation.bundle.jsonl`), which a Sigstore
client verifies offline with the public key (scripts/verify-independently.sh).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox_attest.report import files as reportfs
from sandbox_attest.report.signature import ED25519_ONLY, KEYLESS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

BUNDLES_NAME = "attestation.sigstore.jsonl"
# The Ed25519 envelopes as Sigstore bundles with public-key verification material (issue 30).
KEY_BUNDLES_NAME = "attestation.bundle.jsonl"
OPT_OUT_VAR = "SANDBOX_ATTEST_SIGSTORE"  # "0" turns keyless signing off even in CI
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"


@dataclass(frozen=True)
class SigstoreDecision:
    """Whether to attempt keyless signing, and the sentence the report shows about it."""

    attempt: bool
    status: str  # KEYLESS or ED25519_ONLY
    reason: str


def has_ambient_token(env: Mapping[str, str]) -> bool:
    """An OIDC identity is available: an explicit token or GitHub's id-token endpoint."""
    if env.get("SIGSTORE_ID_TOKEN"):
        return True
    return bool(env.get("ACTIONS_ID_TOKEN_REQUEST_URL")) and bool(
        env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN")
    )


def sigstore_importable() -> bool:
    """The optional `sigstore` package is installed."""
    return importlib.util.find_spec("sigstore") is not None


def _ed25519_only(reason: str) -> SigstoreDecision:
    return SigstoreDecision(attempt=False, status=ED25519_ONLY, reason=reason)


def decide(
    env: Mapping[str, str], importable: Callable[[], bool] = sigstore_importable
) -> SigstoreDecision:
    """Decide whether keyless signing happens, and word the reason for the report.

    Args:
        env: the environment (token variables and the opt-out).
        importable: the check for the `sigstore` package (a seam for tests).
    """
    if env.get(OPT_OUT_VAR) == "0":
        return _ed25519_only(f"keyless signing turned off by {OPT_OUT_VAR}=0")
    if not has_ambient_token(env):
        return _ed25519_only(
            "no ambient OIDC token (in GitHub Actions grant `permissions: id-token: write`)"
        )
    if not importable():
        return _ed25519_only(
            "an OIDC token exists but the `sigstore` package is not installed "
            "(pip install sigstore)"
        )
    return SigstoreDecision(
        attempt=True, status=KEYLESS, reason="ambient OIDC token and sigstore available"
    )


def sign_keyless(
    payloads: Sequence[bytes], dir_fd: int, env: Mapping[str, str]
) -> SigstoreDecision:
    """Sign each statement's bytes keylessly when `decide` allows; never raises.

    Writes one Sigstore bundle per line to `attestation.sigstore.jsonl` in the directory
    behind `dir_fd` (from `reportfs.open_report_dir`), through the descriptor, never by
    following a name someone could have planted. A bundle left by an earlier signing is
    deleted first: it signs other bytes, and must not pass for this one's.

    Returns:
        What happened, worded for the report (a failure degrades to Ed25519 only, and its
        reason is printed to stderr too, so a CI log shows why keyless signing was lost).
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(BUNDLES_NAME, dir_fd=dir_fd)
    return _sign_into(payloads, dir_fd, env)


def _sign_into(payloads: Sequence[bytes], dir_fd: int, env: Mapping[str, str]) -> SigstoreDecision:
    decision = decide(env)
    if not decision.attempt:
        return decision
    try:
        lines = _sign_with_sigstore(payloads, env)
    except Exception as exc:  # the sigstore API varies by version; any failure is "not signed"
        reason = f"sigstore signing failed: {type(exc).__name__}: {exc}"
        print(f"warning: {reason}; the report is signed with Ed25519 only", file=sys.stderr)
        return _ed25519_only(reason)
    reportfs.write_new(dir_fd, BUNDLES_NAME, "".join(line + "\n" for line in lines).encode())
    return decision


def _sign_with_sigstore(payloads: Sequence[bytes], env: Mapping[str, str]) -> list[str]:
    # Imported dynamically: sigstore is an optional extra and has no stubs here.
    oidc: Any = importlib.import_module("sigstore.oidc")
    sign_mod: Any = importlib.import_module("sigstore.sign")
    dsse: Any = importlib.import_module("sigstore.dsse")
    raw_token = env.get("SIGSTORE_ID_TOKEN") or oidc.detect_credential()
    if not raw_token:
        raise RuntimeError("detect_credential() found no token")
    token = oidc.IdentityToken(raw_token)
    if hasattr(sign_mod.SigningContext, "production"):  # sigstore < 4
        context = sign_mod.SigningContext.production()
    else:
        models: Any = importlib.import_module("sigstore.models")
        context = sign_mod.SigningContext.from_trust_config(models.ClientTrustConfig.production())
    with context.signer(token) as signer:
        return [signer.sign_dsse(dsse.Statement(p)).to_json() for p in payloads]


def key_bundle(envelope_line: str) -> str:
    """One DSSE envelope line as a Sigstore bundle v0.3 verified by a public key.

    The bundle carries the very envelope (payload, payloadType, signature bytes), so it
    signs the same statement; `verificationMaterial.publicKey.hint` is the keyid, which a
    Sigstore client maps to the public key it is given. No transparency-log entry or
    timestamp is claimed: a client verifies it offline with thresholds of 0.
    """
    envelope = json.loads(envelope_line)
    signatures = envelope.get("signatures") or []
    hint = str(signatures[0].get("keyid", "")) if signatures else ""
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {
            "publicKey": {"hint": hint},
            "tlogEntries": [],
            "timestampVerificationData": {"rfc3161Timestamps": []},
        },
        "dsseEnvelope": {
            "payload": envelope["payload"],
            "payloadType": envelope["payloadType"],
            "signatures": [{"sig": s["sig"], "keyid": str(s.get("keyid", ""))} for s in signatures],
        },
    }
    return json.dumps(bundle, separators=(",", ":"))


def key_bundles(envelope_lines: bytes) -> bytes:
    """`key_bundle` of every line of attestation.intoto.jsonl, one bundle per line."""
    lines = [line for line in envelope_lines.decode("utf-8").splitlines() if line.strip()]
    return "".join(key_bundle(line) + "\n" for line in lines).encode("utf-8")
