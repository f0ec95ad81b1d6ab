"""Broken payload: starts, then crashes before its JSON line."""
import json
import sys

task = json.load(open(sys.argv[1]))
print("SANDBOX-ATTEST-START " + task["nonce"], flush=True)
raise RuntimeError("payload crashed on purpose")
