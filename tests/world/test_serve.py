"""`serve` as a real process: one JSON line, a working world, a clean exit on signals."""

from __future__ import annotations

import dataclasses
import json
import selectors
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import sandbox_attest
from sandbox_attest.world.info import WorldInfo

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(sandbox_attest.__file__).resolve().parent.parent
SERVE = (
    "import sys; from pathlib import Path; from sandbox_attest.world.core import serve; "
    "sys.exit(serve(Path(sys.argv[1]) if len(sys.argv) > 1 else None))"
)


def read_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The first stdout line of `proc`, or fail after `timeout` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout), "serve printed nothing"
    return proc.stdout.readline()


def run_serve(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """Start `serve` in a child Python with the repo importable."""
    return subprocess.Popen(
        [sys.executable, "-c", SERVE, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONPATH": str(REPO)},
    )


def curl_ok(info: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The README recipe: /ok on the allowed host through the proxy with the world's CA.

    In the lab (serve as root) the world is reachable only from inside it: the recipe runs
    under `nsenter` into serve's namespaces, as the README says.
    """
    port = info["hosts"]["allowed"]["https_port"]
    inside: list[str] = []
    if info["extra"]["world"]["kind"] == "lab":
        inside = ["nsenter", "--target", str(info["extra"]["serve_pid"]), "--net", "--mount"]
    return subprocess.run(
        [*inside, "curl", "-sS", "--max-time", "10", "--proxy", info["proxy"]["url"],
         "--cacert", info["ca_bundle"], f"https://allowed.test:{port}/ok?nonce=serve-1"],
        capture_output=True, text=True, timeout=30, env=env, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_prints_one_line_and_stops_cleanly(
    tmp_path: Path, sig: signal.Signals, clean_env: Callable[..., dict[str, str]]
) -> None:
    """Serve prints the WorldInfo JSON on one line, serves, and exits 0 on the signal."""
    proc = run_serve(clean_env(), str(tmp_path / "w"))
    try:
        info = json.loads(read_line(proc))
        assert set(info) == {f.name for f in dataclasses.fields(WorldInfo)}
        assert info["run_dir"] == str((tmp_path / "w").resolve())
        if shutil.which("curl"):
            result = curl_ok(info, clean_env())
            assert result.stdout == "ok serve-1\n", result.stderr
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out == ""  # exactly one line in all
    assert not Path(info["proxy"]["socket"]).exists()
    assert not Path(info["daemon"]["unix"]).exists()


def test_serve_without_run_dir_removes_its_temp_dir(
    clean_env: Callable[..., dict[str, str]],
) -> None:
    """With no run_dir, serve uses a temporary directory and removes it on exit."""
    proc = run_serve(clean_env())
    try:
        info = json.loads(read_line(proc))
        assert Path(info["run_dir"]).is_dir()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert not Path(info["run_dir"]).exists()
