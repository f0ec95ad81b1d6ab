r"""Host-side broker: the AppContainer's named pipe -> the egress proxy's loopback TCP port.

The container holds no proxy secret. Each pipe connection is relayed to the proxy's TCP
port, and the broker puts `Proxy-Authorization: Basic <userinfo of the proxy URL>` into every
request head it forwards, after removing any the container sent. After a CONNECT head, or a
request whose body is chunked, the rest of the connection is relayed blind: a CONNECT tunnel
is opaque by design, and a later request on a chunked connection reaches the proxy without
credentials and is refused (407), which fails closed.

Bounded like the proxy: a request head over 64 KiB closes the connection unforwarded.

The pipe itself (Windows): created with the SDDL from `appcontainer.pipe_sddl`, first
instance exclusive (FILE_FLAG_FIRST_PIPE_INSTANCE, so no one can have pre-created the name),
remote clients rejected, byte mode, overlapped I/O via CPython's `_winapi`. On POSIX the same
broker listens on a unix socket instead, so the relay logic runs under the Linux test suite.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import importlib
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import unquote, urlsplit

from sandbox_attest.errors import ConfigError, FixtureError
from sandbox_attest.world.egress.pipe_shim import PipeChannel, SocketChannel, pump

MAX_HEAD: Final = 64 * 1024
CHUNK: Final = 65536
_WINDOWS: Final = sys.platform == "win32"
# winbase.h / winnt.h
PIPE_ACCESS_DUPLEX: Final = 0x00000003
FILE_FLAG_FIRST_PIPE_INSTANCE: Final = 0x00080000
FILE_FLAG_OVERLAPPED: Final = 0x40000000
PIPE_REJECT_REMOTE_CLIENTS: Final = 0x00000008  # byte type, byte read mode, blocking: all 0
PIPE_UNLIMITED_INSTANCES: Final = 255
ERROR_PIPE_CONNECTED: Final = 535
ERROR_IO_PENDING: Final = 997
WAIT_TIMEOUT: Final = 0x102


class Channel(Protocol):
    """A duplex byte stream (socket or pipe)."""

    half_close: bool

    def recv(self, size: int) -> bytes:
        """Up to size bytes; b"" at EOF."""
        ...

    def sendall(self, data: bytes) -> None:
        """Send every byte."""
        ...

    def shutdown_write(self) -> None:
        """Half-close when the channel can."""
        ...

    def close(self) -> None:
        """Close."""
        ...


def proxy_authorization(proxy_url: str) -> tuple[tuple[str, int], bytes]:
    """The proxy's (host, port) and the Proxy-Authorization value from the URL's userinfo.

    Raises:
        ConfigError: the URL is not loopback, has no port, or carries no userinfo.
    """
    parts = urlsplit(proxy_url)
    if parts.hostname not in {"127.0.0.1", "::1", "localhost"} or parts.port is None:
        raise ConfigError(
            f"pipe broker: proxy URL must be loopback with a port (got host "
            f"{parts.hostname!r}); pass the proxy's tcp_url"
        )
    if parts.username is None:
        raise ConfigError("pipe broker: the proxy URL has no userinfo; pass the proxy's tcp_url")
    userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
    return (host, parts.port), b"Basic " + base64.b64encode(userinfo.encode())


class HeadError(ValueError):
    """A request head the broker will not forward."""


def rewrite_head(head: bytes, authorization: bytes) -> tuple[bytes, bool, int]:
    r"""Put our Proxy-Authorization into one request head (which ends with \r\n\r\n).

    Returns:
        (the new head, whether the rest of the connection must be relayed blind, the
        number of body bytes that follow this head).

    Raises:
        HeadError: no request line, or conflicting Content-Length values.
    """
    lines = head[:-4].split(b"\r\n")
    request_line = lines[0]
    if request_line.count(b" ") < 2:
        raise HeadError("malformed request line")
    method = request_line.split(b" ", 1)[0].upper()
    kept = [request_line, b"Proxy-Authorization: " + authorization]
    lengths: set[int] = set()
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"proxy-authorization":
            continue  # never forward a credential the container chose
        if key == b"content-length":
            if not value.strip().isdigit():
                raise HeadError("bad Content-Length")
            lengths.add(int(value.strip()))
        if key == b"transfer-encoding":
            chunked = True
        kept.append(line)
    if len(lengths) > 1:
        raise HeadError("conflicting Content-Length")
    blind = method == b"CONNECT" or chunked
    body = 0 if blind else (lengths.pop() if lengths else 0)
    return b"\r\n".join(kept) + b"\r\n\r\n", blind, body


def _read_head(client: Channel, buffer: bytes) -> tuple[bytes, bytes] | None:
    r"""(head, rest) once a full head is buffered; None at EOF or past MAX_HEAD."""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > MAX_HEAD:
            return None
        data = client.recv(CHUNK)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n") + 4
    if end > MAX_HEAD:
        return None
    return buffer[:end], buffer[end:]


def forward_requests(client: Channel, upstream: Channel, authorization: bytes) -> None:
    """Client -> proxy: rewrite each request head, copy bodies, go blind when told to."""
    buffer = b""
    while (found := _read_head(client, buffer)) is not None:
        raw, buffer = found
        try:
            head, blind, body = rewrite_head(raw, authorization)
        except HeadError:
            return
        upstream.sendall(head)
        if blind:
            if buffer:
                upstream.sendall(buffer)
            pump(client, upstream, lambda: None)
            return
        while body:
            if not buffer:
                buffer = client.recv(min(CHUNK, body))
                if not buffer:
                    return
            piece, buffer = buffer[:body], buffer[body:]
            upstream.sendall(piece)
            body -= len(piece)


def serve_connection(client: Channel, proxy: tuple[str, int], authorization: bytes) -> None:
    """Relay one pipe connection to a fresh proxy connection; close both at the end."""
    try:
        sock = socket.create_connection(proxy, timeout=10)
    except OSError:
        client.close()
        return
    sock.settimeout(None)
    upstream = SocketChannel(sock)
    closed = threading.Event()

    def close_both() -> None:
        if not closed.is_set():
            closed.set()
            for channel in (client, upstream):
                with contextlib.suppress(OSError):
                    channel.close()

    back = threading.Thread(target=pump, args=(upstream, client, close_both), daemon=True)
    back.start()
    with contextlib.suppress(OSError):
        forward_requests(client, upstream, authorization)
    # Requests are over (EOF, refusal, or a tunnel that ended): let the proxy finish its
    # answer, then close.
    upstream.shutdown_write()
    back.join()
    close_both()


class PipeBroker:
    """Accepts pipe (or, on POSIX, unix-socket) connections and relays each to the proxy."""

    def __init__(self, address: str, sddl: str, proxy_url: str) -> None:
        """Bind the pipe or socket now; relaying starts with `start()`."""
        self.address = address
        self.sddl = sddl
        self.proxy, self.authorization = proxy_authorization(proxy_url)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clients: list[Channel] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        if not _WINDOWS:
            posix: Any = socket  # AF_UNIX is absent from Windows builds
            self._listener = socket.socket(posix.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(address)
            Path(address).chmod(0o600)
            self._listener.listen(64)

    def start(self) -> PipeBroker:
        """Start the accept loop in a daemon thread."""
        target = self._accept_posix if self._listener is not None else self._accept_windows
        thread = threading.Thread(target=target, name="pipe-broker", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def _spawn(self, client: Channel) -> None:
        with self._lock:
            self._clients.append(client)
            thread = threading.Thread(
                target=serve_connection, args=(client, self.proxy, self.authorization), daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _accept_posix(self) -> None:
        assert self._listener is not None  # noqa: S101  (set in __init__ on POSIX)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._spawn(SocketChannel(conn))

    def _accept_windows(self) -> None:
        winapi: Any = importlib.import_module("_winapi")
        win: Any = ctypes
        advapi = win.WinDLL("advapi32", use_last_error=True)
        descriptor = ctypes.c_void_p()
        if not advapi.ConvertStringSecurityDescriptorToSecurityDescriptorW(
            self.sddl, 1, ctypes.byref(descriptor), None
        ):
            raise FixtureError(f"pipe broker: SDDL {self.sddl!r} rejected by Windows")

        class SecurityAttributes(ctypes.Structure):
            _fields_ = (
                ("nLength", ctypes.c_uint32),
                ("lpSecurityDescriptor", ctypes.c_void_p),
                ("bInheritHandle", ctypes.c_int32),
            )

        attrs = SecurityAttributes(ctypes.sizeof(SecurityAttributes), descriptor.value, 0)
        first = FILE_FLAG_FIRST_PIPE_INSTANCE
        while not self._stop.is_set():
            handle = winapi.CreateNamedPipe(
                self.address,
                PIPE_ACCESS_DUPLEX | FILE_FLAG_OVERLAPPED | first,
                PIPE_REJECT_REMOTE_CLIENTS,
                PIPE_UNLIMITED_INSTANCES,
                CHUNK,
                CHUNK,
                0,
                ctypes.addressof(attrs),
            )
            first = 0
            ov = winapi.ConnectNamedPipe(handle, overlapped=True)
            connected = False
            while not self._stop.is_set():
                if winapi.WaitForMultipleObjects([ov.event], False, 200) != WAIT_TIMEOUT:  # noqa: FBT003
                    connected = True
                    break
            if not connected:
                ov.cancel()
                winapi.CloseHandle(handle)
                return
            _, err = ov.GetOverlappedResult(True)  # noqa: FBT003
            if err not in (0, ERROR_PIPE_CONNECTED):
                winapi.CloseHandle(handle)
                continue
            self._spawn(PipeChannel(handle))

    def stop(self) -> None:
        """Stop accepting, close every relay, wait for the threads."""
        self._stop.set()
        if self._listener is not None:
            # shutdown wakes the thread blocked in accept(); close alone does not on Linux.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            with contextlib.suppress(OSError):
                Path(self.address).unlink()
        with self._lock:
            clients = list(self._clients)
            threads = list(self._threads)
        for client in clients:
            with contextlib.suppress(OSError):
                client.close()
        for thread in threads:
            thread.join(timeout=5)


def start_pipe_broker(address: str, sddl: str, proxy_url: str) -> PipeBroker:
    """Create and start a broker (the AppContainer backend's default factory)."""
    return PipeBroker(address, sddl, proxy_url).start()
