"""The Windows AppContainer backend: a capability-less AppContainer token inside a job object.

One run, in order (each step registers its undo before the next starts, so every exit path,
a failing CreateProcessW included, revokes and deletes what was made):

1. create the AppContainer profile, or derive its SID when it already exists;
2. grant the package SID read/execute on the interpreter, the probe dir and the shim, and
   modify on the workspace, whose label becomes Low (AppContainer tokens are Low integrity and
   no-write-up would refuse a Medium-labelled folder);
3. start the pipe broker: a named pipe whose DACL names the user and the package SID, relayed
   into the proxy's loopback TCP port (see `sandbox_attest.world.egress.pipe_broker`);
4. a job object with JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
5. stdio pipes; an attribute list with SECURITY_CAPABILITIES (no capabilities) and a
   HANDLE_LIST naming only the child's three pipe ends, so nothing else is inherited;
6. CreateProcessW suspended -> AssignProcessToJobObject -> ResumeThread: the child cannot run
   an instruction outside the job;
7. wait; at the deadline TerminateJobObject kills the whole tree; after a clean exit too,
   so no orphan survives its cell.

Egress decision (issue 7): the secret never enters the container. The payload's proxy is the
in-container shim on 127.0.0.1:SHIM_PORT (egress mode "shim", like bubblewrap), the shim
bridges to the named pipe, and the host broker adds `Proxy-Authorization` from the proxy
URL's userinfo to each request head before relaying to the proxy's TCP port. Reaching the
pipe is the capability, exactly as reaching the unix socket is elsewhere.

What this module does not do: it does not restore the workspace's integrity label (the
workspace is per cell and discarded), and it has never run on this host: its contract is
pinned by tests against fake seams and proven live on the Windows leg.
"""

from __future__ import annotations

import hashlib
import ntpath
import os
import platform
import re
import secrets
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final, Protocol

import sandbox_attest.backends.win32 as w
from sandbox_attest.backends.base import (
    SHIM_PORT,
    Availability,
    DeclaredClaims,
    EgressMode,
    Identity,
    ProbeRequest,
    ProbeRun,
    program_facts,
)
from sandbox_attest.backends.capture import CappedBuffer
from sandbox_attest.backends.process import Capture, finish_run
from sandbox_attest.errors import BackendUnavailable, ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# No capabilities (so no network but the named pipe to the proxy) and Low integrity on the
# granted dirs only: "proxy-only", reads and writes limited to the granted paths.
CLAIMS: Final = DeclaredClaims(
    network="proxy",
    filesystem="workspace",
    ipc="isolated",
    reads="workspace",
    writes="workspace",
    environment="scrubbed",
    network_cut="proxy-only",
)
SHIM_SCRIPT: Final = Path(__file__).resolve().parent.parent / "world" / "egress" / "pipe_shim.py"
# What the container may do on the pipe: read, write, read attributes, synchronize. Not
# FILE_CREATE_PIPE_INSTANCE (0x4, the same bit as FILE_APPEND_DATA): a container able to
# create its own server instance could answer the next client in the broker's place.
PIPE_CONTAINER_ACCESS: Final = (
    w.FILE_READ_DATA | w.FILE_WRITE_DATA | w.FILE_READ_ATTRIBUTES | w.READ_CONTROL | w.SYNCHRONIZE
)
CREATION_FLAGS: Final = (
    w.CREATE_SUSPENDED
    | w.EXTENDED_STARTUPINFO_PRESENT
    | w.CREATE_UNICODE_ENVIRONMENT
    | w.CREATE_NO_WINDOW
)
# Python on Windows cannot start without SYSTEMROOT (CryptGenRandom, sockets); it is added to
# the declared environment, and the addition is recorded in the run's notes.
REQUIRED_ENV: Final = ("SYSTEMROOT",)
# How long the output readers may take after the job is terminated (the pipes' last bytes).
READER_JOIN_S: Final = 5.0
_SID = re.compile(r"S-1-\d+(-\d+)+")
TOKEN_FACTS_PREFIX: Final = "shim: token-facts "  # noqa: S105  (a log prefix, not a secret)


def profile_name(cell_id: str, pid: int) -> str:
    """The AppContainer profile name for one cell of one harness process (<= 64 chars).

    The pid keeps two harness runs on one host from sharing (and deleting) a profile.
    """
    digest = hashlib.sha256(cell_id.encode()).hexdigest()[:16]
    return f"sandbox-attest.{pid}.{digest}"


def pipe_name(token: str) -> str:
    r"""The broker's pipe path, e.g. `\\.\pipe\sandbox-attest-<token>`.

    The token is random per cell so that no other process can pre-create the name.
    """
    if not re.fullmatch(r"[0-9a-f]{16,64}", token):
        raise ConfigError(f"pipe token {token!r} must be 16-64 lowercase hex digits")
    return rf"\\.\pipe\sandbox-attest-{token}"


def pipe_sddl(user_sid: str, package_sid: str) -> str:
    """The security descriptor of the broker's pipe, as SDDL.

    Owner and full control: the user running the harness. The package SID gets read/write
    only (no create-instance right), and the Low mandatory label lets the Low-integrity
    container write to it (no-write-up would refuse otherwise). `P` protects the DACL from
    inheriting anything broader.

    Raises:
        ConfigError: a SID is not in S-1-... form.
    """
    for what, sid in (("user", user_sid), ("package", package_sid)):
        if not _SID.fullmatch(sid):
            raise ConfigError(f"pipe DACL: {what} SID {sid!r} is not a string SID (S-1-...)")
    return (
        f"O:{user_sid}"
        f"D:P(A;;GA;;;{user_sid})(A;;0x{PIPE_CONTAINER_ACCESS:08X};;;{package_sid})"
        "S:(ML;;NW;;;LW)"
    )


def command_line(argv: tuple[str, ...] | list[str]) -> str:
    """The CreateProcessW command line for argv (`subprocess.list2cmdline` rules).

    Those are the MS C runtime rules that CommandLineToArgvW and Python's own argv parsing
    follow: an argument with a space, a tab or nothing is quoted; backslashes double only
    before a quote. The first token is parsed by CreateProcessW itself, which knows no
    escapes, so argv[0] may not contain a quote.

    Raises:
        ConfigError: empty argv, a NUL anywhere, or a quote in argv[0].
    """
    if not argv:
        raise ConfigError("appcontainer: the payload argv is empty")
    for arg in argv:
        if "\0" in arg:
            raise ConfigError(f"appcontainer: argument {arg!r} contains NUL")
    if '"' in argv[0]:
        raise ConfigError(
            f"appcontainer: program path {argv[0]!r} contains a quote, which CreateProcessW "
            "cannot parse; move the interpreter to a plain path"
        )
    return subprocess.list2cmdline(argv)


def environment_block(env: Mapping[str, str]) -> bytes:
    """The CREATE_UNICODE_ENVIRONMENT block: `NAME=value` entries, sorted, double NUL.

    Windows wants the block sorted by name case-insensitively (by upper case, as the
    CreateProcess docs put it), UTF-16LE, each entry NUL-terminated and one more NUL at the
    end. An empty block still needs its two NULs.

    Raises:
        ConfigError: a name is empty, holds '=' or NUL, a value holds NUL, or two names
            differ only by case (Windows would keep one of them at random).
    """
    seen: dict[str, str] = {}
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ConfigError(f"appcontainer: environment entry {name!r} cannot be passed")
        folded = name.upper()
        if folded in seen:
            raise ConfigError(
                f"appcontainer: environment names {seen[folded]!r} and {name!r} differ only "
                "by case; Windows names are case-insensitive, keep one"
            )
        seen[folded] = name
    entries = [f"{name}={env[name]}\0" for name in sorted(env, key=str.upper)]
    text = "".join(entries) + "\0"
    if not entries:
        text = "\0\0"
    return text.encode("utf-16-le")


class Broker(Protocol):
    """A started pipe broker; stopping it closes the pipe and every relay."""

    def stop(self) -> None:
        """Stop accepting, close every relay, wait for the threads."""
        ...


def shim_token_facts(stderr: str) -> str | None:
    """The token facts the shim printed, or None; only ever from the first stderr line.

    The payload shares the shim's stderr and may print a `shim: token-facts` line of its own
    (is_app_container: true, say). The shim writes and flushes its facts before it starts the
    payload, so the genuine line is the first one, and no payload output can come before it;
    any later line is the payload's and is never taken as evidence. Call this only when the
    shim ran: without it, the first line is the payload's.
    """
    first = stderr.split("\n", 1)[0].rstrip("\r")
    return first.removeprefix(TOKEN_FACTS_PREFIX) if first.startswith(TOKEN_FACTS_PREFIX) else None


def _start_real_broker(name: str, sddl: str, proxy_url: str) -> Broker:
    from sandbox_attest.world.egress.pipe_broker import start_pipe_broker  # noqa: PLC0415  (Windows only)

    broker: Broker = start_pipe_broker(name, sddl, proxy_url)
    return broker


def _drain(stream: IO[bytes], buffer: CappedBuffer) -> None:
    with stream:
        while chunk := stream.read(65536):
            buffer.feed(chunk)  # past the cap too: the child must never block on a full pipe


class AppContainerBackend:
    """Runs probes in a capability-less AppContainer, inside a kill-on-close job object."""

    name = "appcontainer"
    egress_mode: EgressMode = "shim"

    def __init__(
        self,
        *,
        seams: w.Seams | None = None,
        broker_factory: Callable[[str, str, str], Broker] = _start_real_broker,
        system: str = sys.platform,
        host_env: Mapping[str, str] | None = None,
        token: Callable[[], str] = lambda: secrets.token_hex(16),
        pid: int | None = None,
    ) -> None:
        """Configure the backend; every argument exists so tests can drive it on Linux.

        Args:
            seams: the Win32 seams (default: the real ctypes ones, loaded on first run).
            broker_factory: starts the host-side pipe broker.
            system: `sys.platform` of this host.
            host_env: where REQUIRED_ENV values come from (default: os.environ).
            token: the random part of the pipe name.
            pid: the harness pid used in profile names (default: os.getpid()).
        """
        self._seams = seams
        self._broker_factory = broker_factory
        self._system = system
        self._host_env = os.environ if host_env is None else host_env
        self._token = token
        self._pid = os.getpid() if pid is None else pid

    def availability(self) -> Availability:
        """AppContainer needs Windows 8 or later (the Windows leg's runner has it)."""
        if self._system != "win32":
            return Availability(
                ok=False,
                reason=f"AppContainer exists only on Windows (this is {self._system}); run the "
                "appcontainer leg on a Windows runner",
                identity=None,
            )
        identity = Identity(
            name=self.name,
            version=f"Windows {platform.version()}",
            platform=f"{platform.system()} {platform.release()} {platform.machine()}",
            claims=CLAIMS,
            profile={
                "capabilities": [],
                "integrity": "low (AppContainer)",
                "job": "JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE",
                "grants": {"read_execute": "interpreter, probe dir, shim", "modify": "workspace"},
                "pipe_sddl": pipe_sddl("S-1-5-21-0-0-0-1000", "S-1-15-2-0"),
                "egress": self.egress_mode,
                "shim_port": SHIM_PORT,
            },
            executables=program_facts(),
            # The AppContainer token is the separation on Windows; the uid split of
            # sandbox_attest/host/trust.py is Linux-only, and the statement's trust domains say so.
            runs_as="an AppContainer token of the harness's own user",
        )
        return Availability(ok=True, reason="", identity=identity)

    def _seam(self) -> w.Seams:
        if self._seams is None:
            self._seams = w.load_seams()
        return self._seams

    def payload_env(self, request: ProbeRequest) -> tuple[dict[str, str], list[str]]:
        """The payload's environment and notes on what was added to the declared one."""
        env = dict(request.env)
        notes = []
        declared = {k.upper() for k in env}
        for key in REQUIRED_ENV:
            if key not in declared and key in self._host_env:
                env[key] = self._host_env[key]
                notes.append(f"added {key} to the environment (Python needs it on Windows)")
        for key in ("TEMP", "TMP"):
            if key not in declared:
                env[key] = str(request.workspace)
        return env, notes

    def shim_argv(self, request: ProbeRequest, pipe: str) -> list[str]:
        """The in-container command: the shim on 127.0.0.1:SHIM_PORT, then the payload."""
        if request.egress is None:
            return list(request.argv)
        return [
            request.argv[0],
            str(SHIM_SCRIPT),
            "--pipe",
            pipe,
            "--port",
            str(SHIM_PORT),
            "--",
            *request.argv,
        ]

    def grants(self, request: ProbeRequest) -> list[tuple[Path, int, int]]:
        """(path, access mask, inheritance) for every grant, workspace last."""
        # ntpath: argv[0] is a Windows path even when tests build the request on Linux.
        interpreter_dir = Path(ntpath.dirname(request.argv[0]))
        read_exec: list[Path] = [interpreter_dir, Path(sys.base_prefix)]
        read_exec += list(request.read_only)
        if request.egress is not None:
            read_exec.append(SHIM_SCRIPT)
        seen: list[Path] = []
        out: list[tuple[Path, int, int]] = []
        for path in read_exec:
            if path in seen:
                continue
            seen.append(path)
            inherit = (
                w.NO_INHERITANCE if path.suffix == ".py" else w.SUB_CONTAINERS_AND_OBJECTS_INHERIT
            )
            out.append((path, w.ACCESS_READ_EXECUTE, inherit))
        out.append((request.workspace, w.ACCESS_MODIFY, w.SUB_CONTAINERS_AND_OBJECTS_INHERIT))
        return out

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run one probe in a fresh AppContainer; never unconfined.

        Raises:
            BackendUnavailable: not on Windows.
            BackendError: a Win32 call failed before the payload ran (everything made so
                far has been undone by then).
        """
        if self._system != "win32" and self._seams is None:
            raise BackendUnavailable(self.availability().reason)
        seams = self._seam()
        env, notes = self.payload_env(request)
        pipe = pipe_name(self._token())
        argv = self.shim_argv(request, pipe)
        launch = _Launch(command_line(argv), environment_block(env), str(request.workspace))
        name = profile_name(request.cell_id, self._pid)
        start = time.monotonic()
        with ExitStack() as undo:
            sid, package_sid = self._contain(undo, seams, request, name, pipe)
            out, err, exit_code, stalled = _launch_and_wait(
                undo, seams.kernel32, sid, launch, request
            )
        run = finish_run(
            request.cell_id,
            argv,
            exit_code,
            out,
            err,
            timed_out=exit_code is None,
            duration=time.monotonic() - start,
        )
        run.notes.extend(notes)
        if stalled:
            # As process.py does for held-open pipes: an empty capture would otherwise read as
            # "the payload did not start" with nothing saying why.
            run.notes.append(
                f"{' and '.join(stalled)} still being read {READER_JOIN_S:.0f}s after the job "
                "was terminated: something outside the job holds the pipe, and whatever it "
                "writes later is missing from this run"
            )
        facts = shim_token_facts(run.stderr) if request.egress is not None else None
        if facts is not None:
            run.notes.append("token facts: " + facts)
        run.notes.append(f"appcontainer profile {name}, package SID {package_sid}")
        return run

    def _contain(
        self, undo: ExitStack, seams: w.Seams, request: ProbeRequest, name: str, pipe: str
    ) -> tuple[int, str]:
        """Steps 1-3: profile, grants and label, broker; each registers its undo first."""
        adv, uenv = seams.advapi32, seams.userenv
        try:
            sid = uenv.create_profile(name, name, "sandbox-attest probe container")
        except w.Win32Error as exc:
            # A crashed run may have left the profile behind: reuse its SID, delete it after.
            if exc.code & 0xFFFFFFFF != w.HRESULT_ALREADY_EXISTS:
                raise
            sid = uenv.derive_sid(name)
        undo.callback(uenv.delete_profile, name)
        undo.callback(adv.free_sid, sid)
        package_sid = adv.sid_to_string(sid)
        for path, mask, inherit in self.grants(request):
            adv.grant(str(path), package_sid, mask, inherit)
            undo.callback(adv.revoke, str(path), package_sid)
        adv.set_low_integrity_label(str(request.workspace))
        if request.egress is not None:
            sddl = pipe_sddl(adv.current_user_sid(), package_sid)
            broker = self._broker_factory(pipe, sddl, request.egress.tcp_url)
            undo.callback(broker.stop)
        return sid, package_sid


@dataclass(frozen=True)
class _Launch:
    command_line: str
    environment: bytes
    cwd: str


def _launch_and_wait(
    undo: ExitStack, k32: w.Kernel32, sid: int, launch: _Launch, request: ProbeRequest
) -> tuple[Capture, Capture, int | None, list[str]]:
    """Steps 4-7: job, pipes, attributes, suspended create -> job -> resume, wait, kill.

    Returns stdout, stderr, the exit code (None on timeout) and the streams whose reader
    was still running after READER_JOIN_S (their capture holds what arrived until then).
    """
    job = k32.create_job_object()
    undo.callback(k32.close_handle, job)
    k32.set_kill_on_job_close(job)
    closed: set[int] = set()

    def close(handle: int) -> None:
        # Both the happy path and the undo stack close these; Windows reuses handle values,
        # so a second CloseHandle could hit another object.
        if handle not in closed:
            closed.add(handle)
            k32.close_handle(handle)

    (stdin_r, stdin_w), (out_r, out_w), (err_r, err_w) = (k32.create_pipe() for _ in range(3))
    for handle in (stdin_r, stdin_w, out_r, out_w, err_r, err_w):
        undo.callback(close, handle)
    attrs = k32.initialize_attribute_list(2)
    undo.callback(k32.delete_attribute_list, attrs)
    k32.update_attribute(
        attrs, w.PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES, w.SecurityCapabilities(sid, ())
    )
    k32.update_attribute(attrs, w.PROC_THREAD_ATTRIBUTE_HANDLE_LIST, (stdin_r, out_w, err_w))
    proc = k32.create_process(
        launch.command_line,
        environment=launch.environment,
        cwd=launch.cwd,
        flags=CREATION_FLAGS,
        std_handles=(stdin_r, out_w, err_w),
        attributes=attrs,
    )
    undo.callback(k32.close_handle, proc.thread)
    undo.callback(k32.close_handle, proc.process)
    try:
        k32.assign_process_to_job(job, proc.process)
    except BaseException:
        # Still suspended, so it never ran; it must not start outside the job.
        k32.terminate_process(proc.process, 1)
        raise
    k32.resume_thread(proc.thread)
    # Our copies of the child's ends must close, or the readers never see EOF.
    for handle in (stdin_r, stdin_w, out_w, err_w):
        close(handle)
    buffers = (CappedBuffer(), CappedBuffer())
    readers = []
    for handle, buffer in ((out_r, buffers[0]), (err_r, buffers[1])):
        stream = k32.open_reader(handle)
        closed.add(handle)  # the stream owns the handle now and closes it
        reader = threading.Thread(target=_drain, args=(stream, buffer), daemon=True)
        reader.start()
        readers.append(reader)
    exited = k32.wait(proc.process, max(1, int(request.timeout * 1000)))
    # Kill the job on a clean exit too: a payload's orphans must not outlive the cell.
    k32.terminate_job(job, 1)
    if not exited:
        k32.wait(proc.process, 5000)
    exit_code = k32.exit_code(proc.process) if exited else None
    for reader in readers:
        reader.join(timeout=READER_JOIN_S)
    stalled = [n for n, r in zip(("stdout", "stderr"), readers, strict=True) if r.is_alive()]
    return buffers[0].capture(), buffers[1].capture(), exit_code, stalled
