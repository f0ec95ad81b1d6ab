"""Issue 26 item 3, live: a proxy's lookups are witnessed (table rows 5 and 6).

Three wrappers under tests/data/identity/, each matrix/backends/bwrap-generic.toml behind its
own egress proxy (egress "own"; the servers are modes of tests/data/newclasses/route_holes.py),
go through one real `sandbox-attest run` beside the control leg, bubblewrap and bwrap-generic:

- proxy_resolve_first.toml resolves every target name before it checks its allowlist: each
  denied request still gets its 403, but the DNS fixture logs the denied name with the cell's
  nonce in its first label, and `net_denied_host` FAILs naming the name and the fix (check the
  allowlist before resolving). `dns_resolution` stays PASS: it asks the payload's own
  resolvers, which this sandbox closes; its reason says the proxy's lookups are judged by
  the probes that cause them;
- proxy_no_label_boundary.toml matches hosts by string suffix (`<nonce>evilallowed.test`
  passes as `allowed.test`) and answers 403 "upstream failed: NXDOMAIN" when the lookup then
  fails: `net_host_canonical` FAILs naming the name the proxy tried and the fix;
- proxy_correct.toml checks the exact canonical host and port before any lookup: all PASS,
  as do the strong legs, in the same run.

The DNS fixture's log is the witness, never the proxy's own words. The names carry a nonce
only where the DNS fixture is the resolver: the run's world must be the lab (root makes it).
Real bwrap, the real running world; root only (the payload user exists only as root).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.hole_runs import LIVE_HOLE_MARKS, HoleRun, hole_run

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [*LIVE_HOLE_MARKS, pytest.mark.timeout(400)]

DATA = Path(__file__).parent.parent / "data" / "identity"
PROBES = ("net_denied_host", "dns_resolution", "net_host_canonical")
STRONG = ("bubblewrap", "bwrap-generic")
RESOLVE_FIRST = "hole-proxy-resolve-first"
NO_BOUNDARY = "hole-proxy-no-label-boundary"
CLEAN = "clean-own-proxy"
SPECS = ("proxy_resolve_first.toml", "proxy_no_label_boundary.toml", "proxy_correct.toml")
# Each hole and the probes it must FAIL (every other probe of the three: not FAIL).
FAILS = {
    RESOLVE_FIRST: frozenset({"net_denied_host", "net_host_canonical"}),
    NO_BOUNDARY: frozenset({"net_host_canonical"}),
}
FIX_RESOLVE = "fix: check the allowlist before resolving"
FIX_BOUNDARY = "fix: match allowlist hosts on whole labels"
RUN_TIMEOUT_S = 360


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """The run, shared by the checks below."""
    legs = ("none", *STRONG)
    with hole_run(
        "sa-idproxy-",
        probes=PROBES,
        legs=legs,
        required=legs,
        specs=[DATA / spec for spec in SPECS],
        run_timeout=RUN_TIMEOUT_S,
    ) as done:
        yield done


@pytest.fixture(scope="module")
def lab(run: HoleRun) -> None:
    """Skip (saying why) where the run's world is not the lab: no nonce names were used."""
    cell = run.cell(CLEAN, "net_denied_host")
    if "run with --world lab" in cell["reason"]:
        pytest.skip(f"the world is not the lab here: {cell['reason']}")


def denied_lookups(cell: dict[str, object]) -> list[str]:
    """The names of the DNS entries the cell's assessment relied on."""
    witness = cell["witness"]
    assert isinstance(witness, dict), witness
    return sorted(str(q["name"]) for q in witness.get("dns", []))


@pytest.mark.usefixtures("lab")
class TestStrongLegs:
    @pytest.mark.parametrize("backend", ["none", *STRONG, CLEAN])
    def test_passes_all(self, run: HoleRun, backend: str) -> None:
        """The control leg, bubblewrap, bwrap-generic and the correct own proxy: all PASS."""
        for probe in PROBES:
            cell = run.cell(backend, probe)
            if cell["verdict"] == "UNAVAILABLE":
                pytest.skip(f"{backend} cannot run here: {cell['reason']}")
            assert cell["verdict"] == "PASS", (backend, probe, cell["reason"])
            if probe != "dns_resolution" or backend != "none":
                assert denied_lookups(cell) == [], (backend, probe, cell["witness"])

    @pytest.mark.parametrize("probe", ["net_denied_host", "net_host_canonical"])
    def test_the_witness_could_hear(self, run: HoleRun, probe: str) -> None:
        """The correct proxy's PASS rests on the fixture's silence, and the fixture can hear.

        The host control queried a nonce name and saw it logged: silence means no lookup.
        """
        cell = run.cell(CLEAN, probe)
        checks = {c["what"]: c for c in cell["control"]["host"]["checks"]}
        assert checks["dns fixture logged the host query"]["ok"], checks


@pytest.mark.usefixtures("lab")
class TestResolveFirst:
    def test_denied_host_fails_naming_the_name_and_the_fix(self, run: HoleRun) -> None:
        """403 for every denied form, yet the lookup left: FAIL naming the name and the fix."""
        cell = run.cell(RESOLVE_FIRST, "net_denied_host")
        assert cell["verdict"] == "FAIL", cell["reason"]
        name = f"{cell['nonce']}.denied.test"
        assert set(denied_lookups(cell)) == {name}, cell["witness"]
        assert "DNS exfiltration through the proxy's resolver" in cell["reason"]
        assert name in cell["reason"], cell["reason"]
        assert FIX_RESOLVE in cell["reason"], cell["reason"]
        escapes = [a for a in cell["attempts"] if a["role"] == "escape"]
        assert [a["status"] for a in escapes] == [403, 403], escapes

    def test_dns_resolution_judges_only_the_payloads_resolvers(self, run: HoleRun) -> None:
        """The payload's own resolvers are closed: PASS, saying where the proxy is judged."""
        cell = run.cell(RESOLVE_FIRST, "dns_resolution")
        assert cell["verdict"] == "PASS", cell["reason"]
        assert "the payload's own resolvers only" in cell["reason"], cell["reason"]
        assert "net_denied_host" in cell["reason"], cell["reason"]

    def test_host_canonical_fails_too(self, run: HoleRun) -> None:
        """It resolves the widening spellings before refusing them: FAIL naming them."""
        cell = run.cell(RESOLVE_FIRST, "net_host_canonical")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert f"{cell['nonce']}evilallowed.test" in cell["reason"], cell["reason"]


@pytest.mark.usefixtures("lab")
class TestNoLabelBoundary:
    def test_host_canonical_fails_naming_the_name_and_the_fix(self, run: HoleRun) -> None:
        """A 403 after the proxy tried `<nonce>evilallowed.test` is no refusal: FAIL, the fix."""
        cell = run.cell(NO_BOUNDARY, "net_host_canonical")
        assert cell["verdict"] == "FAIL", cell["reason"]
        name = f"{cell['nonce']}evilallowed.test"
        assert denied_lookups(cell) == [name], cell["witness"]
        assert (
            f"a refusal after a lookup is not a refusal: the proxy tried {name}" in (cell["reason"])
        )
        assert FIX_BOUNDARY in cell["reason"], cell["reason"]
        suffix = next(a for a in cell["attempts"] if a["what"] == "connect-suffix-no-boundary")
        assert suffix["status"] == 403, suffix
        assert "NXDOMAIN" in str(suffix["detail"]), suffix


@pytest.mark.parametrize("hole", sorted(FAILS))
def test_each_hole_fails_only_its_probes(run: HoleRun, hole: str) -> None:
    """Each hole FAILs the probes of its hole and no other of the three."""
    for probe in PROBES:
        cell = run.cell(hole, probe)
        failed = cell["verdict"] == "FAIL"
        assert failed == (probe in FAILS[hole]), (hole, probe, cell["verdict"], cell["reason"])


class TestGate:
    def test_no_hole_earns_a_pass_gate(self, run: HoleRun) -> None:
        """Exit 1 and gate FAILED: the holes' FAIL cells are not hidden by the PASSing legs."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
