#!/usr/bin/env bash
# Run a command the way a fresh machine shows the harness its own host state:
#
#   scripts/fresh-state.sh CMD [ARGS...]     (as root; .ci/run uses it for `./run test`)
#
# The command runs in a private mount namespace (unshare --mount --propagation private) where
# every place the harness and its tests keep state between runs starts as on a machine that
# never ran them, and everything written there vanishes with the namespace:
#   /tmp                          a fresh, empty tmpfs (the suite's temp root
#                                 /tmp/attest-tests-<uid>, worlds, sockets, canaries)
#   /run, /var/lib, /var/tmp,     a fresh tmpfs in which every entry of the host's is bound
#   /dev/shm                      again except the harness's own (FRESH below): those are
#                                 absent, as on a fresh machine, not empty
# and scripts/docker-engine.sh keeps its record of the engine it starts in the fresh /run
# (DOCKER_ENGINE_STATE_DIR), not in the checkout's .state/ that runs outside share.
# Why absent and not an empty directory over each: an empty /run/sandbox-attest left by an
# earlier run is exactly what hid bubblewrap's failure to make its own mount point (issue 24).
# A place is hidden by covering its parent, because a mount needs an existing mount point
# and making one would itself leave the directory on the host. No mount is made under a path
# naming the harness (the checkout, /opt/sandbox-attest): the suite checks that no mount of
# its own leaked by looking for its name in /proc/self/mountinfo.
#
# The Docker engine's state is hidden too (/run/docker*, /run/containerd, /var/lib/docker,
# /var/lib/containerd), so `./run test` starts an engine of its own inside the namespace, on
# fresh state, as on a fresh machine (scripts/docker-engine.sh; its skeleton image is built
# locally, nothing is pulled). An engine started outside cannot serve the run: the daemon
# resolves bind sources in its own mount namespace, where this namespace's /tmp does not
# exist ("bind source path does not exist: /tmp/attest-tests-0/..."), and a container given
# the host's / would see the host's files, not the canaries planted here. For the same
# reason a DOCKER_HOST naming an engine outside is refused.
#
# Not hidden, on purpose: installed tools (/opt/sandbox-attest/npm, the venv, Debian packages,
# dockerd itself) and accounts (the payload user, once made by useradd, stays in /etc/passwd:
# /etc cannot be covered without breaking useradd's rename of /etc/passwd).
#
# Host processes started before the command keep their view; entries the host adds under a
# covered parent after the start are not seen inside. Nothing here changes the host's own view.
set -euo pipefail
set -f  # the globs below are matched against names, never expanded against files

say() { printf '==> %s\n' "$*" >&2; }
die() {
  printf 'fresh-state.sh: %s\n' "$*" >&2
  exit 1
}

# PARENT and the names (globs) of the state in it a fresh machine lacks. "*" hides every entry.
# /run goes first: libmount keeps its table of this namespace's mounts in /run/mount, which
# must be the namespace's own (the first mount makes it in the fresh /run, never the host's).
FRESH=(
  # SANDBOX_RUN_DIR's host copy, test_faults' exec roots, sweep.RUN_DIR_NAMES, mktemp's
  # default names (the busy-host noise of tests/noise.py); libmount's table; an outside
  # engine's socket and runtime state; an enclosing fresh-state namespace's own record (a
  # nested run keeps its engine record apart from the one it runs in)
  # (the kiln* names: sandbox_attest/host/disguise.py; sandbox-attest* are the names before it)
  "/run|kiln .kiln-* sandbox-attest sa-* rogue-n*.sock shim-n*.py .sandbox-attest-* tmp.* mount docker.sock docker.pid docker containerd fresh-state"
  "/tmp|*"
  # the journal (sweep.ROOT_STATE_DIR), the payload user's home (trust.PAYLOAD_HOME: agent/,
  # sandbox-attest/ before), the tests' accounts' homes and data roots (sa-nonroot, sa-faults-*)
  "/var/lib|sandbox-attest sandbox-attest-* agent sa-* docker containerd"
  # the fs_write_outside canary classes (catalog/fs.py), tests' scratch outside /tmp
  "/var/tmp|kiln-* .kiln-* sandbox-attest* .sandbox-attest* sa-*"
  "/dev/shm|kiln-* .kiln-* sandbox-attest* .sandbox-attest* sa-*"
)

# True when NAME matches one of the globs in the space-separated list.
hidden() {
  local name=$1 glob
  for glob in $2; do
    # shellcheck disable=SC2053  # the glob is meant to match
    [[ "$name" == $glob ]] && return 0
  done
  return 1
}

# Cover PARENT with a tmpfs of its mode and owner and bind every entry back that is not hidden.
# The host's entries are reached through a descriptor opened on PARENT before it is covered;
# mount's --no-canonicalize hands the kernel that /proc/self/fd path as it is (canonicalized,
# it would name the covered path again, i.e. the fresh tmpfs).
cover() {
  local parent=$1 globs=$2 fd kind name src dst kept=0 dropped=0 gone=0
  [[ -d "$parent" && ! -L "$parent" ]] || return 0
  exec {fd}<"$parent"
  local mode uid gid
  read -r mode uid gid < <(stat -c '%a %u %g' "$parent")
  # No nosuid/nodev/noexec: nothing the host does not restrict is restricted here.
  mount -n -t tmpfs -o "mode=$mode,uid=$uid,gid=$gid" fresh-state "$parent"
  while IFS=$'\t' read -r -d '' kind name; do
    if hidden "$name" "$globs"; then
      dropped=$((dropped + 1))
      continue
    fi
    src="/proc/self/fd/$fd/$name"
    dst="$parent/$name"
    case "$kind" in
      l) ln -s "$(readlink "$src")" "$dst" ;;
      d) mkdir "$dst" ;;
      *) : >"$dst" ;;
    esac
    if [[ "$kind" != l ]] && ! mount -n --no-canonicalize --rbind "$src" "$dst" 2>/dev/null; then
      # Another program's entry may go between the listing and the bind (a busy /run): then
      # it is gone on the host too. Any other failure stops here: a half-made view would
      # not be the host's.
      [[ ! -e "$src" && ! -L "$src" ]] || die "could not bind $parent/$name back into the fresh $parent"
      rm -d "$dst"
      gone=$((gone + 1))
      continue
    fi
    kept=$((kept + 1))
  done < <(find "/proc/self/fd/$fd/" -mindepth 1 -maxdepth 1 -printf '%y\t%f\0')
  exec {fd}<&-
  local meanwhile=""
  ((gone == 0)) || meanwhile=", $gone gone meanwhile"
  say "fresh $parent (tmpfs): $kept host entries bound back, $dropped hidden$meanwhile"
}

if [[ "${1:-}" == --inside ]]; then
  shift
  # Only in the namespace the step below made: run in the host's own, it would cover the
  # host's /run and /tmp for every process there.
  here=$(readlink /proc/self/ns/mnt)
  [[ -n "${FRESH_STATE_OUTER_NS:-}" && "$here" != "$FRESH_STATE_OUTER_NS" ]] ||
    die "--inside is this script's own step, run only in the mount namespace it makes"
  unset FRESH_STATE_OUTER_NS
  for spec in "${FRESH[@]}"; do
    cover "${spec%%|*}" "${spec#*|}"
  done
  export DOCKER_ENGINE_STATE_DIR=/run/fresh-state/docker-engine
  mkdir -p "$DOCKER_ENGINE_STATE_DIR"
  exec "$@"
fi

[[ $# -gt 0 ]] || die "usage: scripts/fresh-state.sh CMD [ARGS...]"
[[ -z "${DOCKER_HOST:-}" ]] || die "DOCKER_HOST=$DOCKER_HOST names an engine outside the fresh namespace, whose containers would not see its files; unset it (the run starts its own engine)"
[[ "$(id -u)" == 0 ]] || die "a private mount namespace needs root; run as root (sudo $0 $*), or run the command directly"
command -v unshare >/dev/null || die "unshare not found; install util-linux"
FRESH_STATE_OUTER_NS=$(readlink /proc/self/ns/mnt)
export FRESH_STATE_OUTER_NS
exec unshare --mount --propagation private -- "$0" --inside "$@"
