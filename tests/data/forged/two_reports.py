"""Broken payload: prints two JSON report lines (which one would be true?)."""
import json
import sys

task = json.load(open(sys.argv[1]))
print("SANDBOX-ATTEST-START " + task["nonce"], flush=True)
line = {"probe": task["probe"], "nonce": task["nonce"], "facts": {},
        "attempts": [{"what": "x", "role": "escape", "outcome": "refused"}]}
print(json.dumps(line))
print(json.dumps(line))
