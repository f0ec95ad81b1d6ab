"""The per-world certificate authority: a fresh `trustme` CA and one leaf per fixture host.

A world mints its own CA at start, so no certificate outlives the run and nothing in the repo
is a trust anchor. Only the CA *certificate* reaches disk (`ca.pem`, for probes, curl and pip);
the CA's private key lives only inside `Pki.create` and is dropped once the leaves are issued.
Leaf keys stay in memory, inside the server `SSLContext`s that need them.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trustme

from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

# Every leaf is also valid for these, so a client that dials the origin by address (the
# direct pip test, curl --resolve-less recipes) still verifies the certificate.
_LOOPBACK_IDENTITIES = ("127.0.0.1", "localhost")


@contextlib.contextmanager
def _pem_path(name: str, data: bytes) -> Iterator[str]:
    """A path that reads as `data` for as long as the block runs, kept off disk if possible.

    `SSLContext.load_cert_chain` only takes paths. On Linux an anonymous memfd gives one
    without the key touching any filesystem; elsewhere a 0700 temp dir is the fallback and is
    removed as soon as OpenSSL has read the file.
    """
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd = memfd_create(name, 0)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix=f"{disguise.STEM}-tls-") as tmp:
        path = Path(tmp) / name
        path.touch(mode=0o600)
        path.write_bytes(data)
        yield str(path)


@dataclass
class Pki:
    """The world's trust material: a CA bundle on disk and server contexts in memory.

    No public constructor; get one from `Pki.create`. It does not reissue certificates: the
    host list is fixed at creation, and the CA key is gone afterwards.

    Attributes:
        ca_bundle: PEM file holding the CA certificate (what `--cacert`/`--cert` take).
        hosts: the host names that have a leaf.
    """

    ca_bundle: Path
    hosts: tuple[str, ...]
    _server_contexts: dict[str, ssl.SSLContext] = field(repr=False)

    @classmethod
    def create(
        cls, directory: Path, hosts: Sequence[str], extra_identities: Sequence[str] = ()
    ) -> Pki:
        """Mint a CA, issue a leaf for each host (plus 127.0.0.1), write `ca.pem`.

        Args:
            directory: where `ca.pem` goes (created if missing).
            hosts: DNS names that need a server certificate.
            extra_identities: more names or IP addresses every leaf is valid for (the lab's
                origin addresses, for clients that dial an address and verify it).

        Returns:
            The new `Pki`.

        Raises:
            FixtureError: the directory cannot be written or a certificate cannot be loaded.
        """
        if not hosts:
            raise FixtureError("Pki.create needs at least one host name to issue a leaf for")
        ca = trustme.CA(organization_name=f"{disguise.STEM} local CA")
        contexts: dict[str, ssl.SSLContext] = {}
        for host in hosts:
            leaf = ca.issue_cert(host, *_LOOPBACK_IDENTITIES, *extra_identities, common_name=host)
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
            try:
                with (
                    _pem_path("leaf-chain.pem", chain) as cert_path,
                    _pem_path("leaf-key.pem", leaf.private_key_pem.bytes()) as key_path,
                ):
                    ctx.load_cert_chain(cert_path, key_path)
            except (OSError, ssl.SSLError) as exc:
                raise FixtureError(
                    f"could not load the leaf certificate for {host!r}: {exc}"
                ) from exc
            contexts[host] = ctx
        try:
            directory.mkdir(parents=True, exist_ok=True)
            bundle = directory / "ca.pem"
            bundle.write_bytes(ca.cert_pem.bytes())
        except OSError as exc:
            raise FixtureError(
                f"could not write the CA bundle into {directory}: {exc}; "
                "pass a writable run directory"
            ) from exc
        # `ca` (and its private key) goes out of scope here: nothing can issue a cert later.
        return cls(ca_bundle=bundle, hosts=tuple(hosts), _server_contexts=contexts)

    def server_context(self, host: str) -> ssl.SSLContext:
        """The server-side context presenting `host`'s leaf (also valid for 127.0.0.1).

        Raises:
            FixtureError: `host` was not in the list given to `Pki.create`.
        """
        try:
            return self._server_contexts[host]
        except KeyError:
            raise FixtureError(
                f"no certificate for {host!r}; this Pki has {', '.join(self.hosts)} "
                "(add the host to fixtures/hosts.toml)"
            ) from None

    def client_context(self) -> ssl.SSLContext:
        """A verifying client context that trusts this CA and nothing else."""
        return ssl.create_default_context(cafile=str(self.ca_bundle))
