"""Ed25519 signing keys: where they come from, their keyid, and whether anyone trusts them.

A key comes from `--key FILE`, else from `$SANDBOX_ATTEST_SIGNING_KEY` (PEM text or a path),
else from a per-machine key created on first use. That last one only proves "the same machine
signed this"; it is marked untrusted, the report says so, and `verify` refuses it unless asked
explicitly (`--trusted-key` naming it AND `--allow-untrusted-local`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from harness.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_VAR = "SANDBOX_ATTEST_SIGNING_KEY"
LOCAL_KEY_NAME = Path("sandbox-attest") / "local-signing-key.pem"

Trust = Literal["provided", "untrusted-local"]


def canonical_json(value: object) -> str:
    """Encode JSON the way securesystemslib's `encode_canonical` does (OLPC canonical JSON).

    Keys sorted, no whitespace, strings quoted with only backslash and double quote
    escaped, integers only (no floats). This is what keyids are computed over.

    Raises:
        TypeError: the value holds something canonical JSON cannot encode (e.g. a float).
    """
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(canonical_json(k) + ":" + canonical_json(v) for k, v in items) + "}"
    raise TypeError(f"canonical JSON cannot encode {type(value).__name__}")


def public_key_dict(public_key: Ed25519PublicKey) -> dict[str, object]:
    """The securesystemslib public-key dict: keytype, scheme and the raw key in hex."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": raw.hex()}}


def keyid_of(public_key: Ed25519PublicKey) -> str:
    """The securesystemslib default keyid: sha256 hex of the canonical JSON of the key dict.

    Matches `securesystemslib.signer._utils.compute_default_keyid(keytype, scheme, keyval)`,
    so tools from that ecosystem name our key the same way.
    """
    canonical = canonical_json(public_key_dict(public_key)).encode("utf-8")
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key with its keyid and where it came from.

    No public constructor is needed: get one from `load_signing_key`.
    """

    private_key: Ed25519PrivateKey
    keyid: str
    source: str  # "file:PATH", "env:SANDBOX_ATTEST_SIGNING_KEY" or "local:PATH"
    trust: Trust

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The matching public key."""
        return self.private_key.public_key()

    @classmethod
    def from_private_key(
        cls, key: Ed25519PrivateKey, source: str, trust: Trust = "provided"
    ) -> SigningKey:
        """Wrap a key object (tests, benchmarks), computing its keyid."""
        return cls(key, keyid_of(key.public_key()), source, trust)


@dataclass(frozen=True)
class TrustedKey:
    """A public key a verifier trusts, with its keyid and the file it came from."""

    public_key: Ed25519PublicKey
    keyid: str
    source: str


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """PKCS#8 PEM, unencrypted (what `openssl genpkey -algorithm ed25519` writes)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    """SubjectPublicKeyInfo PEM, the format `--trusted-key` reads."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


MAKE_KEY = "`openssl genpkey -algorithm ed25519 -out signing-key.pem`"


def _parse_private(pem: bytes, where: str) -> Ed25519PrivateKey:
    if not pem.strip():
        # cryptography would only say "MalformedFraming", which names neither cause nor fix.
        raise ConfigError(f"{where}: the key file is empty; create a key with {MAKE_KEY}")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError as exc:  # raised for an encrypted key without a password
        raise ConfigError(
            f"{where}: the key is passphrase-protected; export it unencrypted into a file "
            "only the signer can read (chmod 600), or put the PEM in $" + ENV_VAR
        ) from exc
    except ValueError as exc:
        raise ConfigError(
            f"{where}: not a PEM private key ({exc}); create one with {MAKE_KEY}"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"{where}: the key is {type(key).__name__}, but attestations are signed with "
            "Ed25519; create one with `openssl genpkey -algorithm ed25519`"
        )
    return key


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}; check the path") from exc


def local_key_path(env: Mapping[str, str]) -> Path:
    """Where the per-machine key lives: $XDG_CONFIG_HOME (default ~/.config)/sandbox-attest."""
    config = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config) / LOCAL_KEY_NAME


def _load_or_create_local(path: Path) -> Ed25519PrivateKey:
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`"
            )
        return _parse_private(_read(path, "local signing key"), str(path))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    # O_EXCL: two concurrent first runs must not overwrite each other's key; the loser reads
    # the winner's. The mode is set at creation so the key is never briefly world-readable.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _parse_private(_read(path, "local signing key"), str(path))
    with os.fdopen(fd, "wb") as handle:
        handle.write(private_key_pem(key))
    return key


def load_signing_key(key_path: Path | None, env: Mapping[str, str]) -> SigningKey:
    """Find the key to sign a report with.

    Args:
        key_path: `--key FILE`, a PEM Ed25519 private key; wins over everything else.
        env: the environment; `SANDBOX_ATTEST_SIGNING_KEY` holds PEM text or a path.

    Returns:
        The key. With neither `key_path` nor the variable, a per-machine key (created 0600 on
        first use) with `trust="untrusted-local"`.

    Raises:
        ConfigError: the key cannot be read, is encrypted, or is not Ed25519.
    """
    if key_path is not None:
        key = _parse_private(_read(key_path, "--key file"), f"--key {key_path}")
        return SigningKey.from_private_key(key, f"file:{key_path}")
    value = env.get(ENV_VAR, "").strip()
    if value:
        if value.startswith("-----BEGIN"):
            key = _parse_private(value.encode("utf-8"), f"${ENV_VAR}")
        else:
            key = _parse_private(_read(Path(value), f"${ENV_VAR} file"), f"${ENV_VAR}={value}")
        return SigningKey.from_private_key(key, f"env:{ENV_VAR}")
    path = local_key_path(env)
    return SigningKey.from_private_key(
        _load_or_create_local(path), f"local:{path}", trust="untrusted-local"
    )


def load_trusted_key(path: Path) -> TrustedKey:
    """Read a `--trusted-key` file: a PEM public key (a private key PEM is accepted too).

    Raises:
        ConfigError: unreadable, not PEM, or not Ed25519.
    """
    data = _read(path, "--trusted-key file")
    if not data.strip():
        raise ConfigError(
            f"--trusted-key {path}: the file is empty; export the signer's public key with "
            "`openssl pkey -in signing-key.pem -pubout -out signing-key.pub`"
        )
    if b"PRIVATE KEY" in data:
        public: object = _parse_private(data, f"--trusted-key {path}").public_key()
    else:
        try:
            public = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise ConfigError(
                f"--trusted-key {path}: not a PEM public key ({exc}); export one with "
                "`openssl pkey -in signing-key.pem -pubout -out signing-key.pub`"
            ) from exc
    if not isinstance(public, Ed25519PublicKey):
        raise ConfigError(
            f"--trusted-key {path}: the key is {type(public).__name__}, not Ed25519; "
            "attestations are signed with Ed25519"
        )
    return TrustedKey(public, keyid_of(public), str(path))
