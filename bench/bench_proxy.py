"""Benchmark: 256 MiB through shim + proxy against a direct loopback copy, in one run.

    python bench/bench_proxy.py [--mib 256]

Prints MB/s for both paths and their ratio (target >= 0.5x), the proxy's CPU seconds per GiB
(utime + stime from /proc/PID/stat; target <= 0.6 s), and the proxy's RSS growth while 512 MiB
are offered to a client that never reads (target < 8 MiB). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.dns import DnsFixture
from harness.egress.proxy import ProxyConfig, start_proxy
from harness.egress.rules import Rule

if TYPE_CHECKING:
    from collections.abc import Iterator

MIB = 1024 * 1024
SHIM = Path(__file__).resolve().parents[1] / "harness" / "egress" / "shim.py"
ROUNDS = 5
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
def shim(socket_path: Path) -> Iterator[tuple[int, int]]:
    """The shim in serve mode; yields (port, pid)."""
    proc = subprocess.Popen(
        [sys.executable, str(SHIM), "--unix", str(socket_path), "--port", "0"],
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


def main() -> int:  # noqa: PLR0915  (one linear script, read top to bottom)
    """Run the three measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    size = parser.parse_args().mib * MIB
    source = Source(size)
    stall_source = Source(512 * MIB)
    rules = (Rule("allowed.test", ports=(source.port, stall_source.port), allow_private=True),)
    with tempfile.TemporaryDirectory() as tmp, DnsFixture({"allowed.test": "127.0.0.1"}) as dns:
        config = ProxyConfig(
            rules=rules,
            dns=("127.0.0.1", dns.port),
            unix_socket=Path(tmp) / "proxy.sock",
            tcp=True,
            decision_log=Path(tmp) / "decisions.jsonl",
        )
        with start_proxy(config) as proxy, shim(Path(tmp) / "proxy.sock") as (shim_port, shim_pid):
            # Alternate direct and proxied copies from the same source in the same run and
            # take medians: the machine is shared, and single runs swing by 2x either way.
            directs: list[float] = []
            proxieds: list[float] = []
            cpu = shim_cpu = 0.0
            for _ in range(ROUNDS):
                with socket.create_connection(("127.0.0.1", source.port)) as sock:
                    directs.append(drain(sock, size))
                cpu_before = cpu_seconds(proxy.pid)
                shim_cpu_before = cpu_seconds(shim_pid)
                with socket.create_connection(("127.0.0.1", shim_port)) as sock:
                    sock.sendall(f"CONNECT allowed.test:{source.port} HTTP/1.1\r\n\r\n".encode())
                    if read_status(sock) != 200:
                        raise SystemExit("proxy refused the benchmark CONNECT")
                    proxieds.append(drain(sock, size))
                time.sleep(0.1)
                cpu += cpu_seconds(proxy.pid) - cpu_before
                shim_cpu += cpu_seconds(shim_pid) - shim_cpu_before
            direct = statistics.median(directs)
            proxied = statistics.median(proxieds)

            assert proxy.port is not None
            with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
                import base64  # noqa: PLC0415

                token = base64.b64encode(f"sandbox-attest:{proxy.secret}".encode()).decode()
                sock.sendall(
                    f"CONNECT allowed.test:{stall_source.port} HTTP/1.1\r\n"
                    f"Proxy-Authorization: Basic {token}\r\n\r\n".encode()
                )
                if read_status(sock) != 200:
                    raise SystemExit("proxy refused the stall CONNECT")
                time.sleep(0.3)
                rss_before = rss_kib(proxy.pid)
                time.sleep(2.0)
                rss_after = rss_kib(proxy.pid)
                offered = stall_source.offered
    gib = size * ROUNDS / (1024 * MIB)
    direct_mbs = size / direct / 1e6
    proxied_mbs = size / proxied / 1e6
    print(f"transfer            {size // MIB} MiB x {ROUNDS} rounds (medians)")
    print(f"direct loopback     {direct_mbs:8.0f} MB/s")
    print(f"shim + proxy        {proxied_mbs:8.0f} MB/s")
    print(f"ratio               {proxied_mbs / direct_mbs:8.2f}x   (target >= 0.5x)")
    print(f"proxy CPU           {cpu / gib:8.3f} s/GiB (target <= 0.6)")
    print(f"shim CPU            {shim_cpu / gib:8.3f} s/GiB")
    growth = (rss_after - rss_before) / 1024
    print(
        f"stalled reader      {growth:8.2f} MiB RSS growth (target < 8); "
        f"origin got {offered // MIB} of 512 MiB out"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
