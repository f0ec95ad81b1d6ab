r"""In-container shim: bridge 127.0.0.1:PORT to the broker's named pipe, then run the payload.

Runs INSIDE the AppContainer, so it is stdlib-only and Python 3.8+ (never imports `harness`).
Usage, the same shape as `sandbox_attest/world/egress/shim.py`:

    python pipe_shim.py --pipe \\.\pipe\NAME --port PORT [--log FILE] -- CMD...

Each connection accepted on 127.0.0.1:PORT gets its own client instance of the pipe; bytes are
copied both ways unchanged (the host broker adds the proxy credentials, which never enter the
container). The shim exits with the payload's exit code.

The pipe is opened with FILE_READ_DATA | FILE_WRITE_DATA only: `open(name, "r+b")` would ask
for GENERIC_WRITE, which on a pipe includes FILE_CREATE_PIPE_INSTANCE, a right the pipe's DACL
withholds from the container on purpose. Reads and writes are overlapped because synchronous
I/O on one pipe handle is serialized by Windows: a blocked read would stall every write.

On POSIX hosts `--pipe` names a unix socket instead, so the same code runs under the test
suite on Linux. On Windows the shim also prints the token facts it sees (IsAppContainer,
integrity level, capability count) as one `shim: token-facts {json}` line on stderr, which
the backend records as evidence of what actually confined the payload. It must stay the
first line the shim writes, before the payload starts: the backend trusts only stderr's
first line, since the payload shares stderr and can print a look-alike line later.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, List, Optional  # noqa: UP035  (Python 3.8 runs this)

PREFIX = "shim: "
CHUNK = 65536
# FILE_READ_DATA | FILE_WRITE_DATA | FILE_READ_ATTRIBUTES | SYNCHRONIZE (winnt.h).
PIPE_CLIENT_ACCESS = 0x0001 | 0x0002 | 0x0080 | 0x00100000
ERROR_PIPE_BUSY = 231
ERROR_SEM_TIMEOUT = 121
ERROR_BROKEN_PIPE = 109
ERROR_IO_PENDING = 997
# A plain bool, not `sys.platform` inline: type checkers then check both sides on every host.
_WINDOWS = sys.platform == "win32"


def _winapi() -> Any:
    """CPython's private `_winapi` (what multiprocessing's pipes use); Windows only."""
    return importlib.import_module("_winapi")


class SocketChannel:
    """A connected socket as a byte channel."""

    half_close = True

    def __init__(self, sock: socket.socket) -> None:
        """Wrap a connected socket."""
        self.sock = sock

    def recv(self, size: int) -> bytes:
        """Up to size bytes; b"" at EOF or on a reset."""
        try:
            return self.sock.recv(size)
        except OSError:
            return b""

    def sendall(self, data: bytes) -> None:
        """Send every byte (raises OSError when the peer is gone)."""
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        """Send FIN; the other direction stays open."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Shut down (which wakes a thread blocked in recv, unlike close) and close."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class PipeChannel:
    """A Windows named-pipe handle (opened overlapped) as a byte channel."""

    # A pipe has no half-close: EOF towards it can only be a full close.
    half_close = False

    def __init__(self, handle: int) -> None:
        """Wrap an overlapped pipe handle; the channel owns it."""
        self.handle = handle
        self.lock = threading.Lock()
        self.closed = False

    def _complete(self, ov: Any, err: int) -> int:
        winapi = _winapi()

        try:
            if err == ERROR_IO_PENDING:
                winapi.WaitForMultipleObjects([ov.event], False, winapi.INFINITE)  # noqa: FBT003
        except BaseException:
            ov.cancel()
            raise
        count, err = ov.GetOverlappedResult(True)  # noqa: FBT003
        if err not in (0, ERROR_BROKEN_PIPE):
            raise OSError(err, "pipe I/O failed")
        return int(count)

    def recv(self, size: int) -> bytes:
        """Up to size bytes; b"" when the other end is gone."""
        winapi = _winapi()

        try:
            ov, err = winapi.ReadFile(self.handle, size, overlapped=True)
            count = self._complete(ov, err)
        except OSError:
            return b""
        return bytes(ov.getbuffer())[:count]

    def sendall(self, data: bytes) -> None:
        """Write every byte."""
        winapi = _winapi()

        view = memoryview(data)
        while view:
            ov, err = winapi.WriteFile(self.handle, bytes(view), overlapped=True)
            view = view[self._complete(ov, err) :]

    def shutdown_write(self) -> None:
        """Not possible on a pipe; the relay closes both sides instead."""

    def close(self) -> None:
        """Close the handle once."""
        winapi = _winapi()

        with self.lock:
            if not self.closed:
                self.closed = True
                winapi.CloseHandle(self.handle)


def open_pipe(name: str, timeout: float = 10.0) -> Any:
    """Connect to the broker: a named pipe on Windows, a unix socket elsewhere."""
    if not _WINDOWS:
        posix: Any = socket  # AF_UNIX is absent from Windows builds of CPython
        sock = socket.socket(posix.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(name)
        return SocketChannel(sock)
    winapi = _winapi()

    deadline = time.monotonic() + timeout
    while True:
        try:
            handle = winapi.CreateFile(
                name,
                PIPE_CLIENT_ACCESS,
                0,
                winapi.NULL,
                winapi.OPEN_EXISTING,
                winapi.FILE_FLAG_OVERLAPPED,
                winapi.NULL,
            )
            return PipeChannel(handle)
        except OSError as exc:
            busy = getattr(exc, "winerror", None) in (ERROR_PIPE_BUSY, ERROR_SEM_TIMEOUT)
            if not busy or time.monotonic() > deadline:
                raise
            winapi.WaitNamedPipe(name, 1000)


def pump(src: Any, dst: Any, done: Callable[[], None]) -> None:
    """Copy src to dst until EOF; then half-close dst (or call `done` to close both)."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        done()
        return
    if dst.half_close and src.half_close:
        dst.shutdown_write()
    else:
        done()


def relay(a: Any, b: Any) -> None:
    """Copy both ways between two channels until both directions end; close both."""
    lock = threading.Lock()
    state = {"closed": False}

    def close_both() -> None:
        with lock:
            if state["closed"]:
                return
            state["closed"] = True
        for channel in (a, b):
            with contextlib.suppress(OSError):
                channel.close()

    back = threading.Thread(target=pump, args=(b, a, close_both), daemon=True)
    back.start()
    pump(a, b, close_both)
    back.join()
    close_both()


def serve(listener: socket.socket, connect: Callable[[], Any], log: Callable[[str], None]) -> None:
    """Accept on `listener` forever; relay each connection to a fresh upstream channel."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # the listener was closed: the payload has exited
        try:
            upstream = connect()
        except OSError as exc:
            log(f"cannot reach the broker pipe: {exc}")
            conn.close()
            continue
        threading.Thread(target=relay, args=(SocketChannel(conn), upstream), daemon=True).start()


def token_facts() -> dict:  # type: ignore[type-arg]  # plain JSON for 3.8
    """What the process token says about this process (Windows only; {} elsewhere).

    Keys: is_app_container (bool), integrity_rid (0x1000 = Low), capability_count (int),
    app_container_sid (str or None), error (str, only if a query failed).
    """
    if not _WINDOWS:
        return {}
    import ctypes  # noqa: PLC0415
    from ctypes import wintypes  # noqa: PLC0415

    # WinDLL and get_last_error exist only on Windows; Any keeps both hosts' checkers honest.
    win: Any = ctypes
    advapi = win.WinDLL("advapi32", use_last_error=True)
    kernel = win.WinDLL("kernel32", use_last_error=True)
    kernel.GetCurrentProcess.restype = wintypes.HANDLE
    advapi.GetSidSubAuthority.restype = ctypes.POINTER(wintypes.DWORD)
    advapi.GetSidSubAuthorityCount.restype = ctypes.POINTER(ctypes.c_ubyte)
    token = wintypes.HANDLE()
    if not advapi.OpenProcessToken(kernel.GetCurrentProcess(), 0x0008, ctypes.byref(token)):
        return {"error": f"OpenProcessToken: {win.get_last_error()}"}

    def query(info_class: int) -> Any:
        size = wintypes.DWORD()
        advapi.GetTokenInformation(token, info_class, None, 0, ctypes.byref(size))
        buf = ctypes.create_string_buffer(max(size.value, 8))
        if not advapi.GetTokenInformation(token, info_class, buf, size, ctypes.byref(size)):
            raise OSError(win.get_last_error(), f"GetTokenInformation({info_class})")
        return buf

    facts: dict = {}  # type: ignore[type-arg]
    try:
        facts["is_app_container"] = bool(wintypes.DWORD.from_buffer(query(29)).value)
        label = query(25)  # TokenIntegrityLevel: TOKEN_MANDATORY_LABEL { SID_AND_ATTRIBUTES }
        sid = ctypes.c_void_p.from_buffer(label).value
        count = advapi.GetSidSubAuthorityCount(ctypes.c_void_p(sid)).contents.value
        rid = advapi.GetSidSubAuthority(ctypes.c_void_p(sid), count - 1).contents.value
        facts["integrity_rid"] = int(rid)
        facts["capability_count"] = int(wintypes.DWORD.from_buffer(query(30)).value)
    except OSError as exc:
        facts["error"] = str(exc)
    finally:
        kernel.CloseHandle(token)
    return facts


def main(argv: Optional[List[str]] = None) -> int:  # noqa: UP006, UP045  (3.8 syntax)
    """Parse the CLI, start the bridge, run the payload, return its exit code."""
    parser = argparse.ArgumentParser(prog="pipe_shim", description=__doc__.splitlines()[0])
    parser.add_argument("--pipe", required=True, help="the broker's pipe (unix socket on POSIX)")
    parser.add_argument("--port", type=int, required=True, help="loopback port to listen on")
    parser.add_argument("--log", help="append diagnostics to this file as well as stderr")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no payload command after --")
    log_file: Optional[IO[str]] = open(args.log, "a") if args.log else None  # noqa: SIM115, PTH123, UP045

    def log(message: str) -> None:
        sys.stderr.write(PREFIX + message + "\n")
        sys.stderr.flush()
        if log_file is not None:
            log_file.write(message + "\n")
            log_file.flush()

    # First, before anything else is written and before the payload exists: the backend
    # takes only stderr's first line as the token facts (see the module docstring).
    facts = token_facts()
    if facts:
        log("token-facts " + json.dumps(facts, sort_keys=True))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", args.port))
        listener.listen(64)
    except OSError as exc:
        log(f"cannot listen on 127.0.0.1:{args.port}: {exc}")
        return 97  # as shim.py: the payload never ran, and the missing marker says so
    threading.Thread(
        target=serve, args=(listener, lambda: open_pipe(args.pipe), log), daemon=True
    ).start()
    try:
        code = subprocess.call(command)
    except OSError as exc:
        log(f"cannot start the payload {command[0]!r}: {exc}")
        code = 127
    listener.close()
    if log_file is not None:
        log_file.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
