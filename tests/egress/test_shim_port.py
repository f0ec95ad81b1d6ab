"""The shim's port where cells share a network namespace (issue 27).

A wrapper that runs the payload in the harness's own network namespace puts every cell's shim on
the same 127.0.0.1:PORT. Every cell was ERROR ("shim: cannot listen on 127.0.0.1:3128: Address
already in use"): a served connection's TIME_WAIT, or another cell's shim, held the port. The
shim now rebinds over TIME_WAIT and waits (--wait-port) for a live listener to go, and when it
cannot, says what holding the port means.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

from tests.egress.egress_helpers import SHIM

if TYPE_CHECKING:
    from pathlib import Path


def shim_argv(tmp_path: Path, port: int) -> list[str]:
    """The shim on `port`, its proxy socket absent (no connection is served here)."""
    return [sys.executable, str(SHIM), "--unix", str(tmp_path / "none.sock"), "--port", str(port)]


def run_shim(tmp_path: Path, port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """The shim on `port` around a command that prints `ran`."""
    return subprocess.run(
        [*shim_argv(tmp_path, port), *extra, "--", sys.executable, "-c", "print('ran')"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def served_once(tmp_path: Path) -> int:
    """A port a shim served one connection on and closed first: TIME_WAIT is left on it.

    The previous cell in a shared namespace: its payload connects to its shim, the shim (here
    finding no proxy) closes the served connection first, and the cell ends.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    connect = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port})); s.recv(1); s.close()"
    )
    first = subprocess.run(
        [*shim_argv(tmp_path, port), "--", sys.executable, "-c", connect],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    return port


class TestSharedNamespacePort:
    def test_time_wait_does_not_stop_the_shim(self, tmp_path: Path) -> None:
        """A port whose last served connection is in TIME_WAIT is taken; the command runs.

        Before: exit 97, "Address already in use", as a plain bind still shows here.
        """
        port = served_once(tmp_path)
        with socket.socket() as plain:  # the reproduction: without SO_REUSEADDR, refused
            try:
                plain.bind(("127.0.0.1", port))
            except OSError:
                pass
            else:
                msg = "no TIME_WAIT on the port: the test reproduces nothing"
                raise AssertionError(msg)
        result = run_shim(tmp_path, port)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "ran\n"

    def test_waits_for_a_live_listener_to_go(self, tmp_path: Path) -> None:
        """Another cell's shim holds the port: this one waits, then listens and runs CMD."""
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        threading.Timer(0.5, taken.close).start()
        result = run_shim(tmp_path, port, "--wait-port", "10")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "ran\n"

    def test_never_shares_a_live_port_and_says_why(self, tmp_path: Path) -> None:
        """A port held throughout is exit 97, CMD never runs, and the reason names the sharing."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            result = run_shim(tmp_path, port, "--wait-port", "0.3")
        assert result.returncode == 97
        assert result.stdout == ""
        assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
        assert "another listener in this network namespace held it" in result.stderr
