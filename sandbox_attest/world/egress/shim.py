"""In-sandbox shim: bridge 127.0.0.1:PORT to the egress proxy's unix socket.

This file runs INSIDE the sandbox, alone: it is copied or bound in without the rest of the
harness, so it imports only the standard library and runs on Python 3.8+.

    python3 shim.py --unix SOCK --port PORT [--log FILE] [--relay] -- CMD ARGS...
        Listen first (so the payload can connect the moment it starts: readiness by
        construction), run CMD with inherited stdio, serve connections until CMD exits, exit
        with its code.
        Exit 97 without running CMD if the port cannot be bound (with --wait-port S: if it
        is still held by another listener after S seconds).
    python3 shim.py --unix SOCK --port PORT
        Print `READY 127.0.0.1:PORT` on stdout once listening (PORT 0 picks one) and serve
        until SIGTERM.

Each accepted connection is handed to the proxy whole: one NUL byte on the unix socket
carrying the connection's socket (SCM_RIGHTS), after which the proxy serves the payload
directly. The shim keeps that unix connection open until the proxy closes it: the proxy cuts
a handed-over connection when its unix connection closes, so nothing handed over outlives the
shim or its sandbox. If the sandbox refuses descriptor passing, or with --relay, the shim
relays the bytes itself instead (bench/bench_proxy.py measures both).

The shim hands CMD exactly the descriptors it inherited beyond 0-2, read from its own
descriptor table before it opens anything, and none of its own (the listener, the proxy's
connections): a sandbox that leaks descriptors to the payload must leak them with the shim
in between as without it, so the host sees the same payload either way (env_inheritance
judges those descriptors; a shim that closed them would hide the sandbox's mistake).

Diagnostics go to --log FILE (appended) or to stderr prefixed `shim: `, never to stdout: in
CMD mode stdout belongs to the payload, whose one JSON line is the probe's report.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_BIND_FAILED = 97
HANDOFF_MARKER = b"\x00"  # the proxy reads a NUL first byte as "a socket rides with this"
# Relaying (the fallback) uses one 1 MiB buffer per direction. Measured side by side (4
# alternating runs of 256 MiB each): recv_into/sendall moved about 1.25x the bytes per second
# of an os.splice pipe for the unix-socket <-> loopback hops the shim makes, at the same CPU.
_BUFFER = 1024 * 1024


class _Log:
    def __init__(self, path: str | None) -> None:
        self._path = path
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        line = "shim: " + message + "\n"
        with self._lock:
            try:
                if self._path:
                    with open(self._path, "a", encoding="utf-8") as handle:  # noqa: PTH123
                        handle.write(time.strftime("%Y-%m-%dT%H:%M:%S ") + line)
                else:
                    sys.stderr.write(line)
                    sys.stderr.flush()
            except OSError:
                pass  # a diagnostics failure must never break the payload's traffic


def inherited_fds() -> list[int]:
    """The open descriptors above 2 this process holds, by number (call it before opening any).

    Listed from /proc/self/fd (Linux) or /dev/fd (macOS); listing's own descriptor is closed
    by the time the numbers are checked, so only numbers that still answer fstat are kept.
    """
    listed: list[int] = []
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(where)  # noqa: PTH208  (one listing, names only)
        except OSError:
            continue
        listed = [int(name) for name in names if name.isdigit()]
        break
    found = []
    for fd in sorted(listed):
        if fd <= 2:
            continue
        try:
            os.fstat(fd)
        except OSError:
            continue
        found.append(fd)
    return found


def _abort(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _buffer_copy(src: socket.socket, dst: socket.socket) -> int:
    buf = bytearray(_BUFFER)
    view = memoryview(buf)
    total = 0
    while True:
        n = src.recv_into(buf)
        if n == 0:
            return total
        dst.sendall(view[:n])
        total += n


def _pump(
    src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]
) -> None:
    """Copy until EOF, then half-close; blocking writes give backpressure."""
    try:
        _buffer_copy(src, dst)
    except OSError:
        _abort(*pair)  # wake the other direction; the owner closes both
        return
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _hand_off(client: socket.socket, upstream: socket.socket) -> None:
    """Send the marker with the client's socket; the proxy then owns the connection."""
    fds = array.array("i", [client.fileno()])
    upstream.sendmsg([HANDOFF_MARKER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])


def _hold_until_proxy_closes(upstream: socket.socket) -> None:
    """Keep the unix connection (the handed-over connection's lifeline) until the proxy ends."""
    with contextlib.suppress(OSError):
        while upstream.recv(4096):
            pass  # the proxy sends nothing here; a byte would be ignored, not relayed


def _bridge(client: socket.socket, unix_path: str, log: _Log, relay: bool) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            upstream.connect(unix_path)
        except OSError as exc:
            log("cannot reach the proxy socket %s: %s" % (unix_path, exc))  # noqa: UP031
            return
        _serve_connection(client, upstream, log, relay)
    finally:
        upstream.close()
        client.close()


def _serve_connection(
    client: socket.socket, upstream: socket.socket, log: _Log, relay: bool
) -> None:
    """Hand the connection over, or relay it when asked to or when passing is refused."""
    if not relay:
        try:
            _hand_off(client, upstream)
        except OSError as exc:
            # sendmsg is all or nothing: the proxy has seen no byte, so relaying is clean.
            log("handing the connection to the proxy failed (%s); relaying its bytes" % exc)  # noqa: UP031
        else:
            client.close()  # the proxy holds its own reference; ours is not needed
            _hold_until_proxy_closes(upstream)
            return
    pair = (client, upstream)
    thread = threading.Thread(target=_pump, args=(client, upstream, pair), daemon=True)
    thread.start()
    _pump(upstream, client, pair)
    thread.join()


def _serve(listener: socket.socket, unix_path: str, log: _Log, relay: bool) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError as exc:
            if listener.fileno() == -1:
                return
            log("accept failed: %s" % exc)  # noqa: UP031
            time.sleep(0.05)
            continue
        threading.Thread(target=_bridge, args=(client, unix_path, log, relay), daemon=True).start()


def _listen(port: int, wait_s: float) -> socket.socket | str:
    """A listener on 127.0.0.1:`port`, or why there is none.

    SO_REUSEADDR: a connection an earlier shim served leaves TIME_WAIT on its port where the
    network namespace outlives the cell (a wrapper that shares the host's), and that must not
    stop this listener; it never lets two listeners share a port (Linux, macOS: without
    SO_REUSEPORT a live listener still wins). A port another listener holds is waited for up to
    `wait_s` seconds: where cells share a namespace, another cell's shim holds it until its
    payload ends, and this payload has not started (its proxy URL names this port).
    """
    deadline = time.monotonic() + wait_s
    while True:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if os.name != "nt":  # on Windows the option lets a bind take a live port
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
        except OSError as exc:
            listener.close()
            if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            why = "cannot listen on 127.0.0.1:%d: %s" % (port, exc)  # noqa: UP031
            if exc.errno == errno.EADDRINUSE:
                why += (
                    " (another listener in this network namespace held it%s: a namespace"
                    " shared with the host or other cells, or a service of the sandbox's own"
                    " on that port)" % (" for %.0f s" % wait_s if wait_s > 0 else "")  # noqa: UP031
                )
            return why
        return listener


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="shim.py", description="Bridge 127.0.0.1:PORT to the egress proxy's unix socket."
    )
    parser.add_argument("--unix", required=True, help="the proxy's unix socket path")
    parser.add_argument("--port", required=True, type=int, help="loopback port (0 = pick one)")
    parser.add_argument("--log", default=None, help="append diagnostics here instead of stderr")
    parser.add_argument(
        "--relay", action="store_true", help="relay bytes instead of handing connections over"
    )
    parser.add_argument(
        "--wait-port",
        type=float,
        default=0.0,
        help="seconds to wait for PORT while another listener holds it (default 0)",
    )
    return parser.parse_args(argv), command


def main(argv: list[str] | None = None) -> int:
    """Run the shim; returns the exit code (CMD's code in CMD mode)."""
    # First, before the listener or a log opens: what the sandbox handed us is CMD's.
    inherited = inherited_fds()
    args, command = _parse(sys.argv[1:] if argv is None else argv)
    log = _Log(args.log)
    listener = _listen(args.port, args.wait_port)
    if isinstance(listener, str):
        # Always to stderr, whatever --log says: the caller needs the reason next to the 97.
        sys.stderr.write("shim: " + listener + "\n")
        return EXIT_BIND_FAILED
    port = listener.getsockname()[1]
    threading.Thread(
        target=_serve, args=(listener, args.unix, log, args.relay), daemon=True
    ).start()
    stop = threading.Event()
    if not command:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        sys.stdout.write("READY 127.0.0.1:%d\n" % port)  # noqa: UP031
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
        listener.close()
        return 0
    try:
        # close_fds stays on for the shim's own descriptors; pass_fds keeps (and makes
        # inheritable) exactly the inherited ones, numbers unchanged.
        child = subprocess.Popen(command, pass_fds=inherited)
    except OSError as exc:
        log("cannot run %r: %s" % (command[0], exc))  # noqa: UP031
        listener.close()
        return 127
    # Pass a polite stop on to the payload rather than dying under it.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: child.send_signal(s))
    code = child.wait()
    listener.close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
