"""The in-sandbox shim as a real subprocess: exit codes, bind failure, stdout discipline."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import TYPE_CHECKING

from sandbox_attest.world.egress.rules import Rule
from tests.egress.egress_helpers import SHIM, read_all, read_head

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from sandbox_attest.world.egress.proxy import ProxyProcess
    from tests.egress.egress_helpers import Origin


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class TestShim:
    def test_exit_code_passthrough(self, tmp_path: Path) -> None:
        """The shim exits with its command's exit code and keeps stdout for the payload."""
        result = subprocess.run(
            [
                sys.executable,
                str(SHIM),
                "--unix",
                str(tmp_path / "none.sock"),
                "--port",
                "0",
                "--",
                sys.executable,
                "-c",
                "print('payload'); raise SystemExit(7)",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 7
        assert result.stdout == "payload\n"

    def test_bind_failure_exits_97_without_running_cmd(self, tmp_path: Path) -> None:
        """A port already taken is exit 97 with the reason on stderr, and CMD never runs."""
        marker = tmp_path / "ran"
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            result = subprocess.run(
                [
                    sys.executable,
                    str(SHIM),
                    "--unix",
                    str(tmp_path / "p.sock"),
                    "--port",
                    str(port),
                    "--",
                    sys.executable,
                    "-c",
                    f"open({str(marker)!r}, 'w')",
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        assert result.returncode == 97
        assert result.stderr.startswith(f"shim: cannot listen on 127.0.0.1:{port}")
        assert result.stdout == ""
        assert not marker.exists()

    def test_cmd_reaches_origin_through_shim(
        self,
        tmp_path: Path,
        make_proxy: Callable[..., ProxyProcess],
        make_origin: Callable[..., Origin],
    ) -> None:
        """A payload run under the shim reaches an allowed origin via the proxy's unix socket."""
        origin = make_origin("echo")
        proxy = make_proxy((Rule("allowed.test", ports=(origin.port,), allow_private=True),))
        port = _free_port()
        payload = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}))\n"
            f"s.sendall(b'CONNECT allowed.test:{origin.port} HTTP/1.1\\r\\n\\r\\nhi')\n"
            "s.shutdown(socket.SHUT_WR)\n"
            "data = b''\n"
            "while True:\n"
            "    c = s.recv(65536)\n"
            "    if not c: break\n"
            "    data += c\n"
            "print(data.split(b'\\r\\n')[0].decode(), data.rsplit(b'\\n', 1)[-1].decode())\n"
        )
        log = tmp_path / "shim.log"
        result = subprocess.run(
            [
                sys.executable,
                str(SHIM),
                "--unix",
                str(proxy.socket),
                "--port",
                str(port),
                "--log",
                str(log),
                "--",
                sys.executable,
                "-c",
                payload,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == "HTTP/1.1 200 Connection established hi\n"
        assert origin.wait_for_accepts(1) == 1

    def test_unreachable_proxy_logged_not_printed(self, tmp_path: Path) -> None:
        """A missing proxy socket is a diagnostic in --log, never on stdout or stderr."""
        port = _free_port()
        log = tmp_path / "shim.log"
        payload = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}))\n"
            "print(repr(s.recv(10)))\n"
        )
        result = subprocess.run(
            [
                sys.executable,
                str(SHIM),
                "--unix",
                str(tmp_path / "absent.sock"),
                "--port",
                str(port),
                "--log",
                str(log),
                "--",
                sys.executable,
                "-c",
                payload,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.stdout == "b''\n"
        assert result.stderr == ""
        assert "cannot reach the proxy socket" in log.read_text()

    def test_serve_mode_ready_and_bridges(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Without CMD the shim prints READY with the port it picked and bridges until SIGTERM."""
        origin = make_origin("echo")
        proxy = make_proxy((Rule("allowed.test", ports=(origin.port,), allow_private=True),))
        proc = subprocess.Popen(
            [sys.executable, str(SHIM), "--unix", str(proxy.socket), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("READY 127.0.0.1:")
            port = int(line.strip().rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n\r\n".encode())
                assert read_head(sock)[0] == 200
                sock.sendall(b"ping")
                sock.shutdown(socket.SHUT_WR)
                assert read_all(sock) == b"ping"
        finally:
            proc.terminate()
            assert proc.wait(timeout=10) == 0
            if proc.stdout is not None:
                proc.stdout.close()
