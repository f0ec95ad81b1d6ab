"""What the views say about the signature, known before anything is signed.

The views are signed subjects themselves, so they cannot quote the signature; they say who
signs (keyid, trust) and what keyless signing was set to do. `SignerFacts` carries that, and
the words for it live here beside it: the sigstore statuses a report shows and the note on an
untrusted local key. `sandbox_attest.attest` imports these (its signer and verify say the
same words); nothing here imports `attest`, so the views stay below the keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["ED25519_ONLY", "KEYLESS", "UNTRUSTED_LOCAL_NOTE", "SignerFacts", "SigstoreOutcome"]

# The two sigstore statuses a report shows (`attest.sigstore.SigstoreDecision.status`).
ED25519_ONLY = "ed25519 only"
KEYLESS = "ed25519 + sigstore keyless"
UNTRUSTED_LOCAL_NOTE = "signed by an untrusted local key"


class SigstoreOutcome(Protocol):
    """What the views read of a keyless-signing decision (`attest.sigstore.SigstoreDecision`)."""

    @property
    def status(self) -> str:
        """KEYLESS or ED25519_ONLY."""
        ...

    @property
    def reason(self) -> str:
        """The sentence the report shows about it."""
        ...


@dataclass(frozen=True)
class SignerFacts:
    """What report.html and summary.md say about the signature, known before signing.

    The views are signed subjects themselves, so they cannot quote the signature; they say
    who signs (keyid, trust) and what keyless signing was set to do. Get one from
    `SignerFacts.of` or from `sandbox_attest.attest.signer.Signer.facts`.
    """

    keyid: str
    trust: str
    sigstore_status: str
    sigstore_reason: str

    @classmethod
    def of(cls, keyid: str, trust: str, decision: SigstoreOutcome) -> SignerFacts:
        """Facts from the key's keyid and trust and `sigstore.decide`'s decision."""
        return cls(keyid, trust, decision.status, decision.reason)
