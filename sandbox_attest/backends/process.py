"""Run one sandbox command line as a process group, with a deadline and bounded capture.

Shared by every backend that confines by wrapping a command (none, bubblewrap, command
wrappers). The child starts in its own session so that a timeout can kill the whole tree:
some wrappers exit on SIGTERM while their confined child keeps running, so we go straight to
SIGKILL of the group and record the timeout ourselves.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sandbox_attest.backends.base import START_MARKER, ProbeRun
from sandbox_attest.host import cellgroup
from sandbox_attest.host.trust import PayloadUser

# A probe prints two short lines. Anything beyond this is noise or an attack on the
# harness's memory; keep the head (where the marker and the JSON line are) and say so.
MAX_CAPTURE_BYTES = 4 * 1024 * 1024
# How long output may keep arriving after the group is gone (buffered tail of a dead writer).
PIPE_GRACE_S = 2.0
# How long to wait for the wrapper to be reaped after SIGKILL of its group. A process we may
# not signal (a setuid wrapper) never dies from it; waiting forever would hang the cell.
KILL_WAIT_S = 10.0
# Lines a helper (the shim) writes to stderr carry this prefix; they are surfaced apart.
HELPER_PREFIXES = ("shim: ",)


@dataclass(frozen=True)
class Capture:
    """Bytes read from one pipe, capped."""

    data: bytes
    truncated: bool


def _drain(stream: IO[bytes], sink: list[Capture], stop: threading.Event) -> None:
    """Read `stream` to EOF (capped), or until `stop` is set.

    A process that left the group (setsid) can keep the write end open forever, so a blocking
    read might never return; polling with a short timeout lets the caller end the capture.
    """
    fd = stream.fileno()
    chunks: list[bytes] = []
    size = 0
    truncated = False
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if size < MAX_CAPTURE_BYTES:
            keep = chunk[: MAX_CAPTURE_BYTES - size]
            chunks.append(keep)
            size += len(keep)
            truncated = truncated or len(keep) < len(chunk)
        else:
            truncated = True  # keep reading so the child never blocks on a full pipe
    sink.append(Capture(b"".join(chunks), truncated))


def kill_group(pid: int) -> str | None:
    """SIGKILL the process group led by `pid`; a group already gone is fine.

    Returns:
        None, or a note for the run when the group could not be signalled: every process
        left in it runs as someone we may not signal (a setuid wrapper such as firejail),
        so the sandbox may still be running and the reader must be told.
    """
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    except PermissionError as exc:
        return (
            f"could not SIGKILL process group {pid} ({exc.strerror}): its processes run "
            "with privileges we lack (a setuid wrapper?) and may still be running"
        )
    return None


def group_alive(pgid: int) -> bool:
    """True while any process of the group `pgid` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_process(
    cell_id: str,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout: float,
    pass_fds: tuple[int, ...] = (),
    user: PayloadUser | None = None,
) -> ProbeRun:
    """Run `argv` in a new session; kill the whole group at the deadline.

    Args:
        cell_id: the matrix cell, copied into the result.
        argv: the full host command line (the sandbox wrapper and the payload).
        env: the exact environment of the child (nothing is inherited).
        cwd: working directory of the child.
        timeout: seconds until the group is killed and the run marked timed out.
        pass_fds: descriptors to leave open in the child (only deliberate weakenings do).
        user: run the child as this unprivileged user (uid, gid and only its own groups);
            None runs it as the harness's user (no trust separation on this host).

    Returns:
        The run as seen from outside; `started` says whether the start marker was printed.
        Never raises for a child's failure: an exec error becomes a run that did not start.
    """
    start = time.monotonic()
    try:
        proc = _spawn(argv, env, cwd, pass_fds, user)
    except (OSError, subprocess.SubprocessError) as exc:
        cellgroup.spawn_failed()
        return _not_started(cell_id, argv, exc, time.monotonic() - start)
    cellgroup.started(proc.pid)
    assert proc.stdout is not None  # noqa: S101  (PIPE was requested just above)
    assert proc.stderr is not None  # noqa: S101
    out: list[Capture] = []
    err: list[Capture] = []
    stop = threading.Event()
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out, stop), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err, stop), daemon=True),
    ]
    for reader in readers:
        reader.start()
    timed_out, kill_notes = _wait_then_kill_group(proc, timeout)
    held_open = _stop_readers(readers, stop)
    proc.stdout.close()
    proc.stderr.close()
    duration = time.monotonic() - start
    stdout = out[0] if out else Capture(b"", truncated=False)
    stderr = err[0] if err else Capture(b"", truncated=False)
    run = finish_run(
        cell_id, argv, proc.returncode, stdout, stderr, timed_out=timed_out, duration=duration
    )
    run.notes.extend(kill_notes)
    if held_open:
        run.notes.append(
            f"output pipes still held open {PIPE_GRACE_S:.0f}s after the process group was "
            "killed: a process outside the group (setsid?) survived the run"
        )
    return run


def _spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    pass_fds: tuple[int, ...],
    user: PayloadUser | None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session with piped output, as `user`, in the cell's group."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
        pass_fds=pass_fds,
        **(user.popen_kwargs() if user is not None else {}),
        # The wrapper dies with the harness even under SIGKILL (its group is killed on
        # timeout by us; after our death only the kernel can): sandbox_attest/host/lifetime.py.
        # It starts inside the cell's group, where the host finds every process it makes
        # (sandbox_attest/host/cellgroup.py).
        **cellgroup.spawn_kwargs(argv, env),
    )


def _not_started(cell_id: str, argv: list[str], exc: Exception, duration: float) -> ProbeRun:
    """The run of a command that could not be executed at all."""
    return ProbeRun(
        cell_id=cell_id,
        started=False,
        exit_code=None,
        stdout="",
        stderr=f"could not execute {argv[0]!r}: {exc}",
        timed_out=False,
        duration_s=duration,
        argv=argv,
    )


def _wait_then_kill_group(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bool, list[str]]:
    """Wait for `proc` until `timeout`, then kill its group; (timed out, notes on the kill)."""
    timed_out = False
    kill_notes: list[str] = []
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # Kill the group on every path, a clean exit included: a payload may have left a
        # background child holding our pipes open, and an outer guard (pytest-timeout,
        # Ctrl-C) interrupting the wait must not leave the sandbox running.
        note = kill_group(proc.pid)
        if note is not None:
            kill_notes.append(note)
        try:
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            kill_notes.append(
                f"the wrapper (pid {proc.pid}) was still running {KILL_WAIT_S:.0f}s after "
                "SIGKILL of its group; it was left behind and its exit code is unknown"
            )
    return timed_out, kill_notes


def _stop_readers(readers: list[threading.Thread], stop: threading.Event) -> bool:
    """Let the readers finish within PIPE_GRACE_S; True when they had to be stopped."""
    held_open = False
    grace_end = time.monotonic() + PIPE_GRACE_S
    for reader in readers:
        reader.join(timeout=max(0.0, grace_end - time.monotonic()))
    if any(reader.is_alive() for reader in readers):
        # Something outside the killed group still holds our pipes: stop capturing, and say so.
        held_open = True
        stop.set()
        for reader in readers:
            reader.join()
    return held_open


def finish_run(
    cell_id: str,
    argv: list[str],
    exit_code: int | None,
    stdout: Capture,
    stderr: Capture,
    *,
    timed_out: bool,
    duration: float,
) -> ProbeRun:
    """Build a ProbeRun from captured output: find the marker, split helper lines."""
    out_text = stdout.data.decode("utf-8", "replace")
    err_text = stderr.data.decode("utf-8", "replace")
    helper = [ln for ln in err_text.splitlines() if ln.startswith(HELPER_PREFIXES)]
    notes = []
    if stdout.truncated:
        notes.append(f"stdout truncated at {MAX_CAPTURE_BYTES} bytes")
    if stderr.truncated:
        notes.append(f"stderr truncated at {MAX_CAPTURE_BYTES} bytes")
    if timed_out:
        notes.append(f"timed out after {duration:.1f}s; process group killed")
    started = any(ln.startswith(START_MARKER) for ln in out_text.splitlines())
    return ProbeRun(
        cell_id=cell_id,
        started=started,
        exit_code=exit_code,
        stdout=out_text,
        stderr=err_text,
        timed_out=timed_out,
        duration_s=duration,
        argv=argv,
        helper_stderr="\n".join(helper),
        notes=notes,
    )
