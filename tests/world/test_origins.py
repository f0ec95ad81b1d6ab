"""The fixture origins over real TLS and plain HTTP: echo, blob, PEP 503 index, access log."""

from __future__ import annotations

import hashlib
import http.client
import re
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.paths import fixtures_dir
from sandbox_attest.world import origins as origins_module
from sandbox_attest.world.origins import Origins, load_hosts, normalize_project
from sandbox_attest.world.wheel import build_canary_wheel

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from sandbox_attest.world.pki import Pki

BLOB_SIZE = 18_874_368
LOG_KEYS = {
    "time", "host", "scheme", "method", "path", "status", "bytes_sent", "complete", "nonce",
    "peer",
}  # fmt: skip


def connect(
    pki: Pki, origins: Origins, key: str, scheme: str = "https"
) -> http.client.HTTPConnection:
    """A connection to host `key` by its fixture name, dialled at 127.0.0.1 (no DNS)."""
    name = origins.host_info(key).name
    port = origins.port(key, "https" if scheme == "https" else "http")
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn: http.client.HTTPConnection
    if scheme == "https":
        ctx = pki.client_context()
        conn = http.client.HTTPSConnection(name, port, context=ctx, timeout=10)
        conn.sock = ctx.wrap_socket(raw, server_hostname=name)
    else:
        conn = http.client.HTTPConnection(name, port, timeout=10)
        conn.sock = raw
    return conn


def get(
    pki: Pki, origins: Origins, key: str, path: str, scheme: str = "https", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """GET `path` from host `key`; returns status, headers and body."""
    conn = connect(pki, origins, key, scheme)
    try:
        conn.request("GET", path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def wait_for(
    predicate: Callable[[], list[dict[str, Any]]], timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Poll `predicate` until it returns a non-empty list (the handler logs after the body)."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, "no log entry appeared"
        time.sleep(0.02)
    return found


def _when_fetched(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`log` once it holds both the index page and the wheel fetch, else []."""
    hosts = {e["host"] for e in log}
    return log if {"index", "files"} <= hosts else []


class TestOk:
    def test_echoes_query_nonce_and_logs_it(self, pki: Pki, origins: Origins) -> None:
        """/ok?nonce=X answers `ok X` and the access log carries X with every documented key."""
        status, headers, body = get(pki, origins, "allowed", "/ok?nonce=q-1")
        assert (status, body) == (200, b"ok q-1\n")
        assert headers["Content-Type"].startswith("text/plain")
        [entry] = wait_for(lambda: origins.records("q-1"))
        assert entry.keys() >= LOG_KEYS
        assert entry["host"] == "allowed"
        assert entry["scheme"] == "https"
        assert (entry["method"], entry["path"], entry["status"]) == ("GET", "/ok?nonce=q-1", 200)
        assert entry["complete"] is True
        assert entry["bytes_sent"] == len(body)
        assert entry["peer"].startswith("127.0.0.1:")

    def test_header_beats_query_beats_path(self, pki: Pki, origins: Origins) -> None:
        """The nonce comes from the header, else the query, else the /c/<nonce>/ prefix."""
        get(pki, origins, "denied", "/c/p-1/ok?nonce=q-2", X_Attest_Nonce="h-1")
        get(pki, origins, "denied", "/c/p-2/ok?nonce=q-3")
        status, _, body = get(pki, origins, "denied", "/c/p-3/ok")
        assert (status, body) == (200, b"ok p-3\n")
        assert [e["host"] for e in wait_for(lambda: origins.records("h-1"))] == ["denied"]
        assert wait_for(lambda: origins.records("q-3"))
        assert wait_for(lambda: origins.records("p-3"))
        assert origins.records("p-1") == []
        assert origins.records("q-2") == []

    def test_plain_http(self, pki: Pki, origins: Origins) -> None:
        """The same endpoint answers on the host's plain-HTTP port, logged as scheme http."""
        status, _, body = get(pki, origins, "files", "/ok?nonce=plain-1", scheme="http")
        assert (status, body) == (200, b"ok plain-1\n")
        [entry] = wait_for(lambda: origins.records("plain-1"))
        assert (entry["host"], entry["scheme"]) == ("files", "http")

    @pytest.mark.parametrize("path", ["/", "/okay", "/c/n/", "/simple/", "/files/x.whl"])
    def test_unknown_paths_are_404(self, pki: Pki, origins: Origins, path: str) -> None:
        """Anything but the documented endpoints is 404 (the index only on its host)."""
        status, _, _ = get(pki, origins, "allowed", path)
        assert status == 404


class TestBlob:
    def test_streams_18_mib_with_sha256(self, pki: Pki, origins: Origins) -> None:
        """A real client reads the whole blob: Content-Length, size and sha256 all match."""
        conn = connect(pki, origins, "allowed")
        try:
            conn.request("GET", "/c/blob-1/blob")
            resp = conn.getresponse()
            assert resp.status == 200
            assert int(resp.headers["Content-Length"]) == BLOB_SIZE
            digest = hashlib.sha256()
            total = 0
            while piece := resp.read(256 * 1024):
                digest.update(piece)
                total += len(piece)
        finally:
            conn.close()
        assert total == BLOB_SIZE
        assert digest.hexdigest() == origins.blob.sha256 == resp.headers["X-Blob-Sha256"]
        [entry] = wait_for(lambda: origins.records("blob-1"))
        assert (entry["bytes_sent"], entry["complete"]) == (BLOB_SIZE, True)

    def test_abandoned_download_is_incomplete(self, pki: Pki, origins: Origins) -> None:
        """A client that stops after 1 MiB leaves a log entry with complete=False."""
        conn = connect(pki, origins, "allowed", scheme="http")
        conn.request("GET", "/blob?nonce=blob-cut")
        resp = conn.getresponse()
        assert len(resp.read(1 << 20)) == 1 << 20
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        [entry] = wait_for(lambda: origins.records("blob-cut"))
        assert entry["complete"] is False
        assert 1 << 20 <= entry["bytes_sent"] < BLOB_SIZE


@pytest.fixture(scope="module")
def wheel(origins: Origins, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The canary wheel, published on the module's origins."""
    path = build_canary_wheel(fixtures_dir() / "canary_wheel", tmp_path_factory.mktemp("w"), "idx")
    origins.publish_wheel(path)
    return path


class TestIndex:
    def test_root_lists_the_project(self, pki: Pki, origins: Origins, wheel: Path) -> None:
        """/c/<nonce>/simple/ links the normalized project name."""
        status, headers, body = get(pki, origins, "index", "/c/i-1/simple/")
        assert status == 200
        assert headers["Content-Type"].startswith("text/html")
        assert b'<a href="kiln-helpers/">' in body

    @pytest.mark.parametrize("prefix", ["/c/i-2", ""], ids=["nonce-prefix", "bare"])
    @pytest.mark.parametrize("spelling", ["kiln-helpers", "Kiln_Helpers"])
    def test_project_page_links_files_host(
        self, pki: Pki, origins: Origins, wheel: Path, prefix: str, spelling: str
    ) -> None:
        """The project page links the files host's wheel URL with its sha256, any spelling."""
        status, _, body = get(pki, origins, "index", f"{prefix}/simple/{spelling}/")
        assert status == 200
        files_port = origins.port("files", "https")
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        href = f"https://files.test:{files_port}{prefix}/files/{wheel.name}#sha256={sha}"
        assert f'href="{href}"'.encode() in body

    def test_unknown_project_is_404(self, pki: Pki, origins: Origins, wheel: Path) -> None:
        """A project that was never published is 404."""
        assert get(pki, origins, "index", "/c/i-3/simple/requests/")[0] == 404

    def test_files_host_serves_the_wheel(self, pki: Pki, origins: Origins, wheel: Path) -> None:
        """The files host returns the exact wheel bytes, logged with the path nonce."""
        status, _, body = get(pki, origins, "files", f"/c/f-1/files/{wheel.name}")
        assert (status, body) == (200, wheel.read_bytes())
        [entry] = wait_for(lambda: origins.records("f-1"))
        assert (entry["host"], entry["complete"]) == ("files", True)
        assert get(pki, origins, "files", "/c/f-1/files/other.whl")[0] == 404

    def test_denied_host_serves_index_as_leak_witness(
        self, pki: Pki, origins: Origins, wheel: Path
    ) -> None:
        """The denied host answers the index too, so a proxy leak would make pip succeed."""
        status, _, _ = get(pki, origins, "denied", "/c/d-1/simple/kiln-helpers/")
        assert status == 200


def test_normalize_project() -> None:
    """PEP 503 normalization folds case and runs of -_. into one dash."""
    assert normalize_project("Kiln__..-Helpers") == "kiln-helpers"


def test_load_hosts_order() -> None:
    """hosts.toml defines the four roles under .test names, in canonical order."""
    hosts = load_hosts()
    assert [h.key for h in hosts] == ["allowed", "denied", "index", "files"]
    assert all(h.name.endswith(".test") for h in hosts)


def test_real_pip_install_from_index(
    pki: Pki, tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    """A real pip --only-binary installs the canary from the index over TLS, via the files host."""
    with Origins(pki) as direct:
        # pip cannot resolve files.test without the proxy; point the links at the address.
        direct.files_base_url = f"https://127.0.0.1:{direct.port('files', 'https')}"
        direct.publish_wheel(build_canary_wheel(fixtures_dir() / "canary_wheel", tmp_path, "pipx1"))
        index = f"https://127.0.0.1:{direct.port('index', 'https')}/c/pip-1/simple/"
        target = tmp_path / "site"
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "--isolated", "install", "--no-cache-dir",
             "--disable-pip-version-check", "--only-binary", ":all:", "--index-url", index,
             "--cert", str(pki.ca_bundle), "--target", str(target), "kiln-helpers"],
            capture_output=True, text=True, timeout=120, env=clean_env(), check=False,
        )  # fmt: skip
        assert pip.returncode == 0, pip.stdout + pip.stderr
        # The origin logs each request after its body went out, so pip may finish first.
        log = wait_for(lambda: _when_fetched(direct.records("pip-1")))
    out = subprocess.run(
        [sys.executable, "-c", "import kiln_helpers as c; print(c.NONCE)"],
        capture_output=True, text=True, timeout=30, env=clean_env(PYTHONPATH=str(target)),
        check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "pipx1"
    fetched = {(e["host"], re.sub(r"/[^/]+\.whl$", "/WHEEL", e["path"])) for e in log}
    assert ("index", "/c/pip-1/simple/kiln-helpers/") in fetched
    assert ("files", "/c/pip-1/files/WHEEL") in fetched
    assert all(e["status"] == 200 for e in log)


class TestStopping:
    """Stopping the origins never hangs, whatever state a serving loop is in."""

    def test_an_accept_with_nothing_pending_returns(self, pki: Pki) -> None:
        """The loop's accept step when poll was wrong (the client gone first) does not block.

        accept(2): a connection poll reported may be removed before accept() is called, and
        a blocking accept then waits for the next client, deaf to shutdown(). Calling the
        step with an empty queue is that moment, made deterministic.
        """
        with Origins(pki) as origins:
            server = origins._servers["denied", "http"]
            # (socketserver's own step after poll said "readable"; private, so not in typeshed)
            accept_step = server._handle_request_noblock  # type: ignore[attr-defined]
            step = threading.Thread(target=accept_step, daemon=True)
            step.start()
            step.join(2.0)
            assert not step.is_alive(), "accept blocked with no connection pending"
            # And the origin still serves afterwards.
            assert get(pki, origins, "denied", "/c/after-step/ok", scheme="http")[0] == 200

    def test_a_wedged_loop_is_named_and_the_rest_is_closed(
        self, pki: Pki, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A loop that never ends makes stop() raise within its bound, not wait for ever."""
        monkeypatch.setattr(origins_module, "_STOP_S", 0.5)
        release = threading.Event()
        origins = Origins(pki)
        origins.start()
        wedged = origins._servers["index", "https"]

        wedged_s = 30.0  # how long the loop stays wedged unless released

        def never_done() -> None:  # serve_forever calls it on every pass of its loop
            release.wait(wedged_s)

        wedged.service_actions = never_done  # type: ignore[method-assign]
        others = [s for k, s in origins._servers.items() if k != ("index", "https")]
        loops = list(origins._threads)
        time.sleep(0.2)  # the loop reaches service_actions and stays there
        start = time.monotonic()
        try:
            with pytest.raises(FixtureError, match=r"did not stop within 0 s: index/https"):
                origins.stop()
            # Not a speed budget: a stop() that waited for the wedged loop would take wedged_s.
            assert time.monotonic() - start < wedged_s, "stop() waited for the wedged loop"
            assert all(s.socket.fileno() == -1 for s in others)  # every listener closed
        finally:
            release.set()
        # Released, the wedged loop finds its listener closed and ends too: no thread is left.
        for loop in loops:
            loop.join(5.0)
        assert not [loop.name for loop in loops if loop.is_alive()]
