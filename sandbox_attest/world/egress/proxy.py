"""The egress proxy: CONNECT and absolute-form HTTP through an allowlist, as its own process.

This module is the host side: `start_proxy` spawns the proxy and `ProxyProcess` is its handle
(`decisions()` reads the decision log, the host-side witness of every proxied attempt). The
child is `python -m sandbox_attest.world.egress.proxy CONFIG.json` with the per-start secret on
stdin (never on argv or in a file, where other processes could read it); run that way, this
module hands over to `server.main`. The proxy's parts, one mechanism each:

- `config`: what the host tells the child (`ProxyConfig`) and the readiness line it answers;
- `server`: the child: listeners, one thread per client, the admission order, the data paths;
- `wire`: request heads and refusals, and the byte movers (buffer copy, splice);
- `handoff`: taking the payload's own connection from a shim on the unix socket, and the
  leash that ends it with the shim;
- `decisions`: the decision log, one JSON line per client.

No child-side module imports this one: `python -m` runs this file as `__main__`, and a module
that imported it back would load it a second time (see the package's `__init__`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

import sandbox_attest
from sandbox_attest.errors import ConfigError, FixtureError
from sandbox_attest.host import lifetime
from sandbox_attest.host.jsonlines import read_complete_lines
from sandbox_attest.world.egress.config import READY_PREFIX
from sandbox_attest.world.egress.wire import PROXY_USER

if TYPE_CHECKING:
    from types import TracebackType

    from sandbox_attest.world.egress.config import ProxyConfig

_START_DEADLINE_S = 15.0
_STOP_DEADLINE_S = 5.0


@dataclass
class ProxyProcess:
    """A running proxy child. Use as a context manager, or call `stop()`.

    Attributes:
        url: `http://USER:SECRET@127.0.0.1:PORT` when listening on TCP, else None; the user
            is `PROXY_USER`, a neutral name a wrapper may see in its environment.
        port: the TCP port, or None.
        socket: the unix socket path, or None.
        secret: the per-start secret (the Basic-auth password on TCP).
        pid: the child's pid (also its process-group id).
        decision_log: where the decision lines go.
        stderr_path: the child's stderr, kept for diagnostics.
    """

    url: str | None
    port: int | None
    socket: Path | None
    secret: str
    pid: int
    decision_log: Path
    stderr_path: Path
    _popen: subprocess.Popen[bytes] = field(repr=False)
    _stopped: bool = field(default=False, repr=False)

    def decisions(self) -> list[dict[str, object]]:
        """Every decision line the child has finished writing so far, parsed, oldest first.

        The child appends while the session reads, so a last line without its newline is
        still being written: it is left for a later call, never parsed (issue 18).

        Raises:
            LogLineError: a complete line is not a JSON object (names the file and line).
        """
        return read_complete_lines(self.decision_log)

    def exit_status(self) -> int | None:
        """The child's exit status if it has ended (negative: killed by that signal), else None.

        Reaps the child when it has ended; the world's health check asks this before it
        trusts the decision log as a witness (a dead proxy logs nothing, which reads as "no
        proxied attempt was made").
        """
        return None if self._stopped else self._popen.poll()

    def stderr_tail(self, limit: int = 600) -> str:
        """The last `limit` characters of the child's stderr, for a reason that names why."""
        return _tail(self.stderr_path)[-limit:]

    def stop(self) -> None:
        """SIGTERM the process group, wait with a deadline, then SIGKILL; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self._popen.wait(timeout=_STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self._popen.wait(timeout=_STOP_DEADLINE_S)
        if self._popen.stdout is not None:
            self._popen.stdout.close()
        # After a SIGKILL the child could not clean up; a stale socket would refuse the next run.
        if self.socket is not None and self.socket.is_socket():
            self.socket.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        """Return the running proxy."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the proxy."""
        self.stop()


def start_proxy(config: ProxyConfig) -> ProxyProcess:
    """Spawn the proxy in its own process group and wait (with a deadline) until it listens.

    Raises:
        ConfigError: neither a unix socket nor TCP was asked for.
        FixtureError: the child died or did not report readiness in time; the message carries
            its stderr.
    """
    if config.unix_socket is None and not config.tcp:
        raise ConfigError(
            "ProxyConfig needs unix_socket or tcp=True; the proxy would be unreachable"
        )
    secret = secrets.token_urlsafe(24)
    config.decision_log.parent.mkdir(parents=True, exist_ok=True)
    stderr_path = config.decision_log.with_name(config.decision_log.name + ".stderr")
    fd, config_name = tempfile.mkstemp(prefix="proxy-config-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(config.to_json(), handle)
    # The directory holding the package (a clone or site-packages), for the child's imports.
    package_root = str(Path(sandbox_attest.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    try:
        with stderr_path.open("wb") as stderr:
            popen = subprocess.Popen(
                [sys.executable, "-m", "sandbox_attest.world.egress.proxy", config_name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                start_new_session=True,  # its own process group: stop() signals the group
                # Dies with the harness even under SIGKILL, when stop() never runs; the
                # session starts the world from the main thread (host/lifetime.py, rule
                # 1).
                **lifetime.popen_kwargs(),
            )
        assert popen.stdin is not None  # noqa: S101  (stdin=PIPE above)
        assert popen.stdout is not None  # noqa: S101  (stdout=PIPE above)
        popen.stdin.write(secret.encode() + b"\n")
        popen.stdin.close()
        try:
            ready = _wait_ready(popen, popen.stdout, stderr_path)
        except BaseException:
            popen.stdout.close()
            raise
    finally:
        Path(config_name).unlink(missing_ok=True)
    port = ready.get("port")
    sock = ready.get("socket")
    if sock:
        # Sandboxed commands run as the payload user (host/trust.py) and must connect;
        # connecting to a unix socket needs write permission on it. It only reaches the
        # allowlisted hosts, behind the proxy's own checks.
        Path(sock).chmod(0o666)
    return ProxyProcess(
        url=f"http://{PROXY_USER}:{secret}@127.0.0.1:{port}" if port else None,
        port=int(port) if port else None,
        socket=Path(sock) if sock else None,
        secret=secret,
        pid=popen.pid,
        decision_log=config.decision_log,
        stderr_path=stderr_path,
        _popen=popen,
    )


def _wait_ready(
    popen: subprocess.Popen[bytes], stdout: IO[bytes], stderr_path: Path
) -> dict[str, Any]:
    deadline = time.monotonic() + _START_DEADLINE_S
    line = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                _kill(popen)
                raise FixtureError(
                    f"egress proxy did not report readiness within {_START_DEADLINE_S:g}s; "
                    f"its stderr: {_tail(stderr_path)}"
                )
            chunk = os.read(stdout.fileno(), 4096)
            if not chunk:
                popen.wait(timeout=_STOP_DEADLINE_S)
                raise FixtureError(
                    f"egress proxy exited with {popen.returncode} before it was ready; "
                    f"its stderr: {_tail(stderr_path)}"
                )
            line += chunk
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith(READY_PREFIX):
        _kill(popen)
        raise FixtureError(f"egress proxy printed {text!r} instead of its readiness line")
    ready: dict[str, Any] = json.loads(text[len(READY_PREFIX) :])
    return ready


def _kill(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait(timeout=_STOP_DEADLINE_S)


def _tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "<unreadable>"
    return text[-4000:].strip() or "<empty>"


if __name__ == "__main__":
    # The child process (`start_proxy`'s command line): imported here, not at the top, so the
    # host side never loads the server.
    from sandbox_attest.world.egress.server import main

    sys.exit(main())
