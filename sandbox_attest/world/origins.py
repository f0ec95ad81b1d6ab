r"""The fixture origins: HTTPS and plain-HTTP hosts of the `.test` zone, all on 127.0.0.1.

Each host in `fixtures/hosts.toml` gets two ephemeral ports (HTTPS with its `trustme` leaf, and
plain HTTP) and the same small API on both:

- `GET /ok?nonce=X`, `/c/X/ok` -> `200 ok X\n`: the positive-control echo.
- `GET /blob?nonce=X`, `/c/X/blob` -> the 18 MiB deterministic blob, streamed with
  Content-Length (the socket's send buffer is the only buffer: a slow reader slows the writer).
- on the `index` host (and, as a leak witness, on `denied`): a PEP 503 simple index at
  `/c/X/simple/` and `/c/X/simple/<project>/`, whose links point at the `files` host
  (`https://files.test:PORT/c/X/files/<wheel>#sha256=...`): pip must follow a cross-host hop.
- on the `files` host: the published wheel at `/c/X/files/<wheel>`.
- every path also works without the `/c/X` prefix; anything else is 404.

Every request lands in a per-host access log with the nonce that tags it (the
`X-Attest-Nonce` header, else the `nonce=` query, else the `/c/<nonce>/` path prefix); that
log is the origin witness. It does not resolve names or follow the proxy: it only serves.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import re
import socket
import socketserver
import threading
import time
import tomllib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Literal, Self
from urllib.parse import parse_qs, urlsplit

from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise
from sandbox_attest.paths import fixtures_dir
from sandbox_attest.world.blob import DEFAULT_CHUNK, BlobSpec, iter_blob, load_blob_spec
from sandbox_attest.world.info import FIXTURE_HOST_KEYS, NONCE_HEADER, FixtureHostKey, HostInfo
from sandbox_attest.world.listeners import LOOPBACK, ConnectionTrackingMixIn, shut_down

if TYPE_CHECKING:
    import ssl
    from collections.abc import Iterable, Sequence
    from pathlib import Path

    from sandbox_attest.world.pki import Pki

Scheme = Literal["https", "http"]
_SCHEMES: tuple[Scheme, ...] = ("https", "http")

# Which hosts answer the simple index. The denied host serves it too, so that a proxy that
# leaks a request to it makes the install *succeed* and the leak cannot go unnoticed.
_INDEX_HOSTS: frozenset[str] = frozenset({"index", "denied"})
_FILES_HOSTS: frozenset[str] = frozenset({"files"})
# How long stopping waits for the serving loops (each ends within one 0.05 s poll).
_STOP_S = 5.0
_NONCE_PREFIX = re.compile(r"^/c/(?P<nonce>[^/]+)(?P<rest>/.*)?$")


def normalize_project(name: str) -> str:
    """PEP 503 name normalization: lowercase, runs of `-_.` become one `-`."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class FixtureHost:
    """One entry of `fixtures/hosts.toml`: a role key and the DNS name it is served under."""

    key: FixtureHostKey
    name: str


def load_hosts(path: Path | None = None) -> tuple[FixtureHost, ...]:
    """Read the fixture hosts, in the canonical order allowed, denied, index, files.

    Raises:
        FixtureError: the file is unreadable, or a role is missing or unknown.
    """
    path = path or fixtures_dir() / "hosts.toml"
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))["hosts"]
        names = {key: str(value["name"]) for key, value in table.items()}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise FixtureError(
            f"{path}: cannot read the fixture hosts ({exc!r}); expected [hosts.<role>] "
            "tables with a name"
        ) from exc
    if set(names) != set(FIXTURE_HOST_KEYS):
        raise FixtureError(
            f"{path}: roles are {sorted(names)}, expected exactly {sorted(FIXTURE_HOST_KEYS)}"
        )
    return tuple(FixtureHost(key=key, name=names[key]) for key in FIXTURE_HOST_KEYS)


@dataclass(frozen=True)
class PublishedWheel:
    """A wheel the files host serves and the index lists (held in memory; wheels are tiny)."""

    project: str  # normalized distribution name
    filename: str
    data: bytes = field(repr=False)
    sha256: str


@dataclass
class _Response:
    status: int
    content_type: str
    length: int
    body: Iterable[bytes]
    headers: dict[str, str] = field(default_factory=dict)


def _text(status: int, text: str, content_type: str = "text/plain; charset=utf-8") -> _Response:
    data = text.encode()
    return _Response(status, content_type, len(data), [data])


class _OriginServer(ConnectionTrackingMixIn, socketserver.TCPServer):
    """One (host, scheme) listener; TLS is wrapped in the connection thread, not at accept."""

    allow_reuse_address = False

    def __init__(self, origins: Origins, host: FixtureHost, scheme: Scheme) -> None:
        self.origins = origins
        self.host = host
        self.scheme: Scheme = scheme
        self.tls: ssl.SSLContext | None = (
            origins.pki.server_context(host.name) if scheme == "https" else None
        )
        self.init_tracking()
        # TCPServer, not http.server.HTTPServer: HTTPServer.server_bind calls getfqdn(), a
        # reverse lookup that could reach the system resolver.
        super().__init__((origins.address, 0), _OriginHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Do the TLS handshake here, in the connection's own thread, then serve it.

        Wrapping the listening socket instead would run every handshake in the accept loop,
        where one silent client stalls all others.
        """
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        tls = self.tls.wrap_socket(request, server_side=True)
        self.track_socket(tls)
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


class _OriginHandler(BaseHTTPRequestHandler):
    server: _OriginServer
    protocol_version = "HTTP/1.1"  # keep-alive: pip reuses connections
    server_version = disguise.ORIGIN_SERVER
    sys_version = ""

    def do_GET(self) -> None:
        """Route, answer and log one GET."""
        self._serve(head=False)

    def do_HEAD(self) -> None:
        """Same as GET without the body."""
        self._serve(head=True)

    def _serve(self, *, head: bool) -> None:
        origins = self.server.origins
        if origins.silenced.is_set():
            # A fault the tests inject (sandbox_attest/world/faults.py): accepted, never answered,
            # until the world stops. The client's own timeout is what ends its attempt.
            origins.released.wait()
            self.close_connection = True
            return
        nonce, route = self._nonce_and_route()
        response = origins.route(self.server.host, route, nonce, urlsplit(self.path).query)
        sent = 0
        complete = False
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(response.length))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if head:
                complete = True
            else:
                for piece in response.body:
                    self.wfile.write(piece)  # blocking sendall: the backpressure
                    sent += len(piece)
                complete = sent == response.length
        except OSError:
            self.close_connection = True
        finally:
            origins.log(
                {
                    "time": time.time(),
                    "host": self.server.host.key,
                    "scheme": self.server.scheme,
                    "method": self.command,
                    "path": self.path,
                    "status": response.status,
                    "bytes_sent": sent,
                    "complete": complete,
                    "nonce": nonce,
                    "peer": f"{self.client_address[0]}:{self.client_address[1]}",
                    "host_header": self.headers.get("Host"),
                }
            )

    def _nonce_and_route(self) -> tuple[str | None, str]:
        """The request's nonce (header, query, then path prefix) and its path without prefix."""
        parts = urlsplit(self.path)
        path = parts.path
        from_path: str | None = None
        if match := _NONCE_PREFIX.match(path):
            from_path = match["nonce"]
            path = match["rest"] or "/"
        from_query = parse_qs(parts.query).get("nonce", [None])[0]
        nonce = self.headers.get(NONCE_HEADER) or from_query or from_path
        route = path if from_path is None else f"/c/{from_path}{path}"
        return nonce, route

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (base signature)
        """Silence the stderr log; the access log is `Origins.access_log()`."""


def _named(servers: dict[tuple[str, Scheme], _OriginServer]) -> dict[str, _OriginServer]:
    return {f"{key}/{scheme}": server for (key, scheme), server in servers.items()}


class Origins:
    """All fixture origins, started and stopped as one unit.

    Use as a context manager or `start()`/`stop()`. Ports are known after `start()`.

    Args:
        pki: issues the HTTPS leaves (one per host name).
        hosts: the fixture hosts; default `load_hosts()`.
        blob: the blob spec; default `load_blob_spec()`.
        files_base_url: base of the index's file links instead of
            `https://<files host>:<its https port>`; e.g. `https://127.0.0.1:PORT` lets a
            client without the fixture DNS follow them.
        address: where every origin binds (a loopback address).
    """

    def __init__(
        self,
        pki: Pki,
        hosts: Sequence[FixtureHost] | None = None,
        *,
        blob: BlobSpec | None = None,
        files_base_url: str | None = None,
        address: str = LOOPBACK,
    ) -> None:
        """Prepare the origins; nothing is bound until `start()`."""
        self.pki = pki
        self.hosts = tuple(hosts) if hosts is not None else load_hosts()
        self.blob = blob or load_blob_spec()
        self.files_base_url = files_base_url
        self.address = address
        self._lock = threading.Lock()
        self._log: dict[str, list[dict[str, Any]]] = {h.key: [] for h in self.hosts}
        self._wheels: dict[str, PublishedWheel] = {}
        self._servers: dict[tuple[str, Scheme], _OriginServer] = {}
        self._threads: list[threading.Thread] = []
        # Set by `stop_answering` (a test's fault): every request is accepted and never
        # answered until `released` is set by `stop`.
        self.silenced = threading.Event()
        self.released = threading.Event()

    def __enter__(self) -> Self:
        """Start and return the origins."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the origins."""
        self.stop()

    def start(self) -> None:
        """Bind every host's HTTPS and HTTP port and serve each in a thread.

        Raises:
            FixtureError: a port could not be bound (everything bound so far is closed).
        """
        try:
            for host in self.hosts:
                for scheme in _SCHEMES:
                    self._servers[host.key, scheme] = _OriginServer(self, host, scheme)
        except (OSError, FixtureError) as exc:
            self.stop()
            raise FixtureError(f"origins could not start: {exc}") from exc
        for (key, scheme), server in self._servers.items():
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"origin-{key}-{scheme}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop_accepting(self) -> None:
        """Close every listener but keep the ports on record: a fault the tests inject.

        What an origin that crashed looks like to a client: connect refused. `stop` still
        ends the open connections and joins the threads afterwards.
        """
        stuck = shut_down(_named(self._servers), _STOP_S)
        for server in self._servers.values():
            server.server_close()
        if stuck:
            raise FixtureError(f"origin serving loops did not stop: {', '.join(stuck)}")

    def stop_answering(self) -> None:
        """Accept every connection and never answer it: a fault the tests inject."""
        self.silenced.set()

    def not_serving(self, timeout: float = 2.0) -> list[str]:
        """Why some origin does not serve right now: one phrase per origin; empty when all do.

        Each host's plain-HTTP listener is asked for `HEAD /` (logged without a nonce, so no
        cell's witness sees it): a listener whose thread ended refuses, and one that accepts
        but never answers times out. Without this a dead origin reads as "the sandbox
        reached nothing", which a denial probe would count in its favour.
        """
        problems = []
        threads = {t.name: t for t in self._threads}
        for key, scheme in self._servers:
            thread = threads.get(f"origin-{key}-{scheme}")
            if thread is None or not thread.is_alive():
                problems.append(f"origin {key} ({scheme}) stopped accepting")
        for key, scheme in self._servers:
            if scheme != "http" or any(p.startswith(f"origin {key} ") for p in problems):
                continue
            why = _no_answer(self.address, self.port(key, "http"), timeout)
            if why is not None:
                problems.append(f"origin {key} (http) {why}")
        return problems

    def stop(self) -> None:
        """Stop every listener, end open connections and join all threads; idempotent."""
        self.released.set()
        servers = dict(self._servers)
        self._servers.clear()
        stuck = shut_down(_named(servers), _STOP_S) if self._threads else []
        for thread in self._threads:
            thread.join(_STOP_S)
        self._threads.clear()
        for server in servers.values():
            server.server_close()
            server.close_connections()
        if stuck:
            # Everything else is closed; a loop that never ended is a fixture bug to report,
            # not a reason to hang the run (or the test suite) in teardown.
            raise FixtureError(
                f"origin serving loops did not stop within {_STOP_S:.0f} s: {', '.join(stuck)}"
            )

    def _server(self, key: str, scheme: Scheme) -> _OriginServer:
        try:
            return self._servers[key, scheme]
        except KeyError:
            raise FixtureError(
                f"origin {key!r} ({scheme}) is not running; call Origins.start() first"
            ) from None

    def port(self, key: str, scheme: Scheme) -> int:
        """The bound port of host `key` for `scheme`."""
        return int(self._server(key, scheme).server_address[1])

    def host_info(self, key: str) -> HostInfo:
        """The `WorldInfo.hosts` entry for host `key`."""
        host = self._server(key, "https").host
        return HostInfo(
            name=host.name,
            address=self.address,
            https_port=self.port(key, "https"),
            http_port=self.port(key, "http"),
        )

    def base_url(self, key: str, scheme: Scheme = "https") -> str:
        """`scheme://<name>:<port>` of host `key` (resolvable only through the fixture DNS)."""
        host = self._server(key, scheme).host
        return f"{scheme}://{host.name}:{self.port(key, scheme)}"

    def publish_wheel(self, path: Path) -> PublishedWheel:
        """Serve the wheel at `path` from the files host and list it in the index.

        Raises:
            FixtureError: the file is unreadable or its name is not a wheel's.
        """
        match = re.fullmatch(r"(?P<dist>[^-]+)-[^-]+-.+\.whl", path.name)
        if match is None:
            raise FixtureError(f"{path.name!r} is not a wheel file name (dist-ver-tags.whl)")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise FixtureError(f"cannot read the wheel {path}: {exc}") from exc
        wheel = PublishedWheel(
            project=normalize_project(match["dist"]),
            filename=path.name,
            data=data,
            sha256=hashlib.sha256(data).hexdigest(),
        )
        with self._lock:
            self._wheels[wheel.project] = wheel
        return wheel

    def published_wheels(self) -> list[PublishedWheel]:
        """The wheels published so far, by project name."""
        with self._lock:
            return [self._wheels[k] for k in sorted(self._wheels)]

    # -- routing -------------------------------------------------------------------------

    def route(self, host: FixtureHost, route: str, nonce: str | None, query: str = "") -> _Response:
        """The response for `route` (the path, `/c/<nonce>` prefix kept) on `host`."""
        prefix = ""
        path = route
        if match := _NONCE_PREFIX.match(route):
            prefix = f"/c/{match['nonce']}"
            path = match["rest"] or "/"
        if path == "/ok":
            return _text(200, f"ok {nonce or ''}\n")
        if path == "/blob":
            return self._blob_response()
        if path == "/dns-query" and host.key == "allowed":
            return self._doh_response(query)
        if host.key in _INDEX_HOSTS and path.startswith("/simple/"):
            return self._index_response(path.removeprefix("/simple/"), prefix)
        if host.key in _FILES_HOSTS and path.startswith("/files/"):
            return self._file_response(path.removeprefix("/files/"))
        return _text(404, f"not found: {path}\n")

    def _doh_response(self, query: str) -> _Response:
        """A DNS-over-HTTPS answer (RFC 8484 GET, `?dns=` base64url) for a fixture host name.

        The allowed host stands for a public DoH resolver on an allowlisted name
        (net_doh_bypass): it answers the fixture's names, the denied host's included, with the
        address the origins bind, as the DNS fixture does; any other name is NXDOMAIN.
        """
        from dnslib import QTYPE, RCODE, RR, A, DNSRecord  # noqa: PLC0415  (used by one route)

        raw = parse_qs(query).get("dns", [""])[0]
        try:
            request = DNSRecord.parse(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        except Exception:  # any undecodable query is the client's 400, never the origin's crash
            return _text(400, "dns= must be a base64url DNS message (RFC 8484 4.1)\n")
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        if name not in {h.name for h in self.hosts}:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(self.address), ttl=5))
        data: bytes = reply.pack()
        return _Response(200, "application/dns-message", len(data), [data])

    def _blob_response(self) -> _Response:
        spec = self.blob
        return _Response(
            200,
            "application/octet-stream",
            spec.size,
            iter_blob(spec.size, spec.seed, DEFAULT_CHUNK),
            {"X-Blob-Sha256": spec.sha256},
        )

    def _files_base(self) -> str:
        if self.files_base_url is not None:
            return self.files_base_url.rstrip("/")
        files = next(h for h in self.hosts if h.key in _FILES_HOSTS)
        return self.base_url(files.key, "https")

    def _index_response(self, rest: str, prefix: str) -> _Response:
        with self._lock:
            wheels = dict(self._wheels)
        head = '<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0">'
        if rest == "":
            links = "".join(
                f'<a href="{html.escape(p)}/">{html.escape(p)}</a><br/>\n' for p in sorted(wheels)
            )
            page = f"{head}<title>Simple index</title></head><body>\n{links}</body></html>\n"
            return _text(200, page, "text/html; charset=utf-8")
        project = normalize_project(rest.rstrip("/"))
        wheel = wheels.get(project)
        if wheel is None or "/" in rest.rstrip("/"):
            return _text(404, f"no project {rest.rstrip('/')!r} in this index\n")
        href = f"{self._files_base()}{prefix}/files/{wheel.filename}#sha256={wheel.sha256}"
        page = (
            f"{head}<title>Links for {project}</title></head><body>\n"
            f"<h1>Links for {project}</h1>\n"
            f'<a href="{html.escape(href)}">{html.escape(wheel.filename)}</a><br/>\n'
            "</body></html>\n"
        )
        return _text(200, page, "text/html; charset=utf-8")

    def _file_response(self, filename: str) -> _Response:
        with self._lock:
            wheel = next((w for w in self._wheels.values() if w.filename == filename), None)
        if wheel is None:
            return _text(404, f"no file {filename!r} here\n")
        return _Response(200, "application/octet-stream", len(wheel.data), [wheel.data])

    # -- the witness ---------------------------------------------------------------------

    def log(self, entry: dict[str, Any]) -> None:
        """Append one access-log entry (called by the handlers)."""
        with self._lock:
            self._log[entry["host"]].append(entry)

    def access_log(self, key: str | None = None) -> list[dict[str, Any]]:
        """Copies of the access log of host `key`, or of all hosts merged by time."""
        with self._lock:
            if key is not None:
                return [dict(e) for e in self._log[key]]
            merged = [dict(e) for log in self._log.values() for e in log]
        return sorted(merged, key=lambda e: e["time"])

    def records(self, nonce: str) -> list[dict[str, Any]]:
        """Every host's log entries whose nonce is `nonce`, oldest first."""
        return [e for e in self.access_log() if e["nonce"] == nonce]


def _no_answer(address: str, port: int, timeout: float) -> str | None:
    """Why `HEAD /` to a plain-HTTP origin got no status line within `timeout`, or None."""
    try:
        with socket.create_connection((address, port), timeout) as sock:
            sock.sendall(b"HEAD / HTTP/1.1\r\nHost: health\r\nConnection: close\r\n\r\n")
            head = sock.recv(16)
    except TimeoutError:
        return f"accepted but did not answer within {timeout:g}s"
    except OSError as exc:
        return f"refused the connection ({exc.strerror or exc})"
    if not head.startswith(b"HTTP/"):
        return f"answered {head!r} instead of an HTTP status line"
    return None


def wait_for_port(address: str, port: int, timeout: float = 5.0) -> None:
    """Block until `address:port` accepts a TCP connection (a loopback readiness check).

    Raises:
        FixtureError: nothing accepted within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection((address, port), 0.5):
            return
        if time.monotonic() > deadline:
            raise FixtureError(f"nothing accepts on {address}:{port} after {timeout} s")
        time.sleep(0.02)
