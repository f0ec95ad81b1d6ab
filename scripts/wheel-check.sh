#!/usr/bin/env bash
# The wheel is the product: build it, install it into a fresh venv outside the checkout, and
# run the commands a user runs from there (run, verify, merge), so a default that only works
# inside a clone (a path relative to the checkout, a message naming a file the wheel lacks)
# fails here instead of in someone else's CI.
#
#   scripts/wheel-check.sh [PYTHON]     PYTHON: the interpreter that has `build` (default:
#                                       the checkout's .venv/bin/python)
#
# What it checks, each with the line that failed:
#   - `python -m build` makes an sdist and a wheel (the wheel built from the sdist);
#   - the wheel installs with its dependencies into a new venv under a mktemp directory;
#   - `sandbox-attest run --backend none --backend bubblewrap` there, in a directory with no
#     matrix/ of its own, passes its gate, with test ids `matrix.toml::<cell>` (never a
#     site-packages path), no PytestAssertRewriteWarning and no mention of scripts/;
#   - `verify --partial` of that report with the package's default policy holds (where this
#     host cannot judge a probe the policy requires, e.g. dev_access with no device the payload
#     user may open, both use that policy minus the probe, excluded with the host's reason);
#   - a second run with a local matrix/ named by flag (two probes, one leg, its own policy),
#     `merge` of that leg with its legs file, and `verify` of the release hold;
#   - as root: `pipx install` of the wheel into a directory only root can enter (PIPX_HOME and
#     PIPX_BIN_DIR under a 0700 mktemp dir, as pipx under /root/.local is), then `run --backend
#     none --backend bubblewrap` and `verify --partial` from an empty directory: the gate
#     PASSES, on an interpreter the payload user can run (the evidence says which) with the
#     payload files copied where it can read them.
# Everything it makes lives under the mktemp directory, removed at the end (kept with
# WHEEL_CHECK_KEEP=1). Exit 0 only if every step held.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${1:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d /tmp/sa-wheel.XXXXXX)
# The payload user (an unprivileged account, sandbox_attest/host/trust.py) must traverse the report and
# scratch directories under it, as it must under /tmp.
chmod 755 "$WORK"
cleanup() { [ "${WHEEL_CHECK_KEEP:-0}" = 1 ] && echo "wheel-check: kept $WORK" >&2 || rm -rf "$WORK"; }
trap cleanup EXIT

say() { printf 'wheel-check: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
t0=$SECONDS

say "python -m build -> $WORK/dist"
"$PY" -m build --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { tail -20 "$WORK/build.log" >&2; fail "python -m build failed (log above)"; }
wheel=$(ls "$WORK"/dist/sandbox_attest-*.whl)
ls "$WORK"/dist/sandbox_attest-*.tar.gz >/dev/null || fail "no sdist in $WORK/dist"

say "fresh venv, pip install $(basename "$wheel")"
base=$("$PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
"$base" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "$wheel" >"$WORK/pip.log" 2>&1 \
  || { tail -20 "$WORK/pip.log" >&2; fail "pip install of the wheel failed (log above)"; }
SA=$WORK/venv/bin/sandbox-attest

# A directory with nothing of the project in it: every default must come from the package.
mkdir -m 755 "$WORK/cwd"
cd "$WORK/cwd"
case "$("$WORK/venv/bin/python" -c 'import sandbox_attest; print(sandbox_attest.__file__)')" in
  "$WORK"/venv/*) ;;
  *) fail "the fresh venv imports sandbox_attest from outside itself (the checkout leaks in)" ;;
esac
openssl genpkey -algorithm ed25519 -out key.pem 2>/dev/null
chmod 600 key.pem
openssl pkey -in key.pem -pubout -out key.pub 2>/dev/null

# A probe this host cannot judge (dev_access where no device opens for the payload user: a
# container's 0600 /dev/fuse) is NOT_APPLICABLE on every leg, and the shipped policy requires
# it, so no run here could pass. The check then uses the shipped policy minus those probes,
# each excluded with the host's own reason and said out loud; elsewhere the shipped policy.
POLICY=()
here=$("$WORK/venv/bin/python" - "$WORK/policy-here.toml" <<'PY'
import json
import sys
from pathlib import Path

from sandbox_attest.report.policy import load_policy
from sandbox_attest.catalog import PROBES
from sandbox_attest.paths import default_policy

reasons = {}
for probe, spec in PROBES.items():
    check = getattr(spec, "not_applicable_here", None)
    reason = check() if callable(check) else None
    if reason:
        reasons[probe] = str(reason)
        print(f"wheel-check: this host cannot judge {probe}: {reason}", file=sys.stderr)
if reasons:
    kept = [
        line
        for line in default_policy().read_text().splitlines()
        if line.strip().rstrip(",").strip('"') not in reasons
    ]
    for probe, reason in reasons.items():
        kept += ["", "[[exclude]]", 'platform = "linux"', 'backend = "*"']
        kept += [f'probe = "{probe}"', "reason = " + json.dumps("this host: " + reason)]
    Path(sys.argv[1]).write_text("\n".join(kept) + "\n")
    load_policy(Path(sys.argv[1]))  # still a valid policy, requiring everything else
    print(sys.argv[1])
PY
) || fail "could not ask the installed package which probes this host can judge"
if [ -n "$here" ]; then
  say "the gate uses the shipped policy minus what this host cannot judge: $here"
  POLICY=(--policy "$here")
fi

say "sandbox-attest run --backend none --backend bubblewrap (from $WORK/cwd)"
set +e
"$SA" run --backend none --backend bubblewrap "${POLICY[@]}" --key key.pem --out leg >run.log 2>&1
code=$?
set -e
grep '^gate:' run.log >&2 || true
[ "$code" -eq 0 ] || { tail -40 run.log >&2; fail "run exited $code"; }
grep -q 'matrix.toml::none-net_denied_host' run.log \
  || fail "test ids do not read matrix.toml::none-net_denied_host: $(grep -m1 '::none-' run.log)"
! grep -n 'site-packages[^ ]*::' run.log || fail "a test id names a site-packages path"
! grep -n 'PytestAssertRewriteWarning' run.log || fail "pytest warned it cannot rewrite asserts"
! grep -n 'scripts/' run.log || fail "a message names scripts/, which the wheel does not carry"

say "sandbox-attest verify leg --partial (the package's default policy, or this host's)"
"$SA" verify leg --trusted-key key.pub --partial "${POLICY[@]}" >verify.log 2>&1 \
  || { cat verify.log >&2; fail "verify of the leg refused"; }

say "a local matrix/ given on purpose: run, merge and verify with it"
# What a project that attests its own choice keeps: two probes, one leg. Given by flag, so it
# also shows that a local matrix/ overrides the package's only when named.
mkdir -m 755 matrix
cat >matrix/matrix.toml <<'EOF'
[matrix]
control = "none"

[[probe]]
id = "net_denied_host"
timeout = 60

[[probe]]
id = "fs_write_outside"
timeout = 60

[[backend]]
name = "none"
platforms = ["linux", "darwin", "windows"]

[[backend]]
name = "bubblewrap"
platforms = ["linux"]
reason = "bubblewrap needs Linux namespaces"
EOF
cat >matrix/policy.toml <<'EOF'
[policy]
name = "wheel-check"
version = 2

[[require]]
platform = "linux"
backend = "none"
probes = ["net_denied_host", "fs_write_outside"]

[[require]]
platform = "linux"
backend = "bubblewrap"
probes = ["net_denied_host", "fs_write_outside"]
EOF
cat >matrix/legs.toml <<'EOF'
[[leg]]
platform = "linux"
backend = "bubblewrap"
EOF
"$SA" run --matrix matrix/matrix.toml --policy matrix/policy.toml --backend bubblewrap \
  --key key.pem --out leg-local >run-local.log 2>&1 || { tail -30 run-local.log >&2; fail "local run"; }
grep -q '^matrix/matrix.toml::bubblewrap-fs_write_outside PASS' run-local.log \
  || fail "the local matrix's ids do not read matrix/matrix.toml::bubblewrap-fs_write_outside"
"$SA" merge leg-local --expect-legs matrix/legs.toml --policy matrix/policy.toml \
  --trusted-key key.pub --key key.pem --out release >merge.log 2>&1 \
  || { cat merge.log >&2; fail "merge refused"; }
"$SA" verify release --trusted-key key.pub --policy matrix/policy.toml >verify-release.log 2>&1 \
  || { cat verify-release.log >&2; fail "verify of the merged release refused"; }
! grep -n 'scripts/' ./*.log || fail "a message names scripts/, which the wheel does not carry"

# Root installs Python tools where only root can enter: pipx under /root/.local, a venv in a
# mktemp -d directory. The payload user (sandbox_attest/host/trust.py) can then neither start the
# harness's interpreter nor read its probes; the run must still work (sandbox_attest/run/reach.py).
if [ "$(id -u)" -eq 0 ]; then
  command -v pipx >/dev/null \
    || fail "pipx not found; install it (Debian: apt-get install pipx; ./run test does)"
  PIPX_ROOT=$(mktemp -d "$WORK/pipx.XXXXXX")  # 0700, root's: the payload user cannot enter
  [ "$(stat -c %a "$PIPX_ROOT")" = 700 ] || fail "$PIPX_ROOT is not mode 700"
  say "pipx install $(basename "$wheel") under $PIPX_ROOT (0700, root's)"
  PIPX_HOME=$PIPX_ROOT/home PIPX_BIN_DIR=$PIPX_ROOT/bin PIPX_MAN_DIR=$PIPX_ROOT/man \
    pipx install --python "$base" "$wheel" >"$WORK/pipx.log" 2>&1 \
    || { tail -20 "$WORK/pipx.log" >&2; fail "pipx install of the wheel failed (log above)"; }
  mkdir -m 755 "$WORK/cwd-pipx"
  cd "$WORK/cwd-pipx"
  say "root-only pipx install: run --backend none --backend bubblewrap (from $WORK/cwd-pipx)"
  set +e
  "$PIPX_ROOT/bin/sandbox-attest" run --backend none --backend bubblewrap "${POLICY[@]}" \
    --key "$WORK/cwd/key.pem" --out leg >run.log 2>&1
  code=$?
  set -e
  grep '^gate:' run.log >&2 || true
  [ "$code" -eq 0 ] || { tail -40 run.log >&2; fail "run from the root-only pipx install exited $code"; }
  grep -q '^gate: PASSED' run.log || fail "the root-only pipx install's run did not pass its gate"
  # The evidence names the interpreter the payloads ran on and where their files were copied.
  "$base" - "$PIPX_ROOT" leg/evidence.json <<'PY' || fail "the evidence does not record the choice"
import json, sys
root, evidence = sys.argv[1], json.load(open(sys.argv[2]))
chosen, copied = evidence["payload_interpreter"], evidence.get("payload_files") or {}
print("wheel-check: payloads ran on", chosen["path"], "-", chosen["reason"], file=sys.stderr)
assert not chosen["path"].startswith(root), chosen
assert chosen["harness_executable"].startswith(root), chosen
assert copied.get("copied_to") and not copied["copied_to"].startswith(root), copied
PY
  "$PIPX_ROOT/bin/sandbox-attest" verify leg --trusted-key "$WORK/cwd/key.pub" --partial \
    "${POLICY[@]}" >verify.log 2>&1 || { cat verify.log >&2; fail "verify of the root-only pipx leg refused"; }
else
  say "skipped the root-only pipx install: not root, so there is no separate payload user"
fi

say "OK in $((SECONDS - t0)) s: built, installed outside the checkout, run + verify + merge hold"
