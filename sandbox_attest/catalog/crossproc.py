"""Other processes, host side: a sandboxed payload must not read, write or signal one outside.

`proc_visibility` asks whether a host process can be *seen* (and sends signal 0 only). This
module asks whether one can be *acted on*: its memory read and written (`process_vm_readv`,
`process_vm_writev`, `/proc/<pid>/mem`) and a real signal delivered to it (issue 28).

The target is harness-made and runs as the payload user, outside any sandbox: the one kind of
process the payload user may act on when nothing confines it (same uid, no Yama restriction
it did not lift itself), so a refusal inside a sandbox is the sandbox's doing. It is its own
witness: it reports on a pipe only the harness reads every SIGUSR1 it received (with the
sender's pid) and every change of its two mailbox buffers; the secret it holds in memory
exists nowhere else, so a payload that reports it read it.

The host control is the same payload run unconfined as the payload user against the same
target, after the sandboxed run: it must read the secret, fill both mailboxes with its own
nonce and have its signal logged. Everything the target logged before that control started
is the sandboxed payload's doing.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

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
    new_control_nonce,
    run_payload_on_host,
)
from sandbox_attest.catalog.judging import conclude, judge_escape
from sandbox_attest.catalog.records import poll_until
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.catalog.witness.kernel import (
    OPENS,
    KernelJudgement,
    ReportedAttempt,
    corroborate,
    path_match,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise, lifetime
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.verdict import Assessment, Escape, Expectation

__all__ = ["LINUX_ONLY_REASON", "SPECS", "ProcCrossProcess"]

LINUX_ONLY_REASON: Final = (
    "uses process_vm_readv/writev, /proc/<pid>/mem and Linux pids; "
    "macOS and Windows need their own cross-process probes"
)
# The target exits on its own after this long, so a crashed run never leaves it behind.
TARGET_LIFETIME_S: Final = 300
TARGET_READY_S: Final = 10.0
MAILBOX_LEN: Final = 64
# The target blocks SIGUSR1 and takes it with sigtimedwait, so a delivered signal is logged
# (with si_pid) instead of ending it; it polls its mailboxes between waits.
_TARGET_CODE: Final = """
import ctypes, os, signal, sys, time
marker, lifetime = sys.argv[1], float(sys.argv[2])
secret = os.urandom(16).hex().encode()
held = ctypes.create_string_buffer(secret, len(secret))
boxes = [ctypes.create_string_buffer(64) for _ in range(2)]
tag = ctypes.create_string_buffer(marker.encode(), len(marker))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print("ready", ctypes.addressof(held), len(secret), ctypes.addressof(boxes[0]),
      ctypes.addressof(boxes[1]), secret.decode(), ctypes.addressof(tag), flush=True)
seen = [b"", b""]
end = time.monotonic() + lifetime
while time.monotonic() < end:
    info = signal.sigtimedwait([signal.SIGUSR1], 0.02)
    if info is not None:
        print("signal", info.si_pid, info.si_uid, flush=True)
    for i, box in enumerate(boxes):
        raw = box.raw.rstrip(b"\\0")
        if raw != seen[i]:
            seen[i] = raw
            print("mailbox", i + 1, raw.decode("ascii", "replace"), flush=True)
"""
_ESCAPES: Final = ("vm-readv", "vm-writev", "mem-read", "mem-write", "signal-usr1")
_FIX: Final = (
    "give the sandbox its own pid namespace (bwrap --unshare-pid, docker's default) so no "
    "host process is addressable, or forbid ptrace-class access (seccomp on "
    "process_vm_readv/writev, kill outside the sandbox; Yama ptrace_scope >= 2)"
)


@dataclass
class _Target:
    process: subprocess.Popen[bytes]
    marker: str
    secret: str
    secret_addr: int
    mailboxes: tuple[int, int]
    tag_addr: int = 0  # where its memory holds the marker (a payload verifies the pid by it)
    lines: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None
    # How many lines the target had printed when the host control began: what came before
    # is the sandboxed payload's doing.
    mark: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def read_lines(self) -> None:
        """Collect the target's lines until its stdout closes (a daemon thread)."""
        assert self.process.stdout is not None  # noqa: S101  (started with stdout=PIPE)
        for raw in self.process.stdout:
            with self.lock:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def logged(self, *, before_mark: bool) -> list[str]:
        """Its signal and mailbox lines, before the host control's mark (or all of them)."""
        with self.lock:
            end = self.mark if before_mark and self.mark is not None else len(self.lines)
            lines = self.lines[:end]
        return [ln for ln in lines if ln.startswith(("signal ", "mailbox "))]


def _start_target(ctx: CellContext) -> _Target:
    """Start the cell's target as the payload user, outside any sandbox; wait for "ready".

    Raises:
        FixtureError: it could not start or did not report ready in time.
    """
    marker = f"{disguise.XPROC_MARKER}{ctx.nonce}"
    directory = ctx.cell_dir / "xproc-target"
    directory.mkdir(parents=True, exist_ok=True)
    python = payload_interpreter(ctx.user).path
    argv = [python, "-c", _TARGET_CODE, marker, str(TARGET_LIFETIME_S)]
    try:
        process = subprocess.Popen(
            argv,
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=directory,
            **(ctx.user.popen_kwargs() if ctx.user is not None else {}),
            **lifetime.popen_kwargs(),  # a killed harness must not leave it running
        )
    except OSError as exc:
        msg = f"could not start the {ctx.probe} target process ({exc}); is {python} runnable?"
        raise FixtureError(msg) from exc
    target = _Target(process, marker, secret="", secret_addr=0, mailboxes=(0, 0))
    target.reader = threading.Thread(target=target.read_lines, name="xproc-target", daemon=True)
    target.reader.start()
    deadline = time.monotonic() + TARGET_READY_S
    ready: list[str] = []
    while not ready and time.monotonic() < deadline and process.poll() is None:
        with target.lock:
            ready = [ln for ln in target.lines if ln.startswith("ready ")]
        time.sleep(0.01)
    if not ready:
        _stop(target)
        why = f"exit {process.poll()}" if process.poll() is not None else "no ready line"
        raise FixtureError(f"the {ctx.probe} target process did not start ({why})")
    words = ready[0].split()
    target.secret_addr, secret_len = int(words[1]), int(words[2])
    target.mailboxes = (int(words[3]), int(words[4]))
    target.secret = words[5]
    target.tag_addr = int(words[6]) if len(words) > 6 else 0
    if len(target.secret) != secret_len:
        _stop(target)
        raise FixtureError(f"the {ctx.probe} target reported a malformed ready line")
    return target


def _stop(target: _Target) -> None:
    target.process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL is not ignorable
        target.process.wait(timeout=HOST_TIMEOUT_S)
    if target.reader is not None:
        target.reader.join(timeout=HOST_TIMEOUT_S)
    if target.process.stdout is not None:
        target.process.stdout.close()


# What backs the two reads the target's log cannot witness, where the kernel witness did.
KERNEL_READS: Final = "the kernel's answers to the payload's reads of the target (kernel witness)"


def _kernel_reads(
    ctx: CellContext, escapes: list[dict[str, Any]], facts: dict[str, Any], pid: int | None
) -> KernelJudgement | None:
    """The kernel's answers to vm-readv and mem-read at the target, where it can give them.

    Only the reads: the target's own log witnesses the writes and the signal. None where
    nothing was attempted, the target is unknown, or the witness did not record the payload
    in the harness's pid namespace (`corroborate`), where the pid it names is the target's.
    """
    if pid is None or (facts.get("found_pid") is None and facts.get("attempted_pid") is None):
        return None
    outcomes = {str(a.get("what")): str(a.get("outcome")) for a in escapes}

    def at_target(event: dict[str, Any]) -> bool:
        return bool((event.get("args") or [0])[0] == pid)

    attempts = [
        ReportedAttempt(
            "vm-readv", outcomes.get("vm-readv", "refused"), ("process_vm_readv",), at_target
        ),
        ReportedAttempt(
            "mem-read", outcomes.get("mem-read", "refused"), OPENS, path_match(f"/proc/{pid}/mem")
        ),
    ]
    return corroborate(ctx, attempts, "pid")


def _judge_unlisted(
    escapes: list[dict[str, Any]], facts: dict[str, Any], shared: list[str], reasons: list[str]
) -> Escape:
    """A refusal whose payload shares the host's pid namespace but did not list the target.

    Its /proc may hide the target (sandlock filters /proc, a sandbox may mount a /proc of its
    own), yet the pid is addressable: the payload then attempts at the host pid it was
    given (`attempted_pid`), and the target's log witnesses the writes and the signal as
    wherever it was found. Undecided: nothing attempted (an older payload), or a refusal no
    kernel gives there (ESRCH: the target is alive in that very pid namespace), which only a
    report that is not the kernel's answer, or a filter faking errnos, could carry.
    """
    where = f"the host sees {', '.join(shared)} in the harness's pid namespace"
    attempted = facts.get("attempted_pid")
    if attempted is None:
        reasons.append(
            f"{where}, yet the payload did not find the target in its /proc, so it attempted "
            "nothing"
        )
        return "undecided"
    absent = [str(a.get("what")) for a in escapes if a.get("errno") == "ESRCH"]
    if absent:
        reasons.append(
            f"{where}, where the target pid {attempted} is alive, yet the payload reports "
            f"no such process for {', '.join(absent)}: that is no kernel's answer there, and "
            "nothing corroborates it"
        )
        return "undecided"
    reasons.append(
        f"{where}; the target was not listed in its /proc, so each attempt was made at the "
        f"host pid it was given ({attempted}, verified by its memory: "
        f"{bool(facts.get('verified'))})"
    )
    return "refused"


class ProcCrossProcess(SpecBase):
    """Read, write and signal a harness-made process of the payload user outside the sandbox."""

    id = "proc_cross_process"
    area = "crossproc"
    kernel_witness = True
    host_readings = ("target process log",)

    def __init__(self) -> None:
        """No target yet: each cell starts its own in `prepare`."""
        self._targets: dict[str, _Target] = {}
        self._lock = threading.Lock()

    def _target(self, ctx: CellContext) -> _Target | None:
        with self._lock:
            return self._targets.get(ctx.nonce)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Two controls, two context readings of its own memory, five attempts at the target."""
        del task
        return AttemptTable(
            required=attempts_of("find-self", "signal-self", "vm-readv-self", "mem-read-self")
            | attempts_of(*_ESCAPES)
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied when ipc is "isolated": that claim keeps the payload from host processes."""
        return "denied" if declared.ipc == "isolated" else "allowed"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the target; the payload gets its marker, pid and addresses, never the secret."""
        target = _start_target(ctx)
        with self._lock:
            self._targets[ctx.nonce] = target
        return self.prepare_targets(target)

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The payload user, unconfined, reads the secret, fills both mailboxes and signals."""
        nonce = new_control_nonce()
        target = self._target(ctx)
        if target is None:
            return control_record(
                nonce, [host_check("target started", ok=False, detail="no prepare()")]
            )
        with target.lock:
            target.mark = len(target.lines)
        targets = self.prepare_targets(target)

        def unconfined() -> dict[str, Any]:
            pid, report = run_payload_on_host(ctx, targets, nonce)
            facts = report.get("facts") or {}
            read = facts.get("vm_readv") == target.secret and facts.get("mem_read") == target.secret
            expected = {f"mailbox 1 v:{nonce}", f"mailbox 2 m:{nonce}", f"signal {pid} "}

            def heard(lines: list[str]) -> bool:
                return all(any(ln.startswith(e) for ln in lines) for e in expected)

            lines = poll_until(lambda: target.logged(before_mark=False), heard)
            ok = read and heard(lines) and all_succeeded(attempts_by_role(report, "control"))
            detail = (
                f"secret read: {read}; target logged {lines[-4:]}; "
                f"payload: {attempts_summary(list(report.get('attempts') or []))}"
            )
            return host_check("payload user reaches the target unconfined", ok, detail)

        return control_record(nonce, [guarded_check("payload user reaches the target", unconfined)])

    @staticmethod
    def prepare_targets(target: _Target) -> dict[str, Any]:
        """The task targets naming `target` (as `prepare` hands them to the payload)."""
        return {
            "marker": target.marker,
            "target_pid": target.pid,
            "secret_addr": target.secret_addr,
            "secret_len": len(target.secret),
            "mailboxes": list(target.mailboxes),
            "tag_addr": target.tag_addr,
        }

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The secret echoed, a mailbox carrying the nonce or a logged signal is an escape."""
        del witness  # the target is this probe's witness
        target = self._target(ctx)
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        facts = report.get("facts") or {}
        secret = target.secret if target else None
        read = [k for k in ("vm_readv", "mem_read") if secret and facts.get(k) == secret]
        logged = target.logged(before_mark=True) if target else []
        written = [ln for ln in logged if ln.startswith("mailbox ") and ctx.nonce in ln]
        signals = [ln for ln in logged if ln.startswith("signal ")]
        pid = target.pid if target else "?"
        reasons = [
            (
                f"target pid {pid} (the payload user's, outside the sandbox): secret read via "
                f"{', '.join(read) or 'nothing'}; mailboxes written: {len(written)}; "
                f"signals received: {', '.join(s.split(' ', 1)[1] for s in signals) or 'none'}"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(observed, bool(read or written or signals), None, reasons)
        shared = [
            f"host pid {p.get('pid', '?')}"
            for p in host_processes(ctx)
            if "pid" in (p.get("shared_with_harness") or [])
        ]
        if escape == "refused" and shared and facts.get("found_pid") is None:
            escape = _judge_unlisted(escapes, facts, shared, reasons)
        kernel = _kernel_reads(ctx, escapes, facts, target.pid if target else None)
        if kernel is not None and kernel.escapes and escape != "escaped":
            escape = "escaped"
            reasons.insert(0, f"the kernel let the payload through: {'; '.join(kernel.escapes)}")
        elif kernel is not None and kernel.all_corroborated and escape == "refused":
            reasons.append("the kernel answered the reads: " + "; ".join(kernel.corroborated))
        if escape == "escaped" and self.expectation(ctx.claims) == "denied":
            done = [str(a.get("what")) for a in escapes if a.get("outcome") == "succeeded"]
            where = (
                f" (the host sees {', '.join(shared)} in the harness's pid namespace)"
                if shared
                else ""
            )
            reasons.insert(
                0,
                f"{claims_of(ctx.claims).phrase('ipc')}; the payload acted on a host process "
                f"of its own user outside the sandbox ({', '.join(done) or 'seen by the target'})"
                f"{where}; fix: {_FIX}",
            )
        inside = attempts_by_role(report, "control")
        assessment = conclude(
            escape,
            observed,
            reasons,
            inside=inside,
            inside_ok=all_succeeded(inside),
            host_control=control,
            witness={
                "secret_read_via": read,
                "mailboxes": written,
                "signals": signals,
                **({"kernel": kernel.as_witness()} if kernel is not None else {}),
            },
        )
        if kernel is not None and kernel.all_corroborated and escape == "refused":
            assessment.corroborated_by = [*self.host_readings, KERNEL_READS]
        return assessment

    def cleanup(self, ctx: CellContext) -> None:
        """Kill this cell's target (only that process) and reap it."""
        with self._lock:
            target = self._targets.pop(ctx.nonce, None)
        if target is not None:
            _stop(target)


SPECS: Final = (ProcCrossProcess(),)
