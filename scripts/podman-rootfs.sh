#!/bin/sh
# The root filesystem matrix/backends/podman.toml runs every payload in, built from this host
# the way the docker backend builds its image (sandbox_attest/backends/docker/image.py): a
# skeleton with no programs in it (the directory layout, the merged-/usr symlinks, an
# /etc/passwd naming root and nobody, the host's loader cache) over which each container mounts
# the host's /usr read-only. Nothing is pulled from a registry (there is no network here) and
# nothing of the host beyond /usr and the loader cache is copied.
#
# Idempotent and fast (a few milliseconds when the rootfs is current): the spec's [detect]
# check calls it as root before every run, so a changed loader cache (an apt upgrade) rebuilds
# it. It writes only under /opt/sandbox-attest/podman (PODMAN_ROOTFS_PREFIX overrides, for
# tests), builds into a fresh directory and renames it into place, so a run never sees a half
# built root. Exit 0 and print the rootfs path when it is ready.
set -eu

PREFIX=${PODMAN_ROOTFS_PREFIX:-/opt/sandbox-attest/podman}
ROOTFS="$PREFIX/rootfs"
STAMP="$ROOTFS/.sandbox-attest-rootfs"
VERSION=3 # bump when the layout below changes
# Container root in matrix/backends/podman.toml's user namespace (--uidmap 0:2147483647:1).
CONTAINER_ROOT=2147483647

if [ "$(id -u)" != 0 ]; then
  echo "podman-rootfs.sh: run as root (rootful podman reads the rootfs as root)" >&2
  exit 1
fi

want() {
  # What the rootfs is built from: the layout version and the host's loader cache.
  echo "version $VERSION"
  if [ -f /etc/ld.so.cache ]; then sha256sum </etc/ld.so.cache; fi
  for root in /bin /sbin /lib /lib32 /lib64 /libx32; do
    if [ -L "$root" ]; then echo "link $root $(readlink "$root")"; fi
  done
}

# What the spec's `--cgroups=split` leaves on a hybrid cgroup host (v1 controllers plus a
# unified hierarchy, as here): podman makes the container's v1 groups at the path of the
# caller's unified group, `<run group>/<cell>/libpod-payload-<id>` and `.../runtime`, in every
# v1 hierarchy (pids, memory, cpu...). It removes its own leaves at exit; the empty parents,
# named after the harness's run group (sandbox_attest/host/disguise.py RUN_CGROUP_PREFIX),
# stay. The harness removes its run group in the unified hierarchy only, so this removes a
# v1 tree whose run group is gone from the unified one (that run is over) and that is empty:
# rmdir refuses a group that still has a process or a child, so nothing alive is touched.
sweep_v1_leftovers() {
  unified=/sys/fs/cgroup/unified
  [ -d "$unified" ] || return 0
  for top in /sys/fs/cgroup/*/kiln-worker-*; do
    [ -d "$top" ] || continue
    case "$top" in "$unified"/*) continue ;; esac
    [ -e "$unified/${top##*/}" ] && continue
    find "$top" -depth -type d -delete 2>/dev/null || true
  done
}
sweep_v1_leftovers

if [ -f "$STAMP" ] && [ "$(want)" = "$(cat "$STAMP")" ]; then
  echo "$ROOTFS"
  exit 0
fi

mkdir -p "$PREFIX"
chmod 0755 "$PREFIX"
NEW=$(mktemp -d "$PREFIX/.rootfs.XXXXXX")
trap 'rm -rf "$NEW"' EXIT
chmod 0755 "$NEW"
cd "$NEW"
# Empty mount points and scratch directories, as the docker skeleton (SKELETON_DIRS).
for d in dev etc proc sys tmp usr run home var; do mkdir "$d"; done
# Merged /usr (Debian 12): /bin, /lib... are symlinks into /usr, recreated as they are here. A
# host where one is a real directory is not merged; the spec mounts only /usr, so refuse.
for root in /bin /sbin /lib /lib32 /lib64 /libx32; do
  if [ -L "$root" ]; then
    ln -s "$(readlink "$root")" ".$root"
  elif [ -d "$root" ]; then
    echo "podman-rootfs.sh: $root is a real directory (not merged /usr); the podman spec mounts only /usr" >&2
    exit 1
  fi
done
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >etc/passwd
printf 'root:x:0:\nnogroup:x:65534:\n' >etc/group
printf 'passwd: files\ngroup: files\nhosts: files\n' >etc/nsswitch.conf
# Without the loader cache the dynamic loader does not search the multiarch directories
# (/usr/lib/x86_64-linux-gnu) and no interpreter starts.
if [ -f /etc/ld.so.cache ]; then cp /etc/ld.so.cache etc/ld.so.cache; fi
# Mount points podman binds its own files onto; made here so that no run writes into the root.
: >etc/hosts
: >etc/hostname
: >etc/resolv.conf
: >run/.containerenv
# Where the spec binds the proxy socket and the shim ([run] proxy_socket_inside, shim_inside).
mkdir run/kiln
chmod 0644 etc/*
want >"$NEW/.sandbox-attest-rootfs"
# Nothing in it is writable by anyone but its owner: /tmp is read-only inside (the spec's
# --read-only-tmpfs=false), so unlike the docker skeleton's it is not 1777, and no local user
# can plant files in the containers' /tmp through the host's view of the rootfs.
chmod -R go-w "$NEW"
# The skeleton belongs to the container's root, as podman's own storage does for a container
# in a user namespace: runc, as that root inside the namespace, makes the mount points of the
# binds (the workspace, the harness's inputs) in the overlay over it. Host root is not mapped
# in the namespace, so a root-owned skeleton would refuse those mkdirs. --read-only makes the
# whole root read-only once the mounts are made.
chown -R "$CONTAINER_ROOT:$CONTAINER_ROOT" "$NEW"
cd /
rm -rf "$ROOTFS.old"
if [ -e "$ROOTFS" ]; then mv "$ROOTFS" "$ROOTFS.old"; fi
mv "$NEW" "$ROOTFS"
trap - EXIT
rm -rf "$ROOTFS.old"
echo "$ROOTFS"
