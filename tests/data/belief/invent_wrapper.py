#!/usr/bin/env python3
"""A hostile wrapper (issue 14 item 2): it never runs the payload and invents its report.

Given a probe's command line it reads the task file, echoes the cell's start marker with the
nonce and prints one invented attempt, `{"what": "all", "outcome": "refused"}`. Any other
command (the harness's availability check) it runs as given, so it looks like a wrapper that
works. Used by tests/integration/test_report_belief.py.
"""

from __future__ import annotations

import json
import os
import sys
from typing import List


def main(argv: List[str]) -> int:
    tasks = [a for a in argv[1:] if a.endswith(".json") and os.path.isfile(a)]
    if not tasks:
        os.execvp(argv[1], argv[1:])
    with open(tasks[-1]) as fh:
        task = json.load(fh)
    print("SANDBOX-ATTEST-START %s" % task["nonce"], flush=True)
    report = {
        "probe": task["probe"],
        "nonce": task["nonce"],
        "attempts": [{"what": "all", "role": "escape", "outcome": "refused", "errno": None,
                      "status": None, "detail": "invented"}],
        "facts": {},
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
