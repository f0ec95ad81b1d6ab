"""Live tests of the docker backend against a real engine (`scripts/docker-engine.sh start`).

Every test runs real containers. The payload is a small stdlib script written to a temporary
directory; it prints the start marker and one JSON line of what it saw from inside. Weakened
containers are each paired with the confined one doing the same thing, so the weakness is shown
to be real from inside *and* absent without it. Nothing here leaves loopback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends import seccomp
from sandbox_attest.backends.base import START_MARKER, Backend, EgressRoute, ProbeRequest, ProbeRun
from sandbox_attest.backends.bubblewrap import LIMITS
from sandbox_attest.backends.docker import seccomp as docker_seccomp
from sandbox_attest.backends.docker.backend import HOST_ROOT_TARGET, PIDS_LIMIT, DockerBackend
from sandbox_attest.backends.docker.engine import ENGINE_FIX, DockerEngineError, engine_socket_path
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.host.trust import payload_user
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world
from tests.backends.standin import take_client
from tests.listening import stop_accept_loop

pytestmark = [pytest.mark.needs_docker, pytest.mark.timeout(120)]

# The interpreter the payload runs under: the host's system Python, which the default image
# mounts read-only from /usr. The venv's interpreter would need its prefixes bound as well.
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

PAYLOAD = r"""
import ctypes, errno, json, os, platform, resource, socket, sys, threading, time, urllib.request

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

# Syscall numbers: ioctl, socket, mount, unshare, ptrace, personality, keyctl, bpf, getpid.
NR = {"x86_64": {"ioctl": 16, "socket": 41, "mount": 165, "unshare": 272, "ptrace": 101,
                 "personality": 135, "keyctl": 250, "bpf": 321, "getpid": 39},
      "aarch64": {"ioctl": 29, "socket": 198, "mount": 40, "unshare": 97, "ptrace": 117,
                  "personality": 92, "keyctl": 219, "bpf": 280, "getpid": 172},
      }.get(platform.machine())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def sc(nr, *args):
    # Every call below uses arguments the kernel rejects (fd -1, NULL, unknown commands), so
    # where it is allowed it fails in its handler (EBADF, EFAULT...) and changes nothing.
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if result >= 0:
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), "?")

def in_child(fn):
    # How a call ends in a forked child: "exit N", or "signal N" when seccomp kills it.
    pid = os.fork()
    if pid == 0:
        os._exit(fn())
    status = os.waitpid(pid, 0)[1]
    if os.WIFSIGNALED(status):
        return "signal %d" % os.WTERMSIG(status)
    return "exit %d" % os.WEXITSTATUS(status)

def syscalls():
    out = {}
    out["io_uring_setup"] = sc(425, 0, 0)
    out["keyctl"] = sc(NR["keyctl"], 0x7FFF, 0, 0)
    out["bpf"] = sc(NR["bpf"], 0x7FFF, 0, 0)
    out["ioctl_tiocsti"] = sc(NR["ioctl"], -1, 0x5412, 0)
    out["ioctl_tiocsti_high_bit"] = sc(NR["ioctl"], -1, 0x5412 | 1 << 32, 0)
    out["ioctl_other"] = sc(NR["ioctl"], -1, 0x5413, 0)
    families = {"vsock": 40, "netlink": 16, "packet": 17, "unspec": 0, "x25": 9,
                "inet_high_bit": 2 | 1 << 32, "unix": 1, "inet": 2, "inet6": 10}
    for name, family in families.items():
        out["socket_" + name] = sc(NR["socket"], family, socket.SOCK_DGRAM, 0)
    out["mount"] = sc(NR["mount"], 0, 0, 0, 0, 0)
    out["unshare_user"] = sc(NR["unshare"], 0x10000000)
    out["clone3"] = sc(435, 0, 0)
    out["ptrace"] = sc(NR["ptrace"], 0x7FFF, 0, 0, 0)
    out["personality_query"] = sc(NR["personality"], 0xFFFFFFFF)
    out["personality_linux32"] = sc(NR["personality"], 0x8)
    sc(NR["personality"], 0)
    out["personality_no_aslr"] = sc(NR["personality"], 0x40000)
    out["personality_query_bit_no_aslr"] = sc(NR["personality"], 0x80040000)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    out["thread"] = "ok"
    out["fork"] = in_child(lambda: 0)
    if platform.machine() == "x86_64":
        out["x32_getpid"] = in_child(lambda: 0 if sc(0x40000000 | NR["getpid"]) == "ok" else 2)
    return out

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
    elif verb == "syscalls":
        facts["syscalls"] = syscalls()
    elif verb == "rlimits":
        facts["rlimits"] = {"fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
                            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)}
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
        self.routes: list[str] = []  # "handoff" when the shim passed the payload's socket
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
                client, head, route = take_client(conn)
                self.routes.append(route)
                with client:
                    self._answer(client, head)

    def _answer(self, client: socket.socket, head: bytes) -> None:
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                break
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        self.seen.append(line)
        body = f"proxied {line}".encode()
        client.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (len(body), body)
        )

    def close(self) -> None:
        stop_accept_loop(self.sock, self.thread)


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
        stop_accept_loop(self.sock, self.thread)


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
        assert profile["seccomp"] == docker_seccomp.profile()
        assert profile["pids_limit"] == PIDS_LIMIT
        assert profile["ulimits"] == {"fsize": 16 * 1024 * 1024, "nofile": 256}
        assert profile["user"] == f"{backend.uid}:{backend.gid}"
        user = payload_user()
        if user is not None:  # as root: the one payload user every sandboxed command runs as
            assert (backend.uid, backend.gid) == (user.uid, user.gid)
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
        assert facts["uid"] == backend.uid
        assert facts["uid"] != 0
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
        assert proxy.routes == ["handoff"]  # the container's own socket crossed to the proxy
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
        sleep_s = 60  # how long the payload lives unless killed
        request, _ = make_request(tmp_path, payload_dir, f"sleep={sleep_s}", timeout=2.0)
        run = backend.run(request)
        assert run.timed_out is True
        assert run.started is True  # the marker came before the sleep
        # Not a speed budget: a payload that was not killed would sleep its full sleep_s.
        assert run.duration_s < sleep_s, "the payload ran to its end: never killed"
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
        assert avail.reason.endswith(ENGINE_FIX)
        assert "apt-get install docker.io" in avail.reason

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


# ---------------------------------------------------------------------------------------------
# The seccomp profile and the limits (what proc_syscall_surface and resource_limits found).

# The refusals of docker's default profile the brief names (for a container without
# capabilities); ours must keep every one of them.
DOCKER_DEFAULT_DENIALS = (
    "mount", "umount2", "pivot_root", "unshare", "setns", "reboot", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "swapon", "swapoff",
    "acct", "settimeofday", "clock_settime", "iopl", "ioperm", "quotactl", "open_by_handle_at",
    "lookup_dcookie", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "userfaultfd", "name_to_handle_at", "ptrace", "process_vm_readv", "process_vm_writev",
)  # fmt: skip


def _refused_names(profile: dict[str, Any]) -> set[str]:
    """Names the profile refuses unconditionally (entries without argument conditions)."""
    return {name for rule in profile["syscalls"] if not rule.get("args") for name in rule["names"]}


class TestSeccompProfile:
    def test_is_a_deny_list_for_two_architectures(self) -> None:
        """Everything not named is allowed; every entry refuses; only x86_64 and aarch64."""
        profile = docker_seccomp.profile()
        assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
        assert profile["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"]
        codes = {(r["action"], r["errnoRet"]) for r in profile["syscalls"]}
        assert codes == {("SCMP_ACT_ERRNO", errno.EPERM), ("SCMP_ACT_ERRNO", errno.ENOSYS)}
        enosys = [r["names"] for r in profile["syscalls"] if r["errnoRet"] == errno.ENOSYS]
        assert enosys == [["clone3"]]

    def test_keeps_docker_default_denials_and_bubblewraps(self) -> None:
        """Docker's own refusals and bubblewrap's deny list are all refused outright."""
        refused = _refused_names(docker_seccomp.profile())
        shared = {name for table in seccomp.ARCHES.values() for name in table.denied}
        assert set(DOCKER_DEFAULT_DENIALS) - refused == set()
        assert shared - refused == set()
        assert {"io_uring_setup", "io_uring_enter", "io_uring_register"} <= refused

    def test_argument_rules_are_single_and_low_32_bit(self) -> None:
        """Each conditional entry has one condition; equalities mask the low 32 bits."""
        conditional = [r for r in docker_seccomp.profile()["syscalls"] if r.get("args")]
        assert {n for r in conditional for n in r["names"]} == {
            "clone", "personality", "socket", "socketpair", "ioctl",
        }  # fmt: skip
        for rule in conditional:
            assert len(rule["args"]) == 1, rule
            (arg,) = rule["args"]
            if arg["op"] == "SCMP_CMP_MASKED_EQ" and rule["names"] != ["clone"]:
                assert arg["value"] <= docker_seccomp.LOW32, rule
            else:
                assert arg["op"] in {"SCMP_CMP_MASKED_EQ", "SCMP_CMP_GT"}, rule

    def test_profile_json_round_trips(self) -> None:
        """The JSON text handed to the engine is the profile recorded in the identity."""
        assert json.loads(docker_seccomp.profile_json()) == docker_seccomp.profile()


class TestSeccompLive:
    def test_refuses_the_doors_the_probe_found(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path
    ) -> None:
        """io_uring, keyrings, bpf, TIOCSTI, vsock/netlink/packet sockets get EPERM inside."""
        request, _ = make_request(tmp_path, payload_dir, "syscalls")
        calls = report(backend.run(request))["syscalls"]
        eperm = [
            "io_uring_setup", "keyctl", "bpf", "ioctl_tiocsti", "ioctl_tiocsti_high_bit",
            "socket_vsock", "socket_netlink", "socket_packet", "socket_unspec", "socket_x25",
            "socket_inet_high_bit", "mount", "unshare_user", "ptrace", "personality_no_aslr",
            "personality_query_bit_no_aslr",
        ]  # fmt: skip
        assert {k: calls[k] for k in eperm} == dict.fromkeys(eperm, "EPERM")
        assert calls["clone3"] == "ENOSYS"  # so libc falls back to clone, whose flags we see
        if "x32_getpid" in calls:
            assert calls["x32_getpid"] == f"signal {signal.SIGSYS.value}"  # not our arch: killed

    def test_ordinary_calls_still_work(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path
    ) -> None:
        """unix/inet/inet6 sockets, threads, fork, other ioctls and allowed personas work."""
        request, _ = make_request(tmp_path, payload_dir, "syscalls")
        calls = report(backend.run(request))["syscalls"]
        ok = ["socket_unix", "socket_inet", "socket_inet6", "thread", "personality_query",
              "personality_linux32"]  # fmt: skip
        assert {k: calls[k] for k in ok} == dict.fromkeys(ok, "ok")
        assert calls["fork"] == "exit 0"
        assert calls["ioctl_other"] == "EBADF"  # reached its handler: only TIOCSTI is refused

    def test_default_seccomp_lets_them_reach_the_kernel(
        self, weakened: Any, tmp_path: Path, payload_dir: Path
    ) -> None:
        """Under the engine's default profile io_uring, TIOCSTI and vsock reach the kernel."""
        live = weakened("default-seccomp")
        identity = live.identity()
        assert identity.profile["seccomp"] is None
        request, _ = make_request(tmp_path, payload_dir, "syscalls")
        calls = report(live.run(request))["syscalls"]
        assert calls["io_uring_setup"] in {"EFAULT", "EINVAL"}
        assert calls["ioctl_tiocsti"] == "EBADF"
        assert calls["socket_vsock"] != "EPERM"
        assert "seccomp=" not in " ".join(live.run(request).argv)


class TestLimits:
    def test_ulimits_applied_and_declared(
        self, backend: DockerBackend, tmp_path: Path, payload_dir: Path
    ) -> None:
        """Bubblewrap's rlimits hold inside (soft = hard) and the claims declare them."""
        request, _ = make_request(tmp_path, payload_dir, "rlimits")
        run = backend.run(request)
        limits = report(run)["rlimits"]
        assert limits == {"fsize": [16 * 1024 * 1024] * 2, "nofile": [256, 256]}
        declared = dict(backend.claims().limits)
        assert declared == {**dict(LIMITS), "forks": PIDS_LIMIT}
        assert run.argv[run.argv.index("--pids-limit") + 1] == str(PIDS_LIMIT)
        assert "--ulimit=nofile=256:256" in run.argv

    def test_no_limits_declares_but_does_not_apply(
        self, weakened: Any, tmp_path: Path, payload_dir: Path
    ) -> None:
        """The "no-limits" weakening keeps the claim and drops the ulimits and pids limit."""
        live = weakened("no-limits")
        request, _ = make_request(tmp_path, payload_dir, "rlimits")
        run = live.run(request)
        limits = report(run)["rlimits"]
        assert limits["fsize"] == [resource.RLIM_INFINITY] * 2
        assert limits["nofile"][0] > 256
        assert dict(live.claims().limits) == {**dict(LIMITS), "forks": PIDS_LIMIT}
        assert "--pids-limit" not in run.argv


# ---------------------------------------------------------------------------------------------
# The two probes through the real runner: strong PASS, each weakening FAILs its own probe.

FOUND = ("proc_syscall_surface", "resource_limits")
HOLES = {"default-seccomp": "proc_syscall_surface", "no-limits": "resource_limits"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module (proxy, DNS, origins, listeners, daemon)."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def runner(
    world: World, backend: DockerBackend, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CellRunner]:
    """A runner over the control leg, the strong backend and one backend per new weakening.

    The control leg runs both probes first: every later verdict is judged against it.
    """
    holes = {f"docker-{hole}": DockerBackend(weaken=frozenset({hole})) for hole in HOLES}
    every: dict[str, Backend] = {"none": NoneBackend(), "docker": backend, **holes}
    try:
        live = CellRunner(
            world=world,
            scratch=tmp_path_factory.mktemp("cells"),
            backends=every,
            availability={name: b.availability() for name, b in every.items()},
            platform="linux",
        )
        for probe in FOUND:
            entry = live.run_cell(Cell("none", ProbeRow(probe, 120), None))
            assert entry["verdict"] == "PASS", f"control leg {probe}: {entry['reason']}"
        yield live
    finally:
        for weak in holes.values():
            weak.close()
            assert weak.leftovers() == {"containers": [], "images": [], "volumes": []}


class TestFoundProbes:
    @pytest.mark.parametrize("probe", FOUND)
    def test_strong_backend_passes(self, runner: CellRunner, probe: str) -> None:
        """The strong docker backend PASSes the two probes that found its gaps."""
        entry = runner.run_cell(Cell("docker", ProbeRow(probe, 120), None))
        assert entry["verdict"] == "PASS", entry["reason"]

    @pytest.mark.parametrize("hole", list(HOLES))
    def test_weakening_fails_its_probe_only(self, runner: CellRunner, hole: str) -> None:
        """Each new weakening FAILs its matching probe and still PASSes the other one."""
        got = {p: runner.run_cell(Cell(f"docker-{hole}", ProbeRow(p, 120), None)) for p in FOUND}
        want = {p: ("FAIL" if p == HOLES[hole] else "PASS") for p in FOUND}
        assert {p: e["verdict"] for p, e in got.items()} == want, {
            p: e["reason"] for p, e in got.items()
        }
