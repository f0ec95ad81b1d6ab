"""DSSE: PAE bytes, sign/verify, and an independent verifier built from the spec."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest import dsse
from sandbox_attest.errors import ReportError, SignatureError

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.attest.keys import SigningKey


def reference_pae(payload_type: str, payload: bytes) -> bytes:
    """PAE written straight from the DSSE protocol text, independent of attest/dsse.py."""
    t = payload_type.encode()
    parts = [b"DSSEv1", str(len(t)).encode(), t, str(len(payload)).encode(), payload]
    return b" ".join(parts)


class TestPae:
    def test_matches_the_spec_example(self) -> None:
        """PAE of the DSSE protocol's worked example is byte-identical to the spec."""
        got = dsse.pae("http://example.com/HelloWorld", b"hello world")
        assert got == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"

    def test_counts_bytes_not_characters(self) -> None:
        """LEN counts UTF-8 bytes, so a non-ASCII payload type still frames correctly."""
        body = "é".encode()
        assert dsse.pae("tÿpe", body) == reference_pae("tÿpe", body)
        assert dsse.pae("tÿpe", body).startswith(b"DSSEv1 5 ")


class TestSignVerify:
    def test_round_trip(self, signing_key: SigningKey) -> None:
        """A signed envelope survives JSON and verifies back to the same payload bytes."""
        env = dsse.sign(b'{"a":1}', signing_key.private_key, signing_key.keyid)
        back = dsse.Envelope.from_json(env.to_json())
        assert dsse.verify(back, signing_key.public_key, signing_key.keyid) == b'{"a":1}'

    def test_wrong_key_is_named(self, signing_key: SigningKey) -> None:
        """Another key's signature fails and the message names both keyids and --trusted-key."""
        other = Ed25519PrivateKey.generate()
        env = dsse.sign(b"x", other, "otherkeyid")
        with pytest.raises(SignatureError, match=r"otherkeyid.*--trusted-key"):
            dsse.verify(env, signing_key.public_key, signing_key.keyid)

    def test_wrong_payload_type(self, signing_key: SigningKey) -> None:
        """An envelope whose payloadType is not in-toto is rejected before any signature check."""
        env = dsse.sign(b"x", signing_key.private_key, signing_key.keyid, "text/plain")
        with pytest.raises(SignatureError, match="payloadType is 'text/plain'"):
            dsse.verify(env, signing_key.public_key, signing_key.keyid)

    def test_truncated_envelope(self) -> None:
        """Truncated JSON is a ReportError saying it is truncated, never a pass."""
        with pytest.raises(ReportError, match="truncated"):
            dsse.Envelope.from_json('{"payload": "eyJ', where="line 1")

    def test_truncated_envelope_message_names_the_signing_command(self) -> None:
        """The message names `sandbox-attest run` (there is no sign step) and reads cleanly."""
        with pytest.raises(ReportError) as info:
            dsse.Envelope.from_json('{"payload": "eyJ', where="line 1")
        message = str(info.value)
        assert "`sandbox-attest run`" in message
        assert "signing step" not in message
        assert "at at" not in message


class TestIndependentVerifier:
    def test_reference_algorithm_accepts_our_envelope(
        self, signed_report: Path, signing_key: SigningKey
    ) -> None:
        """Every line we wrote verifies with PAE + Ed25519 re-implemented from the spec."""
        lines = (signed_report / "attestation.intoto.jsonl").read_text().splitlines()
        # One test-result statement per backend (none, bubblewrap), then the evidence one.
        assert len(lines) == 3
        public = signing_key.public_key
        for line in lines:
            envelope = json.loads(line)
            assert envelope["payloadType"] == "application/vnd.in-toto+json"
            payload = base64.b64decode(envelope["payload"])
            (signature,) = envelope["signatures"]
            assert signature["keyid"] == signing_key.keyid
            public.verify(
                base64.b64decode(signature["sig"]), reference_pae(envelope["payloadType"], payload)
            )
            statement = json.loads(payload)
            assert statement["_type"] == "https://in-toto.io/Statement/v1"

    def test_reference_algorithm_rejects_a_flipped_payload_byte(
        self, signed_report: Path, signing_key: SigningKey
    ) -> None:
        """Negative control: the same reference check fails once one payload byte changes."""
        envelope = json.loads(
            (signed_report / "attestation.intoto.jsonl").read_text().splitlines()[0]
        )
        payload = bytearray(base64.b64decode(envelope["payload"]))
        payload[10] ^= 0x01
        sig = base64.b64decode(envelope["signatures"][0]["sig"])
        with pytest.raises(InvalidSignature):
            signing_key.public_key.verify(
                sig, reference_pae(envelope["payloadType"], bytes(payload))
            )
