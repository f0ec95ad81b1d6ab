"""A wrapper that shares the harness's network namespace under egress harness-unix, live.

Every cell of such a wrapper was ERROR ("shim: cannot listen on 127.0.0.1:3128: Address
already in use", issue 27): each cell's shim wants the same port in the one shared namespace.
Now its cells are judged: the shared network FAILs the probes that reach past the proxy.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.hole_runs import hole_run

SPEC = Path(__file__).resolve().parents[1] / "data" / "artifacts" / "wrap_shared_net_unix.toml"
PROBES = ("net_direct_egress", "net_denied_host", "dns_resolution")


def test_shared_network_wrapper_is_judged_not_error() -> None:
    """net_direct_egress FAILs naming the harness's network namespace; no cell is ERROR."""
    with hole_run("a27-shared-net-", probes=PROBES, legs=["none"], required=["none"],
                  specs=[SPEC]) as run:  # fmt: skip
        cells = {p: run.cell("wrap-shared-net-unix", p) for p in PROBES}
    verdicts = {p: c["verdict"] for p, c in cells.items()}
    assert "ERROR" not in verdicts.values(), {p: c.get("reason") for p, c in cells.items()}
    direct = cells["net_direct_egress"]
    assert direct["verdict"] == "FAIL"
    assert "ran in the harness's network namespace" in direct["reason"]
    assert verdicts["dns_resolution"] == "FAIL"
