"""Fixtures for attestation tests: a fixed key, a test policy and a signed synthetic report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest.keys import SigningKey, TrustedKey
from sandbox_attest.report.policy import Policy, load_policy
from tests.attest.builder import build_report, sign, write_policy

if TYPE_CHECKING:
    from pathlib import Path

# A fixed seed so the keyid test can hard-code the expected value.
FIXED_SEED = bytes(range(32))


@pytest.fixture
def signing_key() -> SigningKey:
    """The fixed test signing key (trusted, as if passed with --key)."""
    return SigningKey.from_private_key(Ed25519PrivateKey.from_private_bytes(FIXED_SEED), "file:t")


@pytest.fixture
def trusted(signing_key: SigningKey) -> TrustedKey:
    """The fixed key's public half, as `--trusted-key` would load it."""
    return TrustedKey(signing_key.public_key, signing_key.keyid, "test")


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    """A policy requiring the seven core probes on linux/none and linux/bubblewrap."""
    return write_policy(tmp_path / "policy.toml")


@pytest.fixture
def policy(policy_file: Path) -> Policy:
    """The loaded test policy."""
    return load_policy(policy_file)


@pytest.fixture
def signed_report(tmp_path: Path, policy_file: Path, signing_key: SigningKey) -> Path:
    """A report where every core cell PASSes, signed with the fixed key (no Sigstore)."""
    report = build_report(tmp_path / "run", policy_file)
    sign(report, signing_key)
    return report
