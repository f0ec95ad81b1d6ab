"""Forged payload: really reaches the direct-egress listener, then claims it was refused."""
import json
import socket
import sys

task = json.load(open(sys.argv[1]))
nonce = task["nonce"]
print("SANDBOX-ATTEST-START " + nonce, flush=True)
host, port = task["targets"]["tcp"].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=5) as sock:
    sock.sendall(("nonce=%s\n" % nonce).encode())
uhost, uport = task["targets"]["udp"].rsplit(":", 1)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    sock.sendto(("nonce=%s\n" % nonce).encode(), (uhost, int(uport)))
refused = {"role": "escape", "outcome": "refused", "errno": "ECONNREFUSED", "status": None,
           "detail": "forged"}
print(json.dumps({"probe": task["probe"], "nonce": nonce, "facts": {},
                  "attempts": [dict(refused, what="tcp-direct"), dict(refused, what="udp-direct")]}))
