"""Forged payload: the denial looks right but the allowed-host control failed."""
import json
import sys

task = json.load(open(sys.argv[1]))
print("SANDBOX-ATTEST-START " + task["nonce"], flush=True)
attempts = [
    {"what": "get-denied-absolute", "role": "escape", "outcome": "refused", "errno": None,
     "status": 403, "detail": "egress denied"},
    {"what": "connect-denied", "role": "escape", "outcome": "refused", "errno": None,
     "status": 403, "detail": "egress denied"},
    {"what": "get-allowed", "role": "control", "outcome": "refused", "errno": None,
     "status": 502, "detail": "bad gateway"},
]
print(json.dumps({"probe": task["probe"], "nonce": task["nonce"], "facts": {},
                  "attempts": attempts}))
