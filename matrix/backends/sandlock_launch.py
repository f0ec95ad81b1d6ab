#!/usr/bin/python3 -I
"""Run one command under sandlock 0.9.0 in its strictest documented configuration.

sandlock (PyPI `sandlock`, github.com/multikernel/sandlock) is a Python SDK with no CLI of
its own in the wheel, so `matrix/backends/sandlock.toml` starts this launcher, which builds one
`sandlock.Sandbox` and runs the payload in it with inherited stdio. Every setting below cites
where sandlock documents it: "PyPI README" is the wheel's own description
(sandlock-0.9.0.dist-info/METADATA, the "sandlock Python SDK" page), "reference" is
docs/sandbox-reference.md in its repository, "project README" is its top-level README.md,
and "sandbox.py" the docstrings of `sandlock.Sandbox` in the installed package.

    python3 sandlock_launch.py --settings FILE -- COMMAND...   run COMMAND confined
    python3 sandlock_launch.py --version                       print sandlock's version
    python3 sandlock_launch.py --check                         exit 0 where it can run here

FILE is the per-cell JSON the spec renders: the workspace, the read-only paths the harness
lists (interpreter, probes, task, CA bundle), the proxy's loopback address and the payload's
own variables. The launcher runs as the payload user and adds nothing the payload did not get
from the harness: it is stdlib-only but for sandlock itself.

The interpreter: /opt/sandbox-attest/py (scripts/real-sandboxes.sh) is a venv whose base
Python may sit where the payload user cannot execute it (a root-only pyenv under /root), so
the spec starts Debian's /usr/bin/python3 (the same 3.11 ABI as the wheel's compiled
library) and this file puts the venv's site-packages on sys.path itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# The venv scripts/real-sandboxes.sh installs sandlock==0.9.0 into.
VENV = Path("/opt/sandbox-attest/py")
# The wheel ships libsandlock_ffi.cpython-311-x86_64-linux-gnu.so: only a 3.11 loads it.
ABI = (3, 11)
PINNED = "0.9.0"

# What the payload may read besides the harness's own read-only paths: the system it runs on.
# PyPI README, "Quick start" and "Sandbox" (`fs_readable=["/usr", "/lib", "/lib64", "/bin",
# "/etc", "/proc", "/dev"]`), narrowed: /dev is not listed whole (see DEVICES), nothing of
# /sys, /tmp, /var, /run, /home or /root is. /etc is the system configuration every example
# in sandlock's docs grants (ld.so.cache, the resolver, passwd for the payload's home).
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/bin", "/etc")
# /proc: the payload's own process view. sandlock virtualizes it in its supervisor (project
# README, "Seccomp Supervisor": openat "/proc virtualization", getdents64 "PID filtering");
# Landlock only decides whether it can be read at all. The harness needs /proc/self there
# (README "Host paths a wrapper must expose").
PROC = "/proc"
# Devices by file, not /dev whole: Landlock rules may name single files (reference, `gpu_devices`:
# "Adds Landlock rules for /dev/nvidia* and /dev/dri/*"). The harmless ones read-only, and
# /dev/null also writable (the probes start children with stdio on it).
DEVICES_READ = ("/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICES_WRITE = ("/dev/null",)


def _import_sandlock() -> ModuleType:
    """Import sandlock from the venv, on this interpreter, or exit 125 saying why not."""
    if sys.version_info[:2] != ABI:
        sys.exit(f"sandlock_launch: needs Python {ABI[0]}.{ABI[1]}, got {sys.version.split()[0]}")
    site = VENV / "lib" / f"python{ABI[0]}.{ABI[1]}" / "site-packages"
    sys.path.insert(0, str(site))
    try:
        import sandlock  # type: ignore[import-not-found]  # noqa: PLC0415  (found only once the venv is on sys.path)
    except ImportError as exc:
        sys.exit(
            f"sandlock_launch: cannot import sandlock from {site}: {exc}; run "
            "scripts/real-sandboxes.sh"
        )
    return sandlock  # type: ignore[no-any-return]


def build(sandlock: ModuleType, settings: dict[str, Any]) -> Any:  # sandlock has no type stubs
    """The one `sandlock.Sandbox` every cell runs in, from the cell's settings."""
    workspace = settings["workspace"]
    env = dict(entry.split("=", 1) for entry in settings["payload_env"])
    return sandlock.Sandbox(
        # Filesystem (Landlock). PyPI README, "Filesystem (Landlock)": fs_readable "Paths the
        # sandbox can read", fs_writable "Paths the sandbox can read and write"; anything not
        # listed is neither (Landlock is deny-by-default once a ruleset handles an access).
        # Reads: the system, the harness's read-only paths and the workspace; writes: the
        # workspace alone (and /dev/null).
        fs_readable=[*SYSTEM_READ, PROC, *DEVICES_READ, *settings["read_only"]],
        fs_writable=[workspace, *DEVICES_WRITE],
        cwd=workspace,  # PyPI README: "cwd -- Child working directory"
        # Network. PyPI README, "Network": net_allow "Outbound endpoint rules ... Empty =
        # deny all"; the one rule is the harness proxy's loopback port, TCP only
        # (`tcp://host:port`), an IP literal so no synthetic /etc/hosts is made (project
        # README, "Network Model", "Resolution"). No UDP or ICMP rule, so UDP and ICMP
        # sockets are refused at the seccomp layer ("Protocol gating"). net_allow_bind stays
        # empty: "TCP ports the sandbox may bind (empty = deny all)".
        net_allow=[f"tcp://{settings['proxy_host']}:{settings['proxy_port']}"],
        net_allow_bind=[],
        # Environment. PyPI README, "Environment": clean_env "Start with minimal environment",
        # env "Variables to set/override in the child": only the payload's own variables.
        clean_env=True,
        env=env,
        # sandbox.py, no_coredump: "Disable core dumps and restrict /proc/pid access from
        # other processes. Applied via prctl(PR_SET_DUMPABLE, 0)."
        no_coredump=True,
        # Syscalls. PyPI README, "Syscall filtering (seccomp)": "Sandlock always applies its
        # default syscall blocklist"; extra_allow_syscalls stays empty (sysv_ipc stays denied).
        extra_allow_syscalls=[],
        # Protection opt-out, PyPI README: "By default sandlock enforces every Landlock
        # protection the host kernel supports and refuses to start when a required
        # protection is unavailable": neither allow_degraded nor disable is used, so IPC
        # scoping (abstract unix sockets, signals) is enforced or the run fails.
        allow_degraded=[],
        disable=[],
        # Not set, on purpose: no resource limits (max_memory, max_processes,
        # max_open_files: reference, "[limits]", call open_files "a resource budget, not
        # confinement"); no http_allow (the harness's proxy is the allowlist); no chroot,
        # workdir or COW (writes must land in the workspace the host reads); no uid/gid
        # (a user namespace the payload does not need); no policy_fn or handlers.
        # NO_NEW_PRIVS is set unconditionally (project README, "How It Works", step 3).
    )


def main(argv: list[str]) -> int:
    """Parse `argv` and run, print the version, or check."""
    if argv == ["--version"]:
        sandlock = _import_sandlock()
        print(
            f"sandlock {sandlock.__version__} (Landlock ABI {sandlock.landlock_abi_version()}"
            f", python {sys.version.split()[0]})"
        )
        return 0
    if argv == ["--check"]:
        sandlock = _import_sandlock()
        if sandlock.__version__ != PINNED:
            sys.exit(
                f"sandlock_launch: sandlock {sandlock.__version__} installed, the spec "
                f"documents {PINNED}; run scripts/real-sandboxes.sh"
            )
        # PyPI README, "Platform": min_landlock_abi() is "the minimum Landlock ABI version
        # required by sandlock (currently 6)".
        have, need = sandlock.landlock_abi_version(), sandlock.min_landlock_abi()
        if have < need:
            sys.exit(f"sandlock_launch: kernel Landlock ABI {have} < {need}, which sandlock needs")
        return 0
    if len(argv) < 4 or argv[0] != "--settings" or argv[2] != "--":
        sys.exit("usage: sandlock_launch.py --settings FILE -- COMMAND... | --version | --check")
    sandlock = _import_sandlock()
    settings = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    sandbox = build(sandlock, settings)
    # PyPI README, "sandbox.run_interactive(cmd) -> int": "Run with inherited stdio (no
    # capture). Returns the exit code." The payload's one JSON line goes straight to stdout.
    # sandlock forks the payload into a child and supervises it from this process, which is
    # unconfined by design; the harness exempts this process from judgement only because it
    # is the one it spawned, running this file as pinned (sandbox_attest/host/cellgroup.py).
    # So this launcher must never exec the payload in its own process (no os.exec*, no
    # run_interactive replaced by an exec): the exempt pid would then be the payload's.
    code = sandbox.run_interactive(argv[3:])
    sys.stdout.flush()
    return code if 0 <= code < 256 else 1  # an exit status is one byte


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
