"""Keys: the securesystemslib keyid, where signing keys come from, and trusted-key files."""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest.keys import (
    ENV_VAR,
    canonical_json,
    keyid_of,
    load_signing_key,
    load_trusted_key,
    private_key_pem,
    public_key_pem,
)
from sandbox_attest.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.attest.keys import SigningKey

# Expected keyid of the fixed test key (seed bytes 0x00..0x1f), computed by the algorithm in
# securesystemslib.signer._utils.compute_default_keyid: the sha256 hex of encode_canonical()
# of the key dict with keytype "ed25519", scheme "ed25519" and keyval.public = the raw key hex
# (FIXED_PUBLIC_HEX). Canonical form sorts keys and drops whitespace, so the hashed text is
# the three keys in the order keytype, keyval, scheme, e.g. '{"keytype":"ed25519","keyval":'.
# Computed once by hand with hashlib over that exact text, then pasted here.
FIXED_PUBLIC_HEX = "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
FIXED_KEYID = "63d00ee3cf4f5c61ad94efa696c68f13b608fe56ecea13fb144a6fd18e9235b9"


class TestKeyid:
    def test_fixed_key_matches_securesystemslib(self, signing_key: SigningKey) -> None:
        """The keyid of the fixed key equals the value computed by securesystemslib's rule."""
        raw = signing_key.public_key.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        assert raw.hex() == FIXED_PUBLIC_HEX
        assert keyid_of(signing_key.public_key) == FIXED_KEYID
        assert signing_key.keyid == FIXED_KEYID

    def test_canonical_json_escapes_like_olpc(self) -> None:
        """Canonical JSON sorts keys and escapes only backslash and quote, like securesystemslib."""
        assert (
            canonical_json({"b": [1, True, None], "a": 'q"\\'})
            == '{"a":"q\\"\\\\","b":[1,true,null]}'
        )
        with pytest.raises(TypeError):
            canonical_json({"f": 1.5})


class TestLoadSigningKey:
    def test_key_file_wins(self, tmp_path: Path) -> None:
        """--key FILE is used even when the environment names another key."""
        key = Ed25519PrivateKey.generate()
        path = tmp_path / "k.pem"
        path.write_bytes(private_key_pem(key))
        env = {ENV_VAR: private_key_pem(Ed25519PrivateKey.generate()).decode()}
        loaded = load_signing_key(path, env)
        assert loaded.keyid == keyid_of(key.public_key())
        assert loaded.trust == "provided"

    def test_env_pem_text_and_env_path(self, tmp_path: Path) -> None:
        """The variable may hold the PEM itself or a path to it; both give the same key."""
        key = Ed25519PrivateKey.generate()
        pem = private_key_pem(key)
        path = tmp_path / "k.pem"
        path.write_bytes(pem)
        by_text = load_signing_key(None, {ENV_VAR: pem.decode()})
        by_path = load_signing_key(None, {ENV_VAR: str(path)})
        assert by_text.keyid == by_path.keyid == keyid_of(key.public_key())
        assert by_text.source == f"env:{ENV_VAR}"

    def test_local_key_created_0600_untrusted_and_reused(self, tmp_path: Path) -> None:
        """With no key given, a per-machine key is made 0600 once, marked untrusted, reused."""
        env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
        first = load_signing_key(None, env)
        path = tmp_path / "cfg" / "sandbox-attest" / "local-signing-key.pem"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert first.trust == "untrusted-local"
        assert load_signing_key(None, env).keyid == first.keyid

    def test_local_key_readable_by_others_is_refused(self, tmp_path: Path) -> None:
        """A local key another user could read is refused with the chmod that fixes it."""
        env = {"XDG_CONFIG_HOME": str(tmp_path)}
        load_signing_key(None, env)
        path = tmp_path / "sandbox-attest" / "local-signing-key.pem"
        path.chmod(0o644)
        with pytest.raises(ConfigError, match="chmod 600"):
            load_signing_key(None, env)

    def test_encrypted_key_names_the_fix(self, tmp_path: Path) -> None:
        """A passphrase-protected key is refused with a message saying how to provide it."""
        key = Ed25519PrivateKey.generate()
        path = tmp_path / "enc.pem"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"pw"),
            )
        )
        with pytest.raises(ConfigError, match="passphrase-protected"):
            load_signing_key(path, {})

    def test_non_ed25519_key_is_refused(self, tmp_path: Path) -> None:
        """An EC key is refused, naming Ed25519 and how to make one."""
        path = tmp_path / "ec.pem"
        path.write_bytes(private_key_pem(ec.generate_private_key(ec.SECP256R1())))  # type: ignore[arg-type]  # any private key serializes the same way
        with pytest.raises(ConfigError, match="genpkey -algorithm ed25519"):
            load_signing_key(path, {})

    def test_garbage_is_refused(self, tmp_path: Path) -> None:
        """A file that is not PEM is a ConfigError naming --key."""
        path = tmp_path / "junk.pem"
        path.write_text("not a key")
        with pytest.raises(ConfigError, match="--key"):
            load_signing_key(path, {})

    @pytest.mark.parametrize("where", ["key", "env"])
    def test_empty_key_file_says_empty(self, tmp_path: Path, where: str) -> None:
        """An empty key file says so and how to make a key (not cryptography's MalformedFraming)."""
        path = tmp_path / "empty.pem"
        path.write_text("\n")
        key_path, env = (path, {}) if where == "key" else (None, {ENV_VAR: str(path)})
        with pytest.raises(ConfigError, match="the key file is empty") as info:
            load_signing_key(key_path, env)
        assert "openssl genpkey -algorithm ed25519" in str(info.value)
        assert "MalformedFraming" not in str(info.value)


class TestTrustedKey:
    def test_empty_file_says_empty(self, tmp_path: Path) -> None:
        """An empty --trusted-key file says so and how to export a public key."""
        path = tmp_path / "empty.pub"
        path.write_bytes(b"")
        with pytest.raises(ConfigError, match="the file is empty; export") as info:
            load_trusted_key(path)
        assert "MalformedFraming" not in str(info.value)

    def test_public_and_private_pem_give_the_same_keyid(self, tmp_path: Path) -> None:
        """--trusted-key accepts the public PEM, or the private PEM from which it derives it."""
        key = Ed25519PrivateKey.generate()
        pub = tmp_path / "k.pub"
        pub.write_bytes(public_key_pem(key.public_key()))
        priv = tmp_path / "k.pem"
        priv.write_bytes(private_key_pem(key))
        assert load_trusted_key(pub).keyid == load_trusted_key(priv).keyid

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing trusted-key file is a ConfigError, not a crash."""
        with pytest.raises(ConfigError, match="cannot read --trusted-key"):
            load_trusted_key(tmp_path / "nope.pub")
