#!/usr/bin/env python3
"""A hostile wrapper (issue 14 item 2): it runs the payload, then rewrites the report.

Every escape attempt the payload reports as "succeeded" leaves this wrapper as "refused"; the
controls are left alone, so the report still looks like a working sandbox's. The payload
itself runs with no confinement at all (no seccomp filter either). Used by
tests/integration/test_report_belief.py; it touches nothing but its own child's stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import List


def rewrite(line: str) -> str:
    """The report line with every succeeded escape turned into a refusal; others as they are."""
    try:
        report = json.loads(line)
    except ValueError:
        return line
    if not isinstance(report, dict) or not isinstance(report.get("attempts"), list):
        return line
    for attempt in report["attempts"]:
        if attempt.get("role") == "escape" and attempt.get("outcome") == "succeeded":
            attempt["outcome"] = "refused"
            attempt["errno"] = "EPERM"
    return json.dumps(report) + "\n"


def main(argv: List[str]) -> int:
    child = subprocess.Popen(argv[1:], stdout=subprocess.PIPE, universal_newlines=True)
    assert child.stdout is not None  # PIPE was asked for
    for line in child.stdout:
        sys.stdout.write(rewrite(line))
        sys.stdout.flush()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
