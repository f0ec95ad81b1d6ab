"""The anchor: a harmless host process carrying the nonce, started per cell.

A harness-planted "anchor" process reports on its stdout whenever something ptraces it, and
carries a secret in its environment that exists nowhere else: the host witness of
proc_visibility. proc_namespace_escape starts its anchor in namespaces of its own, with a
listener on its own loopback (`ANCHOR_NAMESPACES`). `AnchoredSpec` starts one per cell in
`prepare` and kills it in `cleanup`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.controls import guarded_check, host_check
from sandbox_attest.catalog.spec import HOST_TIMEOUT_S, CellContext, SpecBase
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise, lifetime
from sandbox_attest.host.interpreter import payload_interpreter

__all__ = ["ANCHOR_NAMESPACES", "SECRET_VAR", "AnchoredSpec"]

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
ANCHOR_NAMESPACES: Final = ("unshare", "--user", "--map-root-user", "--mount", "--net", "--")


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


class AnchoredSpec(SpecBase):
    """A spec that starts one anchor process per cell in `prepare` and kills it in `cleanup`."""

    def __init__(self) -> None:
        """Anchors held per nonce between prepare and cleanup."""
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
            argv = [*ANCHOR_NAMESPACES, *argv]
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
