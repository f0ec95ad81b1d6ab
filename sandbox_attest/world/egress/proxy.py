"""The egress proxy: CONNECT and absolute-form HTTP through an allowlist, as its own process.

Admission order, for every client: auth (TCP only) -> canonical host -> rules -> resolve ONCE
through the DNS fixture -> check the resolved address -> dial THAT address with a timeout. Each
refusal is an HTTP status with an `X-Proxy-Deny-Reason` header and a body naming the host and
the reason, and a JSON line in the decision log (the host-side witness of every attempt).

The data path is one thread per direction with blocking sockets, so the kernel gives
backpressure for free: a direction never reads more than the other side accepted. Bytes move
through one preallocated buffer per direction with `recv_into`, or, on Linux when one end is a
unix socket, with `os.splice` through a pipe (measured faster there, slower TCP to TCP). A
stdlib asyncio stream version moved about a tenth of the bytes per CPU second, which is why
this is threads.

Handoff on the unix socket. The in-sandbox shim does not relay bytes itself: for each
connection it accepts it sends one NUL byte carrying that TCP socket (SCM_RIGHTS), and the
proxy serves the payload's connection directly, so every byte still passes the proxy's
admission, accounting and backpressure. That takes the shim's copy hop out of the path
(bench/bench_proxy.py: about 2.3 GB/s handed off against 1.7-2.4 GB/s relayed, and the shim's
CPU from about 0.27 s/GiB to none). Only the sandbox's own socket crosses the boundary, into
the proxy; no host socket is ever passed into a sandbox. The proxy adopts a handed-over
descriptor only if it is a connected TCP socket (400 otherwise), and keeps it, and the upstream
dialed for it, no longer than the unix connection that brought it stays open (`_Leash`), so
nothing handed over outlives the shim or its sandbox, whatever the origin does. A unix client
that does not start with NUL simply speaks HTTP.

Run by `start_proxy`; the child is `python -m world.egress.proxy CONFIG.json` with the
per-start secret on stdin (never on argv or in a file, where other processes could read it).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self
from urllib.parse import parse_qs

from sandbox_attest.errors import ConfigError, FixtureError
from sandbox_attest.host import disguise, lifetime
from sandbox_attest.host.jsonlines import read_complete_lines
from sandbox_attest.host.proctitle import proxy_title, set_title
from sandbox_attest.world.dns import ResolveError, resolve
from sandbox_attest.world.egress.rules import (
    EgressPolicy,
    EgressRequest,
    HostError,
    Rule,
    address_allowed,
    canonical_host,
)
from sandbox_attest.world.netguard import (
    OutsideLabError,
    check_destination,
    register_lab_namespaces,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

# The proxy URL sits in the payload's environment, which a wrapper reads: a neutral name (issue 23).
PROXY_USER = "agent"
DENY_HEADER = disguise.PROXY_DENY_HEADER
NONCE_HEADER = "X-Attest-Nonce"
MAX_HEAD = 64 * 1024  # a request head of exactly this many bytes (CRLFCRLF included) is accepted
# The first byte a shim sends on the unix socket to hand over a connection; no HTTP request
# head starts with NUL, so a plain client can never be mistaken for a handoff.
HANDOFF_MARKER = b"\x00"
# Ends the reason of a decision line whose tunnel was cut by its leash (`_Leash`).
CUT_REASON = "cut: the unix connection that handed it over closed"
READY_PREFIX = "READY "
# The copy buffer starts small (most connections carry a few KiB) and doubles each time a read
# fills it, up to 4 MiB: on 256 MiB TCP -> TCP (bench/bench_relay_copy.py) 4 MiB moved as many
# or up to 1.1x the bytes per second of 1 MiB (fewer syscalls and wake-ups); 8 or 16 MiB, tried
# the same way, no more.
_BUFFER_START = 64 * 1024
_BUFFER_MAX = 4 * 1024 * 1024
_PIPE_SIZE = 1024 * 1024
_LINGER_S = 0.5  # after an error response, read what the client still sends so close() won't RST
_LINGER_BYTES = 1024 * 1024
_START_DEADLINE_S = 15.0
_STOP_DEADLINE_S = 5.0
_NONCE_PATH = re.compile(r"/c/([^/?#]+)/")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Hop-by-hop headers (RFC 9110 7.6.1) plus the proxy's own: never forwarded to an origin.
# Transfer-Encoding is kept: the body is relayed as it came, so its framing must travel with it.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
_REASONS = {
    200: "Connection established",
    400: "Bad Request",
    403: "Forbidden",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


# ---------------------------------------------------------------------------------------------
# Host side: configuration and the child process handle
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyConfig:
    """What the proxy process needs; serialised to JSON for the child.

    Attributes:
        rules: the allowlist, in order.
        dns: the DNS fixture's (host, port); the only resolver the proxy uses.
        unix_socket: where to listen on a unix socket (no auth), or None.
        tcp: whether to listen on 127.0.0.1:0 too (Basic auth with the per-start secret).
        decision_log: JSON-lines file the proxy appends one line per client to.
        dial_timeout: seconds for the upstream TCP connect before answering 504.
        head_timeout: seconds for a client to send its whole request head (slow drips).
        max_clients: client connections served at once; more get 503. A handoff leaves the
            sandbox holding no descriptor for the connection, so this is what bounds the
            proxy's descriptors and threads.
    """

    rules: tuple[Rule, ...]
    dns: tuple[str, int]
    unix_socket: Path | None
    tcp: bool
    decision_log: Path
    dial_timeout: float = 5.0
    head_timeout: float = 10.0
    max_clients: int = 512
    # In the lab (sandbox_attest/world/lab.py): the networks where the fixture hosts live, which the
    # address check treats as remote hosts, and the namespaces the proxy may send to them
    # from (sandbox_attest/world/netguard.py). Empty outside the lab.
    remote_networks: tuple[str, ...] = ()
    lab_namespaces: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON object the child reads (holds no secret)."""
        return {
            "rules": [
                {
                    "host": r.host,
                    "suffix": r.suffix,
                    "ports": list(r.ports),
                    "allow_private": r.allow_private,
                }
                for r in self.rules
            ],
            "dns": list(self.dns),
            "unix_socket": str(self.unix_socket) if self.unix_socket else None,
            "tcp": self.tcp,
            "decision_log": str(self.decision_log),
            "dial_timeout": self.dial_timeout,
            "head_timeout": self.head_timeout,
            "max_clients": self.max_clients,
            "remote_networks": list(self.remote_networks),
            "lab_namespaces": list(self.lab_namespaces),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProxyConfig:
        """Rebuild a config from `to_json` output."""
        return cls(
            rules=tuple(
                Rule(
                    host=r["host"],
                    suffix=bool(r["suffix"]),
                    ports=tuple(int(p) for p in r["ports"]),
                    allow_private=bool(r["allow_private"]),
                )
                for r in data["rules"]
            ),
            dns=(str(data["dns"][0]), int(data["dns"][1])),
            unix_socket=Path(data["unix_socket"]) if data["unix_socket"] else None,
            tcp=bool(data["tcp"]),
            decision_log=Path(data["decision_log"]),
            dial_timeout=float(data["dial_timeout"]),
            head_timeout=float(data["head_timeout"]),
            max_clients=int(data["max_clients"]),
            remote_networks=tuple(str(n) for n in data.get("remote_networks", [])),
            lab_namespaces=tuple(str(n) for n in data.get("lab_namespaces", [])),
        )


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
    package_root = str(Path(__file__).resolve().parents[2])
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


# ---------------------------------------------------------------------------------------------
# Child side: the server
# ---------------------------------------------------------------------------------------------


class _Refusal(Exception):  # noqa: N818  (control flow, never escapes the handler)
    """Answer the client with `status` and end the connection."""

    def __init__(self, status: int, reason: str, host: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.host = host


@dataclass
class _Head:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def get_all(self, name: str) -> list[str]:
        lowered = name.lower()
        return [v for k, v in self.headers if k.lower() == lowered]

    def get(self, name: str) -> str | None:
        values = self.get_all(name)
        if len(values) > 1:
            raise _Refusal(400, f"duplicate {name} header")
        return values[0] if values else None


@dataclass
class _Record:
    """The decision line for one client, filled in as the request moves along."""

    client: str
    method: str | None = None
    host: str | None = None
    port: int | None = None
    target: str | None = None
    decision: str = "deny"
    status: int | None = None
    reason: str = ""
    nonce: str | None = None
    address: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "time": time.time(),
            "client": self.client,
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "target": self.target,
            "decision": self.decision,
            "status": self.status,
            "reason": self.reason,
            "nonce": self.nonce,
            "address": self.address,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }


class _DecisionLog:
    """Append-only JSON lines; the secret is redacted from every line, whatever carried it."""

    def __init__(self, path: Path, secret: str) -> None:
        self._handle = path.open("a", encoding="utf-8")
        self._secret = secret
        self._lock = threading.Lock()

    def write(self, record: _Record) -> None:
        line = json.dumps(record.as_json(), sort_keys=True)
        # token_urlsafe has no JSON-escaped characters, so the secret appears verbatim if at
        # all: in a target, a host, a nonce, a reason quoting any of them.
        line = line.replace(self._secret, "[redacted]")
        with self._lock:
            self._handle.write(line + "\n")
            self._handle.flush()

    def close(self) -> None:
        with self._lock:
            self._handle.close()


class _Server:
    def __init__(self, config: ProxyConfig, secret: str) -> None:
        self.config = config
        self.secret = secret
        self.policy = EgressPolicy(config.rules)
        self.log = _DecisionLog(config.decision_log, secret)
        self.listeners: list[socket.socket] = []
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(config.max_clients)

    # -- lifecycle ----------------------------------------------------------------------------

    def bind(self) -> dict[str, object]:
        ready: dict[str, object] = {"pid": os.getpid(), "port": None, "socket": None}
        if self.config.unix_socket is not None:
            path = self.config.unix_socket
            if path.is_socket():
                path.unlink()  # a stale socket from a killed run; the path is ours by config
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            listener.listen(512)
            self.listeners.append(listener)
            threading.Thread(target=self._accept_loop, args=(listener, False), daemon=True).start()
            ready["socket"] = str(path)
        if self.config.tcp:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(512)
            self.listeners.append(listener)
            threading.Thread(target=self._accept_loop, args=(listener, True), daemon=True).start()
            ready["port"] = listener.getsockname()[1]
        return ready

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def request_stop(self, _signum: int, _frame: object) -> None:
        self._stop.set()

    def close(self) -> None:
        for listener in self.listeners:
            with contextlib.suppress(OSError):
                listener.close()
        if self.config.unix_socket is not None:
            self.config.unix_socket.unlink(missing_ok=True)
        self.log.close()

    def _accept_loop(self, listener: socket.socket, needs_auth: bool) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)  # EMFILE and friends: back off instead of spinning
                continue
            label = f"tcp:{peer[0]}:{peer[1]}" if needs_auth else "unix"
            if self._slots.acquire(blocking=False):
                self._spawn(self._handle, conn, label, needs_auth, holds_slot=True)
            else:
                self._spawn(self._turn_away, conn, label, needs_auth, holds_slot=False)

    def _spawn(
        self, target: Callable[..., None], conn: socket.socket, *args: object, holds_slot: bool
    ) -> None:
        """Serve `conn` in its own thread; if no thread can start, drop it, never the loop."""
        try:
            threading.Thread(target=target, args=(conn, *args), daemon=True).start()
        except RuntimeError:  # "can't start new thread": out of memory or a tasks limit
            print("egress proxy: cannot start a thread; connection dropped", file=sys.stderr)
            sys.stderr.flush()  # before the close, so whoever sees the drop can read why
            conn.close()
            if holds_slot:
                self._slots.release()
            time.sleep(0.05)

    def _turn_away(self, conn: socket.socket, label: str, needs_auth: bool) -> None:
        """Answer 503 to a client over the concurrency limit (it holds no slot).

        A handed-over connection is taken first, so the payload itself reads the 503.
        """
        record = _Record(client=label, decision="deny", status=503)
        record.reason = f"proxy busy: {self.config.max_clients} clients already connected"
        client = conn
        try:
            if not needs_auth:
                client, _ = self._take_handoff(conn, record)
        except (_Refusal, OSError):
            pass  # not a clean handoff: the 503 goes to the unix connection itself
        self.log.write(record)
        try:
            self._refuse(client, _Refusal(503, record.reason), record)
        finally:
            if client is not conn:
                client.close()
            conn.close()

    # -- one client ---------------------------------------------------------------------------

    def _handle(self, conn: socket.socket, label: str, needs_auth: bool) -> None:
        """Serve one accepted connection; `needs_auth` is the TCP route, else the unix route.

        Owns the connection's lifetime: the slot, the decision line, and the close of `conn`
        and of the handed-over client (each exactly once, after the leash let go of it);
        `_serve` owns the upstream's close.
        """
        record = _Record(client=label)
        client = conn
        leash: _Leash | None = None
        logged = False
        try:
            initial = b""
            if not needs_auth:
                client, initial = self._take_handoff(conn, record)
                leash = _Leash(conn, client) if client is not conn else None
            self._serve(client, initial, record, needs_auth=needs_auth, leash=leash)
        except _Refusal as refusal:
            record.status = refusal.status
            record.reason = refusal.reason
            record.decision = "deny"
            if leash is not None:
                leash.note(record)
            # Deny lines are written before the answer, so a client that has read its 403
            # can already find the line (the witness never lags the refusal it records).
            self.log.write(record)
            logged = True
            self._refuse(client, refusal, record)
        except Exception as exc:
            if not isinstance(exc, OSError):
                # A bug must not kill the proxy or leak the descriptors; say so loudly.
                traceback.print_exc(file=sys.stderr)
            if record.decision == "allow":
                record.reason = f"{record.reason}; connection ended: {exc.__class__.__name__}"
            else:
                record.reason = f"client connection failed: {exc.__class__.__name__}"
        finally:
            self._finish(conn, client, leash, record, logged=logged)

    def _finish(
        self,
        conn: socket.socket,
        client: socket.socket,
        leash: _Leash | None,
        record: _Record,
        *,
        logged: bool,
    ) -> None:
        """Close `conn` and `client` once each, free the slot, write the line if not yet done.

        Every way a client ends comes through here: refused, leash fired, either side closed
        or reset, a head timeout, a bug.
        """
        if leash is not None:
            leash.release()  # before the closes: the watcher may still shut these down
        if client is not conn:
            client.close()
        conn.close()
        self._slots.release()
        if not logged:
            if leash is not None:
                leash.note(record)  # last, so the line ends with the cut when it was one
            self.log.write(record)

    def _serve(
        self,
        client: socket.socket,
        initial: bytes,
        record: _Record,
        *,
        needs_auth: bool,
        leash: _Leash | None = None,
    ) -> None:
        """Read the head, admit, then tunnel or forward; raises _Refusal for every refusal.

        Owns the upstream: a handed-over client's `leash` holds it from the dial on, so a cut
        wakes the pump reading it, and lets go of it before it is closed here.
        """
        head, rest = self._read_head(client, record, initial)
        record.method = head.method
        record.target = head.target[:2048]
        # The nonce is read before auth so that even a 407 is attributed to its cell.
        record.nonce = head.get(NONCE_HEADER) or _nonce_from_target(head)
        if needs_auth:
            self._check_auth(head)
        host, port, path = self._target(head, record)
        # Body framing is checked before the dial: a smuggling shape never costs a connect.
        framing = _body_framing(head) if head.method != "CONNECT" else 0
        upstream = self._admit(host, port, record)
        record.decision = "allow"
        try:
            if leash is not None:
                leash.hold(upstream)
            if head.method == "CONNECT":
                self._connect(client, upstream, rest, record)
            else:
                self._forward_http(
                    client,
                    upstream,
                    head=head,
                    rest=rest,
                    host=host,
                    port=port,
                    path=path,
                    framing=framing,
                    record=record,
                )
        finally:
            if leash is not None:
                # The watcher may be shutting the upstream down right now: end it first, so
                # its shutdown can never land on a descriptor number reused after this close.
                leash.release()
            upstream.close()

    def _take_handoff(self, conn: socket.socket, record: _Record) -> tuple[socket.socket, bytes]:
        """Read a unix client's first byte: a handoff (marker + one TCP socket) or plain HTTP.

        Returns the socket to serve and the bytes already read from it. Descriptors that are
        not exactly one connected TCP socket behind the marker are closed and refused.
        """
        conn.settimeout(self.config.head_timeout)
        try:
            # Room for one descriptor only: the kernel drops any extra and sets MSG_CTRUNC.
            data, fds, flags, _ = socket.recv_fds(conn, 1, 1)
        except TimeoutError:
            raise _Refusal(
                408, f"request head not complete within {self.config.head_timeout:g}s"
            ) from None
        conn.settimeout(None)
        if data != HANDOFF_MARKER or len(fds) != 1 or flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            if data == HANDOFF_MARKER:
                raise _Refusal(400, "a handoff must carry exactly one TCP socket")
            if fds or flags & socket.MSG_CTRUNC:
                raise _Refusal(400, "descriptors sent without the handoff marker")
            return conn, data
        client = _adopt_handed_socket(fds[0])
        record.client = "unix-handoff"
        return client, b""

    def _read_head(
        self, client: socket.socket, record: _Record, initial: bytes = b""
    ) -> tuple[_Head, bytes]:
        deadline = time.monotonic() + self.config.head_timeout
        buf = bytearray(initial)
        while True:
            end = buf.find(b"\r\n\r\n")
            if end != -1:
                if end + 4 > MAX_HEAD:
                    raise _Refusal(431, f"request head over {MAX_HEAD} bytes")
                break
            if len(buf) >= MAX_HEAD:
                raise _Refusal(431, f"request head over {MAX_HEAD} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Refusal(
                    408, f"request head not complete within {self.config.head_timeout:g}s"
                )
            client.settimeout(remaining)
            try:
                chunk = client.recv(MAX_HEAD - len(buf))
            except TimeoutError:
                raise _Refusal(
                    408, f"request head not complete within {self.config.head_timeout:g}s"
                ) from None
            if not chunk:
                record.reason = "client closed before a complete request head"
                raise OSError("client closed before a complete request head")
            buf += chunk
        client.settimeout(None)
        return _parse_head(bytes(buf[:end])), bytes(buf[end + 4 :])

    def _check_auth(self, head: _Head) -> None:
        value = head.get("Proxy-Authorization")
        if value is None:
            raise _Refusal(407, "proxy authentication required")
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "basic":
            raise _Refusal(407, "proxy authentication must be Basic")
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise _Refusal(407, "malformed Basic credentials") from None
        user, sep, password = decoded.partition(b":")
        ok = hmac.compare_digest(password, self.secret.encode())
        if not sep or user != PROXY_USER.encode() or not ok:
            raise _Refusal(407, "bad proxy credentials")

    def _target(self, head: _Head, record: _Record) -> tuple[str, int, str]:
        """Canonical host, port and origin-form path of the request."""
        if head.method == "CONNECT":
            raw_host, port = _split_authority(head.target, default_port=None)
            path = ""
        else:
            scheme, sep, remainder = head.target.partition("://")
            if not sep or scheme.lower() != "http":
                raise _Refusal(
                    400,
                    "request target must be absolute-form http://... (use CONNECT for https)",
                )
            cut = min((i for i in map(remainder.find, "/?#") if i != -1), default=len(remainder))
            authority, path = remainder[:cut], remainder[cut:]
            path = path.split("#", 1)[0]
            if not path.startswith("/"):
                path = "/" + path
            raw_host, port = _split_authority(authority, default_port=80)
        record.host, record.port = raw_host, port
        try:
            host = canonical_host(raw_host)
        except HostError as exc:
            raise _Refusal(400, f"bad host: {exc}", raw_host) from None
        record.host = host
        if head.method != "CONNECT":
            self._check_host_header(head, host, port)
        return host, port, path

    def _check_host_header(self, head: _Head, host: str, port: int) -> None:
        value = head.get("Host")
        if value is None:
            return
        raw_host, header_port = _split_authority(value.strip(), default_port=80)
        try:
            header_host = canonical_host(raw_host)
        except HostError as exc:
            raise _Refusal(400, f"bad Host header: {exc}", host) from None
        if (header_host, header_port) != (host, port):
            raise _Refusal(
                421,
                f"Host header {header_host}:{header_port} differs from the request target",
                host,
            )

    def _admit(self, host: str, port: int, record: _Record) -> socket.socket:
        """Rules, one resolution, the address check and the one dial; returns the upstream."""
        decision = self.policy.decide(EgressRequest(host, port))
        record.reason = decision.reason
        if not decision.allowed or decision.rule is None:
            raise _Refusal(403, decision.reason, host)
        rule = decision.rule
        try:
            ipaddress.ip_address(host)
            is_literal = True  # an IP literal allowed by an exact rule: nothing to resolve
        except ValueError:
            is_literal = False
        if is_literal:
            address = host
        else:
            try:
                addresses = resolve(self.config.dns, host, timeout=self.config.dial_timeout)
            except ResolveError as exc:
                raise _Refusal(502, f"name did not resolve: {exc}", host) from None
            if not addresses:
                raise _Refusal(502, "name has no A record in the DNS fixture", host)
            address = addresses[0]
        record.address = address
        ok, why = address_allowed(address, rule, remote=self.config.remote_networks)
        if not ok:
            raise _Refusal(403, why, host)
        try:
            check_destination(address)
        except OutsideLabError as exc:
            raise _Refusal(403, str(exc), host) from None
        record.reason = f"{decision.reason}; {why}"
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.settimeout(self.config.dial_timeout)
        try:
            upstream.connect((address, port))
        except TimeoutError:
            upstream.close()
            raise _Refusal(
                504, f"dial {address}:{port} timed out after {self.config.dial_timeout:g}s", host
            ) from None
        except OSError as exc:
            upstream.close()
            raise _Refusal(
                502, f"dial {address}:{port} failed: {exc.strerror or exc}", host
            ) from None
        upstream.settimeout(None)
        return upstream

    def _refuse(self, client: socket.socket, refusal: _Refusal, record: _Record) -> None:
        host = refusal.host or record.host or record.target or "?"
        where = f"{host}:{record.port}" if record.port is not None else host
        body = f"egress denied to {_quote(where)}: {refusal.reason}\n".encode("utf-8", "replace")
        header_reason = _header_safe(refusal.reason)
        lines = [
            f"HTTP/1.1 {refusal.status} {_REASONS.get(refusal.status, 'Error')}",
            f"{DENY_HEADER}: {header_reason}",
            "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        if refusal.status == 407:
            lines.append(f'Proxy-Authenticate: Basic realm="{PROXY_USER}"')
        with contextlib.suppress(OSError):
            client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            client.shutdown(socket.SHUT_WR)
            _drain(client)

    # -- data paths ---------------------------------------------------------------------------

    def _connect(
        self, client: socket.socket, upstream: socket.socket, rest: bytes, record: _Record
    ) -> None:
        """Answer an admitted CONNECT, forward what came with its head, then tunnel."""
        record.status = 200
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if rest:
            upstream.sendall(rest)
            record.bytes_up += len(rest)
        self._tunnel(client, upstream, record)

    def _tunnel(self, client: socket.socket, upstream: socket.socket, record: _Record) -> None:
        counts = [0, 0]

        def up() -> None:
            counts[0] = _pump(client, upstream, abort=(client, upstream))

        thread = threading.Thread(target=up, daemon=True)
        thread.start()
        try:
            counts[1] = _pump(upstream, client, abort=(client, upstream))
        finally:
            thread.join()
            record.bytes_up += counts[0]
            record.bytes_down += counts[1]

    def _forward_http(
        self,
        client: socket.socket,
        upstream: socket.socket,
        *,
        head: _Head,
        rest: bytes,
        host: str,
        port: int,
        path: str,
        framing: int | None,
        record: _Record,
    ) -> None:
        connection_tokens = {
            t.strip().lower() for v in head.get_all("Connection") for t in v.split(",")
        }
        lines = [f"{head.method} {path} {head.version}"]
        for name, value in head.headers:
            lowered = name.lower()
            if lowered in _HOP_BY_HOP or lowered in connection_tokens or lowered == "host":
                continue
            lines.append(f"{name}: {value}")
        host_value = f"[{host}]" if ":" in host else host
        lines.append(f"Host: {host_value}" + (f":{port}" if port != 80 else ""))
        lines.append("Connection: close")  # one request per client connection, never a second
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        upstream.sendall(out)
        record.bytes_up += len(out)
        counts = [0]

        def send_body() -> None:
            try:
                counts[0] = _forward_body(client, upstream, rest, framing)
            except (OSError, _Refusal):
                _abort(client, upstream)

        thread = threading.Thread(target=send_body, daemon=True)
        thread.start()
        try:
            self._relay_response(client, upstream, record)
        finally:
            # The response is complete: whatever the client still sends is a second request or
            # the tail of an unread body, and neither may reach this upstream.
            _abort(client, upstream)
            thread.join()
            record.bytes_up += counts[0]

    def _relay_response(
        self, client: socket.socket, upstream: socket.socket, record: _Record
    ) -> None:
        buf = bytearray()
        while True:
            end = buf.find(b"\r\n\r\n")
            if end != -1:
                head_bytes, buf = bytes(buf[:end]), buf[end + 4 :]
                status, out = _filter_response_head(head_bytes)
                client.sendall(out)
                record.bytes_down += len(out)
                if 100 <= status < 200 and status != 101:
                    continue  # an interim response; the final one follows
                record.status = status
                break
            if len(buf) > MAX_HEAD:
                raise _Refusal(502, "origin response head too large", record.host)
            chunk = upstream.recv(65536)
            if not chunk:
                raise _Refusal(502, "origin closed without a response", record.host)
            buf += chunk
        if buf:
            client.sendall(buf)
            record.bytes_down += len(buf)
        record.bytes_down += _pump(upstream, client, abort=(client, upstream))


# ---------------------------------------------------------------------------------------------
# Parsing helpers
# ---------------------------------------------------------------------------------------------


def _parse_head(raw: bytes) -> _Head:
    text = raw.decode("latin-1")
    lines = text.split("\r\n")
    if any("\n" in line or "\r" in line for line in lines):
        raise _Refusal(400, "bare CR or LF in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise _Refusal(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.match(method) or version not in {"HTTP/1.1", "HTTP/1.0"}:
        raise _Refusal(400, "malformed request line")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise _Refusal(400, "malformed header line")
        if any(ord(c) < 0x20 and c != "\t" for c in value):
            raise _Refusal(400, f"control character in header {name}")
        headers.append((name, value.strip(" \t")))
    return _Head(method=method, target=target, version=version, headers=headers)


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    if authority.startswith("["):
        close = authority.find("]")
        if close == -1:
            raise _Refusal(400, f"unterminated IPv6 literal in {_quote(authority)}")
        host, after = authority[: close + 1], authority[close + 1 :]
        if after and not after.startswith(":"):
            raise _Refusal(400, f"junk after IPv6 literal in {_quote(authority)}")
        port_text = after[1:] if after else None
    elif authority.count(":") == 1:
        host, _, port_text = authority.partition(":")
    elif ":" in authority:
        raise _Refusal(400, f"IPv6 literal without brackets in {_quote(authority)}")
    else:
        host, port_text = authority, None
    if port_text is None or port_text == "":
        if default_port is None:
            raise _Refusal(400, f"CONNECT target {_quote(authority)} needs host:port")
        return host, default_port
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        raise _Refusal(400, f"bad port in {_quote(authority)}")
    return host, int(port_text)


def _nonce_from_target(head: _Head) -> str | None:
    if head.method == "CONNECT":
        return None
    _, sep, remainder = head.target.partition("://")
    if not sep:
        return None
    cut = min((i for i in map(remainder.find, "/?") if i != -1), default=len(remainder))
    return _nonce_from_path(remainder[cut:].split("#", 1)[0])


def _nonce_from_path(path: str) -> str | None:
    _, _, query = path.partition("?")
    values = parse_qs(query).get("nonce")
    if values:
        return values[0]
    match = _NONCE_PATH.search(path.split("?", 1)[0])
    return match.group(1) if match else None


def _body_framing(head: _Head) -> int | None:
    """Bytes of request body to forward, or None for chunked framing."""
    te = head.get_all("Transfer-Encoding")
    cl = head.get_all("Content-Length")
    if te and cl:
        raise _Refusal(400, "Transfer-Encoding together with Content-Length")
    if te:
        if len(te) != 1 or te[0].strip().lower() != "chunked":
            raise _Refusal(400, "only 'Transfer-Encoding: chunked' is supported")
        return None
    if cl:
        if len(set(cl)) != 1 or not cl[0].isdigit() or not cl[0].isascii():
            raise _Refusal(400, "malformed or conflicting Content-Length")
        return int(cl[0])
    return 0


class _Reader:
    """Buffered reads from the client, starting with bytes already read with the head."""

    def __init__(self, sock: socket.socket, initial: bytes) -> None:
        self.sock = sock
        self.buf = bytearray(initial)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise OSError("client closed inside the request body")
        self.buf += chunk

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) == -1:
            if len(self.buf) > 8192:
                raise _Refusal(400, "chunk line too long")
            self._fill()
        out = bytes(self.buf[: end + 2])
        del self.buf[: end + 2]
        return out

    def copy(self, n: int, dst: socket.socket) -> int:
        sent = 0
        while sent < n:
            if not self.buf:
                self._fill()
            take = min(n - sent, len(self.buf))
            dst.sendall(self.buf[:take])
            del self.buf[:take]
            sent += take
        return sent


def _forward_body(
    client: socket.socket, upstream: socket.socket, rest: bytes, framing: int | None
) -> int:
    reader = _Reader(client, rest)
    if framing is not None:
        return reader.copy(framing, upstream)
    total = 0
    while True:
        size_line = reader.line()
        size_text = size_line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise _Refusal(400, "malformed chunk size") from None
        upstream.sendall(size_line)
        total += len(size_line)
        if size == 0:
            while True:  # trailers, up to the empty line
                trailer = reader.line()
                upstream.sendall(trailer)
                total += len(trailer)
                if trailer == b"\r\n":
                    return total
        total += reader.copy(size + 2, upstream)


def _filter_response_head(raw: bytes) -> tuple[int, bytes]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise _Refusal(502, "origin sent a malformed status line")
    status = int(parts[1])
    kept = [lines[0]]
    for line in lines[1:]:
        name = line.partition(":")[0].strip().lower()
        # An origin must not be able to forge the proxy's own verdict header.
        if name == DENY_HEADER.lower() or name in _HOP_BY_HOP:
            continue
        kept.append(line)
    if status >= 200:
        kept.append("Connection: close")
    return status, ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1")


def _quote(text: str) -> str:
    return "'" + text[:200].replace("'", "\\'") + "'"


def _header_safe(text: str) -> str:
    return "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in text)[:300]


# ---------------------------------------------------------------------------------------------
# Byte movers
# ---------------------------------------------------------------------------------------------


class _Leash:
    """Ties a handed-over socket, and the upstream dialed for it, to the unix connection.

    The sender keeps that connection open while the payload's connection lives (the shim
    waits for our close). When it closes, because the shim or its whole sandbox is gone, the
    tunnel is cut: without this a sandbox could hand over both ends of one TCP connection and
    leave a tunnel running after it exited. The cut shuts down both ends, the handed-over
    socket and the upstream (`hold`), because each pump blocks reading one of them: shutting
    only the client leaves the pump that reads a silent origin asleep, and the tunnel, its
    threads, descriptors and decision line wait for the origin to close (issue 18).

    Made by `_Server._handle` for a handed-over client only. It never closes a socket: the
    owners close them after `release`, so a shutdown from the watcher can never reach a
    descriptor number that was reused in between.
    """

    def __init__(self, conn: socket.socket, client: socket.socket) -> None:
        self._conn = conn
        self._ends = [client]
        self._lock = threading.Lock()
        self._released = False
        self._fired = False
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @property
    def fired(self) -> bool:
        """Whether the sender closed while the tunnel was held, so the cut ended it."""
        with self._lock:
            return self._fired

    def hold(self, upstream: socket.socket) -> None:
        """Cut `upstream` with the client; at once if the leash fired while it was dialed."""
        with self._lock:
            if self._released:
                return
            self._ends.append(upstream)
            if self._fired:
                _abort(upstream)

    def _watch(self) -> None:
        with contextlib.suppress(OSError):
            # Returns at EOF (the sender is gone) or on any byte (not part of the protocol).
            self._conn.recv(1)
        with self._lock:
            if not self._released:
                self._fired = True
                _abort(*self._ends)  # wakes both pumps; their owners close the sockets

    def release(self) -> None:
        """End the watch before the owners close the sockets; a second call does nothing.

        After it returns the watcher has exited and touches no held socket again.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
        with contextlib.suppress(OSError):
            self._conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher's recv
        self._thread.join()

    def note(self, record: _Record) -> None:
        """Append the cut to `record`'s reason if the leash fired; call once, before writing."""
        if self.fired:
            record.reason = f"{record.reason}; {CUT_REASON}"


def _adopt_handed_socket(fd: int) -> socket.socket:
    """Wrap a descriptor a sandbox handed over; only a connected TCP socket is accepted.

    The proxy only reads, writes and closes it; checking the kind keeps a pipe, a listener, a
    UDP or a unix socket from being served as if it were the payload's connection.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        raise _Refusal(400, "the handed-over descriptor is not a socket") from None
    try:
        is_tcp = (
            sock.family in (socket.AF_INET, socket.AF_INET6)
            and sock.type == socket.SOCK_STREAM
            and sock.proto == socket.IPPROTO_TCP
            and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        )
        if is_tcp:
            sock.getpeername()  # raises ENOTCONN for a socket that never connected
    except OSError:
        is_tcp = False
    if not is_tcp:
        sock.close()
        raise _Refusal(400, "the handed-over descriptor is not a connected TCP socket")
    return sock


def _abort(*socks: socket.socket) -> None:
    """Wake every thread blocked on these sockets; they close in their owner's finally."""
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _drain(sock: socket.socket) -> None:
    # Reading what the client still sends lets it read our error before close() would RST.
    deadline = time.monotonic() + _LINGER_S
    seen = 0
    buf = bytearray(65536)
    while seen < _LINGER_BYTES:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        sock.settimeout(remaining)
        try:
            n = sock.recv_into(buf)
        except OSError:
            return
        if n == 0:
            return
        seen += n


def _pump(src: socket.socket, dst: socket.socket, abort: tuple[socket.socket, ...]) -> int:
    """Copy src to dst until EOF, then half-close dst; on error wake the other direction.

    Returns the number of bytes moved (also when the copy ended in an error). Blocking writes
    are the backpressure: nothing is read from `src` until `dst` accepted the previous chunk.
    Splice only when a unix socket is an end (bench/bench_relay_copy.py, 256 MiB, ratios to a
    direct loopback read): TCP -> TCP it lost to the buffer (0.37-0.43x against 0.48-0.52x);
    TCP -> unix it was even or ahead (0.73-1.01x against 0.70-0.83x).
    """
    moved = [0]
    unix_end = socket.AF_UNIX in (src.family, dst.family)
    try:
        src.settimeout(None)
        dst.settimeout(None)
        (_splice_copy if _HAVE_SPLICE and unix_end else _buffer_copy)(src, dst, moved)
    except OSError:
        _abort(*abort)
        return moved[0]
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)  # pass the half-close through
    return moved[0]


_HAVE_SPLICE = hasattr(os, "splice") and sys.platform.startswith("linux")


def _splice_copy(src: socket.socket, dst: socket.socket, moved: list[int]) -> None:
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a smaller pipe still works, only slower
            import fcntl  # noqa: PLC0415  (Linux only, like splice itself)

            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        src_fd, dst_fd = src.fileno(), dst.fileno()
        while True:
            n = os.splice(src_fd, write_end, _PIPE_SIZE, flags=os.SPLICE_F_MOVE)
            if n == 0:
                return
            while n:
                out = os.splice(read_end, dst_fd, n, flags=os.SPLICE_F_MOVE)
                n -= out
                moved[0] += out
    finally:
        os.close(read_end)
        os.close(write_end)


def _buffer_copy(src: socket.socket, dst: socket.socket, moved: list[int]) -> None:
    buf = bytearray(_BUFFER_START)
    view = memoryview(buf)
    while n := src.recv_into(buf):
        dst.sendall(view[:n])
        moved[0] += n
        if n == len(buf) < _BUFFER_MAX:
            buf = bytearray(2 * len(buf))
            view = memoryview(buf)


# ---------------------------------------------------------------------------------------------
# Entry point of the child process
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the proxy from a config file; the secret arrives on stdin. Returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m sandbox_attest.world.egress.proxy CONFIG.json  (secret on stdin)",
            file=sys.stderr,
        )
        return 2
    # Every wrapper can read this process's command line in /proc: a neutral one, in the
    # shape the sweep finds an orphaned proxy by (sandbox_attest/host/proctitle.py, issue 23).
    set_title(proxy_title(args[0]))
    config = ProxyConfig.from_json(json.loads(Path(args[0]).read_text(encoding="utf-8")))
    register_lab_namespaces(*config.lab_namespaces)
    secret = sys.stdin.readline().strip()
    if not secret:
        print("egress proxy: no secret on stdin; start it with start_proxy()", file=sys.stderr)
        return 2
    server = _Server(config, secret)
    signal.signal(signal.SIGTERM, server.request_stop)
    signal.signal(signal.SIGINT, server.request_stop)
    try:
        ready = server.bind()
        sys.stdout.write(READY_PREFIX + json.dumps(ready) + "\n")
        sys.stdout.flush()
        server.wait()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
