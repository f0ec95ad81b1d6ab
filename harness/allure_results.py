"""What the harness adds to allure-pytest's results: labels, evidence, environment, categories.

allure-pytest writes one result per matrix cell. We label each with its backend, probe and
platform and set them as parameters too (so cells never merge into "retries" of each other),
attach the cell's evidence, and at the end of the run write `environment.properties` (who ran
what) and `categories.json` (so a reader sees escapes, inconclusive cells, errors and
unavailable backends as separate groups instead of one red pile).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypedDict


class Category(TypedDict):
    """One entry of allure's categories.json."""

    name: str
    messageRegex: str  # allure's own key names (camelCase)
    matchedStatuses: list[str]


# Categories match on the failure message, which is "CellFailed: <VERDICT>: <reason>" for a
# cell that did not PASS and "UNAVAILABLE: ..." / "NOT_APPLICABLE: ..." for a skipped one.
CATEGORIES: list[Category] = [
    {
        "name": "Escape (FAIL)",
        "messageRegex": r"(?s).*CellFailed: FAIL:.*",
        "matchedStatuses": ["failed", "broken"],
    },
    {
        "name": "Inconclusive (a control failed or the witnesses disagree)",
        "messageRegex": r"(?s).*CellFailed: INCONCLUSIVE:.*",
        "matchedStatuses": ["failed", "broken"],
    },
    {
        "name": "Error (crash, timeout, no start marker, bad output)",
        "messageRegex": r"(?s).*CellFailed: ERROR:.*",
        "matchedStatuses": ["failed", "broken"],
    },
    {
        "name": "Unavailable backend",
        "messageRegex": r"(?s).*UNAVAILABLE:.*",
        "matchedStatuses": ["failed", "broken", "skipped"],
    },
    {
        "name": "Not applicable (written reason)",
        "messageRegex": r"(?s).*NOT_APPLICABLE:.*",
        "matchedStatuses": ["skipped"],
    },
]


def attach_cell(entry: dict[str, Any], platform: str) -> None:
    """Label the running cell's result and attach its evidence (no-op without allure)."""
    try:
        import allure  # noqa: PLC0415
    except ImportError:
        return
    dynamic: Any = allure.dynamic  # allure-python ships no type hints for `dynamic`
    for name, value in (
        ("backend", entry["backend"]),
        ("probe", entry["probe"]),
        ("platform", platform),
    ):
        dynamic.label(name, value)
        dynamic.parameter(name, value)
    allure.attach(
        json.dumps(entry, indent=2, default=str),
        name="evidence",
        attachment_type=allure.attachment_type.JSON,
    )


def write_run_files(results_dir: Path, environment: dict[str, str]) -> None:
    """Write environment.properties and categories.json into the allure results directory.

    allure-results/ is a signed subject (its tree digest), so these are written like every
    report file: new temp file, no-follow, rename, relative to the directory's descriptor
    (`harness.attest.reportfs`). A directory that does not exist yet is created 0700.

    Raises:
        ConfigError: the directory is someone else's or writable by others.
        ReportError: a file could not be written.
    """
    from harness.attest import reportfs  # noqa: PLC0415  (cryptography: only a run signs)

    # Java properties: one key=value per line; keep values on one line.
    lines = [f"{key}={' '.join(str(value).split())}" for key, value in sorted(environment.items())]
    dir_fd = reportfs.ensure_report_dir(results_dir)
    try:
        reportfs.write_new(dir_fd, "environment.properties", ("\n".join(lines) + "\n").encode())
        reportfs.write_new(dir_fd, "categories.json", json.dumps(CATEGORIES, indent=2).encode())
    finally:
        os.close(dir_fd)
