"""AppContainer: constants, SDDL, quoting, env block, call order, cleanup, broker and shim.

Win32 constants and layouts, the pipe SDDL, argv quoting and the environment block are pure;
the call order and cleanup run against recording fake seams; the pipe broker and shim run
over real sockets.

Nothing here runs on Windows; the fakes stand at the seam the backend calls (Kernel32,
Advapi32, Userenv) and record every call in one shared list, so order is checkable.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from sandbox_attest.backends import appcontainer
from sandbox_attest.backends import win32 as w
from sandbox_attest.backends.appcontainer import (
    CREATION_FLAGS,
    SHIM_SCRIPT,
    AppContainerBackend,
    command_line,
    environment_block,
    pipe_name,
    pipe_sddl,
    profile_name,
)
from sandbox_attest.backends.base import SHIM_PORT, START_MARKER, Backend, EgressRoute, ProbeRequest
from sandbox_attest.errors import BackendUnavailable, ConfigError
from sandbox_attest.world.egress.pipe_broker import PipeBroker, rewrite_head
from tests.listening import stop_accept_loop

# ruff: noqa: D102, D107  (the fakes implement the seam Protocols documented in win32.py)

USER = "S-1-5-21-1111-2222-3333-1001"
PACKAGE = "S-1-15-2-1-2-3-4-5-6-7"


# --- fakes --------------------------------------------------------------------------------


@dataclass
class Recorder:
    """The shared call log and the failures to inject."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    fail: dict[str, Exception] = field(default_factory=dict)
    wait_results: list[bool] = field(default_factory=lambda: [True])
    stdout: bytes = b""
    stderr: bytes = b""

    def __call__(self, name: str, *args: Any) -> None:
        self.calls.append((name, *args))
        if name in self.fail:
            raise self.fail[name]

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeKernel32:
    """Records kernel32 calls; hands out increasing handle numbers."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.next = 100

    def _handle(self) -> int:
        self.next += 4
        return self.next

    def create_job_object(self) -> int:
        h = self._handle()
        self.rec("create_job_object", h)
        return h

    def set_kill_on_job_close(self, job: int) -> None:
        self.rec("set_kill_on_job_close", job)

    def create_pipe(self) -> tuple[int, int]:
        r, wr = self._handle(), self._handle()
        self.rec("create_pipe", r, wr)
        return r, wr

    def initialize_attribute_list(self, count: int) -> object:
        self.rec("initialize_attribute_list", count)
        return "ATTRS"

    def update_attribute(self, attributes: object, attribute: int, value: Any) -> None:
        self.rec("update_attribute", attribute, value)

    def delete_attribute_list(self, attributes: object) -> None:
        self.rec("delete_attribute_list", attributes)

    def create_process(self, command_line: str, **kw: Any) -> w.ProcessInfo:
        self.rec("create_process", command_line, kw)
        return w.ProcessInfo(process=900, thread=904, pid=4242)

    def assign_process_to_job(self, job: int, process: int) -> None:
        self.rec("assign_process_to_job", job, process)

    def resume_thread(self, thread: int) -> None:
        self.rec("resume_thread", thread)

    def wait(self, handle: int, timeout_ms: int) -> bool:
        self.rec("wait", handle, timeout_ms)
        return self.rec.wait_results.pop(0) if self.rec.wait_results else True

    def exit_code(self, process: int) -> int:
        self.rec("exit_code", process)
        return 0

    def terminate_job(self, job: int, exit_code: int) -> None:
        self.rec("terminate_job", job, exit_code)

    def terminate_process(self, process: int, exit_code: int) -> None:
        self.rec("terminate_process", process, exit_code)

    def close_handle(self, handle: int) -> None:
        self.rec("close_handle", handle)

    def open_reader(self, handle: int) -> IO[bytes]:
        self.rec("open_reader", handle)
        # The first reader opened is stdout, the second stderr (the backend's order).
        opened = sum(1 for c in self.rec.calls if c[0] == "open_reader")
        return io.BytesIO(self.rec.stdout if opened == 1 else self.rec.stderr)


class FakeAdvapi32:
    """Records advapi32 calls."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def current_user_sid(self) -> str:
        self.rec("current_user_sid")
        return USER

    def sid_to_string(self, sid: int) -> str:
        self.rec("sid_to_string", sid)
        return PACKAGE

    def free_sid(self, sid: int) -> None:
        self.rec("free_sid", sid)

    def grant(self, path: str, sid: str, mask: int, inheritance: int) -> None:
        self.rec("grant", path, sid, mask, inheritance)

    def revoke(self, path: str, sid: str) -> None:
        self.rec("revoke", path, sid)

    def set_low_integrity_label(self, path: str) -> None:
        self.rec("set_low_integrity_label", path)


class FakeUserenv:
    """Records userenv calls."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def create_profile(self, name: str, display_name: str, description: str) -> int:
        self.rec("create_profile", name)
        return 0x5151

    def derive_sid(self, name: str) -> int:
        self.rec("derive_sid", name)
        return 0x5252

    def delete_profile(self, name: str) -> None:
        self.rec("delete_profile", name)


class FakeBroker:
    """Records the broker's start and stop."""

    def __init__(self, rec: Recorder, name: str, sddl: str, url: str) -> None:
        self.rec = rec
        rec("broker_start", name, sddl, url)

    def stop(self) -> None:
        self.rec("broker_stop")


def make_backend(rec: Recorder) -> AppContainerBackend:
    """A backend wired to the fakes (as if on Windows)."""
    seams = w.Seams(FakeKernel32(rec), FakeAdvapi32(rec), FakeUserenv(rec))
    return AppContainerBackend(
        seams=seams,
        broker_factory=lambda n, s, u: FakeBroker(rec, n, s, u),
        system="win32",
        host_env={"SYSTEMROOT": r"C:\Windows"},
        token=lambda: "ab" * 8,
        pid=77,
    )


def make_request(tmp_path: Path, *, egress: bool = True) -> ProbeRequest:
    """A request with a workspace, one read-only dir and (optionally) a proxy route."""
    return ProbeRequest(
        cell_id="appcontainer-net_denied_host",
        argv=(r"C:\py\python.exe", r"C:\probes\net_denied_host.py", r"C:\cell\task.json"),
        env={"PATH": r"C:\py", "HTTP_PROXY": f"http://127.0.0.1:{SHIM_PORT}"},
        workspace=Path(r"C:\cell\ws"),
        read_only=(Path(r"C:\probes"),),
        egress=EgressRoute(Path("unused.sock"), "http://sandbox-attest:s3cret@127.0.0.1:4242")
        if egress
        else None,
        timeout=2.5,
        cell_dir=tmp_path,
    )


# --- pure functions ---------------------------------------------------------------------


class TestConstants:
    """Win32 constants and structure layouts, pinned to the SDK's values."""

    @pytest.mark.parametrize(
        ("name", "value"),
        [
            ("PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES", 0x00020009),
            ("PROC_THREAD_ATTRIBUTE_HANDLE_LIST", 0x00020002),
            ("CREATE_SUSPENDED", 0x4),
            ("EXTENDED_STARTUPINFO_PRESENT", 0x00080000),
            ("CREATE_UNICODE_ENVIRONMENT", 0x400),
            ("CREATE_NO_WINDOW", 0x08000000),
            ("JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE", 0x2000),
            ("JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS", 9),
            ("HRESULT_ALREADY_EXISTS", 0x800700B7),
            ("ACCESS_READ_EXECUTE", 0x001200A9),
            ("ACCESS_MODIFY", 0x001301BF),
            ("FILE_CREATE_PIPE_INSTANCE", 0x4),
        ],
    )
    def test_value(self, name: str, value: int) -> None:
        """Each constant has the value of the Windows SDK headers."""
        assert getattr(w, name) == value

    def test_creation_flags(self) -> None:
        """The child is created suspended, with STARTUPINFOEX and a Unicode environment."""
        assert CREATION_FLAGS == 0x08080404

    def test_struct_sizes_match_x64_sdk(self) -> None:
        """Every structure has the x64 size of the SDK declaration."""
        assert w.struct_sizes() == {
            "SECURITY_ATTRIBUTES": 24,
            "SID_AND_ATTRIBUTES": 16,
            "SECURITY_CAPABILITIES": 24,
            "STARTUPINFOW": 104,
            "STARTUPINFOEXW": 112,
            "PROCESS_INFORMATION": 24,
            "JOBOBJECT_BASIC_LIMIT_INFORMATION": 64,
            "IO_COUNTERS": 48,
            "JOBOBJECT_EXTENDED_LIMIT_INFORMATION": 144,
            "TRUSTEE_W": 32,
            "EXPLICIT_ACCESS_W": 48,
        }

    def test_limit_flags_offset(self) -> None:
        """LimitFlags sits at offset 16 of the basic limits, as the job API reads it."""
        assert w.JOBOBJECT_BASIC_LIMIT_INFORMATION.LimitFlags.offset == 16
        assert w.STARTUPINFOEXW.lpAttributeList.offset == 104


class TestSddl:
    """The named pipe's security descriptor."""

    def test_exact_descriptor(self) -> None:
        """The user owns the pipe; the package may read/write but not create instances."""
        assert pipe_sddl(USER, PACKAGE) == (
            f"O:{USER}D:P(A;;GA;;;{USER})(A;;0x00120083;;;{PACKAGE})S:(ML;;NW;;;LW)"
        )

    def test_container_lacks_create_instance(self) -> None:
        """The package's mask leaves out FILE_CREATE_PIPE_INSTANCE (= FILE_APPEND_DATA)."""
        ace = next(a for a in pipe_sddl(USER, PACKAGE).split("(") if f";;;{PACKAGE})" in a)
        mask = int(ace.split(";")[2], 16)
        assert mask & w.FILE_CREATE_PIPE_INSTANCE == 0
        assert mask & (w.FILE_READ_DATA | w.FILE_WRITE_DATA) == 0x3

    @pytest.mark.parametrize("bad", ["", "S-1", "S-1-5-21-1)(A;;GA;;;WD", "WD"])
    def test_rejects_non_sids(self, bad: str) -> None:
        """Anything but a string SID is refused, so no ACE can be injected."""
        with pytest.raises(ConfigError, match="not a string SID"):
            pipe_sddl(bad, PACKAGE)

    def test_pipe_and_profile_names(self) -> None:
        """Pipe and profile names are well-formed and bounded."""
        assert pipe_name("0123456789abcdef") == r"\\.\pipe\sandbox-attest-0123456789abcdef"
        with pytest.raises(ConfigError):
            pipe_name("..\\evil")
        name = profile_name("appcontainer-" + "x" * 200, 123456)
        assert len(name) <= 64
        assert name.startswith("sandbox-attest.123456.")


def command_line_to_argv(line: str) -> list[str]:
    """CommandLineToArgvW's rules (post-2008 MSVCRT) for every argument after the first."""
    args: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        current, quoted = [], False
        while i < n and (quoted or line[i] not in " \t"):
            slashes = 0
            while i < n and line[i] == "\\":
                slashes += 1
                i += 1
            if i < n and line[i] == '"':
                current.append("\\" * (slashes // 2))
                if slashes % 2:
                    current.append('"')
                elif quoted and i + 1 < n and line[i + 1] == '"':
                    current.append('"')
                    i += 1
                else:
                    quoted = not quoted
                i += 1
            else:
                current.append("\\" * slashes)
                if i < n and (quoted or line[i] not in " \t"):
                    current.append(line[i])
                    i += 1
        args.append("".join(current))
    return args


class TestCommandLine:
    """argv quoting for CreateProcessW."""

    @pytest.mark.parametrize(
        "arg",
        [
            "plain",
            "with space",
            "",
            'quote"inside',
            "trailing\\",
            "trailing space\\",
            'back\\\\"quote',
            "tab\there",
            "C:\\Program Files\\x\\",
            "ünïcödé",
        ],
    )
    def test_round_trips_through_commandlinetoargvw(self, arg: str) -> None:
        """Every argument survives the trip through CommandLineToArgvW's rules."""
        line = command_line([r"C:\py\python.exe", arg, "next"])
        assert command_line_to_argv(line)[1:] == [arg, "next"]

    def test_exact_quoting(self) -> None:
        """Quoting matches subprocess.list2cmdline exactly."""
        assert command_line([r"C:\py dir\python.exe", 'a"b', "c d\\"]) == (
            '"C:\\py dir\\python.exe" a\\"b "c d\\\\"'
        )

    @pytest.mark.parametrize(
        "argv", [[], ["a\0b"], ['C:\\"q\\python.exe']], ids=["empty", "nul", "quote-in-program"]
    )
    def test_refusals(self, argv: list[str]) -> None:
        """Empty argv, NUL and a quote in the program path are ConfigErrors."""
        with pytest.raises(ConfigError):
            command_line(argv)


class TestEnvironmentBlock:
    """The CREATE_UNICODE_ENVIRONMENT block."""

    def test_sorted_case_insensitively_utf16_double_nul(self) -> None:
        """Entries are sorted by upper-cased name, UTF-16LE, NUL-separated, NUL-terminated."""
        block = environment_block({"b": "2", "A": "1", "_x": "3", "Path": "C:\\é"})
        assert block == "A=1\0b=2\0Path=C:\\é\0_x=3\0\0".encode("utf-16-le")
        assert block.endswith(b"\0\0\0\0")

    def test_empty_block(self) -> None:
        """An empty environment is still two NULs."""
        assert environment_block({}) == b"\0\0\0\0"

    @pytest.mark.parametrize(
        "env",
        [{"A=B": "1"}, {"": "1"}, {"A": "x\0y"}, {"Path": "1", "PATH": "2"}],
        ids=["equals", "empty-name", "nul-value", "case-duplicate"],
    )
    def test_refusals(self, env: dict[str, str]) -> None:
        """Names with '=', empty names, NUL values and case duplicates are refused."""
        with pytest.raises(ConfigError):
            environment_block(env)


# --- the run against the fakes -----------------------------------------------------------


class TestRun:
    """The launch sequence and its cleanup, seen through the recording seams."""

    def test_is_a_backend_with_shim_egress(self) -> None:
        """AppContainerBackend is a Backend whose payload reaches the proxy through a shim."""
        backend = make_backend(Recorder())
        assert isinstance(backend, Backend)
        assert backend.egress_mode == "shim"

    def test_unavailable_off_windows(self, tmp_path: Path) -> None:
        """Off Windows availability is False with the fix, and run() refuses."""
        backend = AppContainerBackend(system="linux")
        avail = backend.availability()
        assert not avail.ok
        assert "only on Windows" in avail.reason
        with pytest.raises(BackendUnavailable):
            backend.run(make_request(tmp_path))

    def test_happy_path_order(self, tmp_path: Path) -> None:
        """Setup, then suspended create -> job -> resume; the job dies; undo runs in reverse."""
        rec = Recorder(stdout=f"{START_MARKER} n1\n{{}}\n".encode())
        rec.stderr = b'shim: token-facts {"is_app_container": true, "integrity_rid": 4096}\n'
        run = make_backend(rec).run(make_request(tmp_path))
        names = rec.names()
        assert names.index("create_profile") < names.index("grant")
        assert names.index("set_low_integrity_label") < names.index("broker_start")
        order = ["create_process", "assign_process_to_job", "resume_thread", "wait"]
        assert [n for n in names if n in order] == order
        assert names.index("terminate_job") > names.index("wait")
        assert names.index("set_kill_on_job_close") < names.index("create_process")
        assert names[-1] == "delete_profile"
        assert names.index("broker_stop") > names.index("terminate_job")
        assert run.started
        assert run.exit_code == 0
        assert not run.timed_out
        assert any("token facts" in n and '"integrity_rid": 4096' in n for n in run.notes)
        assert run.helper_stderr.startswith("shim: token-facts")

    def test_payload_cannot_forge_token_facts(self, tmp_path: Path) -> None:
        """Only the shim's first stderr line counts; a payload's later look-alike is ignored."""
        rec = Recorder(stdout=f"{START_MARKER} n1\n{{}}\n".encode())
        rec.stderr = (
            b'shim: token-facts {"is_app_container": false, "integrity_rid": 8192}\n'
            b'shim: token-facts {"is_app_container": true, "integrity_rid": 4096}\n'
        )
        run = make_backend(rec).run(make_request(tmp_path))
        facts = [n for n in run.notes if n.startswith("token facts")]
        assert facts == ['token facts: {"is_app_container": false, "integrity_rid": 8192}']

    def test_forged_facts_after_other_output_are_ignored(self, tmp_path: Path) -> None:
        """No facts on the first line (the shim printed none): a later one is the payload's."""
        rec = Recorder(stdout=f"{START_MARKER} n1\n{{}}\n".encode())
        rec.stderr = b'warning\nshim: token-facts {"is_app_container": true}\n'
        run = make_backend(rec).run(make_request(tmp_path))
        assert not any(n.startswith("token facts") for n in run.notes)

    def test_no_shim_no_token_facts(self, tmp_path: Path) -> None:
        """Without egress no shim runs, so even stderr's first line is the payload's."""
        rec = Recorder(stdout=f"{START_MARKER} n1\n{{}}\n".encode())
        rec.stderr = b'shim: token-facts {"is_app_container": true}\n'
        run = make_backend(rec).run(make_request(tmp_path, egress=False))
        assert not any(n.startswith("token facts") for n in run.notes)

    def test_stuck_reader_is_noted(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A pipe still open after the job died leaves an empty capture, and a note says why."""
        monkeypatch.setattr(appcontainer, "READER_JOIN_S", 0.2)
        release = threading.Event()

        class Stuck(io.RawIOBase):
            """Delivers the start marker, then blocks like a pipe held open past the job."""

            sent = False

            def readinto(self, buffer: Any) -> int:
                if not self.sent:
                    self.sent = True
                    line = f"{START_MARKER} n1\n".encode()
                    buffer[: len(line)] = line
                    return len(line)
                release.wait(10)
                return 0

        rec = Recorder()
        backend = make_backend(rec)
        monkeypatch.setattr(FakeKernel32, "open_reader", lambda _self, _handle: Stuck())
        try:
            run = backend.run(make_request(tmp_path))
        finally:
            release.set()
        assert run.started  # what arrived before the reader stuck is kept
        assert any(
            "stdout and stderr still being read" in n and "outside the job" in n for n in run.notes
        ), run.notes

    def test_attributes_capabilities_and_handle_list(self, tmp_path: Path) -> None:
        """No capabilities are granted, and only the child's three pipe ends are inheritable."""
        rec = Recorder()
        make_backend(rec).run(make_request(tmp_path))
        updates = {c[1]: c[2] for c in rec.calls if c[0] == "update_attribute"}
        assert updates[0x00020009] == w.SecurityCapabilities(0x5151, ())
        pipes = [c[1:] for c in rec.calls if c[0] == "create_pipe"]
        (in_r, _), (_, out_w), (_, err_w) = pipes
        assert updates[0x00020002] == (in_r, out_w, err_w)
        create = next(c for c in rec.calls if c[0] == "create_process")
        assert create[2]["flags"] == CREATION_FLAGS
        assert create[2]["std_handles"] == (in_r, out_w, err_w)

    def test_command_line_env_and_grants(self, tmp_path: Path) -> None:
        """The shim wraps the payload; SYSTEMROOT is added and noted; grants fit their paths."""
        rec = Recorder()
        run = make_backend(rec).run(make_request(tmp_path))
        create = next(c for c in rec.calls if c[0] == "create_process")
        argv = command_line_to_argv(create[1])
        assert argv[1] == str(SHIM_SCRIPT)
        assert argv[2:7] == [
            "--pipe",
            r"\\.\pipe\sandbox-attest-" + "ab" * 8,
            "--port",
            str(SHIM_PORT),
            "--",
        ]
        assert argv[7:] == list(make_request(tmp_path).argv)
        env = create[2]["environment"].decode("utf-16-le").split("\0")
        assert "SYSTEMROOT=C:\\Windows" in env
        assert not [e for e in env if "s3cret" in e]  # the proxy secret never enters
        assert any("SYSTEMROOT" in n for n in run.notes)
        grants = {c[1]: (c[3], c[4]) for c in rec.calls if c[0] == "grant"}
        assert grants[r"C:\cell\ws"] == (w.ACCESS_MODIFY, w.SUB_CONTAINERS_AND_OBJECTS_INHERIT)
        assert grants[r"C:\probes"] == (w.ACCESS_READ_EXECUTE, 3)
        assert grants[str(SHIM_SCRIPT)] == (w.ACCESS_READ_EXECUTE, w.NO_INHERITANCE)
        assert grants[r"C:\py"] == (w.ACCESS_READ_EXECUTE, 3)  # the interpreter's folder
        revoked = {c[1] for c in rec.calls if c[0] == "revoke"}
        assert revoked == set(grants)
        broker = next(c for c in rec.calls if c[0] == "broker_start")
        assert broker[2] == pipe_sddl(USER, PACKAGE)
        assert broker[3].endswith("@127.0.0.1:4242")

    @pytest.mark.parametrize(
        "failing",
        ["create_process", "assign_process_to_job", "resume_thread", "grant", "create_job_object"],
    )
    def test_cleanup_on_every_failure(self, tmp_path: Path, failing: str) -> None:
        """Whatever fails, every grant, handle, broker and profile is undone exactly once."""
        rec = Recorder(fail={failing: w.Win32Error(failing, 5)})
        with pytest.raises(w.Win32Error, match=failing):
            make_backend(rec).run(make_request(tmp_path))
        names = rec.names()
        assert names[-1] == "delete_profile"
        granted = {c[1] for c in rec.calls if c[0] == "grant"}
        revoked = {c[1] for c in rec.calls if c[0] == "revoke"}
        # A grant that failed changed nothing, so it has nothing to revoke.
        assert revoked == (set() if failing == "grant" else granted)
        assert ("broker_stop" in names) == ("broker_start" in names)
        # Handles the backend received (a failing create returned none).
        made = [h for c in rec.calls if c[0] == "create_pipe" != failing for h in c[1:]]
        made += [c[1] for c in rec.calls if c[0] == "create_job_object" != failing]
        closed = [c[1] for c in rec.calls if c[0] == "close_handle"]
        assert sorted(closed) == sorted(set(closed))  # nothing closed twice
        assert set(made) <= set(closed)
        if failing == "assign_process_to_job":
            assert ("terminate_process", 900, 1) in rec.calls
            assert "resume_thread" not in names
        if "create_process" in names and failing != "create_process":
            assert {900, 904} <= set(closed)
        if failing == "create_process":
            assert "delete_attribute_list" in names

    def test_timeout_terminates_the_job(self, tmp_path: Path) -> None:
        """At the deadline the job is terminated and the run is marked timed out."""
        rec = Recorder(wait_results=[False, True])
        run = make_backend(rec).run(make_request(tmp_path))
        waits = [c for c in rec.calls if c[0] == "wait"]
        assert waits[0][2] == 2500
        job = next(c[1] for c in rec.calls if c[0] == "create_job_object")
        assert ("terminate_job", job, 1) in rec.calls
        assert run.timed_out
        assert run.exit_code is None
        assert "exit_code" not in rec.names()

    def test_existing_profile_is_derived(self, tmp_path: Path) -> None:
        """A profile left by a crashed run is reused via its derived SID, then deleted."""
        rec = Recorder(
            fail={"create_profile": w.Win32Error("CreateAppContainerProfile", -2147024713)}
        )
        make_backend(rec).run(make_request(tmp_path))
        names = rec.names()
        assert names.index("derive_sid") == names.index("create_profile") + 1
        assert names[-1] == "delete_profile"

    def test_no_egress_no_broker(self, tmp_path: Path) -> None:
        """Without an egress route there is no broker and no shim."""
        rec = Recorder()
        make_backend(rec).run(make_request(tmp_path, egress=False))
        assert "broker_start" not in rec.names()
        create = next(c for c in rec.calls if c[0] == "create_process")
        assert "pipe_shim" not in create[1]


# --- broker and shim over real sockets -----------------------------------------------------


class FakeProxy:
    """A loopback TCP server that answers each request head with what it received."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.heads: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                end = buf.index(b"\r\n\r\n") + 4
                head, buf = buf[:end], buf[end:]
                self.heads.append(head)
                if head.startswith(b"CONNECT"):
                    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n" + buf)
                    while data := conn.recv(65536):
                        conn.sendall(data)
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                answer = json.dumps({"head": head.decode(), "body": body.decode()}).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer
                )

    def close(self) -> None:
        stop_accept_loop(self.sock, self.thread)


@pytest.fixture
def proxy() -> Any:
    """A running fake proxy."""
    server = FakeProxy()
    yield server
    server.close()


@pytest.fixture
def broker(tmp_path: Path, proxy: FakeProxy) -> Any:
    """A broker on a unix socket (the POSIX stand-in for the pipe) relaying to the proxy."""
    url = f"http://sandbox-attest:s%40cret@127.0.0.1:{proxy.port}"
    b = PipeBroker(str(tmp_path / "pipe.sock"), "unused on POSIX", url).start()
    yield b
    b.stop()


def read_response(sock: socket.socket) -> dict[str, str]:
    """One JSON response from the fake proxy."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, body = buf.split(b"\r\n\r\n", 1)
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    answer: dict[str, str] = json.loads(body)
    return answer


EXPECTED_AUTH = "Proxy-Authorization: Basic " + base64.b64encode(b"sandbox-attest:s@cret").decode()


class TestBroker:
    """The broker's head rewriting and relaying, over real sockets."""

    def test_rewrite_strips_container_credentials(self) -> None:
        """Our credential replaces any the container sent; the body length is returned."""
        head = (
            b"POST http://a.test/ HTTP/1.1\r\n"
            b"Proxy-Authorization: Basic Zm9v\r\nContent-Length: 3\r\n\r\n"
        )
        new, blind, body = rewrite_head(head, b"Basic QQ==")
        assert (
            new == b"POST http://a.test/ HTTP/1.1\r\n"
            b"Proxy-Authorization: Basic QQ==\r\nContent-Length: 3\r\n\r\n"
        )
        assert (blind, body) == (False, 3)
        assert rewrite_head(b"CONNECT a.test:443 HTTP/1.1\r\n\r\n", b"x")[1] is True

    def test_keep_alive_requests_each_get_credentials(
        self, broker: PipeBroker, proxy: FakeProxy
    ) -> None:
        """Two requests on one connection each reach the proxy with the credential."""
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(broker.address)
            for i in range(2):
                body = f"body{i}".encode()
                client.sendall(
                    b"POST http://allowed.test/ok HTTP/1.1\r\nHost: allowed.test\r\n"
                    b"Proxy-Authorization: Basic forged\r\nContent-Length: %d\r\n\r\n"
                    % len(body)
                    + body
                )
                answer = read_response(client)
                assert EXPECTED_AUTH in answer["head"]
                assert "forged" not in answer["head"]
                assert answer["body"] == body.decode()
        assert len(proxy.heads) == 2

    def test_connect_tunnel_is_byte_exact(self, broker: PipeBroker, proxy: FakeProxy) -> None:
        """After CONNECT, 4 MiB of binary data crosses the tunnel unchanged both ways."""
        payload = os.urandom(4 * 1024 * 1024)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(broker.address)
            client.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
            got = b""
            start = time.monotonic()
            sender = threading.Thread(target=client.sendall, args=(payload,))
            sender.start()
            marker = b"established\r\n\r\n"
            while len(got) < len(payload) + len(b"HTTP/1.1 200 Connection ") + len(marker):
                data = client.recv(1 << 20)
                if not data:
                    break
                got += data
            sender.join()
            elapsed = time.monotonic() - start
        assert got.split(marker, 1)[1] == payload
        assert EXPECTED_AUTH.encode() in proxy.heads[0]
        print(f"tunnel: {len(payload) / elapsed / 1e6:.0f} MB/s echo through broker")

    def test_oversized_head_is_dropped(self, broker: PipeBroker, proxy: FakeProxy) -> None:
        """A head over 64 KiB is never forwarded; the connection closes."""
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(broker.address)
            client.sendall(b"GET http://a.test/ HTTP/1.1\r\nX: " + b"a" * 70000)
            client.settimeout(5)
            assert client.recv(100) == b""
        assert proxy.heads == []

    def test_refuses_non_loopback_or_anonymous_proxy(self, tmp_path: Path) -> None:
        """The broker only relays to a loopback proxy URL that carries credentials."""
        with pytest.raises(ConfigError):
            PipeBroker(str(tmp_path / "a.sock"), "", "http://u:p@proxy.test:1")
        with pytest.raises(ConfigError):
            PipeBroker(str(tmp_path / "b.sock"), "", "http://127.0.0.1:1")


class TestPipeShim:
    """pipe_shim.py as a real process: loopback listener -> pipe (unix socket) -> broker."""

    def test_payload_reaches_proxy_without_the_secret(
        self, tmp_path: Path, broker: PipeBroker
    ) -> None:
        """The request arrives with the credential the payload never held; the exit code passes."""
        port = free_port()
        code = (
            "import json,os,socket,sys\n"
            f"s=socket.create_connection(('127.0.0.1',{port}))\n"
            "s.sendall(b'GET http://allowed.test/ok HTTP/1.1\\r\\n'\n"
            "          b'Host: allowed.test\\r\\n\\r\\n')\n"
            "buf=b''\n"
            "while not buf.endswith(b'}'): buf+=s.recv(65536)\n"
            "print(buf.split(b'\\r\\n\\r\\n',1)[1].decode())\n"
            "leak = any('s@cret' in v or 's%40cret' in v for v in os.environ.values())\n"
            "print('SECRET' if leak else 'CLEAN')\n"
            "sys.exit(3)\n"
        )
        env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
        proc = subprocess.run(
            [sys.executable, str(SHIM_SCRIPT), "--pipe", broker.address, "--port", str(port),
             "--", sys.executable, "-c", code],
            capture_output=True, text=True, timeout=30, env=env, check=False,
        )  # fmt: skip
        assert proc.returncode == 3, proc.stderr
        answer_line, clean = proc.stdout.splitlines()
        assert EXPECTED_AUTH in json.loads(answer_line)["head"]
        assert clean == "CLEAN"

    def test_bind_failure_exits_97_without_running_payload(self, tmp_path: Path) -> None:
        """If the port is taken the shim says so and exits 97 before the payload runs."""
        with socket.create_server(("127.0.0.1", 0)) as taken:
            port = taken.getsockname()[1]
            proc = subprocess.run(
                [sys.executable, str(SHIM_SCRIPT), "--pipe", str(tmp_path / "x"), "--port",
                 str(port), "--", sys.executable, "-c", "print('RAN')"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
        assert proc.returncode == 97
        assert "RAN" not in proc.stdout
        assert proc.stderr.startswith("shim: cannot listen")


def free_port() -> int:
    """A loopback port free right now."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port: int = s.getsockname()[1]
        return port
