"""Which host readings back a cell's reading, and the one rule that needs them.

`believe` downgrades a PASS that rests on the payload's report alone where that report crossed
a wrapper the harness does not control; each spec names the host readings behind its reading
(`corroboration`). Host views here are shaped as sandbox_attest/run/hostview.py writes them.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.spec import host_seen_own_network
from sandbox_attest.run.runner import inside_route
from sandbox_attest.verdict import UNCORROBORATED, Assessment, Decision, Verdict, believe

CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
NO_CAPS = "0000000000000000"


def view(**status: str) -> dict[str, Any]:
    """A host view of one payload process with its own namespaces and these status fields."""
    base = {"CapEff": NO_CAPS, "NoNewPrivs": "1", "Seccomp": "2", "Seccomp_filters": "1"}
    return {
        "seen": True,
        "pid": 4242,
        "shared_with_harness": [],
        "default_routes": [],
        "status": base | status,
        "env_names": ["HOME", "PATH"],
        "fds": {"0": "/dev/null", "1": "pipe:[1]", "2": "pipe:[2]"},
    }


def ctx(tmp_path: Path, probe: str, host_view: dict[str, Any]) -> CellContext:
    """A cell of `probe` under a confining claim, with this host view."""
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    return CellContext(
        probe=probe,
        backend="unit",
        nonce=nonce,
        world=None,  # type: ignore[arg-type]  # corroboration reads no fixture
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=CONFINED,
        route=inside_route(),
        host_view=host_view,
    )


def assessment(*corroborated_by: str) -> Assessment:
    """A refusal with working controls, backed by these readings."""
    return Assessment(
        "refused",
        controls_ok=True,
        reasons=["refused"],
        observed="refused",
        corroborated_by=[*corroborated_by],
    )


class TestBelieve:
    PASS = Decision(Verdict.PASS, "refused")

    def test_uncorroborated_pass_across_a_wrapper_is_inconclusive(self) -> None:
        """A PASS with no host reading behind it, through a wrapper, is INCONCLUSIVE, saying so."""
        decision = believe(self.PASS, assessment(), crossed_wrapper=True)
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert decision.reason == f"{UNCORROBORATED}; was: refused"

    def test_corroborated_pass_stands(self) -> None:
        """A PASS a host reading backs stands on a wrapper too."""
        decision = believe(self.PASS, assessment("fake daemon log"), crossed_wrapper=True)
        assert decision == self.PASS

    def test_built_in_backends_are_not_downgraded(self) -> None:
        """Where the harness runs the payload itself, the report crossed no wrapper."""
        assert believe(self.PASS, assessment(), crossed_wrapper=False) == self.PASS

    @pytest.mark.parametrize("verdict", [Verdict.FAIL, Verdict.ERROR, Verdict.INCONCLUSIVE])
    def test_only_pass_is_touched(self, verdict: Verdict) -> None:
        """A FAIL is a FAIL whoever reported it; ERROR and INCONCLUSIVE stay too."""
        decision = Decision(verdict, "why")
        assert believe(decision, assessment(), crossed_wrapper=True) == decision


class TestWitnessReadings:
    def test_a_witness_backs_a_cell_once_the_payload_ran(self, tmp_path: Path) -> None:
        """The daemon log backs a refusal only when the host saw the payload at its rendezvous."""
        spec = PROBES["ipc_unix_socket_escape"]
        seen = ctx(tmp_path, spec.id, view())
        assert "fake daemon log" in spec.corroboration(seen, {})
        never_ran = ctx(tmp_path, spec.id, {"seen": False, "why": "never reached it"})
        assert spec.corroboration(never_ran, {}) == []

    def test_where_the_host_cannot_look_the_witness_alone_backs_it(self, tmp_path: Path) -> None:
        """On a host without /proc (macOS, Windows) the witness is all there is, and counts."""
        spec = PROBES["dns_resolution"]
        blind = ctx(tmp_path, spec.id, {"seen": False, "supported": False, "why": "no /proc"})
        assert spec.corroboration(blind, {}) == ["DNS fixture query log"]

    @pytest.mark.parametrize("probe", ["fs_read_secrets", "resource_limits"])
    def test_without_host_readings_they_name_nothing(self, tmp_path: Path, probe: str) -> None:
        """A view without the host's looks or limits leaves these probes the payload's word."""
        assert PROBES[probe].corroboration(ctx(tmp_path, probe, view()), {}) == []


class TestHostView:
    def test_own_network_namespace_is_a_reading(self, tmp_path: Path) -> None:
        """Its own netns without a default route backs the direct-egress refusals."""
        cell = ctx(tmp_path, "net_direct_egress", view())
        assert PROBES["net_direct_egress"].corroboration(cell, {}) == [
            "direct-egress listeners",
            "host view: own network namespace, no default route",
        ]

    def test_harness_network_is_no_reading(self, tmp_path: Path) -> None:
        """The harness's own netns backs nothing the raw-socket attempts reported."""
        shared = view() | {"shared_with_harness": ["net"]}
        cell = ctx(tmp_path, "net_ipv6_udp_icmp", shared)
        assert host_seen_own_network(cell) == ""
        assert PROBES["net_ipv6_udp_icmp"].corroboration(cell, {}) == []

    def test_a_seccomp_filter_backs_no_syscall_surface_pass(self, tmp_path: Path) -> None:
        """A filter's existence says nothing of what it refuses: it corroborates no PASS."""
        spec = PROBES["proc_syscall_surface"]
        filtered = ctx(tmp_path, spec.id, view(Seccomp_filters="2"))
        assert spec.corroboration(filtered, {}) == []

    def test_refusals_without_any_filter_are_an_escape(self, tmp_path: Path) -> None:
        """Seccomp-only calls reported refused while the host sees no filter are FAIL-worthy."""
        spec = PROBES["proc_syscall_surface"]
        cell = ctx(tmp_path, spec.id, view(Seccomp="0", Seccomp_filters="0"))
        calls = ("io_uring_setup", "keyctl", "bpf")
        report = {
            "attempts": [
                {"what": "getpid", "role": "control", "outcome": "succeeded"},
                *({"what": c, "role": "escape", "outcome": "refused"} for c in calls),
            ],
            "facts": {"seccomp": "0"},
        }
        baseline = {
            "attempts": [{"what": c, "role": "escape", "outcome": "succeeded"} for c in calls]
        }
        control = {"ok": True, "nonce": "h", "checks": [], "baseline": baseline}
        reading = spec.assess(cell, report, None, control)  # type: ignore[arg-type]
        assert reading.escape == "escaped"
        seen = "the host sees no seccomp filter on the payload (host pid 4242"
        assert any(seen in reason for reason in reading.reasons), reading.reasons
        filtered = ctx(tmp_path, spec.id, view())
        assert spec.assess(filtered, report, None, control).escape == "refused"  # type: ignore[arg-type]

    def test_no_caps_and_no_new_privs_back_the_privileges_probe(self, tmp_path: Path) -> None:
        """CapEff 0 and NoNewPrivs 1 read by the host back proc_privileges; caps do not."""
        spec = PROBES["proc_privileges"]
        assert spec.corroboration(ctx(tmp_path, spec.id, view()), {}) == [
            "host view: CapEff 0",
            "host view: NoNewPrivs 1",
        ]
        capable = ctx(tmp_path, spec.id, view(CapEff="00000000a80425fb"))
        assert spec.corroboration(capable, {}) == []

    def test_host_sees_caps_the_report_denies(self, tmp_path: Path) -> None:
        """Effective capabilities the host sees make proc_privileges an escape, report or not."""
        spec = PROBES["proc_privileges"]
        cell = ctx(tmp_path, spec.id, view(CapEff="00000000a80425fb"))
        report = {
            "attempts": [
                {"what": "read-status", "role": "control", "outcome": "succeeded"},
                {"what": "effective-capabilities", "role": "escape", "outcome": "refused"},
            ],
            "facts": {"status": {"CapEff": NO_CAPS}},
        }
        control = {"ok": True, "nonce": "h", "checks": [], "baseline": {}}
        reading = spec.assess(cell, report, None, control)  # type: ignore[arg-type]
        assert reading.escape == "escaped"
        assert "host pid 4242 CapEff=00000000a80425fb" in reading.reasons[0]

    def test_env_canary_in_the_hosts_environ_read_is_an_escape(self, tmp_path: Path) -> None:
        """A canary variable the host reads in the payload's environ backs no refusal."""
        spec = PROBES["env_inheritance"]
        clean = ctx(tmp_path, spec.id, view())
        assert spec.corroboration(clean, {}) == [
            "host view: environment names",
            "host view: open descriptors",
        ]
        canary = spec.names(clean)[0]  # type: ignore[attr-defined]  # EnvInheritance's own
        leaky = ctx(tmp_path, spec.id, view())
        leaky.host_view["env_names"] = [canary.replace(clean.nonce.upper(), leaky.nonce.upper())]
        assert spec.corroboration(leaky, {}) == []
