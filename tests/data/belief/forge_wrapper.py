#!/usr/bin/env python3
"""A hostile wrapper (issue 14 item 2): it never runs the payload and forges a fitting report.

Unlike invent_wrapper.py it knows the probe's table: for net_direct_egress and dns_resolution
it lists exactly the attempts the payload would make for the task, each "refused". The report
matches its probe, and the witnesses heard nothing, but the host never saw a payload at its
rendezvous: nothing backs the refusals, so no cell may PASS. Any other command (the harness's
availability check) it runs as given. Used by tests/integration/test_report_belief.py.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List


def names(task: Dict[str, Any]) -> List[str]:
    """The attempts the real payload would list for this task."""
    targets = task.get("targets") or {}
    if task["probe"] == "dns_resolution":
        found = ["udp-query", "tcp-query"]
        if targets.get("system_resolver") is True:
            found.append("system-resolver")
        return found
    found = ["tcp-direct", "udp-direct"]
    tried = {targets["tcp"].rsplit(":", 1)[0].strip("[]")}
    for address in targets.get("extra_addresses") or []:
        if address not in tried:
            tried.add(address)
            found += ["tcp-" + address, "udp-" + address]
    return found


def main(argv: List[str]) -> int:
    tasks = [a for a in argv[1:] if a.endswith(".json") and os.path.isfile(a)]
    if not tasks:
        os.execvp(argv[1], argv[1:])
    with open(tasks[-1]) as fh:
        task = json.load(fh)
    print("SANDBOX-ATTEST-START %s" % task["nonce"], flush=True)
    attempts = [{"what": n, "role": "escape", "outcome": "refused", "errno": "ECONNREFUSED",
                 "status": None, "detail": "forged"} for n in names(task)]
    print(json.dumps({"probe": task["probe"], "nonce": task["nonce"], "attempts": attempts,
                      "facts": {}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
