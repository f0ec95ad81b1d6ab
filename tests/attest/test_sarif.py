"""results.sarif: one SARIF 2.1.0 result per FAIL cell, valid against the OASIS schema, signed.

The schema is vendored in tests/data/sarif/ (SOURCE.md names the PyPI package and version it
was taken from); reports are built and signed with the real `sign_report`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sandbox_attest.attest.keys import SigningKey, TrustedKey
from sandbox_attest.attest.subjects import FILE_SUBJECTS, SARIF
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.report.explain import probe_docs
from sandbox_attest.report.policy import Policy
from sandbox_attest.report.sarif import render_sarif
from tests.attest.builder import build_report, make_cells, sign, signed_subjects

SCHEMA = Path(__file__).parents[1] / "data" / "sarif" / "sarif-schema-2.1.0.json"
# The digest SOURCE.md records: a schema edited by hand would validate anything it likes.
SCHEMA_SHA256 = "c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e"


def validate(log: dict[str, Any]) -> None:
    """Raise unless `log` is valid SARIF 2.1.0 (the schema declares JSON Schema draft 4)."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft4Validator(schema).validate(log)


@pytest.fixture
def report(tmp_path: Path, policy_file: Path, signing_key: SigningKey) -> Path:
    """A signed report with two FAIL cells, an INCONCLUSIVE one and PASSes."""
    cells = make_cells(
        verdicts={
            "bubblewrap-net_denied_host": "FAIL",
            "bubblewrap-fs_write_outside": "FAIL",
            "bubblewrap-dns_resolution": "INCONCLUSIVE",
        },
        required=("bubblewrap",),
    )
    out = build_report(tmp_path / "report", policy_file, cells)
    sign(out, signing_key)
    return out


class TestSarif:
    def test_vendored_schema_is_the_published_one(self) -> None:
        """The vendored schema has the digest its SOURCE.md names."""
        assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256

    def test_valid_against_the_schema(self, report: Path) -> None:
        """The report's results.sarif validates against the SARIF 2.1.0 schema."""
        validate(json.loads((report / SARIF).read_text(encoding="utf-8")))

    def test_one_result_per_fail(self, report: Path) -> None:
        """Each FAIL cell is one result, ruled by its probe; no other verdict is a result."""
        log = json.loads((report / SARIF).read_text(encoding="utf-8"))
        results = log["runs"][0]["results"]
        assert sorted(r["properties"]["cell_id"] for r in results) == [
            "bubblewrap-fs_write_outside",
            "bubblewrap-net_denied_host",
        ]
        rules = log["runs"][0]["tool"]["driver"]["rules"]
        for result in results:
            assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
            uris = [
                loc["physicalLocation"]["artifactLocation"]["uri"] for loc in result["locations"]
            ]
            assert f"probes/{result['ruleId']}.py" in uris

    def test_message_carries_the_reason_and_fix(self, report: Path) -> None:
        """A result's message has the cell's reason and the probe's usual fix."""
        log = json.loads((report / SARIF).read_text(encoding="utf-8"))
        evidence = json.loads((report / "evidence.json").read_text(encoding="utf-8"))
        reasons = {c["cell_id"]: c["reason"] for c in evidence["cells"]}
        for result in log["runs"][0]["results"]:
            cell_id = result["properties"]["cell_id"]
            text = result["message"]["text"]
            assert reasons[cell_id] in text
            assert probe_docs()[result["ruleId"]].fix in text

    def test_signed_with_the_other_views(
        self, report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """results.sarif is a signed subject, and emptying its results breaks verification."""
        assert SARIF in FILE_SUBJECTS
        assert SARIF in signed_subjects(report)
        before = verify_report(report, trusted, policy)
        log = json.loads((report / SARIF).read_text(encoding="utf-8"))
        log["runs"][0]["results"] = []
        (report / SARIF).write_text(json.dumps(log), encoding="utf-8")
        after = verify_report(report, trusted, policy)
        assert not after.ok
        assert len(after.reasons) > len(before.reasons)
        assert any(SARIF in reason for reason in after.reasons)

    def test_no_fail_is_an_empty_valid_log(self) -> None:
        """A run without FAIL gives a valid log with no results, clearing old alerts."""
        evidence = {"run_id": "r", "cells": [{"verdict": "PASS", "probe": "dev_access"}]}
        log = json.loads(render_sarif(evidence))
        validate(log)
        assert log["runs"][0]["results"] == []
