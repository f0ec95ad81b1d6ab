#!/usr/bin/env bash
# Make a Docker engine answer for the docker backend's tests, and undo only what we did.
#
#   scripts/docker-engine.sh start   use the engine that answers; else install Debian's
#                                    docker.io (when dockerd is missing) and start dockerd
#   scripts/docker-engine.sh stop    stop dockerd only if `start` started it
#   scripts/docker-engine.sh answers exit 0 when an engine answers now (starts nothing)
#
# `start` prints nothing on success. It records in .state/docker-engine/state whether it started
# dockerd, so `stop` never touches an engine someone else runs (a developer's Docker Desktop, a
# CI service). The dockerd we start runs with --bridge=none and --iptables=false: the backend
# only uses network_mode "none" (and "host" for the deliberately weakened case), so the engine
# has no reason to create a bridge on a private range or rewrite the host's firewall.
#
# Environment:
#   DOCKER_ENGINE_START_TIMEOUT  seconds to wait for a started dockerd to answer (default 60)
#   DOCKER_ENGINE_STOP_TIMEOUT   seconds to wait for it to exit before SIGKILL (default 30)
#   DOCKER_ENGINE_STATE_DIR      where the record of the started engine is kept (default
#                                .state/docker-engine; scripts/fresh-state.sh gives its
#                                namespace a record of its own)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state_dir="${DOCKER_ENGINE_STATE_DIR:-${repo_root}/.state/docker-engine}"
state_file="${state_dir}/state"
log_file="${state_dir}/dockerd.log"
apt_log="${state_dir}/apt.log"
pid_file="${state_dir}/dockerd.pid"

die() {
  echo "docker-engine.sh: $*" >&2
  exit 1
}

# True when an engine answers on DOCKER_HOST (or the default socket). A bounded `timeout` keeps
# a hung daemon from hanging the test command.
engine_answers() {
  command -v docker >/dev/null 2>&1 || return 1
  timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

install_docker_io() {
  mkdir -p "${state_dir}"
  export DEBIAN_FRONTEND=noninteractive
  # An empty package list (a fresh machine) has no candidate: update once, then install.
  # The lock timeout waits for another apt run (other jobs share the machine) instead of failing.
  if ! apt-cache policy docker.io 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -qq >>"${apt_log}" 2>&1 || {
      tail -n 20 "${apt_log}" >&2
      die "apt-get update failed (log: ${apt_log}); fix the package sources, then rerun"
    }
  fi
  apt-get install -y -qq -o DPkg::Lock::Timeout=300 docker.io >>"${apt_log}" 2>&1 || {
    tail -n 20 "${apt_log}" >&2
    die "apt-get install docker.io failed (log: ${apt_log}); install Docker by hand, then rerun"
  }
}

start() {
  mkdir -p "${state_dir}"
  if engine_answers; then
    # A second `start` must not forget that an earlier one started this engine.
    if [[ "$(read_state started)" == 1 ]] && is_our_dockerd "$(read_state pid)"; then
      return 0
    fi
    echo "started=0" >"${state_file}"
    return 0
  fi
  if [[ -n "${DOCKER_HOST:-}" ]]; then
    die "DOCKER_HOST=${DOCKER_HOST} does not answer; start that engine or unset DOCKER_HOST"
  fi
  [[ "$(id -u)" == 0 ]] || die "no Docker engine answers and starting dockerd needs root; start Docker (or run this as root)"
  command -v dockerd >/dev/null 2>&1 || install_docker_io
  command -v dockerd >/dev/null 2>&1 || die "docker.io installed but dockerd is not on PATH"

  : >"${log_file}"
  # setsid: dockerd must outlive this script and not share the test runner's process group.
  setsid dockerd --bridge=none --iptables=false --ip-masq=false --pidfile "${pid_file}" \
    </dev/null >>"${log_file}" 2>&1 &
  local pid=$!
  echo "started=1 pid=${pid}" >"${state_file}"

  local deadline=$((SECONDS + ${DOCKER_ENGINE_START_TIMEOUT:-60}))
  while ((SECONDS < deadline)); do
    if ! kill -0 "${pid}" 2>/dev/null; then
      echo "started=0" >"${state_file}"
      echo "--- last lines of ${log_file} ---" >&2
      tail -n 25 "${log_file}" >&2
      die "dockerd exited during startup (see above: a missing kernel feature such as overlayfs, cgroups or namespaces shows up there); the docker backend stays UNAVAILABLE"
    fi
    if engine_answers; then
      return 0
    fi
    sleep 0.2
  done
  tail -n 25 "${log_file}" >&2
  stop_pid "${pid}"
  echo "started=0" >"${state_file}"
  die "dockerd did not answer within ${DOCKER_ENGINE_START_TIMEOUT:-60}s (log: ${log_file}); raise DOCKER_ENGINE_START_TIMEOUT or read the log"
}

# The value of KEY in the state file (empty when absent).
read_state() {
  local word
  [[ -f "${state_file}" ]] || return 0
  for word in $(<"${state_file}"); do
    [[ "${word}" == "$1="* ]] && echo "${word#"$1"=}"
  done
  return 0
}

is_our_dockerd() {
  [[ -n "$1" && "$(cat "/proc/$1/comm" 2>/dev/null || true)" == dockerd ]]
}

# TERM, wait up to the deadline, then KILL. Only ever called with the pid `start` recorded.
stop_pid() {
  local pid=$1
  is_our_dockerd "${pid}" || return 0
  kill -TERM "${pid}" 2>/dev/null || return 0
  local deadline=$((SECONDS + ${DOCKER_ENGINE_STOP_TIMEOUT:-30}))
  while ((SECONDS < deadline)); do
    kill -0 "${pid}" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "${pid}" 2>/dev/null || true
}

stop() {
  [[ -f "${state_file}" ]] || return 0
  if [[ "$(read_state started)" == 1 ]]; then
    stop_pid "$(read_state pid)"
  fi
  rm -f "${state_file}"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  answers) engine_answers ;;
  *) die "usage: $0 start|stop|answers" ;;
esac
