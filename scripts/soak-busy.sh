#!/usr/bin/env bash
# Issue 24's soak: `./run test` N times in a row (default 3), each as CI runs it (in
# scripts/fresh-state.sh's private namespace, on fresh state), each beside tests/noise.py's busy
# host: directories like mktemp's and a browser's coming and going under /tmp and /run, some
# private, some with sockets. A busy host must never change a verdict, so every run must pass.
#
#   scripts/soak-busy.sh [RUNS] [pytest options]     (as root)
#
# One line per run on stderr and in .state/soak/summary.txt: exit status, duration, pytest's
# last line, what the noise made; each run's whole output in .state/soak/run-K.log.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "soak-busy.sh: run as root (the fresh-state namespace needs it)" >&2; exit 1; }
runs=${1:-3}
shift || true
out=.state/soak
mkdir -p "$out"
: >"$out/summary.txt"
failed=0
for k in $(seq "$runs"); do
  log="$out/run-$k.log"
  start=$(date +%s)
  # The noise runs inside the namespace: its /tmp is a fresh tmpfs the host's cannot reach.
  # shellcheck disable=SC2016  # expanded by the inner shell
  set +e
  scripts/fresh-state.sh bash -c '
    python3 -m tests.noise >"$0.noise" 2>&1 & noise=$!
    ./run test "$@"; rc=$?
    kill -TERM "$noise"; wait "$noise"
    exit "$rc"' "$log" "$@" >"$log" 2>&1
  rc=$?
  set -e
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  line="run $k/$runs: exit $rc in $(( $(date +%s) - start )) s; $(grep -E '(passed|failed)' "$log" | tail -1); $(cat "$log.noise" 2>/dev/null)"
  echo "$line" | tee -a "$out/summary.txt" >&2
done
echo "soak: $failed of $runs runs failed" | tee -a "$out/summary.txt" >&2
[ "$failed" -eq 0 ]
