"""Ed25519 signing keys: where they come from, their keyid, and whether anyone trusts them.

A key comes from `--key FILE`, else from `$SANDBOX_ATTEST_SIGNING_KEY` (PEM text or a path),
else from a per-machine key created on first use. That last one only proves "the same machine
signed this"; it is marked untrusted, the report says so, and `verify` refuses it unless asked
explicitly (`--trusted-key` naming it AND `--allow-untrusted-local`).

Trust comes from the key, never from the payload: when the harness creates (or first loads)
the per-machine key it appends the key's keyid to a registry it owns beside the key
(`untrusted-keys`, one keyid per line, 0600). `verify` and `merge` look the verified keyid
up there. A field the signer wrote (`signer.trust`) is information only: whoever holds the
local key can sign any payload, including one that says `"trust": "provided"`.
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

from sandbox_attest.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_VAR = "SANDBOX_ATTEST_SIGNING_KEY"
LOCAL_KEY_NAME = Path("sandbox-attest") / "local-signing-key.pem"
REGISTRY_NAME = "untrusted-keys"
# Not every platform has O_NOFOLLOW (Windows); there the config dir's ACL is what protects it.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_KEYID = frozenset("0123456789abcdef")

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


def untrusted_registry_path(env: Mapping[str, str]) -> Path:
    """The registry of untrusted per-machine keyids: `untrusted-keys` beside the local key."""
    return local_key_path(env).parent / REGISTRY_NAME


def _check_registry_owner(path: Path, fd: int) -> None:
    """Refuse a registry another user could edit: deleting a line would make a key trusted."""
    info = os.fstat(fd)
    getuid = getattr(os, "getuid", None)
    if getuid is not None and info.st_uid != getuid():
        raise ConfigError(
            f"{path} is owned by uid {info.st_uid}, not by this user; it decides which keys "
            f"are untrusted, so only its owner may write it: `rm {path}` and sign once to "
            "recreate it"
        )
    if stat.S_IMODE(info.st_mode) & 0o022:
        raise ConfigError(
            f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run `chmod 600 {path}`"
        )


def read_untrusted_keyids(path: Path) -> frozenset[str]:
    """The keyids listed in an untrusted-keys registry (a missing file lists none).

    Raises:
        ConfigError: the registry is a symlink, another user's, or writable by others.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        return frozenset()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the untrusted-key registry {path}: {exc.strerror}; it must be a "
            "regular file (not a symlink) owned by this user"
        ) from exc
    with os.fdopen(fd, "rb") as handle:
        _check_registry_owner(path, handle.fileno())
        text = handle.read().decode("utf-8", errors="replace")
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def register_untrusted(path: Path, keyid: str) -> None:
    """Append `keyid` to the registry at `path` unless it is listed already.

    The file is created 0600 with O_EXCL (two first runs cannot clobber each other) and
    otherwise appended to with O_APPEND, so a concurrent writer's line is never lost.

    Raises:
        ConfigError: `keyid` is not lowercase hex, or the registry is unsafe (see
            `read_untrusted_keyids`).
    """
    if not keyid or not set(keyid) <= _KEYID:
        raise ConfigError(f"keyid {keyid!r} is not lowercase hex; it cannot be registered")
    if keyid in read_untrusted_keyids(path):
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW)
    with os.fdopen(fd, "ab") as handle:
        _check_registry_owner(path, handle.fileno())
        handle.write(keyid.encode("ascii") + b"\n")


def check_key_file_private(path: Path, payload_uid: int | None, payload_gids: set[int]) -> None:
    """Refuse a signing-key file the payload's uid could read (or replace).

    Call it before a run whose payloads run as `payload_uid`. It checks the file itself
    (after symlinks, i.e. the bytes that would be read), not the directories above it.

    Args:
        path: the private key file.
        payload_uid: the uid sandboxed commands run as; None when the domains are not
            separated (then only world access is checked: the payload is the harness's user).
        payload_gids: every group the payload uid is in.

    Raises:
        ConfigError: the file is owned by the payload uid, readable or writable through a
            group the payload uid is in, or by everyone; the message names the fix.
    """
    try:
        info = path.stat()
    except OSError as exc:
        raise ConfigError(
            f"cannot stat signing key {path}: {exc.strerror}; check the path"
        ) from exc
    mode = stat.S_IMODE(info.st_mode)
    fix = f"`chown root:root {path} && chmod 600 {path}` (or chown it to the harness's user)"
    problem = ""
    if payload_uid is not None and info.st_uid == payload_uid:
        problem = f"is owned by the payload uid {payload_uid}"
    elif mode & 0o066 and info.st_gid in payload_gids:
        problem = (
            f"is group-accessible (mode {mode:o}) by gid {info.st_gid}, a group of the payload uid"
        )
    elif mode & 0o006:
        problem = f"is accessible to everyone (mode {mode:o})"
    if problem:
        raise ConfigError(
            f"signing key {path} {problem}, so a sandboxed payload could read it and sign "
            f"its own report; run {fix}"
        )


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


def _provided(key: Ed25519PrivateKey, source: str, env: Mapping[str, str]) -> SigningKey:
    """A key given by --key or the variable: untrusted all the same if the registry lists it.

    Passing the per-machine key's file as `--key` does not make it a release key.
    """
    signing = SigningKey.from_private_key(key, source)
    if signing.keyid in read_untrusted_keyids(untrusted_registry_path(env)):
        return SigningKey(signing.private_key, signing.keyid, source, "untrusted-local")
    return signing


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
        return _provided(key, f"file:{key_path}", env)
    value = env.get(ENV_VAR, "").strip()
    if value:
        if value.startswith("-----BEGIN"):
            key = _parse_private(value.encode("utf-8"), f"${ENV_VAR}")
        else:
            key = _parse_private(_read(Path(value), f"${ENV_VAR} file"), f"${ENV_VAR}={value}")
        return _provided(key, f"env:{ENV_VAR}", env)
    path = local_key_path(env)
    local = SigningKey.from_private_key(
        _load_or_create_local(path), f"local:{path}", trust="untrusted-local"
    )
    # Registered on every load, not only at creation: a key made before the registry
    # existed is listed the first time it signs again.
    register_untrusted(untrusted_registry_path(env), local.keyid)
    return local


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
