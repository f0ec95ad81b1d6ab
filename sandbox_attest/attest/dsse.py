"""DSSE envelopes: PAE, sign and verify over Ed25519 (`cryptography`).

Follows the DSSE v1.0 protocol (https://github.com/secure-systems-lab/dsse/blob/master/protocol.md):

    PAE(type, body) = "DSSEv1" + SP + LEN(type) + SP + type + SP + LEN(body) + SP + body
    LEN(s) = ASCII decimal encoding of the byte length of s, with no leading zeros

The signature covers PAE(payloadType, payload) where payload is the exact serialized bytes;
the envelope carries those bytes base64-encoded, so nothing is ever re-serialized before a
check. This module does not parse the payload: a caller that gets bytes back from `verify`
owns interpreting them (sigstore's `dsse` draws the same line).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature

from sandbox_attest.errors import ReportError, SignatureError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

# The in-toto payload type; every envelope the harness writes carries it.
PAYLOAD_TYPE = "application/vnd.in-toto+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    """Return the DSSE v1 Pre-Authentication Encoding of a payload and its type.

    Args:
        payload_type: the envelope's `payloadType` (its UTF-8 bytes are what is counted).
        payload: the exact payload bytes.

    Returns:
        The bytes that are actually signed.
    """
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(type_bytes), type_bytes, len(payload), payload)


@dataclass(frozen=True)
class Signature:
    """One DSSE signature: the raw signature bytes and an optional (unauthenticated) keyid."""

    keyid: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    """A DSSE envelope. Build one with `sign`, read one with `Envelope.from_json`."""

    payload: bytes
    payload_type: str
    signatures: tuple[Signature, ...]

    def to_json(self) -> str:
        """The envelope as one line of compact JSON (one envelope per `.jsonl` line)."""
        return json.dumps(
            {
                "payload": base64.b64encode(self.payload).decode("ascii"),
                "payloadType": self.payload_type,
                "signatures": [
                    {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")}
                    for s in self.signatures
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, *, where: str = "envelope") -> Envelope:
        """Parse an envelope, naming `where` it came from in every error.

        Raises:
            ReportError: the text is not JSON or not shaped like a DSSE envelope.
        """
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReportError(
                f"{where}: not valid JSON at char {exc.pos} ({exc.msg}); the file is "
                "truncated or was edited: re-run `sandbox-attest run`, which signs its report"
            ) from exc
        if not isinstance(data, dict):
            raise ReportError(f"{where}: a DSSE envelope must be a JSON object")
        payload_type = data.get("payloadType")
        raw_sigs = data.get("signatures")
        if not isinstance(payload_type, str) or not isinstance(raw_sigs, list):
            raise ReportError(f"{where}: missing payloadType or signatures; not a DSSE envelope")
        payload = _b64decode(data.get("payload"), f"{where}: payload")
        sigs: list[Signature] = []
        for i, raw in enumerate(raw_sigs):
            if not isinstance(raw, dict):
                raise ReportError(f"{where}: signatures[{i}] is not an object")
            keyid = raw.get("keyid", "")
            sigs.append(
                Signature(
                    keyid=keyid if isinstance(keyid, str) else "",
                    sig=_b64decode(raw.get("sig"), f"{where}: signatures[{i}].sig"),
                )
            )
        return cls(payload=payload, payload_type=payload_type, signatures=tuple(sigs))


def _b64decode(value: object, where: str) -> bytes:
    # DSSE: "Either standard or URL-safe base64 encodings are allowed" when reading.
    if not isinstance(value, str):
        raise ReportError(f"{where} is missing or not a string")
    try:
        if "-" in value or "_" in value:
            return base64.urlsafe_b64decode(value)
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ReportError(f"{where} is not valid base64 ({exc})") from exc


def sign(
    payload: bytes, key: Ed25519PrivateKey, keyid: str, payload_type: str = PAYLOAD_TYPE
) -> Envelope:
    """Sign payload bytes into a one-signature envelope.

    Args:
        payload: the exact bytes to carry; they are never re-serialized.
        key: the Ed25519 signing key.
        keyid: the hint verifiers use to pick a key (securesystemslib keyid).
        payload_type: the DSSE payloadType.

    Returns:
        The envelope.
    """
    sig = key.sign(pae(payload_type, payload))
    return Envelope(payload, payload_type, (Signature(keyid, sig),))


def verify(
    envelope: Envelope,
    key: Ed25519PublicKey,
    keyid: str,
    payload_type: str = PAYLOAD_TYPE,
) -> bytes:
    """Verify an envelope against one trusted key and return its payload bytes.

    DSSE protocol, verification steps: 1. reject an unsupported payloadType; 2. compute
    PAE(payloadType, payload); 3. accept if any signature verifies with the trusted key.
    The keyid is only a hint: a signature whose keyid names another key is still tried, so a
    relabelled signature cannot dodge the check, and the error names the keyids seen.

    Raises:
        SignatureError: wrong payloadType, no signatures, or none verifies with `key`.
    """
    if envelope.payload_type != payload_type:
        raise SignatureError(
            f"payloadType is {envelope.payload_type!r}, expected {payload_type!r}; "
            "this is not an in-toto attestation from sandbox-attest"
        )
    if not envelope.signatures:
        raise SignatureError("the envelope carries no signatures; the report was never signed")
    message = pae(envelope.payload_type, envelope.payload)
    for signature in envelope.signatures:
        try:
            key.verify(signature.sig, message)
        except InvalidSignature:
            continue
        return envelope.payload
    seen = ", ".join(s.keyid or "<none>" for s in envelope.signatures)
    if any(s.keyid == keyid for s in envelope.signatures):
        raise SignatureError(
            f"the signature by trusted key {keyid} does not verify: the payload, its type or "
            "the signature bytes were altered after signing"
        )
    raise SignatureError(
        f"signed by key(s) {seen}, not by the trusted key {keyid}; was it signed by another "
        "run's key? pass the signer's public key with --trusted-key"
    )
