"""The bubblewrap backend: its argv, its availability message, and live confinement."""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_attest.backends import bubblewrap as bw
from sandbox_attest.backends.base import SANDBOX_RUN_DIR, SHIM_PORT, EgressRoute, ProbeRequest
from sandbox_attest.errors import BackendUnavailable
from sandbox_attest.host import disguise
from sandbox_attest.payload import interpreter_paths, payload_env
from tests.backends.standin import take_client
from tests.listening import stop_accept_loop

pytestmark = pytest.mark.needs_bwrap

# A payload that reports what it can see and do from inside; stdlib only, like a probe.
PAYLOAD = r"""
import json, os, socket, sys
print("SANDBOX-ATTEST-START test", flush=True)
facts = {"uid": os.getuid(), "pid": os.getpid(), "hostname": socket.gethostname(),
         "netdevs": sorted(ln.split(":")[0].strip()
                           for ln in open("/proc/net/dev").readlines()[2:])}
ws = sys.argv[1]
with open(os.path.join(ws, "inside.txt"), "w") as f:
    f.write("written inside")
for target in ("/usr/sandbox-attest-write-test", "/etc/sandbox-attest-write-test"):
    try:
        open(target, "w").close()
        facts[target] = "succeeded"
    except OSError as exc:
        import errno
        facts[target] = errno.errorcode.get(exc.errno, str(exc.errno))
facts["docker_sock_visible"] = any(
    os.path.exists(p) for p in ("/var/run/docker.sock", "/run/docker.sock"))
facts["home_visible"] = sorted(os.listdir("/root")) if os.path.isdir("/root") else None
if len(sys.argv) > 2 and sys.argv[2] == "proxy":
    s = socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=5)
    s.sendall(b"ping through shim")
    s.shutdown(socket.SHUT_WR)
    facts["echo"] = s.recv(100).decode()
if len(sys.argv) > 2 and sys.argv[2] == "sleep":
    import time; time.sleep(60)
print(json.dumps({"attempts": [{"what": "facts"}], "facts": facts}), flush=True)
"""


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    """The test payload, in a directory of its own (bound read-only)."""
    pdir = tmp_path / "payload"
    pdir.mkdir()
    path = pdir / "payload.py"
    path.write_text(PAYLOAD)
    return path


@dataclass
class EchoProxy:
    """A unix socket standing in for the proxy: echoes what it receives, prefixed."""

    path: Path
    routes: list[str]  # how each client came: "handoff" (the shim passed its socket) or "stream"


@pytest.fixture
def echo_socket(tmp_path: Path) -> Iterator[EchoProxy]:
    """The stand-in proxy on tmp_path/proxy.sock, serving until teardown."""
    stand_in = EchoProxy(tmp_path / "proxy.sock", [])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(stand_in.path))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                client, data, route = take_client(conn)
                stand_in.routes.append(route)
                with client:
                    while chunk := client.recv(4096):
                        data += chunk
                    client.sendall(b"echo:" + data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield stand_in
    stop_accept_loop(server, thread)


def make_request(
    tmp_path: Path, payload: Path, *extra: str, socket_path: Path | None = None, timeout: float = 30
) -> ProbeRequest:
    """A request like the runner makes: venv interpreter, workspace, payload dir read-only."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    egress = None
    if socket_path is not None:
        egress = EgressRoute(unix_socket=socket_path, tcp_url="http://unused")
    return ProbeRequest(
        cell_id="bubblewrap-test",
        argv=(sys.executable, str(payload), str(workspace), *extra),
        env=payload_env(None, workspace),
        workspace=workspace,
        read_only=(*interpreter_paths(), payload.parent),
        egress=egress,
        timeout=timeout,
        cell_dir=tmp_path,
    )


def facts_of(stdout: str) -> dict[str, object]:
    """The payload's facts from its JSON line."""
    line = [ln for ln in stdout.splitlines() if ln.startswith("{")][-1]
    return dict(json.loads(line)["facts"])


class TestArgv:
    def test_confinement_flags_present(self, tmp_path: Path, payload: Path) -> None:
        """The argv has every namespace, lifetime and capability flag the claims rely on."""
        argv = bw.BubblewrapBackend().build_argv(make_request(tmp_path, payload))
        for flag in (
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--die-with-parent",
            "--new-session",
        ):
            assert flag in argv
        assert argv[argv.index("--cap-drop") + 1] == "ALL"
        assert argv[argv.index("--tmpfs") + 1] == "/tmp"

    def test_workspace_is_the_only_writable_bind(self, tmp_path: Path, payload: Path) -> None:
        """Exactly one read-write --bind exists, and it is the workspace; / is never bound."""
        request = make_request(tmp_path, payload)
        argv = bw.BubblewrapBackend().build_argv(request)
        rw = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
        assert rw == [str(request.workspace)]
        ro = [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]
        assert "/" not in ro

    def test_interpreter_bound_by_lexical_and_resolved_path(
        self, tmp_path: Path, payload: Path
    ) -> None:
        """Both the interpreter's own path and its resolved target are visible inside."""
        argv = bw.BubblewrapBackend().build_argv(make_request(tmp_path, payload))
        ro = [Path(argv[i + 1]) for i, a in enumerate(argv) if a == "--ro-bind"]
        lexical = Path(sys.executable)
        resolved = lexical.resolve()
        for exe in (lexical, resolved):
            assert exe.is_relative_to("/usr") or any(exe.is_relative_to(p) for p in ro), exe

    def test_weakening_is_visible_in_argv_and_identity(self, tmp_path: Path, payload: Path) -> None:
        """A weakened backend drops exactly the flag it names and says so in its identity."""
        weak = bw.BubblewrapBackend(weaken=frozenset({"share-net"}))
        argv = weak.build_argv(make_request(tmp_path, payload))
        assert "--unshare-net" not in argv
        assert "--unshare-ipc" in argv
        avail = weak.availability()
        assert avail.identity is not None
        assert avail.identity.name == "bubblewrap+weakened"
        assert avail.identity.profile["weakened"] == ["share-net"]
        strong = bw.BubblewrapBackend().availability().identity
        assert strong is not None
        assert strong.profile_digest != avail.identity.profile_digest

    def test_unknown_weakening_is_refused(self) -> None:
        """A typo in a weakening is an error, not a silently strong (or weak) sandbox."""
        with pytest.raises(ValueError, match="unknown bubblewrap weakening"):
            bw.BubblewrapBackend(weaken=frozenset({"share-netz"}))


class TestAvailability:
    def test_missing_bwrap_names_the_fix(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without bwrap on PATH the backend is unavailable and says how to install it."""
        monkeypatch.setattr("sandbox_attest.backends.bubblewrap.shutil.which", lambda _name: None)
        avail = bw.BubblewrapBackend().availability()
        assert not avail.ok
        assert "apt-get install bubblewrap" in avail.reason

    def test_namespace_failure_names_the_sysctl(self, tmp_path: Path) -> None:
        """A bwrap that cannot create namespaces is unavailable with the sysctl fix."""
        fake = tmp_path / "bwrap"
        fake.write_text(
            "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'bubblewrap 0.0'; exit 0; }\n"
            "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1\n"
        )
        fake.chmod(0o755)
        avail = bw.BubblewrapBackend(bwrap=str(fake)).availability()
        assert not avail.ok
        assert "setting up uid map" in avail.reason
        assert "unprivileged_userns_clone" in avail.reason

    def test_available_here_with_version(self) -> None:
        """On this machine bwrap runs, and its identity carries the version and claims."""
        avail = bw.BubblewrapBackend().availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.version.startswith("bubblewrap")
        assert avail.identity.claims.network == "proxy"


class TestLive:
    def test_confined_payload_sees_an_empty_world(self, tmp_path: Path, payload: Path) -> None:
        """Inside: only lo, read-only system, no docker.sock, no host home; workspace works."""
        request = make_request(tmp_path, payload)
        run = bw.BubblewrapBackend().run(request)
        assert run.started, run.stderr
        facts = facts_of(run.stdout)
        assert facts["netdevs"] == ["lo"]
        assert facts["/usr/sandbox-attest-write-test"] == "EROFS"
        assert facts["/etc/sandbox-attest-write-test"] in {"EROFS", "EACCES", "ENOENT"}
        assert facts["docker_sock_visible"] is False
        assert facts["hostname"] == disguise.HOSTNAME
        assert (request.workspace / "inside.txt").read_text() == "written inside"
        # /root inside holds at most the directories on the way to a bound interpreter prefix
        # (pyenv lives there on some machines); the host's own home entries never show.
        home = facts["home_visible"]
        bound = {
            p.relative_to("/root").parts[0]
            for p in request.read_only
            if p.is_relative_to("/root") and p != Path("/root")
        }
        assert home is None or (isinstance(home, list) and set(home) <= bound), home

    def test_shim_bridges_loopback_to_the_proxy_socket(
        self, tmp_path: Path, payload: Path, echo_socket: EchoProxy
    ) -> None:
        """The only way out is the proxy socket, reached through the shim on loopback.

        The shim hands the payload's own connection across the namespace boundary to the
        proxy, which answers on it directly.
        """
        request = make_request(
            tmp_path, payload, "proxy", str(SHIM_PORT), socket_path=echo_socket.path
        )
        run = bw.BubblewrapBackend().run(request)
        assert run.started, run.stderr
        assert facts_of(run.stdout)["echo"] == "echo:ping through shim"
        assert echo_socket.routes == ["handoff"]

    def test_timeout_kills_the_whole_tree(self, tmp_path: Path, payload: Path) -> None:
        """A hung payload is killed with bwrap at the deadline and nothing survives."""
        request = make_request(tmp_path, payload, "sleep", timeout=3)
        start = time.monotonic()
        run = bw.BubblewrapBackend().run(request)
        assert run.timed_out
        # Not a speed budget: a payload that was not killed would sleep its full 60 s.
        payload_sleep_s = 60  # PAYLOAD's "sleep" branch
        assert time.monotonic() - start < payload_sleep_s, "the payload ran to its end"
        survivors = []
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit():
                continue
            try:
                cmdline = (proc_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if str(request.workspace).encode() in cmdline:
                survivors.append(proc_dir.name)
        assert survivors == []

    def test_weakened_host_root_routes_through_its_own_tmpfs(
        self, tmp_path: Path, payload: Path, echo_socket: EchoProxy
    ) -> None:
        """host-root-rw mounts the route under the private /tmp and leaves the host's /run alone.

        With the host's / bound writable, a mount point outside a tmpfs bwrap made is created
        on the host: refused for the payload user in /run, and a leftover where it succeeds
        (as root), which a later run then silently relied on.
        """
        weak = bw.BubblewrapBackend(weaken=frozenset({"host-root-rw"}))
        request = make_request(
            tmp_path, payload, "proxy", str(SHIM_PORT), socket_path=echo_socket.path
        )
        argv = weak.build_argv(request)
        tmpfs_at = argv.index("--tmpfs")
        assert argv[tmpfs_at + 1] == "/tmp"
        route = weak.inside_paths(None, tmp_path)  # type: ignore[arg-type]  # unused by bwrap
        for inside in (route.proxy_socket, route.shim):
            assert Path(inside).is_relative_to("/tmp"), inside
            assert argv.index(inside) > tmpfs_at, argv  # mounted after the tmpfs exists
        host_run_dir = Path(SANDBOX_RUN_DIR)
        existed = host_run_dir.exists()
        run = weak.run(request)
        assert run.started, run.stderr
        assert facts_of(run.stdout)["echo"] == "echo:ping through shim"
        assert host_run_dir.exists() == existed  # nothing made on the host's /run

    def test_weakened_share_net_sees_host_interfaces(self, tmp_path: Path, payload: Path) -> None:
        """Control for the weakening: sharing the network shows the host's devices."""
        run = bw.BubblewrapBackend(weaken=frozenset({"share-net"})).run(
            make_request(tmp_path, payload)
        )
        assert run.started, run.stderr
        host = sorted(
            ln.split(":")[0].strip() for ln in Path("/proc/net/dev").read_text().splitlines()[2:]
        )
        assert len(host) > 1
        assert facts_of(run.stdout)["netdevs"] == host


class TestHardening:
    def test_filter_program_is_well_formed(self) -> None:
        """The seccomp program is whole instructions, allows by default and denies with EPERM."""
        from sandbox_attest.backends import seccomp  # noqa: PLC0415

        program = seccomp.build_filter("x86_64")
        assert len(program) % 8 == 0
        assert 8 < len(program) // 8 < 64  # short enough for a reviewer and for u8 jumps
        last_code, _, _, last_k = struct.unpack("=HBBI", program[-8:])
        assert (last_code, last_k) == (seccomp.BPF_RET_K, seccomp.SECCOMP_RET_ERRNO | 1)
        assert seccomp.build_filter("aarch64") != program

    def test_unknown_architecture_is_unavailable(self) -> None:
        """No syscall table means no filter, and the backend must not run without it."""
        from sandbox_attest.backends import seccomp  # noqa: PLC0415

        with pytest.raises(BackendUnavailable, match="no seccomp syscall table"):
            seccomp.build_filter("sparc64")

    def test_argv_carries_filter_userns_and_limits(self, tmp_path: Path, payload: Path) -> None:
        """--seccomp FD, --disable-userns and the prlimit prefix are all in the argv."""
        backend = bw.BubblewrapBackend()
        argv = backend.build_argv(make_request(tmp_path, payload), seccomp_fd=7)
        assert argv[: argv.index("--") + 1] == [
            "prlimit",
            f"--fsize={16 * 1024 * 1024}",
            "--nofile=256",
            "--",
        ]
        assert argv[argv.index("--seccomp") + 1] == "7"
        assert "--disable-userns" in argv
        assert (
            "--seccomp"
            not in bw.BubblewrapBackend(weaken=frozenset({"no-seccomp"})).argv_template()
        )

    def test_declared_limits_are_in_the_identity(self) -> None:
        """The claims a verdict judges against names the limits the argv applies."""
        identity = bw.BubblewrapBackend().availability().identity
        assert identity is not None
        assert identity.claims.as_dict()["limits"] == {"fsize_mib": 16, "nofile": 256}
