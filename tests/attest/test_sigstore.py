"""Keyless Sigstore: only the decision logic and the absent path (no network here)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.attest import sigstore
from sandbox_attest.attest.sigstore import (
    BUNDLES_NAME,
    SigstoreDecision,
    decide,
    sign_keyless,
)
from sandbox_attest.report import files as reportfs
from sandbox_attest.report.signature import ED25519_ONLY, KEYLESS

if TYPE_CHECKING:
    from pathlib import Path

GITHUB = {
    "ACTIONS_ID_TOKEN_REQUEST_URL": "http://127.0.0.1:1/t",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "x",
}


class TestDecide:
    def test_no_token_is_ed25519_only(self) -> None:
        """Without an ambient OIDC token the report is Ed25519 only, saying how to get one."""
        d = decide({}, importable=lambda: True)
        assert (d.attempt, d.status) == (False, ED25519_ONLY)
        assert "id-token: write" in d.reason

    def test_token_without_package(self) -> None:
        """A token without the sigstore package is Ed25519 only, naming the package."""
        d = decide(GITHUB, importable=lambda: False)
        assert (d.attempt, d.status) == (False, ED25519_ONLY)
        assert "pip install sigstore" in d.reason

    def test_token_and_package_attempts_keyless(self) -> None:
        """Both present (either GitHub's endpoint or SIGSTORE_ID_TOKEN) attempts keyless signing."""
        assert decide(GITHUB, importable=lambda: True).status == KEYLESS
        assert decide({"SIGSTORE_ID_TOKEN": "e30"}, importable=lambda: True).attempt

    def test_half_a_github_token_is_no_token(self) -> None:
        """Only the request URL without its bearer token is not an identity."""
        env = {"ACTIONS_ID_TOKEN_REQUEST_URL": "http://127.0.0.1:1/t"}
        assert not decide(env, importable=lambda: True).attempt

    def test_opt_out(self) -> None:
        """SANDBOX_ATTEST_SIGSTORE=0 turns keyless off even with a token."""
        d = decide({**GITHUB, "SANDBOX_ATTEST_SIGSTORE": "0"}, importable=lambda: True)
        assert not d.attempt


def test_sign_report_records_ed25519_only(signed_report: Path) -> None:
    """Without a token: Ed25519 only, no keyless bundle; the key bundles name the key."""
    signing = json.loads((signed_report / "signing.json").read_text())
    assert signing["sigstore"]["status"] == ED25519_ONLY
    assert signing["trust"] == "provided"
    assert not (signed_report / "attestation.sigstore.jsonl").exists()
    envelopes = (signed_report / "attestation.intoto.jsonl").read_text().splitlines()
    bundles = [
        json.loads(line)
        for line in (signed_report / "attestation.bundle.jsonl").read_text().splitlines()
    ]
    assert len(bundles) == len(envelopes)
    for bundle, line in zip(bundles, envelopes, strict=True):
        envelope = json.loads(line)
        assert bundle["verificationMaterial"]["publicKey"] == {"hint": signing["keyid"]}
        assert "certificate" not in bundle["verificationMaterial"]
        assert bundle["dsseEnvelope"]["payload"] == envelope["payload"]
        assert bundle["dsseEnvelope"]["signatures"][0]["sig"] == envelope["signatures"][0]["sig"]


def _sign_keyless_in(directory: Path) -> SigstoreDecision:
    """`sign_keyless` of one statement into `directory`, through its descriptor."""
    dir_fd = reportfs.open_report_dir(directory)
    try:
        return sign_keyless([b"{}"], dir_fd, {})
    finally:
        os.close(dir_fd)


class TestSignKeyless:
    def test_stale_bundle_is_removed(self, tmp_path: Path) -> None:
        """A bundle from an earlier signing is deleted even when keyless is not attempted."""
        stale = tmp_path / BUNDLES_NAME
        stale.write_text('{"old": "bundle"}\n')
        decision = _sign_keyless_in(tmp_path)
        assert decision.status == ED25519_ONLY
        assert not stale.exists()

    def test_failure_is_printed_and_leaves_no_bundle(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A failed keyless attempt says why on stderr; no stale bundle survives it."""
        (tmp_path / BUNDLES_NAME).write_text('{"old": "bundle"}\n')

        def fail(*_args: object) -> list[str]:
            raise RuntimeError("Fulcio said 503")

        monkeypatch.setattr(
            sigstore,
            "decide",
            lambda _env: SigstoreDecision(attempt=True, status=KEYLESS, reason=""),
        )
        monkeypatch.setattr(sigstore, "_sign_with_sigstore", fail)
        decision = _sign_keyless_in(tmp_path)
        assert decision.status == ED25519_ONLY
        assert "Fulcio said 503" in decision.reason
        assert "Fulcio said 503" in capsys.readouterr().err
        assert not (tmp_path / BUNDLES_NAME).exists()
