"""Every name the harness gives a thing that a wrapper or its payload can see (issue 23, part 4).

A wrapper that confines only when it sees it is under test would earn every PASS. So nothing
the payload can list or read (workspace files, cgroup paths, other processes' command lines,
files and sockets in /tmp and /run, HTTP `Server:` headers, the hostname) says "test",
"sandbox-attest", "probe", "canary", "harness" or "witness": each is named as an ordinary
application's cache, lock or socket file would be, under one made-up application stem
(`kiln`). Changing the vocabulary is one edit here; the sweep (sandbox_attest/run/sweep.py) keeps
recognising the names before this module (`LEGACY_*`) for one release, so a run interrupted
under the old names is still cleaned up.

What stays visible is listed in reports/README.md ("What a wrapper can still see"): a fixed
stem is itself a fingerprint to anyone who reads this file, and the payload's own code, its
task and its output say what it tries.

The payload (`probes/`) is stdlib-only and never imports this module: the launcher's two
rendezvous prefixes are repeated in probes/_launch.py and tests/unit/test_disguise.py checks
they agree; every other name reaches a probe through its task.

This module imports nothing of ours, so every layer can.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ABSTRACT_WITNESS_PREFIX",
    "ANCHOR_MARKER",
    "ANCHOR_SECRET_VAR",
    "CANARY_FILE",
    "CANARY_PREFIX",
    "DAEMON_ABSTRACT_PREFIX",
    "DAEMON_SERVER",
    "DIRFD_CANARY_DIR",
    "DNS_NAME_SUFFIX",
    "ENV_CANARY_PREFIX",
    "GO_PREFIX",
    "HANDLE_CANARY_DIR",
    "HOME_CANARY_PREFIX",
    "HOSTNAME",
    "LEGACY_ANCHOR_MARKER",
    "LEGACY_RUN_CGROUP_PREFIX",
    "LEGACY_RUN_DIR",
    "LEGACY_STEM",
    "LINK_PREFIX",
    "NS_CANARY_DIR",
    "ORIGIN_SERVER",
    "ORPHAN_MARKER",
    "PROXY_DENY_HEADER",
    "RACE_CANARY_DIR",
    "READY_PREFIX",
    "RUN_CGROUP_PREFIX",
    "SANDBOX_RUN_DIR",
    "SECRET_PREFIX",
    "STEM",
    "TUNABLES_PREFIX",
    "WITNESS_PREFIX",
    "XPROC_MARKER",
    "go_name",
    "ready_name",
]

# The made-up application every name below belongs to. It must contain no telltale word
# (sandbox_attest.payload.TELLTALE_WORDS) and no probe id; tests/unit/test_disguise.py checks.
STEM: Final = "kiln"

# The rendezvous files in the workspace (sandbox_attest/run/hostview.py, probes/_launch.py): the
# launcher writes `<READY_PREFIX><nonce>` and waits for `<GO_PREFIX><nonce>`.
READY_PREFIX: Final = f".{STEM}-lock-"
GO_PREFIX: Final = f".{STEM}-sync-"

# A run's cgroup (`<prefix><pid>-<tag>`, sandbox_attest/host/cellgroup.py), which every process of a
# cell shows in /proc/self/cgroup; the sweep kills in and removes only directories so named.
RUN_CGROUP_PREFIX: Final = f"{STEM}-worker-"
# proc_kernel_tunables's delegated group inside the run's cgroup (`<prefix><nonce>`).
TUNABLES_PREFIX: Final = f"{STEM}-pool-"

# Command-line words of host processes the payload may see in /proc (each `<marker><nonce>`):
# the proc anchor (catalog/proc.py; the sweep matches it), the cross-process target
# (catalog/crossproc.py), the orphans the payload starts (catalog/lifecycle.py).
ANCHOR_MARKER: Final = f"{STEM}-idle:"
XPROC_MARKER: Final = f"{STEM}-peer:"
ORPHAN_MARKER: Final = f"{STEM}-bg"
# The variable holding the proc anchor's secret, which the payload user may read in its environ.
ANCHOR_SECRET_VAR: Final = f"{STEM.upper()}_IDLE_TOKEN"

# Host-planted files the payload may list: canaries in /tmp and other places outside the
# workspace (catalog/fs.py), in homes (`.<...>`, and in ~/.ssh, ~/.aws, ~/.docker), the
# symlink-target directory (catalog/fs.py), and the canary file's own name inside a directory.
CANARY_PREFIX: Final = f"{STEM}-cache-"
HOME_CANARY_PREFIX: Final = f".{STEM}-cache-"
LINK_PREFIX: Final = f"{STEM}-link-"
CANARY_FILE: Final = "notes.txt"
# Directories a probe's host side makes in the cell dir, beside the workspace, which the payload
# may list: fs_setup_race's canary (catalog/races.py), fs_leaked_dirfd's (catalog/machinery.py),
# fs_open_by_handle's (catalog/handles.py), proc_namespace_escape's (catalog/proc.py).
RACE_CANARY_DIR: Final = f"{STEM}-data"
DIRFD_CANARY_DIR: Final = f"{STEM}-store"
HANDLE_CANARY_DIR: Final = f"{STEM}-files"
NS_CANARY_DIR: Final = f"{STEM}-mnt"
# Planted secrets (catalog/env.py): the variables' names (`<prefix><NONCE>_API_KEY`) and their
# values; the payload reads them if the environment leaks.
ENV_CANARY_PREFIX: Final = f"{STEM.upper()}_CACHE_"
SECRET_PREFIX: Final = f"{STEM}-token-"

# Socket witnesses (catalog/socket_witness.py): a path socket's file name and an abstract name,
# each `<prefix><nonce>` (+ ".sock" for the path one); the fake daemon's abstract name.
WITNESS_PREFIX: Final = f".{STEM}-ipc-"
ABSTRACT_WITNESS_PREFIX: Final = f"{STEM}-ipc-"
DAEMON_ABSTRACT_PREFIX: Final = f"{STEM}-bus-"

# The header in which the egress proxy says why it refused (403/407/...): the payload reads it
# (probes/ and its copies there) and a wrapper relaying to the proxy sees it.
PROXY_DENY_HEADER: Final = "X-Proxy-Deny-Reason"

# `Server:` headers the payload reads from the fixture origins and the fake daemon.
ORIGIN_SERVER: Final = f"{STEM}-web/1"
DAEMON_SERVER: Final = f"{STEM}-api/1"

# The DNS fixture answers every name below this one (`<nonce>.<suffix>`): the payload queries it
# and a wrapper's own resolver or proxy sees it. Under the reserved `.test` zone (RFC 6761),
# which no real resolver answers, so that part stays whatever the name.
DNS_NAME_SUFFIX: Final = f"{STEM}.test"

# Inside namespaced sandboxes (bubblewrap, docker, the shipped bwrap spec): the hostname, and
# the directory the proxy socket and the shim are mounted at.
HOSTNAME: Final = STEM
SANDBOX_RUN_DIR: Final = f"/run/{STEM}"

# The names before this module, for the sweep only: a run interrupted under them is cleaned up
# by the first run after an upgrade. Drop them one release after this one.
LEGACY_STEM: Final = "sandbox-attest"
LEGACY_RUN_CGROUP_PREFIX: Final = f"{LEGACY_STEM}-run-"
LEGACY_ANCHOR_MARKER: Final = f"{LEGACY_STEM}-anchor:"
LEGACY_RUN_DIR: Final = f"/run/{LEGACY_STEM}"


def ready_name(nonce: str) -> str:
    """The file the launcher writes into the workspace when it waits."""
    return f"{READY_PREFIX}{nonce}"


def go_name(nonce: str) -> str:
    """The file the runner writes into the workspace to let the payload go on."""
    return f"{GO_PREFIX}{nonce}"
