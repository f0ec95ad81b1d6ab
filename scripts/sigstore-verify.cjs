// Verify Sigstore bundles (one per line) with a public key, offline, using the Sigstore
// project's own JavaScript verifier (@sigstore/verify, the library under @sigstore/cli).
// Usage: node scripts/sigstore-verify.cjs BUNDLES.jsonl PUBLIC.pem KEYID  (NODE_PATH: where
// @sigstore/verify and @sigstore/bundle are, e.g. /opt/sandbox-attest/npm/node_modules, which
// scripts/real-sandboxes.sh fills at pinned versions)
// Prints one JSON line per bundle: {"line": n, "ok": true} or {"line": n, "ok": false,
// "error": "..."}; exits 0 only if every bundle verified.
"use strict";
const fs = require("fs");
const crypto = require("crypto");
const { bundleFromJSON } = require("@sigstore/bundle");
const { toSignedEntity, toTrustMaterial, Verifier } = require("@sigstore/verify");

const [bundlesPath, pemPath, keyid] = process.argv.slice(2);
const publicKey = crypto.createPublicKey(fs.readFileSync(pemPath));
// No Fulcio, Rekor or TSA: the trust is the one public key, found by the bundle's hint.
const emptyRoot = { certificateAuthorities: [], timestampAuthorities: [], tlogs: [], ctlogs: [] };
const trust = toTrustMaterial(emptyRoot, (hint) => {
  if (hint !== keyid) {
    throw new Error(`key not found: ${hint}`);
  }
  return { publicKey, validFor: () => true };
});
const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
let failed = 0;
fs.readFileSync(bundlesPath, "utf8")
  .split("\n")
  .filter((line) => line.trim())
  .forEach((line, i) => {
    try {
      verifier.verify(toSignedEntity(bundleFromJSON(JSON.parse(line))));
      console.log(JSON.stringify({ line: i + 1, ok: true }));
    } catch (err) {
      failed += 1;
      console.log(JSON.stringify({ line: i + 1, ok: false, error: String(err.message || err) }));
    }
  });
process.exit(failed ? 1 : 0);
