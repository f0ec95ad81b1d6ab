"""The old name of `sandbox_attest.testing`, kept for one release (issue 25's move).

A vendor's `pytest_plugins = ["sandbox_attest.fixtures"]` or `from sandbox_attest.fixtures
import ...` keeps working; new code imports `sandbox_attest.testing`. Registering both as
plugins would define every fixture twice, so the plugin registers only `testing`.
"""

from __future__ import annotations

from sandbox_attest.testing import (
    AttestBackend,
    CellPool,
    CellVerdict,
    attest_backend,
    attest_cell,
    attest_cell_pool,
    attest_world,
    egress_proxy,
    make_egress_proxy,
    parse_rule,
)

__all__ = [
    "AttestBackend",
    "CellPool",
    "CellVerdict",
    "attest_backend",
    "attest_cell",
    "attest_cell_pool",
    "attest_world",
    "egress_proxy",
    "make_egress_proxy",
    "parse_rule",
]
