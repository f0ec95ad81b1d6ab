"""Process and kernel probes (issue 8), host side; all five are Linux-only.

Visibility of host processes, privileges, namespace escape, syscall surface and resource
limits.

Two kinds of witness are used. Where the host can see an escape, it does: a harness-planted
"anchor" process records in a host file whenever something ptraces it and carries a secret in
its environment that exists nowhere else; a canary directory and a read-only-bound task
directory get a nonce file only if a namespace escape worked; the direct-egress listener logs
a connection made from the host's network namespace. Where nothing on the host can see it
(the capabilities a process holds, whether a syscall reaches its kernel handler, how far a
fork loop got), the payload's report is the evidence. That is acceptable only in one
direction: a report *against* the sandbox ("I hold CapEff", "keyctl reached the kernel") is
believed, because no payload gains anything by forging one; a refusal is believed only when
the same file run unsandboxed on the host (the host control) shows the attempt succeeding
there, so the refusal means something.

Every payload is safe unsandboxed as root (the control leg runs them so): signal 0 only,
ptrace only PTRACE_SEIZE of the anchor, mounts only inside a private mount namespace, syscalls
only with arguments the kernel rejects, loops bounded by `BOUNDS`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    host_writes_check,
    new_control_nonce,
    run_payload_on_host,
)
from sandbox_attest.catalog.judging import conclude, judge_escape
from sandbox_attest.catalog.records import poll_until
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    PolicyLike,
    ProbeSpec,
    SpecBase,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.claims import Claims, claims_of, unclaimed
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise, lifetime, safefs
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.host.trust import give
from sandbox_attest.verdict import Assessment, Escape, Expectation

__all__ = [
    "BOUNDS",
    "LINUX_ONLY_REASON",
    "SPECS",
    "ProcNamespaceEscape",
    "ProcPrivileges",
    "ProcSyscallSurface",
    "ProcVisibility",
    "ResourceLimits",
    "ResourceLimitsSpec",
    "declared_limits",
]

# For the matrix rows: every probe here reads /proc, Linux namespaces or Linux syscalls.
LINUX_ONLY_REASON: Final = (
    "reads /proc and uses Linux namespaces, ptrace and syscall numbers; "
    "macOS and Windows get their own process probes"
)

SECRET_VAR: Final = disguise.ANCHOR_SECRET_VAR
# The anchor exits on its own after this long, so a crashed run never leaves it behind.
ANCHOR_LIFETIME_S: Final = 300
# The anchor reports on its stdout, a pipe only the harness holds (no file a payload could
# forge): "ready [PORT]" once, "tracer PID" for each new tracer (it polls its own TracerPid;
# the payload holds its seize for 0.3 s), and with a listener "conn LINE" for each line a
# connection sent. With "listen" it first brings up `lo` of its own network namespace (it is
# root there, in a user namespace the payload user owns) and checks its listener once, before
# "ready".
_ANCHOR_CODE: Final = """
import fcntl, socket, struct, sys, time
marker, lifetime, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
server = None
if mode == "listen":
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ifr = fcntl.ioctl(ctl, 0x8913, struct.pack("16sH", b"lo", 0))
    flags = struct.unpack("16sH", ifr[:18])[1]
    fcntl.ioctl(ctl, 0x8914, struct.pack("16sH", b"lo", flags | 1))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(2)
    # The self-test is heard and reported before "ready": whoever waited for "ready" already
    # holds its "conn self-test" line (no window in which the listener looks deaf).
    with socket.create_connection(server.getsockname(), 2) as own:
        own.sendall(b"self-test\\n")
        conn, _ = server.accept()
        with conn:
            conn.settimeout(1)
            print("conn", conn.recv(512).decode("utf-8", "replace").strip(), flush=True)
    server.settimeout(0.02)
    print("ready", server.getsockname()[1], flush=True)
else:
    print("ready", flush=True)
seen = set()
end = time.monotonic() + lifetime
while time.monotonic() < end:
    try:
        with open("/proc/self/status") as fh:
            tracer = [l.split()[1] for l in fh if l.startswith("TracerPid:")][0]
    except (OSError, IndexError):
        tracer = "0"
    if tracer != "0" and tracer not in seen:
        seen.add(tracer)
        print("tracer", tracer, flush=True)
    if server is None:
        time.sleep(0.02)
        continue
    try:
        conn, _ = server.accept()
    except OSError:
        continue
    with conn:
        conn.settimeout(1)
        try:
            data = conn.recv(512)
        except OSError:
            data = b""
    print("conn", data.decode("utf-8", "replace").strip().replace("\\n", " "), flush=True)
"""
# Seconds the harness waits for the anchor's "ready" line.
ANCHOR_READY_S: Final = 10.0
# The anchor of proc_namespace_escape lives in namespaces of its own, owned by the payload
# user: the one kind of "other process's namespace" an unprivileged user can join when
# nothing confines it (setns needs CAP_SYS_ADMIN over the target's user namespace, which the
# payload user holds over the ones it created and never over the host's). A sandbox must keep
# it from that as from the host's own.
_ANCHOR_NAMESPACES: Final = ("unshare", "--user", "--map-root-user", "--mount", "--net", "--")


# The runner's task dir under cell_dir (run.runner `inputs`), bound read-only into every
# sandbox: the place the remount attempt writes to. This probe hands it to the payload user,
# so that on an open host nothing but the read-only bind stands between the two.
TASK_DIR: Final = "input"


def _confines_anything(policy: PolicyLike) -> bool:
    return (policy.network, policy.filesystem, policy.ipc) != ("open", "open", "open")


# ---------------------------------------------------------------------------------------------
# The anchor: a harmless host process carrying the nonce, started per cell.


@dataclass
class _Anchor:
    process: subprocess.Popen[bytes]
    marker: str
    secret: str
    port: int | None = None
    lines: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def read_lines(self) -> None:
        """Collect the anchor's report lines until its stdout closes (a daemon thread)."""
        assert self.process.stdout is not None  # noqa: S101  (started with stdout=PIPE)
        for raw in self.process.stdout:
            with self.lock:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def reported(self, kind: str) -> list[str]:
        """The values of every "<kind> VALUE" line the anchor printed so far."""
        with self.lock:
            return [ln.split(" ", 1)[1] for ln in self.lines if ln.startswith(kind + " ")]

    def tracers(self) -> list[str]:
        return self.reported("tracer")

    def ready(self) -> str | None:
        """None until the anchor said "ready"; then what followed it ("" or its port)."""
        with self.lock:
            for line in self.lines:
                if line == "ready" or line.startswith("ready "):
                    return line[len("ready ") :]
        return None


class _AnchoredSpec(SpecBase):
    """A spec that starts one anchor process per cell in `prepare` and kills it in `cleanup`."""

    def __init__(self) -> None:
        self._anchors: dict[str, _Anchor] = {}
        self._lock = threading.Lock()

    def _start_anchor(self, ctx: CellContext, *, own_namespaces: bool = False) -> _Anchor:
        """Start this cell's anchor as the payload user; wait for its "ready" line.

        Args:
            ctx: the cell.
            own_namespaces: start it in a new user, mount and network namespace (owned by
                the payload user) with a listener on its own loopback.

        Raises:
            FixtureError: it could not start or did not report ready in time.
        """
        directory = ctx.cell_dir / "anchor"
        directory.mkdir(parents=True, exist_ok=True)
        marker = f"{disguise.ANCHOR_MARKER}{ctx.nonce}"
        env = {"PATH": "/usr/bin:/bin", SECRET_VAR: secrets.token_hex(16)}
        mode = "listen" if own_namespaces else "plain"
        python = payload_interpreter(ctx.user).path  # one the payload user can run
        argv = [python, "-c", _ANCHOR_CODE, marker, str(ANCHOR_LIFETIME_S), mode]
        if own_namespaces:
            argv = [*_ANCHOR_NAMESPACES, *argv]
        try:
            process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=directory,
                **(ctx.user.popen_kwargs() if ctx.user is not None else {}),
                # Its lifetime is 300 s: without this a killed harness leaves it running.
                **lifetime.popen_kwargs(),
            )
        except OSError as exc:
            raise FixtureError(
                f"could not start the anchor process for {ctx.probe} ({exc}); "
                f"is {argv[0]} runnable?"
            ) from exc
        anchor = _Anchor(process, marker, env[SECRET_VAR])
        anchor.reader = threading.Thread(
            target=anchor.read_lines, name="anchor-reader", daemon=True
        )
        anchor.reader.start()
        with self._lock:
            self._anchors[ctx.nonce] = anchor
        deadline = time.monotonic() + ANCHOR_READY_S
        while (ready := anchor.ready()) is None and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(0.01)
        if ready is None:
            why = f"exit {process.poll()}" if process.poll() is not None else "no ready line"
            hint = (
                "; unprivileged user namespaces must be allowed (sysctl "
                "user.max_user_namespaces > 0) and util-linux's unshare installed"
                if own_namespaces
                else ""
            )
            raise FixtureError(f"the anchor process for {ctx.probe} did not start ({why}){hint}")
        if ready.isdigit():
            anchor.port = int(ready)
        return anchor

    def _anchor(self, ctx: CellContext) -> _Anchor | None:
        with self._lock:
            return self._anchors.get(ctx.nonce)

    def _anchor_checks(self, ctx: CellContext) -> list[dict[str, Any]]:
        """The anchor is alive and the host sees it: marker, secret, kill(pid, 0)."""
        anchor = self._anchor(ctx)
        if anchor is None:
            return [host_check("anchor started", ok=False, detail="prepare() did not run")]

        def alive() -> dict[str, Any]:
            os.kill(anchor.pid, 0)  # signal 0: the host's own existence check
            cmdline = Path(f"/proc/{anchor.pid}/cmdline").read_bytes().split(b"\0")
            ok = anchor.process.poll() is None and anchor.marker.encode() in cmdline
            return host_check("host sees the anchor", ok, f"pid {anchor.pid}")

        def environ() -> dict[str, Any]:
            env = Path(f"/proc/{anchor.pid}/environ").read_bytes().split(b"\0")
            ok = f"{SECRET_VAR}={anchor.secret}".encode() in env
            return host_check("host reads the anchor's environ", ok, f"{len(env)} variables")

        return [
            guarded_check("host sees the anchor", alive),
            guarded_check("host reads environ", environ),
        ]

    def cleanup(self, ctx: CellContext) -> None:
        """Kill this cell's anchor (only that process) and reap it."""
        with self._lock:
            anchor = self._anchors.pop(ctx.nonce, None)
        if anchor is None:
            return
        anchor.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL is not ignorable
            anchor.process.wait(timeout=HOST_TIMEOUT_S)
        # Its stdout reaches EOF with it; the reader ends, then the pipe is closed.
        if anchor.reader is not None:
            anchor.reader.join(timeout=HOST_TIMEOUT_S)
        if anchor.process.stdout is not None:
            anchor.process.stdout.close()


# ---------------------------------------------------------------------------------------------
# Host controls that run the payload file itself, unsandboxed.


def _run_on_host(ctx: CellContext, targets: dict[str, Any]) -> dict[str, Any]:
    """The probe's own payload run unsandboxed on the host (`run_payload_on_host`): its report."""
    return run_payload_on_host(ctx, targets)[1]


def _baseline_control(ctx: CellContext, targets: dict[str, Any]) -> dict[str, Any]:
    """The host control of a self-reporting probe: the payload's own baseline on the host."""
    nonce = new_control_nonce()
    try:
        baseline = _run_on_host(ctx, targets)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        control = control_record(
            nonce, [host_check("host baseline ran", ok=False, detail=repr(exc))]
        )
        control["baseline"] = None
        return control
    inside = attempts_by_role(baseline, "control")
    # With no control attempt the baseline broke before its controls: say what it did report
    # (a crash is its `probe` error attempt), so the cause is in the evidence, not guessed.
    detail = (
        attempts_summary(inside)
        if inside
        else "no control attempt; it reported: "
        + (attempts_summary(list(baseline.get("attempts") or [])) or "nothing")
    )
    control = control_record(
        nonce, [host_check("host baseline ran", all_succeeded(inside), detail)]
    )
    control["baseline"] = baseline
    return control


def _assessed(
    escape: Escape,
    observed: Any,
    reasons: list[str],
    report: dict[str, Any],
    control: dict[str, Any],
    witness: dict[str, Any],
) -> Assessment:
    """The shared ending: the payload's own controls and the host control, via `conclude`."""
    inside = attempts_by_role(report, "control")
    return conclude(
        escape,
        observed,
        reasons,
        inside_ok=all_succeeded(inside),
        inside_failed=f"in-sandbox control failed: {attempts_summary(inside)}",
        host_control=control,
        host_failed="host control failed",
        witness=witness,
        controls={"inside": inside, "host": control},
    )


def _self_reported(observed: str, reasons: list[str]) -> Escape:
    """The escape of a probe no host witness can see: believed against the sandbox only."""
    if observed == "succeeded":
        reasons.append(
            "the payload reports it (no host witness exists; a report against the "
            "sandbox is believed)"
        )
        return "escaped"
    if observed == "refused":
        return "refused"
    return "undecided"  # decide() words it: "the attempt could not be made"


# ---------------------------------------------------------------------------------------------
# The specs.


class ProcVisibility(_AnchoredSpec):
    """Find, read, signal (0) and ptrace a harness-planted host process."""

    id = "proc_visibility"
    area = "proc"
    host_readings = ("anchor process log",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Two controls on its own process, four attempts at the anchor."""
        del task
        return AttemptTable(
            required=attempts_of(
                "scan-own", "kill-0-self", "scan-proc", "read-environ", "kill-0", "ptrace-seize"
            )
        )

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied when ipc is "isolated": that claim includes no view of host processes."""
        return "denied" if policy.ipc == "isolated" else "allowed"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the anchor; the payload gets its marker and pid, never its secret."""
        anchor = self._start_anchor(ctx)
        return {"marker": anchor.marker, "anchor_pid": anchor.pid}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host sees the anchor by its marker, reads its secret and signals it (0)."""
        return control_record(new_control_nonce(), self._anchor_checks(ctx))

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The anchor's tracer log, its secret echoed, or its host pid found is an escape."""
        del witness  # the anchor is this probe's witness
        anchor = self._anchor(ctx)
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        facts = report.get("facts", {})
        tracers = anchor.tracers() if anchor else []
        secret_read = anchor is not None and facts.get("environ_secret") == anchor.secret
        found = [p for p in facts.get("found_pids", []) if isinstance(p, int)]
        pid_found = anchor is not None and anchor.pid in found
        reasons = [
            (
                f"anchor pid {anchor.pid if anchor else '?'}: "
                f"traced by {', '.join(tracers) or 'nobody'}, "
                f"secret echoed: {secret_read}, host pid found: {pid_found}"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(observed, bool(tracers or secret_read or pid_found), None, reasons)
        shared = _sharing(host_processes(ctx), "pid")
        if shared and self.expectation(ctx.policy) == "denied":
            # The host's own reading: a process of the cell in the harness's pid namespace
            # sees every host process, whatever its report says it found.
            escape = "escaped"
            reasons.insert(
                0,
                f"{claims_of(ctx.policy).phrase('ipc')}; the host sees {shared} in the "
                "harness's pid namespace (shared_with_harness: ['pid'])",
            )
        return _assessed(
            escape,
            observed,
            reasons,
            report,
            control,
            {
                "tracers": tracers,
                "secret_echoed": secret_read,
                "pid_found": pid_found,
                "pid_namespace_shared": shared,
            },
        )


class _BaselineSpec(SpecBase):
    """A self-reporting probe: nothing to plant, and its host control is its own baseline.

    The payload only reads its own state or calls with arguments the kernel rejects, so there
    is no target; the host control runs the same file unsandboxed (`_baseline_control`).
    """

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Nothing to plant."""
        del ctx
        return {}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The same file's attempts, unsandboxed on the host."""
        return _baseline_control(ctx, {})


def _named(process: dict[str, Any]) -> str:
    """A host reading's process in words: "host pid 123 (python3)"."""
    comm = process.get("comm")
    return f"host pid {process.get('pid', '?')}" + (f" ({comm})" if comm else "")


def _sharing(processes: list[dict[str, Any]], kind: str) -> str:
    """The judged processes the host saw in the harness's own `kind` namespace, or ""."""
    return ", ".join(_named(p) for p in processes if kind in (p.get("shared_with_harness") or []))


def _without_no_new_privs(processes: list[dict[str, Any]]) -> str:
    """The judged processes whose status the host read with NoNewPrivs unset, or ""."""
    return ", ".join(
        f"{_named(p)} NoNewPrivs={(p.get('status') or {}).get('NoNewPrivs')}"
        for p in processes
        if (p.get("status") or {}) and (p.get("status") or {}).get("NoNewPrivs") != "1"
    )


def _with_capabilities(processes: list[dict[str, Any]]) -> str:
    """The payload processes the host saw holding effective capabilities, in words; or ""."""
    held = []
    for process in processes:
        cap_eff = str((process.get("status") or {}).get("CapEff", ""))
        with contextlib.suppress(ValueError):
            if int(cap_eff, 16):
                held.append(f"{_named(process)} CapEff={cap_eff}")
    return ", ".join(held)


def _seccomp_filters(status: dict[str, Any]) -> int:
    """How many seccomp filters the host sees on a process (mode 2 only); 0 without any."""
    if str(status.get("Seccomp")) != "2":
        return 0
    try:
        return int(str(status.get("Seccomp_filters", "1")))
    except ValueError:
        return 1


# Raw syscalls only a seccomp filter refuses where the host baseline reaches them (the probe
# calls them with arguments the kernel rejects, so no capability or namespace is involved).
# TIOCSTI and the socket families are left out: a new session or an LSM refuses those too.
SECCOMP_ONLY: Final = frozenset({"io_uring_setup", "keyctl", "bpf"})


def _refused_without_filter(ctx: CellContext, refused: list[dict[str, Any]]) -> str:
    """Why refusals of seccomp-only calls cannot be the kernel's, or "" when they can be."""
    names = sorted(str(a.get("what")) for a in refused if a.get("what") in SECCOMP_ONLY)
    bare = [p for p in host_processes(ctx) if _seccomp_filters(p.get("status") or {}) < 1]
    if not names or not bare:
        return ""
    pids = ", ".join(
        f"{p.get('pid', '?')} (Seccomp {(p.get('status') or {}).get('Seccomp', '?')})" for p in bare
    )
    return (
        f"the report says {', '.join(names)} were refused, calls the host baseline reaches, "
        f"but the host sees no seccomp filter on the payload (host pid {pids}): nothing could "
        "have refused them, so the report is not what the kernel said"
    )


class ProcPrivileges(_BaselineSpec):
    """Capabilities held, and setuid elevation possible, inside the sandbox."""

    id = "proc_privileges"
    area = "proc"

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host's read of the payload's status: no effective capability, NoNewPrivs set."""
        del report
        processes = host_processes(ctx)
        statuses = [p.get("status") or {} for p in processes]
        if not statuses or _with_capabilities(processes):
            return []
        if any(s.get("NoNewPrivs") != "1" for s in statuses):
            return []
        return ["host view: CapEff 0", "host view: NoNewPrivs 1"]

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Reading its status (the control), then three attempts; none without the status."""
        del task
        later = attempts_of("effective-capabilities", "setuid-elevation", "writable-root-path")
        return AttemptTable(required=later | {"read-status"}, excuses=(("read-status", later),))

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied wherever anything is confined: privilege can undo any confinement."""
        return "denied" if _confines_anything(policy) else "allowed"

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The same read, by the same file, unsandboxed on the host, must find CapEff there.

        The host need not hold a capability itself (it usually runs unprivileged): the
        baseline shows the payload's reading works, so "no capability" inside is a reading,
        not a status file the payload failed to parse.
        """
        control = super().host_control(ctx)
        status = ((control.get("baseline") or {}).get("facts") or {}).get("status") or {}
        read = host_check(
            "host baseline read its credentials",
            "CapEff" in status,
            f"CapEff={status.get('CapEff')} CapBnd={status.get('CapBnd')}",
        )
        return control_record(control["nonce"], [*control["checks"], read]) | {
            "baseline": control.get("baseline")
        }

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any effective capability or a usable setuid route is an escape (self-reported).

        The host's own read of the payload's status wins over the report: effective
        capabilities the host sees while the report says none are an escape.
        """
        del witness
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        facts = report.get("facts", {})
        status = facts.get("status", {})
        reasons = [
            f"payload: {attempts_summary(escapes)}",
            (
                f"CapEff={status.get('CapEff')} CapBnd={status.get('CapBnd')} "
                f"NoNewPrivs={status.get('NoNewPrivs')} Seccomp={status.get('Seccomp')} "
                f"uid_map={facts.get('uid_map')}"
            ),
        ]
        escape = _self_reported(observed, reasons)
        # Every judged process of the cell (sandbox_attest/run/hostview.py), not only the one
        # carrying the launcher's name: the worst one decides.
        held = _with_capabilities(host_processes(ctx))
        if held:
            escape = "escaped"
            reasons.insert(0, f"the host sees effective capabilities on the payload: {held}")
        unset = _without_no_new_privs(host_processes(ctx))
        if unset and str(status.get("NoNewPrivs")) == "1":
            # The report speaks for one process; the kernel shows another of the cell free to
            # gain privileges through a setuid program: the report is not the cell's state.
            escape = "escaped"
            reasons.insert(
                0,
                f"the report says NoNewPrivs 1, but the host sees a process of the cell "
                f"without it: {unset}",
            )
        claims = claims_of(ctx.policy)
        if claims.runs_as:
            broke, seen = _runs_as_reading(ctx, claims)
            if broke:
                escape = "escaped"
                reasons.insert(0, broke)
            elif seen:
                reasons.append(f"{claims.phrase('runs_as')}: the host sees {seen}")
        baseline = control.get("baseline") or {}
        host_status = baseline.get("facts", {}).get("status", {})
        return _assessed(
            escape,
            observed,
            reasons,
            report,
            control,
            {"payload_status": status, "host_status": host_status},
        )


def _wanted_uid(ctx: CellContext, claim: str) -> int | None:
    """The one uid a `runs_as` claim names (None: "non-root", or a name unknown here)."""
    if claim == "payload-user":
        return ctx.user.uid if ctx.user is not None else os.geteuid()
    if claim.isdigit():
        return int(claim)
    if claim == "non-root":
        return None
    import pwd  # noqa: PLC0415  (POSIX only, and only a named user needs it)

    try:
        return pwd.getpwnam(claim).pw_uid
    except KeyError:
        return None


def _runs_as_reading(ctx: CellContext, claims: Claims) -> tuple[str, str]:
    """(how the host's uid reading breaks the `runs_as` claim, or ""; what it saw, or "").

    The uids come from /proc/<pid>/status on the host (real, effective, saved, fs), read at
    the rendezvous for every payload process: the report's own uid_map is not believed.
    """
    claim = claims.runs_as
    wanted = _wanted_uid(ctx, claim)
    if wanted is None and claim != "non-root":
        return f"{claims.phrase('runs_as')}, a user this host does not know", ""
    seen = []
    for process in host_processes(ctx):
        pid = process.get("pid", "?")
        text = str((process.get("status") or {}).get("Uid", ""))
        uids = {int(u) for u in text.split() if u.isdigit()}
        if not uids:
            continue
        seen.append(f"host pid {pid} with uids {text}")
        wrong = 0 in uids if wanted is None else uids != {wanted}
        if wrong:
            return (
                f"{claims.phrase('runs_as')}; the host sees the payload (host pid {pid}) "
                f"run with uids {text} (real, effective, saved, fs)"
            ), ""
    return "", "; ".join(seen)


# The reason a proc_namespace_escape cell is NOT_APPLICABLE where its control cannot work: the
# words a policy that requires it then fails with.
NEEDS_ROOT: Final = "needs root for its setns control; run as root"
# The control's own steps, run once as the payload user: join the user, mount and network
# namespaces of a process that user created (ctypes: os.setns is Python 3.12+).
_SETNS_CHECK: Final = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
for kind, flag in (("user", 0x10000000), ("mnt", 0x00020000), ("net", 0x40000000)):
    try:
        fd = os.open("/proc/%d/ns/%s" % (pid, kind), os.O_RDONLY)
    except OSError as exc:
        print("open(/proc/%d/ns/%s): %s" % (pid, kind, errno.errorcode.get(exc.errno, "?")))
        sys.exit(0)
    if libc.setns(fd, flag) != 0:
        print("setns(%s): %s" % (kind, errno.errorcode.get(ctypes.get_errno(), "?")))
        sys.exit(0)
print("ok")
"""


@functools.cache
def setns_control_refused() -> str | None:
    """Why this host refuses proc_namespace_escape's setns control, or None when it works.

    The control is an unprivileged user joining namespaces it created itself (see
    `_ANCHOR_NAMESPACES`). Where the kernel lets it, as on Debian or Ubuntu with
    `kernel.apparmor_restrict_unprivileged_userns=0`, the probe runs as root or not. Where it
    refuses (AppArmor's restriction on Ubuntu 24.04 leaves such a namespace without
    capabilities: setns fails EPERM) nothing could see the escape succeed, so the cells are
    NOT_APPLICABLE with the reason instead of INCONCLUSIVE. Checked once per process, with
    the control's own steps, as the user that runs the control.
    """
    if sys.platform != "linux":
        return None
    from sandbox_attest.host.trust import payload_user  # noqa: PLC0415  (only where the probe runs)

    user = payload_user()
    as_user = user.popen_kwargs() if user is not None else {}
    anchor_code = "import sys, time; print('ready', flush=True); time.sleep(30)"
    try:
        anchor = subprocess.Popen(
            [*_ANCHOR_NAMESPACES, payload_interpreter(user).path, "-c", anchor_code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **as_user,
            **lifetime.popen_kwargs(),
        )
    except OSError as exc:
        return f"{NEEDS_ROOT} (here {_ANCHOR_NAMESPACES[0]} did not start: {exc})"
    try:
        assert anchor.stdout is not None  # noqa: S101  (stdout=PIPE above)
        if anchor.stdout.readline().strip() != b"ready":
            assert anchor.stderr is not None  # noqa: S101  (stderr=PIPE above)
            said = anchor.stderr.read(400).decode(errors="replace").strip()
            return f"{NEEDS_ROOT} (here an unprivileged user namespace could not be made: {said})"
        check = subprocess.run(
            [payload_interpreter(user).path, "-c", _SETNS_CHECK, str(anchor.pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            **as_user,
        )
        said = check.stdout.strip() or check.stderr.strip()[-300:]
        return None if said == "ok" else f"{NEEDS_ROOT} (here {said})"
    finally:
        anchor.kill()
        anchor.wait(timeout=10)
        for stream in (anchor.stdout, anchor.stderr):
            if stream is not None:
                stream.close()


class ProcNamespaceEscape(_AnchoredSpec):
    """setns into the host's namespaces; mount power in a private namespace."""

    id = "proc_namespace_escape"
    area = "proc"
    host_readings = ("anchor's canary dir and listener",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Own ids and a fork, setns into the anchor, unshare; the mounts only once inside.

        The forked children report a failure of their own as one `child` error.
        """
        del task
        inner = ("make-private", "abort", "mount-tmpfs", "pivot-root")
        optional = {f"inner:{step}:{how}" for step in inner for how in ("mnt", "userns")}
        optional |= {"remount-rw:mnt", "remount-rw:userns"}
        forked = attempts_of(
            "fork-child", "setns-mnt", "setns-net", "inner:unshare-mnt", "inner:unshare-userns"
        )
        return AttemptTable(
            required=forked | {"read-own-ns"},
            optional=frozenset(optional),
            excuses=(("child", forked),),
        )

    def not_applicable_here(self) -> str | None:
        """Why this probe cannot be judged on this host (see `setns_control_refused`)."""
        return setns_control_refused()

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied wherever anything is confined: a joined host namespace undoes all of it."""
        return "denied" if _confines_anything(policy) else "allowed"

    @staticmethod
    def canary_dir(ctx: CellContext) -> Path:
        """A host-only directory (never bound into a sandbox) the setns-mnt child writes to."""
        return ctx.cell_dir / disguise.NS_CANARY_DIR

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the anchor in its own namespaces, plant the canary dir, name its listener."""
        anchor = self._start_anchor(ctx, own_namespaces=True)
        self.canary_dir(ctx).mkdir(parents=True, exist_ok=True)
        # Writable to the payload user, so the only thing between the payload and this dir
        # is whether it can see the host's mount tree (the setns-mnt escape), not permissions;
        # the same for the task dir and the read-only bind a remount must undo.
        give(self.canary_dir(ctx), ctx.user)
        give(ctx.cell_dir / TASK_DIR, ctx.user)
        return {
            "marker": anchor.marker,
            "anchor_pid": anchor.pid,
            "canary_dir": str(self.canary_dir(ctx)),
            # The anchor's own loopback listener: reachable only from inside its namespace.
            "listener": f"127.0.0.1:{anchor.port}",
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The anchor is in namespaces of its own; the canary dir and its listener work."""
        nonce = new_control_nonce()
        checks = self._anchor_checks(ctx)
        anchor = self._anchor(ctx)

        def namespaces() -> dict[str, Any]:
            pid = anchor.pid if anchor else 0
            kinds = ("user", "mnt", "net")
            ours = [str(Path(f"/proc/self/ns/{k}").readlink()) for k in kinds]
            theirs = [str(Path(f"/proc/{pid}/ns/{k}").readlink()) for k in kinds]
            owner = Path(f"/proc/{pid}").stat().st_uid
            want = ctx.user.uid if ctx.user is not None else os.geteuid()
            ok = all(a != b for a, b in zip(ours, theirs, strict=True)) and owner == want
            return host_check(
                "anchor is in user/mnt/net namespaces of the payload user's",
                ok,
                f"{theirs} owned by uid {owner}",
            )

        def canary() -> dict[str, Any]:
            # Through the dir's descriptor (sandbox_attest/host/safefs.py): the payload user owns
            # NS_CANARY_DIR and may have planted a link at any name in it.
            name = f"{nonce}.host"
            try:
                with safefs.open_dir(self.canary_dir(ctx)) as directory:
                    directory.create_file(name, nonce, 0o600)
                    directory.unlink(name)
            except safefs.UnsafePathError as exc:
                return host_check("host writes the canary dir", ok=False, detail=str(exc))
            return host_check(
                "host writes the canary dir", ok=True, detail=str(self.canary_dir(ctx))
            )

        def listener() -> dict[str, Any]:
            heard = anchor.reported("conn") if anchor else []
            return host_check(
                "anchor's listener heard its self-test", "self-test" in heard, f"{heard[:3]}"
            )

        checks += [
            guarded_check("anchor namespaces", namespaces),
            guarded_check("host writes the canary dir", canary),
            guarded_check("anchor's listener", listener),
        ]
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A nonce file in the canary or task dir, or a setns-net connection, is an escape."""
        del witness  # the anchor's own listener witnesses setns-net, not the world's
        escapes = [
            a
            for a in attempts_by_role(report, "escape")
            if not str(a.get("what")).startswith("inner:")
        ]
        inner = [
            a for a in attempts_by_role(report, "escape") if str(a.get("what")).startswith("inner:")
        ]
        observed = observed_outcome(escapes)
        mnt_file = self.canary_dir(ctx) / f"{ctx.nonce}.setns-mnt"
        # Only the task dir counts: a sandbox binds it read-only, while the workspace beside
        # it is the payload's to write, so a nonce file there proves nothing.
        remount_file = ctx.cell_dir / TASK_DIR / f"{ctx.nonce}.remount"
        remounts = [str(remount_file)] if remount_file.exists() else []
        anchor = self._anchor(ctx)
        sent = f"nonce={ctx.nonce} via=setns-net"
        claimed = any(
            a.get("what") == "setns-net" and a.get("outcome") == "succeeded" for a in escapes
        )

        def hits() -> list[str]:
            heard = anchor.reported("conn") if anchor is not None else []
            return [line for line in heard if sent in line]

        # The anchor prints what it heard a moment after the payload sent it: wait for it when
        # the payload says it got there, as every witness read does.
        net_hits = poll_until(hits, bool) if claimed else hits()
        seen = mnt_file.exists() or bool(remounts) or bool(net_hits)
        reasons = [
            (
                f"host saw: setns-mnt file {mnt_file.exists()}, remount files {len(remounts)}, "
                f"setns-net connections heard by the anchor {len(net_hits)}"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(observed, seen, None, reasons)
        if escape == "disagree" and self.expectation(ctx.policy) == "denied":
            # setns into the verified anchor's namespace, or a remount of the read-only task
            # dir, reported with no file to show for it: a report against the sandbox is
            # believed (module docstring). Not on the open leg, which must show its witness.
            reasons.append("believed: a report against the sandbox")
            escape = "escaped"
        powers = [str(a.get("what")) for a in inner if a.get("outcome") == "succeeded"]
        if powers:
            reasons.append(f"exposure, not an escape (private to the payload): {', '.join(powers)}")
        return _assessed(
            escape,
            observed,
            reasons,
            report,
            control,
            {
                "setns_mnt_file": mnt_file.exists(),
                "remount_files": remounts,
                "setns_net": net_hits,
                "inner": inner,
            },
        )


class ProcSyscallSurface(_BaselineSpec):
    """io_uring, keyctl, bpf, TIOCSTI and vsock/netlink/packet sockets, with bad arguments."""

    id = "proc_syscall_surface"
    area = "proc"

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """None: a seccomp filter the host sees shows that one exists, not what it refuses.

        So a filter backs no PASS (a wrapper could filter nothing of these and rewrite the
        report), and no filter at all rules the refusals out (`assess`: FAIL). Across a
        command wrapper this probe's PASS is therefore INCONCLUSIVE at best.
        """
        del ctx, report
        return []

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The getpid control, four raw syscalls and three socket families.

        Where the payload has no syscall table for its machine it says so in one `syscalls`
        error instead of the four calls.
        """
        del task
        calls = attempts_of("io_uring_setup", "keyctl", "bpf", "ioctl-tiocsti")
        families = attempts_of("socket-vsock", "socket-netlink", "socket-packet")
        return AttemptTable(required=calls | families | {"getpid"}, excuses=(("syscalls", calls),))

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied under a filtered-syscalls claim (the default where ipc is "isolated").

        Keyrings are per-uid across namespaces, vsock talks to the hypervisor, TIOCSTI types
        into a terminal: each is a channel to the host that isolation has to close. A kernel
        interface reached at all is also kernel attack surface the payload shares with the host.
        """
        return "denied" if claims_of(policy).syscalls == "filtered" else "allowed"

    def not_claimed(self, policy: PolicyLike) -> str | None:
        """NOT_APPLICABLE under an open syscall surface: this probe tests that claim alone."""
        return unclaimed(self.id, claims_of(policy))

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A call the host baseline reaches and the payload reaches too is an escape.

        So is a refusal the host's own reading rules out: a raw syscall the baseline reaches,
        reported refused while the host sees no seccomp filter on the payload.
        """
        del witness
        baseline = control.get("baseline") or {}
        host = {a.get("what"): a for a in attempts_by_role(baseline, "escape")}
        escapes = attempts_by_role(report, "escape")
        # An interface the host kernel itself lacks (EAFNOSUPPORT for vsock...) proves nothing.
        judged = [a for a in escapes if host.get(a.get("what"), {}).get("outcome") == "succeeded"]
        skipped = sorted(
            str(a.get("what")) for a in escapes if a not in judged and a.get("outcome") != "error"
        )
        observed: Literal["succeeded", "refused", "error"] = (
            observed_outcome(judged) if judged else "error"
        )
        reached = [a for a in judged if a.get("outcome") == "succeeded"]
        refused = [a for a in judged if a.get("outcome") == "refused"]
        reasons = [
            f"reached the kernel handler: {attempts_summary(reached) if reached else 'none'}",
            f"refused: {attempts_summary(refused) if refused else 'none'}",
            f"seccomp={report.get('facts', {}).get('seccomp')}",
        ]
        if skipped:
            reasons.append(
                f"not judged (the host baseline does not reach them): {', '.join(skipped)}"
            )
        if not judged:
            reasons.append("no call the host baseline reaches was reported")
        escape = _self_reported(observed, reasons)
        unfiltered = _refused_without_filter(ctx, refused)
        if unfiltered:
            escape = "escaped"
            reasons.insert(0, unfiltered)
        claims = claims_of(ctx.policy)
        if escape == "escaped" and claims.syscalls == "filtered":
            names = ", ".join(str(a.get("what")) for a in reached) or "a forged refusal"
            reasons.insert(0, f"{claims.phrase('syscalls')}; the payload reached {names}")
        # A refusal counts only for a surface that was tried: a crash, or a call the host
        # reaches that the report never mentions, leaves that surface unknown.
        crashed = [a for a in escapes if a.get("outcome") == "error"]
        tried = {a.get("what") for a in escapes}
        missing = sorted(
            str(w) for w, a in host.items() if a.get("outcome") == "succeeded" and w not in tried
        )
        if escape != "escaped" and (crashed or missing):
            escape = "undecided"
            if crashed:
                reasons.append(f"the payload failed: {attempts_summary(crashed)}")
            if missing:
                reasons.append(f"never tried, though the host reaches them: {', '.join(missing)}")
        return _assessed(
            escape,
            observed,
            reasons,
            report,
            control,
            {"reached": reached, "host_baseline": list(host.values())},
        )


# ---------------------------------------------------------------------------------------------
# Resource limits.


@dataclass(frozen=True)
class ResourceLimits:
    """What a backend declares it caps; None = no claim.

    Attributes:
        forks: children the payload can have alive at once.
        memory_mib: MiB the payload can allocate on top of its interpreter.
        fsize_mib: MiB a single file can grow to.
        nofile: descriptors the payload can open on top of the ones it starts with.
    """

    forks: int | None = None
    memory_mib: int | None = None
    fsize_mib: int | None = None
    nofile: int | None = None

    def claims(self) -> dict[str, int]:
        """The declared limits only."""
        return {k: v for k, v in asdict(self).items() if v is not None}


# Every loop stops here even where nothing caps it: the control leg runs unsandboxed on a
# shared machine. A declared limit at or above its bound cannot be tested (reported, not judged).
BOUNDS: Final = {"forks": 64, "memory_mib": 256, "fsize_mib": 32, "nofile": 512}


# What the kernel answers when each declared limit stops its loop (the payload reports a
# MemoryError as ENOMEM and ignores SIGXFSZ so RLIMIT_FSIZE shows as EFBIG). Any other stop
# (ENOSPC on a full disk, ENFILE on a full system table, a crash) is some other wall: it says
# nothing about the declared limit.
LIMIT_ERRNOS: Final = {
    "forks": "EAGAIN",
    "memory_mib": "ENOMEM",
    "fsize_mib": "EFBIG",
    "nofile": "EMFILE",
}
# A loop starts with part of each resource already used (the interpreter's own descriptors,
# memory and process), so it stops somewhat below the declared value; stopping below half of
# it means something else stopped it first.
NEAR_FRACTION: Final = 0.5
# The payload's loop names, as the keys of `ResourceLimits`.
_LOOP_KEYS: Final = {
    "forks": "forks",
    "memory": "memory_mib",
    "fsize": "fsize_mib",
    "nofile": "nofile",
}


def _pairs(values: dict[str, Any]) -> str:
    """`{"fsize_mib": 8, "nofile": 64}` as "fsize_mib=8, nofile=64" for a reason."""
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _unexplained_stop(key: str, declared: int, reached: int, loop: dict[str, Any]) -> str:
    """Why a loop's stop is not the declared limit holding, or "" when it is."""
    want = LIMIT_ERRNOS[key]
    got = loop.get("errno")
    if loop.get("outcome") != "refused" or got != want:
        return f"{key} stopped with {got or loop.get('outcome')}, not the limit's {want}"
    if reached < declared * NEAR_FRACTION:
        return f"{key} stopped at {reached}, far below the declared {declared}"
    return ""


def _held_to_declared(
    backend: str,
    declared: dict[str, int],
    reached: dict[str, int],
    loops: dict[str, dict[str, Any]],
    reasons: list[str],
) -> Escape:
    """A confining backend's reading: each testable declared limit stopped its loop, or not."""
    testable = {k: v for k, v in declared.items() if v < BOUNDS[k]}
    if not testable:
        reasons.append(
            f"backend {backend!r} declares no limit below the probe's bounds "
            f"(declared {_pairs(declared) or 'nothing'}): nothing to hold it to; declare "
            "[policy] limits in the backend spec (e.g. limits = {fsize_mib = 16})"
        )
        return "undecided"
    exceeded = {k: reached.get(k) for k, v in testable.items() if reached.get(k, 0) > v}
    if exceeded:
        reasons.insert(
            0, f"went past the declared limits ({_pairs(testable)}): reached {_pairs(exceeded)}"
        )
        return "escaped"
    unexplained = [
        why
        for k, v in testable.items()
        if (why := _unexplained_stop(k, v, reached.get(k, 0), loops.get(k, {})))
    ]
    if unexplained:
        reasons.insert(0, f"not stopped by the declared limit: {'; '.join(unexplained)}")
        return "undecided"
    reasons.insert(0, f"every declared limit held: {_pairs(testable)}")
    return "refused"


MIB: Final = 1024 * 1024
# Where the host sees each declared limit on the payload (run/hostview.py): its row of
# /proc/<pid>/limits, the unit of that row per unit of the limit, and the cgroup v2 file that
# caps the same resource for the payload's whole group (None: no cgroup caps it).
HOST_LIMITS: Final = {
    "forks": ("Max processes", 1, "pids.max"),
    "memory_mib": ("Max address space", MIB, "memory.max"),
    "fsize_mib": ("Max file size", MIB, None),
    "nofile": ("Max open files", 1, None),
}
HOST_COUNTS: Final = "the host's count of forked children and of the fsize file's size"


def _limit_state(key: str, value: int, process: dict[str, Any]) -> tuple[str, str]:
    """One declared limit on one payload process: ("applied" | "unset" | "unknown", seen).

    Applied when its rlimit's soft value, or the tightest cgroup cap above the payload, is
    at or below the declared value. Memory is the exception: the declared MiB are on top of
    the interpreter's own address space, so any finite RLIMIT_AS or memory cap counts (the
    memory loop itself tests the size). Unknown, never unset, where the rlimit does not
    hold it and the cgroup that might is one the host cannot read.
    """
    row, unit, cgroup_file = HOST_LIMITS[key]
    soft = ((process.get("limits") or {}).get(row) or {}).get("soft")
    cap = (process.get("cgroup_limits") or {}).get(cgroup_file) if cgroup_file else None
    seen = f"{row} {'unlimited' if soft is None else soft}"
    if cgroup_file:
        seen += f", {cgroup_file} {'max' if cap is None else cap}"
    caps = [v for v in (soft, cap) if isinstance(v, int)]
    held = bool(caps) if key == "memory_mib" else any(v <= value * unit for v in caps)
    if held:
        return "applied", seen
    return ("unknown" if isinstance(cap, str) else "unset"), seen


def unapplied_limits(
    declared: dict[str, int], process: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """The declared limits the host sees unset on one payload process, and those it cannot tell.

    Each is named with what the host saw ("fsize_mib=16 (Max file size unlimited)"); see
    `_limit_state`. `process` is one reading of `sandbox_attest.run.hostview.read_process`.
    """
    unset: list[str] = []
    unknown: list[str] = []
    for key, value in sorted(declared.items()):
        state, seen = _limit_state(key, value, process)
        if state != "applied":
            (unset if state == "unset" else unknown).append(f"{key}={value} ({seen})")
    return unset, unknown


def declared_limits(policy: PolicyLike) -> ResourceLimits:
    """The limits a backend's declared policy claims (none when it claims nothing)."""
    return ResourceLimits(**dict(policy.limits))


class ResourceLimitsSpec(SpecBase):
    """Bounded fork, memory, file-size and open-file loops against the declared limits."""

    id = "resource_limits"
    area = "proc"

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The write-and-fork control and one loop per bounded resource."""
        del task
        return AttemptTable(
            required=attempts_of("write-and-fork-once", "forks", "memory", "fsize", "nofile")
        )

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied (held to its declared limits) wherever anything is confined.

        The open control leg declares no limit and must be seen running every loop to its
        bound, which proves the loops can exceed a limit that is not enforced.
        """
        return "denied" if _confines_anything(policy) else "allowed"

    def not_claimed(self, policy: PolicyLike) -> str | None:
        """NOT_APPLICABLE where the backend confines something but declares no limit.

        This probe tests the limits claim alone; a backend that makes none has nothing to
        be held to (the release policy, which requires the claim, is what catches that).
        The control leg confines nothing and always runs.
        """
        if _confines_anything(policy) and not policy.limits:
            return "the backend declares no resource limits"
        return None

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host readings behind this cell: its counts, and the payload's limits it read.

        See `host_limits`: only where the host read every payload process's limits and saw
        each declared limit applied.
        """
        del report
        return self.host_limits(ctx)[0]

    def host_limits(self, ctx: CellContext) -> tuple[list[str], list[str], list[str]]:
        """The host's reading of the declared limits: (corroborated_by, unset, unknown).

        The host counts the forked children's files and the fsize file's size itself, and
        reads each payload process's rlimits and cgroup caps at the rendezvous. Both back
        the cell only when every declared limit is seen applied there; `unset` names each
        declared limit the host saw unset (with the pid and what it saw instead), `unknown`
        each it could not tell (a cgroup it cannot read).
        """
        declared = declared_limits(ctx.policy).claims()
        read = [p for p in host_processes(ctx) if p.get("limits")]
        if not declared or not read:
            return [], [], []
        unset: list[str] = []
        unknown: list[str] = []
        for process in read:
            not_set, not_known = unapplied_limits(declared, process)
            unset += [f"{limit} on pid {process.get('pid')}" for limit in not_set]
            unknown += [f"{limit} on pid {process.get('pid')}" for limit in not_known]
        if unset or unknown:
            return [], unset, unknown
        pids = ", ".join(str(p.get("pid")) for p in read)
        limits = (
            f"the payload's rlimits and cgroup caps, read by the host (/proc/{pids}/limits): "
            f"{_pairs(declared)} applied"
        )
        return [HOST_COUNTS, limits], [], []

    @staticmethod
    def fork_dir(ctx: CellContext) -> str:
        """Workspace-relative dir where each forked child leaves a file (host witness)."""
        return f"forks-{ctx.nonce}"

    @staticmethod
    def fsize_file(ctx: CellContext) -> str:
        """Workspace-relative file the fsize loop grows (host witness)."""
        return f"fsize-{ctx.nonce}.bin"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The bounds, the backend's declared limits, and where the witnesses go."""
        return {
            "bounds": dict(BOUNDS),
            "declared": declared_limits(ctx.policy).claims(),
            "fork_dir": self.fork_dir(ctx),
            "fsize_file": self.fsize_file(ctx),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host can write the workspace and sees what the payload left there."""
        nonce = new_control_nonce()
        return control_record(
            nonce, [host_writes_check("host writes the workspace", ctx.workspace, nonce)]
        )

    def _witnessed(self, ctx: CellContext) -> dict[str, int]:
        forks = ctx.workspace / self.fork_dir(ctx)
        grown = ctx.workspace / self.fsize_file(ctx)
        try:
            fork_count = sum(1 for p in forks.iterdir() if p.name.startswith("fork-"))
        except OSError:
            fork_count = 0
        try:
            size_mib = grown.stat().st_size // (1024 * 1024)
        except OSError:
            size_mib = 0
        return {"forks": fork_count, "fsize_mib": size_mib}

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A loop that went past its declared limit is an escape; the host counts two loops."""
        del witness
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        loops = {_LOOP_KEYS.get(str(a.get("what")), str(a.get("what"))): a for a in escapes}
        reached = {key: int(a.get("reached") or 0) for key, a in loops.items()}
        seen = self._witnessed(ctx)
        # The host's count wins where it has one: files a child made exist or they don't.
        for key, value in seen.items():
            if reached.get(key) != value:
                reached[f"{key}_payload"] = reached.get(key, 0)
                reached[key] = value
        reasons = [
            f"reached {_pairs(reached)} (bounds {_pairs(BOUNDS)}); host counted {_pairs(seen)}"
        ]
        disagree = any(k.endswith("_payload") for k in reached)
        if disagree:
            reasons.append("the payload's counts differ from what the host found")
        declared = declared_limits(ctx.policy).claims()
        escape: Escape
        if any(a.get("outcome") == "error" for a in escapes) or len(escapes) != len(BOUNDS):
            reasons.append(f"a loop could not run: {attempts_summary(escapes)}")
            escape = "undecided"
        elif self.expectation(ctx.policy) == "denied":
            escape = _held_to_declared(ctx.backend, declared, reached, loops, reasons)
            if escape == "refused" and disagree:
                escape = "disagree"
        else:
            at_bound = all(reached.get(k, 0) >= v for k, v in BOUNDS.items())
            escape = "escaped" if at_bound and not disagree else "disagree"
            if not at_bound:
                reasons.append("an unconfined loop stopped before its bound")
        corroborated, unapplied, unknown = self.host_limits(ctx)
        if unknown:
            reasons.append(
                f"the host cannot tell whether {'; '.join(unknown)} is applied: the cell "
                "rests on the loops"
            )
        if unapplied and self.expectation(ctx.policy) == "denied":
            # The kernel's own record of the payload's limits: a declared limit it does not
            # carry was never applied, whatever the loops (or a rewritten report) say.
            escape = "escaped"
            reasons.insert(
                0,
                f"the resource limits claim ({_pairs(declared)}) is not applied: the host "
                f"sees {'; '.join(unapplied)} on the payload (its /proc/<pid>/limits and "
                "cgroup); apply them (prlimit, docker --ulimit/--pids-limit)",
            )
        assessment = _assessed(
            escape,
            observed,
            reasons,
            report,
            control,
            {
                "host_counted": seen,
                "declared": declared,
                "reached": reached,
                "host_limits": [
                    {
                        "pid": p.get("pid"),
                        "limits": p.get("limits"),
                        "cgroup": p.get("cgroup_limits"),
                    }
                    for p in host_processes(ctx)
                ],
            },
        )
        assessment.corroborated_by = corroborated
        return assessment


SPECS: tuple[ProbeSpec, ...] = (
    ProcVisibility(),
    ProcPrivileges(),
    ProcNamespaceEscape(),
    ProcSyscallSurface(),
    ResourceLimitsSpec(),
)
