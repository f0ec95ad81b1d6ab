"""`reports/<id>/results.sarif`: every FAIL cell as a SARIF 2.1.0 result, for code scanning.

GitHub code scanning (and any SARIF viewer) then lists each escape beside the file a vendor
changes: the probe's payload (`probes/<probe>.py`) and, for a backend attested through a
shipped command spec, `matrix/backends/<name>.toml`. One result per FAIL cell, rule = probe,
message = the cell's reason with the probe's usual fix (`sandbox_attest.report.explain.with_fix`).
It is rendered from the judged evidence like every other view and signed with them
(`sandbox_attest.attest.subjects`); other verdicts are not results, since a SARIF result
says "a problem was found" and only FAIL is an escape seen.

Spec: SARIF 2.1.0, OASIS Standard (errata 01),
https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/sarif-v2.1.0-errata01-os.html;
checked against the schema vendored in tests/data/sarif/.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest import __version__
from sandbox_attest.report.explain import probe_docs, with_fix

if TYPE_CHECKING:
    from sandbox_attest.report.evidence import CellEntry

SARIF_NAME: Final = "results.sarif"
SARIF_VERSION: Final = "2.1.0"
SARIF_SCHEMA: Final = "https://json.schemastore.org/sarif-2.1.0.json"
# Locations are relative to the checkout (or the installed package's data): a viewer
# resolves them against the repository it scans, where probes/ and matrix/ live.
SRCROOT: Final = "%SRCROOT%"


def render_sarif(evidence: dict[str, Any]) -> bytes:
    """The SARIF log of one run's evidence: one result per FAIL cell, in the cells' order.

    A run with no FAIL is a valid log with no results, so a code-scanning upload clears
    alerts an earlier run raised.
    """
    cells = [c for c in evidence.get("cells", []) if c.get("verdict") == "FAIL"]
    specs = _spec_backends(evidence)
    docs = probe_docs()
    rule_ids = list(dict.fromkeys(str(c.get("probe", "")) for c in cells))
    rules = [_rule(probe, docs) for probe in rule_ids]
    results = [_result(cell, rule_ids, specs, evidence) for cell in cells]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "sandbox-attest",
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "automationDetails": {"id": f"sandbox-attest/{evidence.get('run_id', '')}"},
                "originalUriBaseIds": {SRCROOT: {"description": {"text": "the checkout"}}},
                "results": results,
            }
        ],
    }
    return (json.dumps(log, indent=2, sort_keys=False) + "\n").encode("utf-8")


def _rule(probe: str, docs: dict[str, Any]) -> dict[str, Any]:
    doc = docs.get(probe)
    rule: dict[str, Any] = {"id": probe, "name": probe}
    if doc is not None:
        rule |= {
            "shortDescription": {"text": doc.title},
            "fullDescription": {"text": f"{doc.attempts} Judges: {doc.claim}"},
            "help": {"text": f"Usual fix: {doc.fix} (sandbox-attest explain {probe})"},
        }
    rule["defaultConfiguration"] = {"level": "error"}
    return rule


def _result(
    cell: CellEntry, rule_ids: list[str], specs: set[str], evidence: dict[str, Any]
) -> dict[str, Any]:
    probe, backend = str(cell.get("probe", "")), str(cell.get("backend", ""))
    cell_id = str(cell.get("cell_id", f"{backend}-{probe}"))
    locations = [_location(f"probes/{probe}.py")]
    if backend in specs:
        # The spec is where a vendor changes what the sandbox does; listed first.
        locations.insert(0, _location(f"matrix/backends/{backend}.toml"))
    required = "required by the policy" if cell.get("required") else "not required"
    return {
        "ruleId": probe,
        "ruleIndex": rule_ids.index(probe),
        "level": "error",
        "message": {
            "text": f"{cell_id}: FAIL ({required}): " + with_fix(probe, str(cell.get("reason", "")))
        },
        "locations": locations,
        # The cell id is stable across runs, so a viewer tracks one alert per cell.
        "partialFingerprints": {"sandboxAttestCell/v1": cell_id},
        "properties": {
            "backend": backend,
            "cell_id": cell_id,
            "platform": str(cell.get("platform", "")),
            "run_id": str(evidence.get("run_id", "")),
        },
    }


def _location(uri: str) -> dict[str, Any]:
    return {"physicalLocation": {"artifactLocation": {"uri": uri, "uriBaseId": SRCROOT}}}


def _spec_backends(evidence: dict[str, Any]) -> set[str]:
    """Backends attested through a command spec (their identity carries the spec's digest)."""
    return {
        str(b.get("name"))
        for b in evidence.get("backends", [])
        if isinstance(b, dict) and (b.get("identity") or {}).get("spec_sha256")
    }
