"""Issue 28, the proxy's protocol surface, live: each class FAILs on a proxy with its one hole.

Five wrappers under tests/data/newclasses/ bring their own allowlist proxy
(protocol_hole_proxy.py) with exactly one mistake each and go through a real
`sandbox-attest run` beside the control leg, whose route is the harness's own proxy:

- `keepalive` keeps the upstream connection open and frames bodies by Content-Length only:
  a GET's body, which the origin ignores, reaches it as a second request to the denied host
  (net_proxy_smuggling FAILs);
- `upgrade` turns a request carrying Upgrade: into a byte tunnel before any 101: the next
  request on the connection reaches the allowed upstream unchecked (net_proxy_upgrade FAILs);
- `rebind` checks the first DNS answer and dials a second one: the per-cell loopback
  listener behind the rebinding name hears it (net_dns_rebinding FAILs);
- `address-allow` admits an IP literal that an allowed name resolves to: the denied host's
  address, learned by DNS-over-HTTPS from the allowed origin, reaches the denied origin, which
  shares it (net_doh_bypass FAILs);
- `self-relay` admits a CONNECT to its own listener and trusts what it sends itself: a request
  relayed through the proxy back into it reaches the denied origin (net_proxy_relay FAILs).

Each hole FAILs its own probe and no other, and the harness's proxy PASSes all five on the
control leg. Real processes and the real DNS fixture; root only (the payload user exists only
as root). Every dial stays on loopback or the lab's 198.18.0.0/15.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.attest import EVIDENCE_NAME
from tests.integration.test_cli_run import CLI, keypair
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.timeout(400),
]

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "newclasses"
PROBES = (
    "net_proxy_smuggling",
    "net_proxy_upgrade",
    "net_dns_rebinding",
    "net_doh_bypass",
    "net_proxy_relay",
)
# Each wrapper's [backend] name -> the one probe its hole must FAIL, and words its reason holds.
HOLES = {
    "hole-net-proxy-smuggling": (
        "net_proxy_smuggling",
        ("cl0-get-body", "fix: refuse a request with both Content-Length and Transfer-Encoding"),
    ),
    "hole-net-proxy-upgrade": (
        "net_proxy_upgrade",
        ("upgrade-websocket-allowed", "upgrade-h2c-allowed", "fix: judge an Upgrade request"),
    ),
    "hole-net-dns-rebinding": (
        "net_dns_rebinding",
        ("dialed its second", "fix: resolve once per request and dial exactly the address"),
    ),
    "hole-net-proxy-relay": (
        "net_proxy_relay",
        ("relay-through-proxy", "refuse a target on the proxy's own host"),
    ),
    "hole-net-doh-bypass": (
        "net_doh_bypass",
        ("reached by the address a DoH lookup gave", "refuse IP literals it does not name"),
    ),
}
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class HolesRun:
    """One `sandbox-attest run` over the five hole wrappers and the control leg."""

    out: Path
    stdout: str
    stderr: str

    def cell(self, backend: str, probe: str) -> dict[str, Any]:
        """One cell of the signed evidence; fails naming the run's output if there is none."""
        path = self.out / EVIDENCE_NAME
        assert path.is_file(), f"no evidence: {self.stdout[-3000:]} {self.stderr[-2000:]}"
        cells: dict[str, dict[str, Any]] = {
            c["cell_id"]: c for c in json.loads(path.read_text())["cells"]
        }
        return cells[f"{backend}-{probe}"]


@pytest.fixture(scope="module")
def run() -> Iterator[HolesRun]:
    """The run, shared by the checks below."""
    with reachable_tempdir("sa-protoholes-") as root:
        matrix = root / "matrix.toml"
        matrix.write_text(
            "".join(f'[[probe]]\nid = "{p}"\ntimeout = 40\n' for p in PROBES)
            + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        )
        policy = root / "policy.toml"
        required = ", ".join(f'"{p}"' for p in PROBES)
        policy.write_text(
            f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{required}]\n'
        )
        private, _ = keypair(root)
        out = root / "report"
        specs = [
            arg for probe in PROBES for arg in ("--backend-spec", str(DATA / f"{probe}_hole.toml"))
        ]
        argv = [
            *CLI,
            "run",
            "--matrix",
            str(matrix),
            "--policy",
            str(policy),
            *specs,
            "--key",
            str(private),
            "--out",
            str(out),
            "-j",
            "2",
        ]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=REPO
        )
        yield HolesRun(out, done.stdout, done.stderr)


def test_the_harness_proxy_holds_on_the_control_leg(run: HolesRun) -> None:
    """The control leg's route is the harness proxy: every class is refused there (PASS)."""
    for probe in PROBES:
        cell = run.cell("none", probe)
        assert cell["verdict"] == "PASS", (probe, cell["reason"])
        assert cell["escape"] == "refused", (probe, cell["reason"])


@pytest.mark.parametrize("backend", sorted(HOLES))
def test_each_hole_fails_its_probe_naming_it_and_the_fix(run: HolesRun, backend: str) -> None:
    """A proxy with one protocol mistake FAILs that class's probe; the reason names both."""
    probe, words = HOLES[backend]
    cell = run.cell(backend, probe)
    assert cell["verdict"] == "FAIL", cell["reason"]
    assert cell["escape"] == "escaped", cell["reason"]
    for word in words:
        assert word in cell["reason"], (word, cell["reason"])


@pytest.mark.parametrize("backend", sorted(HOLES))
def test_each_hole_fails_no_other_class(run: HolesRun, backend: str) -> None:
    """The other classes hold on each hole wrapper: one mistake, one FAIL."""
    own = HOLES[backend][0]
    for probe in PROBES:
        if probe != own:
            cell = run.cell(backend, probe)
            assert cell["verdict"] == "PASS", (backend, probe, cell["reason"])
