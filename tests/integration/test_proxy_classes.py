"""Issue 28, "through the proxy" part A, live: four route holes, each with a host witness.

Four deliberately broken wrappers under tests/data/newclasses/, each matrix/backends/
bwrap-generic.toml with one hole in its egress (the servers are tests/data/newclasses/
route_holes.py), go through one real `sandbox-attest run` beside the control leg and the strong
built-in backends:

- net_proxy_dns_exfil_hole.toml brings its own proxy that resolves a host before it checks its
  allowlist: every denied request still gets its 403, but the DNS fixture logs the secret
  label, and `net_proxy_dns_exfil` FAILs naming the lookup and the fix;
- net_socks5_hole.toml keeps the harness's proxy and also exports ALL_PROXY=socks5h://... to an
  open SOCKS5 relay: the denied origin logs the payload's request, and `net_socks5` FAILs
  naming the SOCKS route and the fix;
- net_metadata_service_hole.toml brings its own proxy that checks its allowlist first but also
  admits every `*.internal` host: the lab stand-in for the cloud metadata service's names logs
  the payload's requests, and `net_metadata_service` FAILs naming it and the fix;
- net_proxy_ignored_hole.toml shares the host's network and relies on the proxy variables: a
  socket that ignores them reaches the allowed origin straight, and `net_proxy_ignored` FAILs
  naming the bypass and the fix.

Each hole FAILs its own probe and no other of these four; bubblewrap, docker and the control
leg PASS all four (the harness's proxy neither resolves a denied name, nor speaks SOCKS, nor
admits a metadata name; the control leg reaches the metadata stand-in and the allowed origin
straight, which is its job).
Real bwrap, real Docker where the engine is up, the real running world (the lab where it can
be made); root only (the payload user exists only as root).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.hole_runs import HoleRun, hole_run

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.timeout(400),
]

DATA = Path(__file__).parent.parent / "data" / "newclasses"
PROBES = ("net_proxy_dns_exfil", "net_socks5", "net_metadata_service", "net_proxy_ignored")
# The probes whose escape the open control leg must see (the others: the proxy's refusal).
SEEN_ON_OPEN_LEG = frozenset({"net_metadata_service", "net_proxy_ignored"})
# Each wrapper (its [backend] name): its spec and the one probe its hole must FAIL.
HOLES = {
    "hole-dns-exfil": ("net_proxy_dns_exfil_hole.toml", "net_proxy_dns_exfil"),
    "hole-socks5": ("net_socks5_hole.toml", "net_socks5"),
    "hole-metadata": ("net_metadata_service_hole.toml", "net_metadata_service"),
    "hole-proxy-vars-only": ("net_proxy_ignored_hole.toml", "net_proxy_ignored"),
}
STRONG = ("bubblewrap", "docker")
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """The run, shared by the checks below: the control leg, the strong legs, every hole."""
    with hole_run(
        "sa-proxyclasses-",
        probes=PROBES,
        legs=(*STRONG, "none"),
        required=("none",),
        specs=[DATA / file for file, _ in HOLES.values()],
        run_timeout=RUN_TIMEOUT_S,
    ) as done:
        yield done


class TestStrongLegs:
    def test_control_leg_passes_all(self, run: HoleRun) -> None:
        """On the open leg each probe PASSes: the proxy's refusals, and the direct escape seen."""
        for probe in PROBES:
            cell = run.cell("none", probe)
            assert cell["verdict"] == "PASS", (probe, cell["reason"])
            want = "escaped" if probe in SEEN_ON_OPEN_LEG else "refused"
            assert cell["escape"] == want, (probe, cell["reason"])

    @pytest.mark.parametrize("backend", STRONG)
    def test_strong_backend_passes_all(self, run: HoleRun, backend: str) -> None:
        """The strong legs PASS all four probes (skipped where the backend cannot run here)."""
        for probe in PROBES:
            cell = run.cell(backend, probe)
            if cell["verdict"] == "UNAVAILABLE":
                pytest.skip(f"{backend} is unavailable here: {cell['reason']}")
            assert cell["verdict"] == "PASS", (probe, cell["reason"])


class TestResolveFirstProxy:
    def test_fails_naming_the_lookup_and_the_fix(self, run: HoleRun) -> None:
        """A proxy that resolves before it refuses leaks the secret label: FAIL with the fix."""
        cell = run.cell("hole-dns-exfil", "net_proxy_dns_exfil")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the proxy resolved denied names before refusing them" in cell["reason"]
        assert "fix: check the allowlist before resolving" in cell["reason"]

    def test_every_denied_request_was_still_refused(self, run: HoleRun) -> None:
        """The hole is the lookup alone: each denied request got its 403, the DNS log the nonce."""
        cell = run.cell("hole-dns-exfil", "net_proxy_dns_exfil")
        escapes = [a for a in cell["attempts"] if a["role"] == "escape"]
        assert [a["status"] for a in escapes] == [403, 403, 403], escapes
        names = {str(q["name"]) for q in cell["witness"]["dns"]}
        assert names, cell["witness"]
        assert all(name.startswith(cell["nonce"]) for name in names), names


class TestOpenSocksRelay:
    def test_fails_naming_the_socks_route_and_the_fix(self, run: HoleRun) -> None:
        """An exported open SOCKS5 relay reaches the denied origin: FAIL naming it and the fix."""
        cell = run.cell("hole-socks5", "net_socks5")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "a SOCKS5 route went around the allowlist" in cell["reason"]
        assert "socks5-connect:env-0" in cell["reason"]
        assert "fix: do not export a SOCKS endpoint that bypasses the allowlist" in cell["reason"]
        assert cell["witness"]["denied_origin"], cell["witness"]


class TestMetadataByName:
    def test_fails_naming_the_stand_in_and_the_fix(self, run: HoleRun) -> None:
        """A proxy admitting *.internal reaches the metadata stand-in: FAIL naming it, the fix."""
        cell = run.cell("hole-metadata", "net_metadata_service")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the metadata service's stand-in was reached by name" in cell["reason"]
        assert "fix: refuse the metadata service's names" in cell["reason"]
        via = {
            a["what"]
            for a in cell["attempts"]
            if a["role"] == "escape" and a["outcome"] == "succeeded"
        }
        assert via == {
            "get-metadata:aws",
            "connect-metadata:aws",
            "get-metadata:gce",
            "connect-metadata:gce",
        }, via
        assert cell["witness"]["stand_in"], cell["witness"]


@pytest.mark.parametrize("hole", sorted(HOLES))
def test_each_hole_fails_only_its_own_probe(run: HoleRun, hole: str) -> None:
    """A wrapper with one route hole FAILs that hole's probe and no other of the four."""
    own = HOLES[hole][1]
    for probe in PROBES:
        if probe != own:
            cell = run.cell(hole, probe)
            assert cell["verdict"] != "FAIL", (hole, probe, cell["reason"])


class TestProxyVariablesOnly:
    def test_fails_naming_the_bypass_and_the_fix(self, run: HoleRun) -> None:
        """A socket that ignores the proxy variables reaches the allowed origin: FAIL, the fix."""
        cell = run.cell("hole-proxy-vars-only", "net_proxy_ignored")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "requests that bypassed the proxy (raw-by-address" in cell["reason"]
        assert "fix: cut the payload's network below the proxy" in cell["reason"]
        paths = [str(hit["path"]) for hit in cell["witness"]["allowed_origin"]]
        assert paths, cell["witness"]
        assert all("via=" in path for path in paths), paths
