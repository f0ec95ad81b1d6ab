"""bubblewrap: Linux namespaces around the payload, egress only through the proxy's socket.

Everything about bwrap lives here: the availability check (with the fix when it fails), the
argv, and the deliberate weakenings the tests use to prove the probes catch a broken sandbox.

The mount plan is minimal on purpose. `--ro-bind / /` would expose every host unix socket
(docker.sock among them) and every host file the probes are meant to miss, so only the
system roots, a few /etc files, the interpreter (by its lexical and its resolved path) and the
paths the request names are visible; the workspace is the only writable bind; /tmp is a fresh
tmpfs; the network namespace is empty and the proxy's unix socket is the one way out.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from sandbox_attest.backends.base import (
    NAMESPACED_INSIDE_PATHS,
    SANDBOX_PROXY_SOCKET,
    SANDBOX_RUN_DIR,
    SANDBOX_SHIM,
    SHIM_PORT,
    Availability,
    DeclaredClaims,
    EgressMode,
    EgressRoute,
    Identity,
    InsidePaths,
    ProbeRequest,
    ProbeRun,
    payload_runs_as,
    program_facts,
    shim_path,
)
from sandbox_attest.backends.none import platform_string
from sandbox_attest.backends.process import run_process
from sandbox_attest.backends.seccomp import build_filter, denied_names
from sandbox_attest.errors import BackendUnavailable
from sandbox_attest.host import disguise
from sandbox_attest.world.info import WorldInfo

# The rlimits every sandboxed process inherits (applied with prlimit around bwrap, which has no
# rlimit flag of its own). Sized so the probes' own work fits: no payload writes a file over a
# few MiB or holds more than a few dozen descriptors.
LIMITS: Final = (("fsize_mib", 16), ("nofile", 256))
# Every claim spelled out: a private network namespace whose only route is the shim, a view
# built from granted binds (reads and writes: the workspace), the seccomp filter of
# sandbox_attest/backends/seccomp.py, and the payload user (never root) inside a user namespace.
CLAIMS = DeclaredClaims(
    network="proxy",
    filesystem="workspace",
    ipc="isolated",
    limits=LIMITS,
    reads="workspace",
    writes="workspace",
    environment="scrubbed",
    syscalls="filtered",
    network_cut="namespace",
    runs_as="non-root",
)


# Top-level directories that are symlinks into /usr on merged-/usr systems (Debian 12) and real
# directories elsewhere; bound read-only either way.
SYSTEM_ROOTS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The few /etc files a Python payload and pip need: the loader cache, user/group names, time.
# resolv.conf is left out on purpose: with no resolver configured, glibc tries 127.0.0.1:53
# inside the empty namespace, which cannot leak anywhere.
ETC_FILES: Final = (
    "/etc/ld.so.cache",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/alternatives",
)

# Deliberate holes, used only by tests to show that the matching probes FAIL.
WEAKENINGS: Final = frozenset(
    {
        "share-net",  # no --unshare-net: the host's network and its abstract sockets
        "share-ipc",  # no --unshare-ipc
        "share-pid",  # no --unshare-pid: /proc shows (and signals reach) host processes
        "host-root-rw",  # the host's / bound writable instead of the read-only system roots
        "no-die-with-parent",  # the sandbox may outlive the harness
        "pass-env",  # the harness's whole environment passed in, not the declared one
        "keep-caps",  # uid 0 inside with --cap-add ALL: namespaced capabilities for the payload
        "no-seccomp",  # no syscall filter: io_uring, keyrings, bpf, TIOCSTI, vsock reach the kernel
        "allow-userns",  # no --disable-userns: nested user namespaces (and their mounts) allowed
        "no-limits",  # the rlimits are still declared but not applied
    }
)


# Where the "host-root-rw" weakening shows the egress route: inside the sandbox's private /tmp.
# With the host's / bound at /, every other mount point bwrap would need for the route (its
# usual SANDBOX_RUN_DIR included) is a directory on the host, which bwrap must create through
# the writable bind as the payload user: refused in the host's /run ("Can't mkdir
# /run/<SANDBOX_RUN_DIR>: Permission denied"), and a leftover on the host where it succeeds. A
# host that already had the directory made the weakening work, so the tests' verdicts rested
# on what an earlier run left behind. The private /tmp is a tmpfs bwrap itself made, so the
# mount points are always creatable and vanish with the sandbox, and the rest of the host's
# root (its /run with every daemon socket) stays in view, as the weakening promises.
HOST_ROOT_RUN_DIR: Final = f"/tmp/{disguise.STEM}"  # noqa: S108  (the sandbox's own tmpfs)
# The same names as in SANDBOX_RUN_DIR, in this directory.
HOST_ROOT_INSIDE_PATHS: Final = InsidePaths(
    SANDBOX_PROXY_SOCKET.replace(SANDBOX_RUN_DIR, HOST_ROOT_RUN_DIR, 1),
    SANDBOX_SHIM.replace(SANDBOX_RUN_DIR, HOST_ROOT_RUN_DIR, 1),
)


INSTALL_FIX: Final = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
USERNS_FIX: Final = (
    "allow unprivileged user namespaces: sysctl -w kernel.unprivileged_userns_clone=1 "
    "(Debian), sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 24.04+), "
    "and make sure user.max_user_namespaces is not 0"
)


@contextlib.contextmanager
def _program_pipe(program: bytes) -> Iterator[int]:
    """A pipe whose read end holds `program`, for `bwrap --seccomp FD`.

    The program is a few hundred bytes, far below a pipe's buffer, so writing it whole before
    bwrap starts cannot block.
    """
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)
        os.close(write_fd)
        write_fd = -1
        yield read_fd
    finally:
        if write_fd != -1:
            os.close(write_fd)
        os.close(read_fd)


def system_root_args() -> list[str]:
    """Read-only binds for /usr and the top-level system roots, mirroring the host layout."""
    args = ["--ro-bind", "/usr", "/usr"]
    for root in SYSTEM_ROOTS:
        path = Path(root)
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), root]
        elif path.is_dir():
            args += ["--ro-bind", root, root]
    for etc in ETC_FILES:
        args += ["--ro-bind-try", etc, etc]
    return args


class BubblewrapBackend:
    """Runs each payload in fresh user/pid/net/ipc/uts(/cgroup) namespaces with bwrap."""

    name = "bubblewrap"

    def __init__(self, bwrap: str = "bwrap", weaken: frozenset[str] = frozenset()) -> None:
        """Create the backend.

        Args:
            bwrap: the executable to use, found on PATH unless absolute.
            weaken: deliberate holes from WEAKENINGS (tests only); recorded in the identity.

        Raises:
            ValueError: for a weakening this backend does not know.
        """
        unknown = set(weaken) - WEAKENINGS
        if unknown:
            raise ValueError(
                f"unknown bubblewrap weakening(s) {sorted(unknown)}; "
                f"choose from {sorted(WEAKENINGS)}"
            )
        self.bwrap = bwrap
        self.weaken = frozenset(weaken)
        # A sandbox sharing the host's network would put the shim on the host's loopback, where
        # parallel cells collide on its port; it reaches the proxy's TCP port like the control
        # leg does instead (which is what such a sandbox really offers).
        self.egress_mode: EgressMode = "direct-tcp" if "share-net" in self.weaken else "shim"

    def inside_paths(self, world: WorldInfo, cell_dir: Path) -> InsidePaths:
        """Where this backend shows the payload the route: SANDBOX_RUN_DIR, in every cell.

        The mounts put the proxy socket and the shim there whatever this run's scratch is,
        so `ipc_proxy_socket_tamper` attacks these paths
        (sandbox_attest.backends.base.inside_paths_of). The "host-root-rw" weakening puts
        them in the private /tmp instead (HOST_ROOT_RUN_DIR says why).
        """
        del world, cell_dir
        return self._route_paths()

    def _route_paths(self) -> InsidePaths:
        """The inside paths of the proxy socket and shim for this configuration."""
        return HOST_ROOT_INSIDE_PATHS if "host-root-rw" in self.weaken else NAMESPACED_INSIDE_PATHS

    # -- availability ------------------------------------------------------------------

    def availability(self) -> Availability:
        """Find bwrap, check it can create namespaces here, and say who it is."""
        exe = shutil.which(self.bwrap)
        if exe is None:
            return Availability(
                ok=False, reason=f"bwrap not found on PATH; {INSTALL_FIX}", identity=None
            )
        if self.limit_args() and shutil.which("prlimit") is None:
            return Availability(
                ok=False,
                reason="prlimit not found on PATH (it applies the declared rlimits); "
                "install util-linux",
                identity=None,
            )
        try:
            build_filter()
        except BackendUnavailable as exc:
            return Availability(ok=False, reason=exc.diagnostics(), identity=None)
        try:
            version = subprocess.run(
                [exe, "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
            true_exe = shutil.which("true") or "/usr/bin/true"
            trial = subprocess.run(
                [
                    exe,
                    "--unshare-all",
                    "--unshare-user",
                    "--die-with-parent",
                    *([] if "allow-userns" in self.weaken else ["--disable-userns"]),
                    *system_root_args(),
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    true_exe,
                ],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Availability(
                ok=False, reason=f"bwrap could not be run ({exc}); {INSTALL_FIX}", identity=None
            )
        if trial.returncode != 0:
            said = trial.stderr.strip() or f"exit {trial.returncode}"
            return Availability(
                ok=False,
                reason=f"bubblewrap could not create its namespaces (bwrap said: {said!r}); "
                f"{USERNS_FIX}",
                identity=None,
            )
        identity = Identity(
            name=self.name + ("+weakened" if self.weaken else ""),
            version=version or "unknown",
            platform=platform_string(),
            claims=CLAIMS,
            profile={
                "argv_template": self.argv_template(),
                "weakened": sorted(self.weaken),
                "egress": self.egress_mode,
                "seccomp_denies": [] if "no-seccomp" in self.weaken else denied_names(),
            },
            executables=program_facts(self.bwrap, "prlimit"),
            runs_as=payload_runs_as(),
        )
        return Availability(ok=True, reason="", identity=identity)

    # -- argv --------------------------------------------------------------------------

    def namespace_args(self) -> list[str]:
        """The namespace and lifetime flags, minus any deliberate weakening."""
        args = []
        if "no-die-with-parent" not in self.weaken:
            args.append("--die-with-parent")
        args += [
            "--new-session",
            "--unshare-user",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            disguise.HOSTNAME,
        ]
        if "keep-caps" not in self.weaken:
            args += ["--cap-drop", "ALL"]
        else:
            # Root of its user namespace with every capability there: what a sandbox that
            # "keeps capabilities" hands an unprivileged caller (bwrap drops them for a
            # non-root caller unless asked to be uid 0 inside and add them).
            args += ["--uid", "0", "--gid", "0", "--cap-add", "ALL"]
        if "allow-userns" not in self.weaken:
            args.append("--disable-userns")
        if "share-pid" not in self.weaken:
            args.append("--unshare-pid")
        if "share-net" not in self.weaken:
            args.append("--unshare-net")
        if "share-ipc" not in self.weaken:
            args.append("--unshare-ipc")
        return args

    def mount_args(self) -> list[str]:
        """System roots read-only, or (weakened) the whole host root writable."""
        if "host-root-rw" in self.weaken:
            # Nothing else: the route goes in the private /tmp (HOST_ROOT_RUN_DIR says why).
            return ["--bind", "/", "/"]
        return system_root_args()

    def limit_args(self) -> list[str]:
        """The prlimit prefix that applies the declared rlimits (absent when weakened)."""
        if "no-limits" in self.weaken:
            return []
        limits = dict(LIMITS)
        return [
            "prlimit",
            f"--fsize={limits['fsize_mib'] * 1024 * 1024}",
            f"--nofile={limits['nofile']}",
            "--",
        ]

    def build_argv(self, request: ProbeRequest, seccomp_fd: int | str | None = None) -> list[str]:
        """The exact host command line for one request (deterministic for its inputs).

        Args:
            request: the probe to run.
            seccomp_fd: the descriptor bwrap reads the filter program from (see `run`);
                None leaves the filter out (only the "no-seccomp" weakening does).
        """
        argv = [*self.limit_args(), self.bwrap, *self.namespace_args()]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        argv += self.mount_args()
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108
        for path in request.read_only:
            argv += ["--ro-bind", str(path), str(path)]
        argv += ["--bind", str(request.workspace), str(request.workspace)]
        payload = list(request.argv)
        if request.egress is not None and self.egress_mode == "shim":
            route = self._route_paths()
            argv += [
                "--ro-bind",
                str(request.egress.unix_socket),
                route.proxy_socket,
                "--ro-bind",
                str(shim_path()),
                route.shim,
            ]
            # The shim binds its port before it starts the payload, so the payload never races
            # it; it runs under the payload's own interpreter (already bound above).
            payload = [
                payload[0],
                route.shim,
                "--unix",
                route.proxy_socket,
                "--port",
                str(SHIM_PORT),
                "--",
                *payload,
            ]
        # The sandbox's own root is a tmpfs bwrap built; make it read-only too, so that only the
        # workspace and the private /tmp take writes.
        if "host-root-rw" not in self.weaken:
            argv += ["--remount-ro", "/"]
        argv += ["--chdir", str(request.workspace), "--", *payload]
        return argv

    def argv_template(self) -> list[str]:
        """The argv with per-cell paths replaced by names: what the identity digest covers."""
        placeholder = ProbeRequest(
            cell_id="{cell}",
            argv=("{python}", "{payload...}"),
            env={},
            workspace=Path("{workspace}"),
            read_only=(Path("{read_only...}"),),
            egress=EgressRoute(unix_socket=Path("{proxy_socket}"), tcp_url=""),
            timeout=0,
            cell_dir=Path("{cell_dir}"),
        )
        shim = str(shim_path())  # install location must not change the digest
        fd = None if "no-seccomp" in self.weaken else "{seccomp_fd}"
        return ["{shim}" if arg == shim else arg for arg in self.build_argv(placeholder, fd)]

    # -- run ---------------------------------------------------------------------------

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run the payload under bwrap; a timeout kills bwrap's group (and so the sandbox)."""
        env = dict(request.env)
        if "pass-env" in self.weaken:
            env = {**os.environ, **env}
        with contextlib.ExitStack() as stack:
            pass_fds: list[int] = []
            seccomp_fd = None
            if "no-seccomp" not in self.weaken:
                seccomp_fd = stack.enter_context(_program_pipe(build_filter()))
                pass_fds.append(seccomp_fd)
            argv = self.build_argv(request, seccomp_fd)
            return run_process(
                request.cell_id,
                argv,
                env,
                request.workspace,
                request.timeout,
                pass_fds=tuple(pass_fds),
                user=request.user,
            )
