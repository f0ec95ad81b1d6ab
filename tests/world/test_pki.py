"""The per-world CA: real TLS handshakes against the origins, with negative controls."""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.world.pki import Pki

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.world.origins import Origins


def _handshake(ctx: ssl.SSLContext, port: int, server_hostname: str) -> dict[str, object]:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=server_hostname) as tls,
    ):
        cert = tls.getpeercert()
        assert cert is not None
        return dict(cert)


class TestHandshake:
    @pytest.mark.parametrize("key", ["allowed", "denied", "index", "files"])
    def test_each_host_verifies_by_name(self, pki: Pki, origins: Origins, key: str) -> None:
        """Each origin presents a leaf for its own name that the world's CA verifies."""
        name = origins.host_info(key).name
        cert = _handshake(pki.client_context(), origins.port(key, "https"), name)
        sans = {value for _, value in cert["subjectAltName"]}  # type: ignore[attr-defined]
        assert {name, "127.0.0.1"} <= sans

    def test_leaf_valid_for_loopback_address(self, pki: Pki, origins: Origins) -> None:
        """The leaf also verifies when the client dials 127.0.0.1 by address."""
        cert = _handshake(pki.client_context(), origins.port("allowed", "https"), "127.0.0.1")
        assert cert["subject"]

    def test_wrong_hostname_fails(self, pki: Pki, origins: Origins) -> None:
        """Negative control: the allowed host's leaf does not verify as another name."""
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):
            _handshake(pki.client_context(), origins.port("allowed", "https"), "denied.test")

    def test_system_trust_store_rejects(self, origins: Origins) -> None:
        """Negative control: a client without the world's CA rejects the leaf."""
        with pytest.raises(ssl.SSLCertVerificationError):
            _handshake(
                ssl.create_default_context(), origins.port("allowed", "https"), "allowed.test"
            )

    def test_other_world_ca_rejects(self, tmp_path: Path, origins: Origins) -> None:
        """Negative control: another world's CA does not trust this world's leaves."""
        other = Pki.create(tmp_path, ["allowed.test"])
        with pytest.raises(ssl.SSLCertVerificationError):
            _handshake(other.client_context(), origins.port("allowed", "https"), "allowed.test")


class TestKeyMaterial:
    def test_only_the_ca_certificate_is_written(self, tmp_path: Path) -> None:
        """Create writes ca.pem alone, and it holds a certificate and no private key."""
        pki = Pki.create(tmp_path, ["allowed.test", "files.test"])
        assert [p.name for p in tmp_path.iterdir()] == ["ca.pem"]
        text = pki.ca_bundle.read_text()
        assert text.count("BEGIN CERTIFICATE") == 1
        assert "PRIVATE KEY" not in text

    def test_unknown_host_names_the_fix(self, tmp_path: Path) -> None:
        """Asking for a host without a leaf raises FixtureError naming hosts.toml."""
        pki = Pki.create(tmp_path, ["allowed.test"])
        with pytest.raises(FixtureError, match=r"hosts\.toml"):
            pki.server_context("elsewhere.test")

    def test_client_context_verifies(self, tmp_path: Path) -> None:
        """The client context checks hostnames and requires a verified certificate."""
        ctx = Pki.create(tmp_path, ["allowed.test"]).client_context()
        assert ctx.check_hostname
        assert ctx.verify_mode == ssl.CERT_REQUIRED
