"""Benchmark: 256 MiB through shim + proxy against a direct loopback copy, in one run.

    python bench/bench_proxy.py [--mib 256]

Prints MB/s for three paths measured alternately from the same source (its own process, as
the world's origins are never the payload's process): a direct loopback copy, shim + proxy
as sandboxes use them (the shim hands each connection to the proxy), and shim + proxy with
the shim relaying bytes itself (`--relay`, its fallback). Then their ratios to direct (target
>= 0.5x for the handoff path), the proxy's and shim's CPU seconds per GiB (utime + stime from
/proc/PID/stat; proxy target <= 0.6 s), and the proxy's RSS growth while 512 MiB are offered
to a client that never reads (target < 8 MiB). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_attest.world.dns import DnsFixture
from sandbox_attest.world.egress.config import ProxyConfig
from sandbox_attest.world.egress.proxy import ProxyProcess, start_proxy
from sandbox_attest.world.egress.rules import Rule

if TYPE_CHECKING:
    from collections.abc import Iterator

MIB = 1024 * 1024
SHIM = Path(__file__).resolve().parents[1] / "sandbox_attest" / "world" / "egress" / "shim.py"
ROUNDS = 7
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Source:
    """A loopback origin that sends `size` bytes to every client, then closes."""

    def __init__(self, size: int) -> None:
        """Listen on a free loopback port and serve in a daemon thread."""
        self.size = size
        self.offered = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        block = os.urandom(MIB)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._send, args=(conn, block), daemon=True).start()

    def _send(self, conn: socket.socket, block: bytes) -> None:
        with conn, contextlib.suppress(OSError):
            for _ in range(self.size // MIB):
                conn.sendall(block)
                self.offered += MIB


@dataclass(frozen=True)
class Endpoint:
    """Where a source listens and how much it sends per connection."""

    port: int
    size: int


@contextlib.contextmanager
def source_process(size: int) -> Iterator[Endpoint]:
    """A Source in a child process (`--source SIZE`); yields its endpoint.

    In real runs the origin (the world) and the payload are different processes, so the
    sending and the reading end must not share one interpreter lock here either.
    """
    proc = subprocess.Popen(
        [sys.executable, __file__, "--source", str(size)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield Endpoint(int(proc.stdout.readline()), size)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def drain(sock: socket.socket, expected: int) -> float:
    """Read until EOF; returns seconds. Raises if the byte count is wrong."""
    buf = bytearray(MIB)
    got = 0
    started = time.perf_counter()
    while n := sock.recv_into(buf):
        got += n
    elapsed = time.perf_counter() - started
    if got != expected:
        raise SystemExit(f"short transfer: {got} of {expected} bytes")
    return elapsed


def cpu_seconds(pid: int) -> float:
    """Utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def shim(socket_path: Path, *extra: str) -> Iterator[tuple[int, int]]:
    """The shim in serve mode; yields (port, pid)."""
    proc = subprocess.Popen(
        [sys.executable, str(SHIM), "--unix", str(socket_path), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        yield int(line.strip().rsplit(":", 1)[1]), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def read_status(sock: socket.socket) -> int:
    """Read the proxy's response head byte by byte (so no payload byte is consumed)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise SystemExit("proxy closed before answering")
        head += chunk
    return int(head.split(b" ", 2)[1])


@dataclass
class Route:
    """One way of reaching the source: its timings and the CPU its relays spent."""

    label: str
    seconds: list[float] = field(default_factory=list)
    proxy_cpu: float = 0.0
    shim_cpu: float = 0.0


def through_shim(
    path: Route, shim_port: int, shim_pid: int, proxy_pid: int, source: Endpoint
) -> None:
    """One CONNECT transfer via a shim; adds its time and both processes' CPU to `path`."""
    proxy_before, shim_before = cpu_seconds(proxy_pid), cpu_seconds(shim_pid)
    with socket.create_connection(("127.0.0.1", shim_port)) as sock:
        sock.sendall(f"CONNECT allowed.test:{source.port} HTTP/1.1\r\n\r\n".encode())
        if read_status(sock) != 200:
            raise SystemExit("proxy refused the benchmark CONNECT")
        path.seconds.append(drain(sock, source.size))
    time.sleep(0.1)  # let the relays finish their closes before reading their CPU
    path.proxy_cpu += cpu_seconds(proxy_pid) - proxy_before
    path.shim_cpu += cpu_seconds(shim_pid) - shim_before


def stalled_reader_growth(proxy: ProxyProcess, stall_source: Source) -> tuple[float, int]:
    """Proxy RSS growth (MiB) from before the CONNECT to 2.3 s into a client that never reads.

    Counted from before the connection, so the relay's own buffer (it grows to 4 MiB while
    the origin pushes) is inside the figure, not hidden in the baseline.
    """
    assert proxy.port is not None
    rss_before = rss_kib(proxy.pid)
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        token = base64.b64encode(f"sandbox-attest:{proxy.secret}".encode()).decode()
        sock.sendall(
            f"CONNECT allowed.test:{stall_source.port} HTTP/1.1\r\n"
            f"Proxy-Authorization: Basic {token}\r\n\r\n".encode()
        )
        if read_status(sock) != 200:
            raise SystemExit("proxy refused the stall CONNECT")
        time.sleep(2.3)
        return (rss_kib(proxy.pid) - rss_before) / 1024, stall_source.offered


def main() -> int:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--source", type=int, help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args()
    if args.source is not None:
        child = Source(args.source)
        print(child.port, flush=True)
        threading.Event().wait()  # serve until killed
    size = args.mib * MIB
    stall_source = Source(512 * MIB)
    direct = Route("direct loopback")
    handoff = Route("shim hands off")
    relay = Route("shim relays")
    with (
        tempfile.TemporaryDirectory() as tmp,
        DnsFixture({"allowed.test": "127.0.0.1"}) as dns,
        source_process(size) as source,
    ):
        ports = (source.port, stall_source.port)
        rules = (Rule("allowed.test", ports=ports, allow_private=True),)
        sock_path = Path(tmp) / "proxy.sock"
        config = ProxyConfig(
            rules=rules,
            dns=("127.0.0.1", dns.port),
            unix_socket=sock_path,
            tcp=True,
            decision_log=Path(tmp) / "decisions.jsonl",
        )
        with (
            start_proxy(config) as proxy,
            shim(sock_path) as (handoff_port, handoff_pid),
            shim(sock_path, "--relay") as (relay_port, relay_pid),
        ):
            # Alternate the three paths from the same source in the same run and take
            # medians: the machine is shared, and single runs swing by 2x either way.
            for _ in range(ROUNDS):
                with socket.create_connection(("127.0.0.1", source.port)) as sock:
                    direct.seconds.append(drain(sock, size))
                through_shim(handoff, handoff_port, handoff_pid, proxy.pid, source)
                through_shim(relay, relay_port, relay_pid, proxy.pid, source)
            growth, offered = stalled_reader_growth(proxy, stall_source)
    gib = size * ROUNDS / (1024 * MIB)
    direct_mbs = size / statistics.median(direct.seconds) / 1e6
    print(f"transfer            {size // MIB} MiB x {ROUNDS} rounds, alternating (medians)")
    print(f"{direct.label:20}{direct_mbs:8.0f} MB/s")
    for path in (handoff, relay):
        mbs = size / statistics.median(path.seconds) / 1e6
        target = "   (target >= 0.5x)" if path is handoff else ""
        print(f"{path.label:20}{mbs:8.0f} MB/s  {mbs / direct_mbs:5.2f}x{target}")
        print(
            f"{'':20}proxy CPU {path.proxy_cpu / gib:.3f} s/GiB (target <= 0.6), "
            f"shim CPU {path.shim_cpu / gib:.3f} s/GiB"
        )
    print(
        f"stalled reader      {growth:8.2f} MiB RSS growth (target < 8); "
        f"origin got {offered // MIB} of 512 MiB out"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
