"""One shape for a cell's evidence entry, and one function for the gate (issue 25).

`CellEntry` is made by `cell_entry` and read back from disk by `parse_cells`; the run's gate
and `verify`'s re-derived gate are both `report.policy.gate_for`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.attest import verification
from sandbox_attest.attest.statement import parse_evidence
from sandbox_attest.attest.verification import Verification, check_judged
from sandbox_attest.errors import ConfigError, ReportError
from sandbox_attest.report import policy as policy_module
from sandbox_attest.report.diff import load_cells
from sandbox_attest.report.evidence import (
    CELL_KEYS,
    SCHEMA,
    CellEntry,
    EvidenceWriter,
    cell_entry,
    parse_cells,
)
from sandbox_attest.report.policy import load_policy
from sandbox_attest.run import session
from tests.attest.builder import CORE_PROBES, write_policy

if TYPE_CHECKING:
    from pathlib import Path


def entry(backend: str = "none", probe: str = "net_direct_egress") -> CellEntry:
    """A judged PASS cell that its run marked required."""
    return cell_entry(
        cell_id=f"{backend}-{probe}",
        backend=backend,
        probe=probe,
        platform="linux",
        verdict="PASS",
        reason="held",
        required=True,
    )


class TestCellEntry:
    def test_the_constructor_serialises_as_the_literal_did(self) -> None:
        """`cell_entry` gives the same JSON bytes as the dict each producer used to write."""
        literal = {
            "cell_id": "none-p",
            "backend": "none",
            "probe": "p",
            "platform": "linux",
            "verdict": "ERROR",
            "reason": "cut short",
            "required": False,
        }
        made = cell_entry(
            cell_id="none-p",
            backend="none",
            probe="p",
            platform="linux",
            verdict="ERROR",
            reason="cut short",
            required=False,
        )
        assert json.dumps(made, sort_keys=True) == json.dumps(literal, sort_keys=True)


class TestParseCells:
    @pytest.mark.parametrize("key", CELL_KEYS)
    def test_a_missing_key_is_refused_naming_the_key_and_the_file(self, key: str) -> None:
        """A cell without a key every entry has is refused; the error names file and key."""
        cell = dict(entry())
        del cell[key]
        with pytest.raises(ReportError) as excinfo:
            parse_cells([entry("bubblewrap"), cell], "leg/evidence.json")
        message = str(excinfo.value)
        assert message.startswith("leg/evidence.json: cell #2")
        assert f"has no {key!r}" in message

    def test_verify_reads_evidence_through_it(self) -> None:
        """`parse_evidence` (verify, sign, merge) refuses such a cell too, naming its file."""
        cell = dict(entry())
        del cell["verdict"]
        data = json.dumps({"schema": SCHEMA, "cells": [cell]}).encode()
        with pytest.raises(ReportError, match=r"^r/evidence.json: cell #1 \(none-net_direct"):
            parse_evidence(data, "r/evidence.json")

    def test_diff_refuses_it_with_its_own_error(self, tmp_path: Path) -> None:
        """`diff` reads cells through the same function and says ConfigError (exit 2)."""
        cell = dict(entry())
        del cell["reason"]
        (tmp_path / "evidence.json").write_text(json.dumps({"cells": [cell]}))
        with pytest.raises(ConfigError, match="has no 'reason'") as excinfo:
            load_cells(tmp_path)
        assert str(tmp_path / "evidence.json") in str(excinfo.value)

    def test_a_whole_cell_is_accepted_as_it_is(self) -> None:
        """A well-formed cell comes back unchanged (no key added or dropped)."""
        cells = [entry(), entry("bubblewrap")]
        assert parse_cells(json.loads(json.dumps(cells)), "e.json") == cells


class TestOneGate:
    def test_the_run_and_verify_call_the_same_function(self) -> None:
        """The session's gate and verify's re-derived one are `report.policy.gate_for`."""
        assert vars(session)["gate_for"] is policy_module.gate_for
        assert vars(verification)["gate_for"] is policy_module.gate_for

    def test_verify_gives_the_runs_gate_where_a_hand_rule_would_not(self, tmp_path: Path) -> None:
        """Only control cells, every one PASS: "all required cells PASS" would say PASSED.

        The run's gate (`gate_for` over the writer's cells) is FAILED, since the control
        leg alone attests nothing, and verify re-derives exactly that from the written bytes.
        """
        policy = load_policy(write_policy(tmp_path / "policy.toml"))
        writer = EvidenceWriter(
            report_dir=tmp_path / "report",
            run_id="r",
            policy_path=tmp_path / "policy.toml",
            matrix_digest="0",
            run_facts={"world": {"kind": "lab"}},
        )
        for probe in CORE_PROBES:
            writer.add_cell(entry("none", probe))
        hand_rule = all(c["verdict"] == "PASS" for c in writer.cells if c.get("required"))
        assert hand_rule
        run_gate = policy_module.gate_for(writer.gate_input(complete=True), policy)
        assert run_gate.result == "FAILED"
        v = Verification(tmp_path / "report")
        evidence = parse_evidence(writer.write(complete=True), "evidence.json")
        check_judged({}, [], evidence, policy, v)
        assert v.gate == run_gate
