"""Live tests of the docker backend against a real engine (`scripts/docker-engine.sh start`).

Every test runs real containers. The payload is a small stdlib script written to a temporary
directory; it prints the start marker and one JSON line of what it saw from inside. Weakened
containers are each paired with the confined one doing the same thing, so the weakness is shown
to be real from inside *and* absent without it. Nothing here leaves loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.backends.base import START_MARKER, Backend, EgressRoute, ProbeRequest, ProbeRun
from harness.backends.docker import (
    HOST_ROOT_TARGET,
    SANDBOX_UID,
    DockerBackend,
    DockerEngineError,
    engine_socket_path,
)

pytestmark = [pytest.mark.needs_docker, pytest.mark.timeout(120)]

# The interpreter the payload runs under: the host's system Python, which the default image
# mounts read-only from /usr. The venv's interpreter would need its prefixes bound as well.
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

PAYLOAD = r"""
import errno, json, os, socket, sys, time, urllib.request

nonce = sys.argv[1]
print("SANDBOX-ATTEST-START " + nonce, flush=True)
facts = {"uid": os.getuid(), "gid": os.getgid(), "interfaces": sorted(os.listdir("/sys/class/net"))}

def attempt(name, fn):
    try:
        facts[name] = {"ok": True, "value": fn()}
    except OSError as exc:
        facts[name] = {"ok": False, "errno": errno.errorcode.get(exc.errno, str(exc.errno)),
                       "detail": str(exc)}

def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)
    return path

attempt("write_usr", lambda: write("/usr/sandbox-attest-" + nonce, nonce))
attempt("write_root", lambda: write("/sandbox-attest-" + nonce, nonce))
attempt("write_workspace", lambda: write(os.path.join(os.getcwd(), "out.txt"), nonce))
for action in sys.argv[2:]:
    verb, _, arg = action.partition("=")
    if verb == "proxy":
        url = "http://allowed.test/ok?nonce=" + nonce
        attempt("proxy", lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    elif verb == "sleep":
        time.sleep(float(arg))
    elif verb == "docker_sock":
        def ping():
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(arg)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return s.recv(4096).decode(errors="replace")
        attempt("docker_sock", ping)
    elif verb == "tcp":
        def connect():
            s = socket.create_connection(("127.0.0.1", int(arg)), timeout=5)
            s.sendall(nonce.encode())
            s.close()
            return "sent"
        attempt("tcp", connect)
    elif verb == "write":
        attempt("write", lambda: write(arg, nonce))
print(json.dumps({"nonce": nonce, "facts": facts}), flush=True)
"""


@pytest.fixture(scope="module")
def backend() -> Iterator[DockerBackend]:
    """The confined docker backend, available or the test fails with the reason (no skip)."""
    with DockerBackend() as live:
        avail = live.availability()
        assert avail.ok, f"docker backend unavailable: {avail.reason}"
        yield live
        live.close()
        assert live.leftovers() == {"containers": [], "images": [], "volumes": []}


@pytest.fixture(scope="module")
def payload_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A world-readable directory holding the payload (the sandbox uid must read it)."""
    directory = tmp_path_factory.mktemp("payload")
    directory.chmod(0o755)
    (directory / "payload.py").write_text(PAYLOAD)
    (directory / "payload.py").chmod(0o644)
    return directory


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A short, world-traversable scratch directory under /tmp (unix socket paths are short)."""
    path = Path(tempfile.mkdtemp(prefix="sa-dk-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_request(
    tmp_path: Path,
    payload_dir: Path,
    *actions: str,
    egress: EgressRoute | None = None,
    timeout: float = 30.0,
) -> tuple[ProbeRequest, str]:
    """A request running the payload with `actions`, and its nonce."""
    nonce = secrets.token_hex(8)
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    request = ProbeRequest(
        cell_id=f"docker-test_{nonce[:6]}",
        argv=(PYTHON, str(payload_dir / "payload.py"), nonce, *actions),
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        workspace=workspace,
        read_only=(payload_dir,),
        egress=egress,
        timeout=timeout,
        cell_dir=tmp_path,
    )
    return request, nonce


def report(run: ProbeRun) -> dict[str, Any]:
    """The payload's JSON line (the last stdout line), after checking the run started."""
    assert run.started, f"no start marker; stdout={run.stdout!r} stderr={run.stderr!r}"
    assert run.stdout.startswith(START_MARKER)
    data: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    facts: dict[str, Any] = data["facts"]
    return facts


class _UnixHttpProxy:
    """A tiny HTTP "proxy" on a unix socket: answers 200 with the request line, logs it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        path.chmod(0o666)  # the sandbox uid must be able to connect (the socket is the grant)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                line = head.split(b"\r\n", 1)[0].decode()
                self.seen.append(line)
                body = f"proxied {line}".encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (len(body), body)
                )

    def close(self) -> None:
        self.sock.close()


class _Listener:
    """A loopback TCP listener on the host that records what each connection sent."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self.received.append(conn.recv(4096))

    def close(self) -> None:
        self.sock.close()


class TestConfinement:
    def test_implements_the_backend_protocol(self, backend: DockerBackend) -> None:
        """The backend satisfies the Backend protocol and routes egress through the shim."""
        assert isinstance(backend, Backend)
        assert backend.egress_mode == "shim"

    def test_identity_records_image_and_options(self, backend: DockerBackend) -> None:
        """The identity carries the image id and every confinement option under its digest."""
        identity = backend.availability().identity
        assert identity is not None
        profile = identity.profile
        assert profile["image"]["id"].startswith("sha256:")
        assert profile["network_mode"] == "none"
        assert profile["read_only"] is True
        assert profile["cap_drop"] == ["ALL"]
        assert profile["security_opt"] == ["no-new-privileges"]
        assert profile["pids_limit"] == 256
        assert profile["user"] == f"{SANDBOX_UID}:{SANDBOX_UID}"
        assert identity.profile_digest.startswith("sha256:")

    def test_image_id_is_stable_across_runs(self, backend: DockerBackend) -> None:
        """A second backend builds the same content-addressed image id under its own tag."""
        with DockerBackend() as other:
            assert other.image().id == backend.image().id
            assert other.image().ref != backend.image().ref

    def test_payload_runs_confined(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path
    ) -> None:
        """The payload starts as a non-root uid with only lo and a read-only root."""
        request, nonce = make_request(tmp_path, payload_dir)
        run = backend.run(request)
        facts = report(run)
        assert run.exit_code == 0
        assert run.argv[:2] == ["docker", "run"]
        assert facts["uid"] == SANDBOX_UID
        assert facts["interfaces"] == ["lo"]
        assert facts["write_usr"]["errno"] == "EROFS"
        assert facts["write_root"]["errno"] == "EROFS"
        assert not Path(f"/usr/sandbox-attest-{nonce}").exists()

    def test_workspace_is_writable_and_visible_on_host(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path
    ) -> None:
        """A file written in the workspace lands on the host, handed back to its owner."""
        request, nonce = make_request(tmp_path, payload_dir)
        facts = report(backend.run(request))
        out = request.workspace / "out.txt"
        assert facts["write_workspace"]["ok"] is True
        assert out.read_text() == nonce
        assert out.stat().st_uid == os.geteuid()
        assert request.workspace.stat().st_uid == os.geteuid()

    def test_proxy_socket_reachable_through_shim(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path, world_dir: Path
    ) -> None:
        """HTTP_PROXY inside reaches the host's unix-socket proxy through the mounted shim."""
        proxy = _UnixHttpProxy(world_dir / "proxy.sock")
        try:
            egress = EgressRoute(unix_socket=proxy.path, tcp_url="http://127.0.0.1:1")
            request, nonce = make_request(tmp_path, payload_dir, "proxy", egress=egress)
            run = backend.run(request)
            facts = report(run)
        finally:
            proxy.close()
        expected_line = f"GET http://allowed.test/ok?nonce={nonce} HTTP/1.1"
        assert proxy.seen == [expected_line], run.stderr
        assert facts["proxy"] == {"ok": True, "value": f"proxied {expected_line}"}
        assert facts["interfaces"] == ["lo"]

    def test_unconnectable_proxy_socket_is_refused(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path, world_dir: Path
    ) -> None:
        """A proxy socket the sandbox uid cannot connect to is an error naming the fix."""
        proxy = _UnixHttpProxy(world_dir / "proxy.sock")
        proxy.path.chmod(0o700)
        try:
            egress = EgressRoute(unix_socket=proxy.path, tcp_url="http://127.0.0.1:1")
            request, _ = make_request(tmp_path, payload_dir, "proxy", egress=egress)
            with pytest.raises(DockerEngineError, match="make it 0666"):
                backend.run(request)
        finally:
            proxy.close()

    def test_timeout_kills_and_removes_the_container(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path
    ) -> None:
        """A payload past its deadline is killed, its container removed, the run marked."""
        request, _ = make_request(tmp_path, payload_dir, "sleep=60", timeout=2.0)
        run = backend.run(request)
        assert run.timed_out is True
        assert run.started is True  # the marker came before the sleep
        assert run.duration_s < 15
        assert any("container killed" in note for note in run.notes)
        assert backend.leftovers()["containers"] == []

    def test_unreadable_input_is_noted(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path
    ) -> None:
        """A read-only input the sandbox uid cannot read is named in the run's notes."""
        secret = tmp_path / "private"
        secret.mkdir(mode=0o700)
        request, _ = make_request(tmp_path, payload_dir)
        request = ProbeRequest(**{**request.__dict__, "read_only": (payload_dir, secret)})
        run = backend.run(request)
        assert any(str(secret) in note and "not readable" in note for note in run.notes)


class TestLifecycle:
    def test_nothing_left_behind_by_label(self, tmp_path: Path, payload_dir: Path) -> None:
        """After close(), no container, image or volume of the run is left in the engine."""
        live = DockerBackend()
        try:
            assert live.availability().ok
            assert live.leftovers()["images"] == [live.image().id]
            report(live.run(make_request(tmp_path, payload_dir)[0]))
        finally:
            live.close()
        assert live.leftovers() == {"containers": [], "images": [], "volumes": []}

    def test_unreachable_engine_is_unavailable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An engine that does not answer makes the backend UNAVAILABLE with the fix."""
        monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/sandbox-attest/docker.sock")
        with DockerBackend() as live:
            avail = live.availability()
        assert avail.ok is False
        assert avail.identity is None
        assert "scripts/docker-engine.sh start" in avail.reason

    def test_missing_named_image_is_unavailable(self) -> None:
        """A named image that is not local is UNAVAILABLE (nothing is pulled)."""
        with DockerBackend(image=f"sandbox-attest/absent:{secrets.token_hex(4)}") as live:
            avail = live.availability()
        assert avail.ok is False
        assert "nothing is pulled" in avail.reason

    def test_unknown_weakening_is_rejected(self) -> None:
        """A weakening the backend does not know is a ValueError listing the known ones."""
        with pytest.raises(ValueError, match="host-network"):
            DockerBackend(weaken=frozenset({"no-such-hole"}))


@pytest.fixture
def weakened() -> Iterator[Any]:
    """A factory of weakened backends, each closed (and checked clean) after the test."""
    made: list[DockerBackend] = []

    def make(*holes: str) -> DockerBackend:
        live = DockerBackend(weaken=frozenset(holes))
        avail = live.availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.name == "docker+weakened"
        assert avail.identity.profile["weakened"] == sorted(holes)
        made.append(live)
        return live

    yield make
    for live in made:
        live.close()
        assert live.leftovers() == {"containers": [], "images": [], "volumes": []}


class TestWeakened:
    def test_docker_socket_answers_ping(
        self, backend: DockerBackend, weakened: Any, tmp_path: Path, payload_dir: Path
    ) -> None:
        """With the docker socket mounted in, /_ping answers OK; confined, there is no socket."""
        sock = "/var/run/docker.sock"
        request, _ = make_request(tmp_path, payload_dir, f"docker_sock={sock}")
        weak = report(weakened("docker-socket").run(request))
        assert weak["docker_sock"]["ok"] is True, weak
        assert weak["docker_sock"]["value"].startswith("HTTP/1.")
        assert weak["docker_sock"]["value"].endswith("OK")
        confined = report(backend.run(request))
        assert confined["docker_sock"]["errno"] == "ENOENT"
        assert Path(engine_socket_path()).is_socket()  # the control: the host has one

    def test_host_network_reaches_host_listener(
        self, backend: DockerBackend, weakened: Any, tmp_path: Path, payload_dir: Path
    ) -> None:
        """With host networking a host loopback listener receives the nonce; confined, none."""
        listener = _Listener()
        try:
            request, nonce = make_request(tmp_path, payload_dir, f"tcp={listener.port}")
            confined = report(backend.run(request))
            assert confined["tcp"]["errno"] == "ECONNREFUSED"
            assert listener.received == []
            weak = report(weakened("host-network").run(request))
            listener.thread.join(timeout=2)
        finally:
            listener.close()
        assert weak["tcp"]["ok"] is True
        assert nonce.encode() in listener.received
        assert weak["interfaces"] != ["lo"]

    def test_host_root_rw_writes_the_host(
        self,
        backend: DockerBackend,
        weakened: Any,
        tmp_path: Path,
        payload_dir: Path,
        world_dir: Path,
    ) -> None:
        """With / mounted writable a file lands outside the workspace; confined, it cannot."""
        target = world_dir / "canary"
        confined_req, _ = make_request(tmp_path, payload_dir, f"write={target}")
        confined = report(backend.run(confined_req))
        assert confined["write"]["errno"] in {"ENOENT", "EROFS"}
        assert not target.exists()
        weak_req, nonce = make_request(tmp_path, payload_dir, f"write={HOST_ROOT_TARGET}{target}")
        weak = report(weakened("host-root-rw").run(weak_req))
        assert weak["write"]["ok"] is True
        assert target.read_text() == nonce
        assert stat.S_IMODE(world_dir.stat().st_mode) == 0o777
