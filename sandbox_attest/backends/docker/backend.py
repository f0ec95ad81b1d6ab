"""The docker backend: each payload in a fresh, confined container (see the package docstring)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self

from sandbox_attest.backends.base import (
    NAMESPACED_INSIDE_PATHS,
    SANDBOX_PROXY_SOCKET,
    SANDBOX_SHIM,
    SHIM_PORT,
    Availability,
    DeclaredClaims,
    EgressMode,
    Identity,
    InsidePaths,
    ProbeRequest,
    ProbeRun,
    program_facts,
    shim_path,
)
from sandbox_attest.backends.bubblewrap import LIMITS
from sandbox_attest.backends.docker import seccomp as docker_seccomp
from sandbox_attest.backends.docker.container import (
    CONFINEMENT,
    BindMount,
    ContainerOutcome,
    ContainerRunner,
    ContainerSpec,
)
from sandbox_attest.backends.docker.engine import (
    DEFAULT_ENGINE_SOCKET,
    DockerEngineError,
    engine_errors,
    engine_socket_path,
)
from sandbox_attest.backends.docker.image import (
    DEFAULT_REPOSITORY,
    RUN_LABEL,
    ImageInfo,
    build_hostroot_image,
    describe_image,
    remove_image,
)
from sandbox_attest.backends.docker.stale import container_names
from sandbox_attest.backends.none import platform_string
from sandbox_attest.backends.process import finish_run
from sandbox_attest.errors import BackendError
from sandbox_attest.host import safefs
from sandbox_attest.host.trust import payload_user
from sandbox_attest.world.info import WorldInfo

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

# The unprivileged uid/gid containers run as when the harness runs as root ("nonroot" in the
# distroless convention; no host account uses it).
SANDBOX_UID: Final = 65532
SANDBOX_GID: Final = 65532
# The pids cgroup limit: tasks (processes and threads) the whole container may hold, shim and
# payload included, so it also caps the payload's children (declared as "forks"). Measured: the
# pip install probe (pip, the shim and their threads) runs under 16; 32 leaves it room.
PIDS_LIMIT: Final = 32
MIB: Final = 1024 * 1024
# The rlimits every process in the container starts with: bubblewrap's, as docker ulimits
# (soft = hard, so the payload cannot raise them). RLIMIT_FSIZE is in bytes.
ULIMITS: Final = (("fsize", dict(LIMITS)["fsize_mib"] * MIB), ("nofile", dict(LIMITS)["nofile"]))
CELL_LABEL: Final = "sandbox-attest.cell"

SHIM_PROXY_URL: Final = f"http://127.0.0.1:{SHIM_PORT}"
# Where the "host-root-rw" weakening mounts the host's /.
HOST_ROOT_TARGET: Final = "/host"

# Deliberate holes, used only by tests to show that the matching probes FAIL.
WEAKENINGS: Final = frozenset(
    {
        "docker-socket",
        "host-network",
        "host-root-rw",
        "host-pid",
        "root-user",  # the container runs as root (uid 0 is the host's root: no userns remap)
        "default-seccomp",  # the engine's profile: io_uring, TIOCSTI, vsock reach the kernel
        "no-limits",  # no ulimits and no pids limit, but the limits are still declared
        "dac-read-search",  # --cap-add DAC_READ_SEARCH: with root-user, open_by_handle_at works
    }
)


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-")[:48] or "cell"


def _runtime_programs(info: dict[str, Any]) -> list[str]:
    """The default OCI runtime's program, as the engine names it (`runc`, `runsc`...)."""
    runtimes = info.get("Runtimes") or {}
    default = runtimes.get(info.get("DefaultRuntime", "")) or {}
    path = default.get("path") if isinstance(default, dict) else None
    return [path] if isinstance(path, str) and path else []


class DockerBackend(ContainerRunner):
    """Runs each payload in a fresh, confined container of a locally built (or named) image."""

    name = "docker"

    def __init__(
        self,
        image: str | None = None,
        *,
        python: str | None = None,
        pids_limit: int = PIDS_LIMIT,
        weaken: frozenset[str] = frozenset(),
        run_id: str | None = None,
        engine_timeout: float = 60.0,
    ) -> None:
        """Create the backend (nothing touches the engine until `availability` or `run`).

        Args:
            image: a local image with Python in it; `None` builds the skeleton image that runs
                the host's interpreter from the host's /usr mounted read-only.
            python: the interpreter inside the image; when given it replaces the payload's
                argv[0] (the host's interpreter path, meaningless in a foreign image).
            pids_limit: the container's pids cgroup limit (declared as the "forks" limit).
            weaken: deliberate holes from WEAKENINGS (tests only); recorded in the identity.
            run_id: labels everything this backend creates; a fresh one when omitted.
            engine_timeout: seconds for one engine API call (not the payload's timeout).

        Raises:
            ValueError: for a weakening this backend does not know.
        """
        unknown = set(weaken) - WEAKENINGS
        if unknown:
            raise ValueError(
                f"unknown docker weakening(s) {sorted(unknown)}; choose from {sorted(WEAKENINGS)}"
            )
        self.image_ref = image
        self.python = python
        self.pids_limit = pids_limit
        self.weaken = frozenset(weaken)
        # With the host's network the shim would bind the host's loopback port (colliding
        # across parallel cells); such a container reaches the proxy's TCP port directly.
        self.egress_mode: EgressMode = "direct-tcp" if "host-network" in self.weaken else "shim"
        self.run_id = run_id or f"{time.strftime('%Y%m%dt%H%M%S')}-{secrets.token_hex(3)}"
        self.engine_timeout = engine_timeout
        self._client_obj: Any = None
        self._image: ImageInfo | None = None
        self._lock = threading.Lock()
        # Containers whose removal failed because the engine was away: removed once it is back
        # (the next cell, or `close`), never left for the next run's sweep when avoidable.
        self._unremoved: set[str] = set()
        if "root-user" in self.weaken:
            self.uid, self.gid = 0, 0
        elif os.geteuid() == 0:
            user = payload_user()
            self.uid, self.gid = (user.uid, user.gid) if user else (SANDBOX_UID, SANDBOX_GID)
        else:
            self.uid, self.gid = os.geteuid(), os.getegid()

    # -- engine and image ----------------------------------------------------------------

    def image(self) -> ImageInfo:
        """The image payloads run in: the named one, or the skeleton built for this run."""
        with self._lock:
            if self._image is None:
                client = self._client()
                if self.image_ref is None:
                    with engine_errors("build the local skeleton image"):
                        self._image = build_hostroot_image(client, self.run_id, self.uid, self.gid)
                else:
                    with engine_errors(f"find the local image {self.image_ref!r}"):
                        self._image = describe_image(client, self.image_ref)
            return self._image

    def identity(self) -> Identity:
        """Who runs the payloads: engine version, image identity and every confinement option."""
        client = self._client()
        with engine_errors("read the engine's version and info"):
            version = client.version()
            info = client.info()
        image = self.image()
        profile: dict[str, Any] = {
            "image": image.as_dict(),
            "user": f"{self.uid}:{self.gid}",
            "network_mode": self._network_mode(),
            "pids_limit": self._pids_limit(),
            "ulimits": dict(self._ulimits()),
            **CONFINEMENT,
            # The whole profile, so the digest covers every rule; None: the engine's default.
            "seccomp": None if "default-seccomp" in self.weaken else docker_seccomp.profile(),
            "seccomp_denies": [] if "default-seccomp" in self.weaken else docker_seccomp.summary(),
            "writable": ["{workspace}"],
            "mounts_template": [m.flag() for m in self._template_mounts(image)],
            "env_added": {"HTTP_PROXY": SHIM_PROXY_URL, "HTTPS_PROXY": SHIM_PROXY_URL},
            "command_template": self._command_template(),
            "python": self.python,
            "weakened": sorted(self.weaken),
            "egress": self.egress_mode,
            "engine": {
                "version": version.get("Version", "unknown"),
                "api_version": version.get("ApiVersion", "unknown"),
                "security_options": list(info.get("SecurityOptions") or []),
                "cgroup_version": info.get("CgroupVersion", ""),
                "default_runtime": info.get("DefaultRuntime", ""),
            },
        }
        return Identity(
            name=self.name + ("+weakened" if self.weaken else ""),
            version=f"engine {version.get('Version', 'unknown')}",
            platform=platform_string(),
            claims=self.claims(),
            profile=profile,
            # The engine runs the container with its default runtime (runc, runsc...): that
            # binary is what confines, so it is pinned (resolved on the harness's PATH, where
            # a local engine finds it too); the image id is in the profile.
            executables=program_facts(*_runtime_programs(info)),
            runs_as=f"uid {self.uid}:{self.gid} in the container",
        )

    def claims(self) -> DeclaredClaims:
        """The claim: proxy-only network, workspace-only writes, isolation, and the limits.

        The limits are declared even under the "no-limits" weakening, which is the point of it.
        """
        limits = (*LIMITS, ("forks", self.pids_limit))
        # --network none (a namespace of its own), a read-only image plus the workspace
        # mount, docker's seccomp profile (sandbox_attest/backends/docker/seccomp.py), a non-root
        # --user.
        return DeclaredClaims(
            network="proxy",
            filesystem="workspace",
            ipc="isolated",
            limits=limits,
            reads="workspace",
            writes="workspace",
            environment="scrubbed",
            syscalls="filtered",
            network_cut="namespace",
            runs_as="non-root",
        )

    def inside_paths(self, world: WorldInfo, cell_dir: Path) -> InsidePaths:
        """Where this backend shows the payload the route: SANDBOX_RUN_DIR, in every cell.

        The mounts put the proxy socket and the shim there whatever this run's scratch is,
        so `ipc_proxy_socket_tamper` attacks these paths
        (sandbox_attest.backends.base.inside_paths_of).
        """
        del world, cell_dir
        return NAMESPACED_INSIDE_PATHS

    def availability(self) -> Availability:
        """Reach the engine, build or find the image, start a trial container, say who it is."""
        try:
            self.image()
            trial = self._trial()
            if trial.exit_code != 0:
                said = trial.stderr.data.decode("utf-8", "replace").strip()
                return Availability(
                    ok=False,
                    reason=f"a trial container exited {trial.exit_code} ({said!r}); the engine "
                    "runs but cannot run this image confined here: check that the image has the "
                    "interpreter (python=) and read the engine's log",
                    identity=None,
                )
            return Availability(ok=True, reason="", identity=self.identity())
        except BackendError as exc:
            self.close()
            return Availability(ok=False, reason=exc.diagnostics(), identity=None)

    def _trial(self) -> ContainerOutcome:
        """Run a no-op under the full confinement, so a kernel/runtime gap shows up here."""
        image = self.image()
        program = [self.python, "-c", "pass"] if self.python else ["/usr/bin/true"]
        spec = ContainerSpec(
            image_id=image.id,
            name=f"sa-{self.run_id}-trial-{secrets.token_hex(3)}",
            command=program,
            user=f"{self.uid}:{self.gid}",
            working_dir="/",
            env={},
            mounts=[BindMount(r, r, read_only=True) for r in image.host_roots],
            network_mode="none",
            pids_limit=self._pids_limit(),
            labels={RUN_LABEL: self.run_id, CELL_LABEL: "trial"},
            seccomp=self._seccomp(),
            ulimits=self._ulimits(),
        )
        return self._run_container(spec, timeout=60.0)

    # -- the container -------------------------------------------------------------------

    def _seccomp(self) -> str | None:
        return None if "default-seccomp" in self.weaken else docker_seccomp.profile_json()

    def _ulimits(self) -> tuple[tuple[str, int], ...]:
        return () if "no-limits" in self.weaken else ULIMITS

    def _pids_limit(self) -> int | None:
        return None if "no-limits" in self.weaken else self.pids_limit

    def _network_mode(self) -> str:
        return "host" if "host-network" in self.weaken else "none"

    def _weakened_mounts(self) -> list[BindMount]:
        mounts = []
        if "docker-socket" in self.weaken:
            sock = engine_socket_path()
            mounts.append(BindMount(sock, DEFAULT_ENGINE_SOCKET, read_only=False))
        if "host-root-rw" in self.weaken:
            mounts.append(BindMount("/", HOST_ROOT_TARGET, read_only=False))
        return mounts

    def _template_mounts(self, image: ImageInfo) -> list[BindMount]:
        mounts = [BindMount(r, r, read_only=True) for r in image.host_roots]
        mounts += [
            BindMount("{read_only...}", "{read_only...}", read_only=True),
            BindMount("{workspace}", "{workspace}", read_only=False),
            BindMount("{proxy_socket}", SANDBOX_PROXY_SOCKET, read_only=True),
            BindMount("{shim}", SANDBOX_SHIM, read_only=True),
        ]
        return mounts + self._weakened_mounts()

    def _command_template(self) -> list[str]:
        python = self.python or "{payload[0]}"
        return [python, SANDBOX_SHIM, "--unix", SANDBOX_PROXY_SOCKET, "--port", str(SHIM_PORT),
                "--", python, "{payload[1:]...}"]  # fmt: skip

    def container_spec(self, request: ProbeRequest) -> tuple[ContainerSpec, list[str]]:
        """The container for one request, and notes about inputs the sandbox uid cannot read.

        Raises:
            DockerEngineError: the proxy socket is not connectable by the sandbox uid.
        """
        image = self.image()
        notes: list[str] = []
        payload = list(request.argv)
        if self.python:
            payload[0] = self.python
        mounts = [BindMount(r, r, read_only=True) for r in image.host_roots]
        for path in request.read_only:
            if not path.exists():
                notes.append(f"read-only path {path} does not exist on the host; not mounted")
                continue
            mounts.append(BindMount(str(path), str(path), read_only=True))
            if not self._readable(path):
                notes.append(
                    f"read-only path {path} is not readable by uid {self.uid} inside the "
                    "container; make it world-readable (or owned by that uid)"
                )
        workspace = str(request.workspace)
        mounts.append(BindMount(workspace, workspace, read_only=False))
        env = dict(request.env)
        group_add: list[str] = []
        command = payload
        if request.egress is not None and self.egress_mode == "shim":
            sock = request.egress.unix_socket
            group_add += self._socket_groups(sock)
            mounts.append(BindMount(str(sock), SANDBOX_PROXY_SOCKET, read_only=True))
            mounts.append(BindMount(str(shim_path()), SANDBOX_SHIM, read_only=True))
            # The shim binds its port before it starts the payload, so the payload never races
            # it; it runs under the payload's own interpreter.
            command = [payload[0], SANDBOX_SHIM, "--unix", SANDBOX_PROXY_SOCKET,
                       "--port", str(SHIM_PORT), "--", *payload]  # fmt: skip
            for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[key] = SHIM_PROXY_URL
        mounts += self._weakened_mounts()
        if "docker-socket" in self.weaken:
            group_add += self._socket_groups(Path(engine_socket_path()))
        spec = ContainerSpec(
            image_id=image.id,
            name=f"sa-{self.run_id}-{_slug(request.cell_id)}-{secrets.token_hex(3)}",
            command=command,
            user=f"{self.uid}:{self.gid}",
            working_dir=workspace,
            env=env,
            mounts=mounts,
            network_mode=self._network_mode(),
            pids_limit=self._pids_limit(),
            labels={RUN_LABEL: self.run_id, CELL_LABEL: request.cell_id},
            group_add=sorted(set(group_add)),
            pid_mode="host" if "host-pid" in self.weaken else None,
            cap_add=["DAC_READ_SEARCH"] if "dac-read-search" in self.weaken else [],
            seccomp=self._seccomp(),
            ulimits=self._ulimits(),
        )
        return spec, notes

    def _readable(self, path: Path) -> bool:
        """Whether the sandbox uid can read `path` by its mode bits (the owner or others)."""
        st = path.stat()
        want = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)
        if st.st_uid == self.uid:
            return True
        return st.st_mode & want == want

    def _socket_groups(self, sock: Path) -> list[str]:
        """The supplementary group the sandbox uid needs to connect to `sock` (if any).

        Raises:
            DockerEngineError: no mode bit lets the sandbox uid connect.
        """
        st = sock.stat()
        if st.st_uid == self.uid or st.st_mode & stat.S_IWOTH:
            return []
        if st.st_mode & stat.S_IWGRP:
            return [str(st.st_gid)]
        raise DockerEngineError(
            f"the socket {sock} (mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}) is not "
            f"connectable by the container's uid {self.uid}; make it 0666, or group-writable "
            "(its group is then added to the container)"
        )

    def _prepare_workspace(self, workspace: Path) -> Callable[[], None]:
        """Hand the workspace to the sandbox uid for the run; return how to hand it back."""
        if os.geteuid() != 0:
            return lambda: None
        owner = workspace.stat()
        # Through descriptors (sandbox_attest/host/safefs.py): the workspace is the payload user's,
        # and a path-based walk follows a directory swapped for a symlink mid-walk.
        with safefs.open_dir(workspace) as top:
            safefs.chown_tree(top, (self.uid, self.gid))

        def restore() -> None:
            # Only what the sandbox uid owns, never through a symlink: a payload may plant
            # links to host files in the workspace, and chown must not follow them out.
            with safefs.open_dir(workspace) as top:
                safefs.chown_tree(top, (owner.st_uid, owner.st_gid), only_uid=self.uid)

        return restore

    # -- the protocol ---------------------------------------------------------------------

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run the payload in a fresh container; on timeout kill and remove it.

        Raises:
            BackendUnavailable: the engine stopped answering.
            DockerEngineError: the engine refused to create or start the container.
            DockerImageError: the image is missing or could not be built.
        """
        spec, notes = self.container_spec(request)
        restore = self._prepare_workspace(request.workspace)
        try:
            outcome = self._run_container(spec, request.timeout)
        finally:
            restore()
        run = finish_run(
            request.cell_id,
            spec.docker_argv(),
            outcome.exit_code,
            outcome.stdout,
            outcome.stderr,
            timed_out=outcome.timed_out,
            duration=outcome.duration,
        )
        if outcome.timed_out:
            run.notes = [n for n in run.notes if not n.startswith("timed out")]
            run.notes.append(f"timed out after {outcome.duration:.1f}s; container killed")
        run.notes += notes
        return run

    # -- cleanup --------------------------------------------------------------------------

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, images and volumes still labelled with this run (should be none).

        Usable after `close()`: it then opens a connection of its own and closes it again.
        """
        was_open = self._client_obj is not None
        client = self._client()
        label = {"label": f"{RUN_LABEL}={self.run_id}"}
        # The built image carries the run in its tag, not a label (its id is content-addressed
        # and shared across runs; see docker/image.py), so images are listed both ways.
        tagged = {"reference": f"{DEFAULT_REPOSITORY}:{self.run_id}"}
        try:
            with engine_errors("list what this run created"):
                images = client.images.list(filters=label) + client.images.list(filters=tagged)
                return {
                    "containers": container_names(client, label),
                    "images": sorted({str(i.id) for i in images}),
                    "volumes": [v.name for v in client.volumes.list(filters=label)],
                }
        finally:
            if not was_open:
                self._disconnect()

    def close(self) -> None:
        """Remove every container of this run still there and the image tag built for it.

        An engine restarting right now is waited for (ENGINE_RETURN_S): a run that ends
        while dockerd restarts must still remove what it made.
        """
        if self._client_obj is None and not self._unremoved and self._image is None:
            return
        label = {"label": f"{RUN_LABEL}={self.run_id}"}

        def clean(client: Any) -> None:
            import docker.errors  # noqa: PLC0415  (optional extra, there once a client is)

            for row in client.api.containers(all=True, filters=label):
                # A cell's --rm container may be going away on its own right now.
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(row["Id"], force=True, v=True)
            for volume in client.volumes.list(filters=label):
                volume.remove(force=True)
            with self._lock:
                if self._image is not None:
                    remove_image(client, self._image)
                    self._image = None

        try:
            self._through_restart("clean up this run's containers and image", clean)
        finally:
            self._disconnect()

    def __enter__(self) -> Self:
        """Use the backend as a context manager that cleans up on exit."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Remove what this run created."""
        self.close()
