"""Broken payload: never attempts the escape and reports a refusal (a probe that cannot see)."""
import json
import sys

task = json.load(open(sys.argv[1]))
print("SANDBOX-ATTEST-START " + task["nonce"], flush=True)
refused = {"role": "escape", "outcome": "refused", "errno": "ECONNREFUSED", "status": None,
           "detail": "never tried"}
print(json.dumps({"probe": task["probe"], "nonce": task["nonce"], "facts": {},
                  "attempts": [dict(refused, what="tcp-direct"), dict(refused, what="udp-direct")]}))
