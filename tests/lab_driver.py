"""Scenarios run inside the lab, in a process of their own: `python -m tests.lab_driver NAME`.

Entering the lab moves the whole process into new namespaces, so a test never does it to
the pytest process: it runs one scenario here and reads the one JSON line it prints.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sandbox_attest.world.core import World, start_world
from sandbox_attest.world.lab import enter_lab

BWRAP_SHARED_NET = [
    "bwrap",
    "--share-net",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    # The caller's CA variables would replace --cert/--cacert: start from nothing.
    "--clearenv",
    "--setenv",
    "PATH",
    "/usr/bin:/bin",
]


def _world(base: Path) -> World:
    lab = enter_lab()
    return start_world(base / "w", lab=lab)


def _get_via_proxy(world: World, host: str, port: int, nonce: str) -> tuple[int, str]:
    """CONNECT through the world's proxy TCP port: the status and the deny reason, if any."""
    url = urlsplit(world.info.proxy.url)
    token = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
    with socket.create_connection(("127.0.0.1", url.port or 0), 5) as sock:
        sock.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Proxy-Authorization: Basic {token}\r\nX-Attest-Nonce: {nonce}\r\n\r\n".encode()
        )
        head = sock.recv(4096).decode("latin-1")
    status = int(head.split()[1])
    reason = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in head.splitlines()
            if ln.lower().startswith("x-proxy-deny-reason:")
        ),
        "",
    )
    return status, reason


def scenario_enter() -> dict[str, Any]:
    """Enter the lab and report what it holds: namespaces, addresses, resolver, set-up time."""
    lab = enter_lab()
    return {
        **lab.facts(),
        "setup_s": lab.setup_s,
        "real_netns": lab.real_netns,
        "resolv_conf": Path("/etc/resolv.conf").read_text(),
    }


def scenario_resolver(base: Path) -> dict[str, Any]:
    """Curl and pip under bubblewrap (sharing the host side) resolve fixture names normally."""
    world = _world(base)
    try:
        info = world.info
        allowed = info.hosts["allowed"]
        nonce = "nlabresolver0001"
        curl = subprocess.run(
            [
                *BWRAP_SHARED_NET,
                "--",
                "curl",
                "-sS",
                "--cacert",
                info.ca_bundle,
                f"https://{allowed.name}:{allowed.https_port}/ok?nonce={nonce}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        index = info.index.url_template.format(nonce=nonce)
        target = tempfile.mkdtemp(prefix="sa-labpip-")
        Path(target).chmod(0o755)
        pip = subprocess.run(
            [
                *BWRAP_SHARED_NET,
                "--bind",
                target,
                target,
                "--setenv",
                "TMPDIR",
                target,
                "--",
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--no-cache-dir",
                "--index-url",
                index,
                "--cert",
                info.ca_bundle,
                "-d",
                target,
                info.index.package,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        got = sorted(p.name for p in Path(target).iterdir())
        shutil.rmtree(target, ignore_errors=True)
        getent = subprocess.run(
            ["getent", "hosts", allowed.name],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return {
            "curl_exit": curl.returncode,
            "curl_out": curl.stdout + curl.stderr,
            "pip_exit": pip.returncode,
            "pip_err": pip.stderr[-800:],
            "downloaded": got,
            "getent": getent.stdout.strip(),
            "origin_hosts": sorted({str(e.get("host")) for e in world.origins.records(nonce)}),
            "dns_names": sorted({str(q.get("name")) for q in world.dns.queries()}),
        }
    finally:
        world.stop()


def scenario_loopback_answer(base: Path) -> dict[str, Any]:
    """The allowed name pointed at 127.0.0.1: the proxy refuses it, with no rule for that."""
    world = _world(base)
    try:
        allowed = world.info.hosts["allowed"]
        before = _get_via_proxy(world, allowed.name, allowed.https_port, "nlabloop0000001")
        world.dns.set_answers(allowed.name, ["127.0.0.1"])
        after = _get_via_proxy(world, allowed.name, allowed.https_port, "nlabloop0000002")
        return {"before": before, "after": after}
    finally:
        world.stop()


SCENARIOS = {
    "enter": lambda _base: scenario_enter(),
    "resolver": scenario_resolver,
    "loopback-answer": scenario_loopback_answer,
}


def main(argv: list[str]) -> int:
    """Run the named scenario and print its result as one JSON line."""
    with tempfile.TemporaryDirectory(prefix="sa-lab-") as base:
        Path(base).chmod(0o755)
        result = SCENARIOS[argv[1]](Path(base))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
