"""docker: each payload in a fresh container with no network, a read-only root and no privileges.

The backend speaks to the engine through the `docker` SDK (never the CLI) and confines every
container the same way, all of it recorded in the identity profile so its digest covers it:

- `network_mode="none"`: only `lo` inside, no bridge traffic at all. The only way out is the
  egress proxy's unix socket, mounted read-only and re-exposed on 127.0.0.1:SHIM_PORT by the
  stdlib shim (`sandbox_attest/world/egress/shim.py`, also mounted read-only, never copied), with
  `HTTP_PROXY`/`HTTPS_PROXY` pointing at it.
- read-only root filesystem, `cap_drop=["ALL"]`, `no-new-privileges`, a private IPC
  namespace, a non-root user.
- our seccomp profile (`docker_seccomp`: docker's own denials as a short deny list, plus
  io_uring, keyrings, bpf, TIOCSTI and socket families other than unix/inet/inet6, which
  docker's default lets through), passed to the engine as JSON text.
- limits, declared in the policy so `resource_limits` holds the backend to them: bubblewrap's
  rlimits (fsize, nofile) as docker ulimits, and the pids cgroup limit as "forks".
- the workspace is the only writable mount (and the only writable path at all: no tmpfs).

The user. Inside, the payload runs as an unprivileged uid. When the harness itself runs as a
non-root user it is that uid (it owns the workspace already, and it cannot chown to another
one). When the harness runs as root (CI here), a container running as root would be a weaker
sandbox than the claim, so it runs as the payload user every other sandboxed command runs as
(`sandbox_attest.host.trust`), so a canary that user owns means the same in a container as under
bubblewrap; `SANDBOX_UID` (65532) only where no payload user can be had. The workspace is
chowned to that uid for the run and handed back to its owner afterwards (only entries the
sandbox uid owns, never through a symlink). Read-only inputs must be readable by that uid;
the run's notes say when they are not, and the proxy socket must be connectable by it (0666,
or group-writable: its gid is then added to the container's groups).

Deliberate weakenings (`weaken=`, for the matrix's "does the probe catch a broken sandbox"
tests) are recorded in the identity, which then carries the name `docker+weakened`.

Every container is labelled `sandbox-attest.run=<run id>` and removed after its run (on
timeout too: killed, then removed); the built image carries the run id in its tag (its id is a
content digest shared by runs, see `docker_image`), and `close()` removes that tag and any
container left over.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

from sandbox_attest.backends import docker_seccomp
from sandbox_attest.backends.base import (
    NAMESPACED_INSIDE_PATHS,
    SANDBOX_PROXY_SOCKET,
    SANDBOX_SHIM,
    SHIM_PORT,
    Availability,
    DeclaredPolicy,
    EgressMode,
    Identity,
    InsidePaths,
    ProbeRequest,
    ProbeRun,
    program_facts,
    shim_path,
)
from sandbox_attest.backends.bubblewrap import LIMITS
from sandbox_attest.backends.capture import CappedBuffer
from sandbox_attest.backends.docker_image import (
    DEFAULT_REPOSITORY,
    RUN_LABEL,
    ImageInfo,
    build_hostroot_image,
    describe_image,
    remove_image,
)
from sandbox_attest.backends.none import platform_string
from sandbox_attest.backends.process import Capture, finish_run
from sandbox_attest.errors import BackendError, BackendUnavailable
from sandbox_attest.host import disguise, safefs
from sandbox_attest.host.trust import payload_user
from sandbox_attest.world.info import WorldInfo

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import TracebackType

T = TypeVar("T")

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
DEFAULT_ENGINE_SOCKET: Final = "/var/run/docker.sock"

# The confinement every container gets, verbatim in the identity profile.
CONFINEMENT: Final[dict[str, Any]] = {
    "read_only": True,
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "ipc_mode": "private",
    "privileged": False,
    "hostname": disguise.HOSTNAME,
    # json-file keeps the whole output for `logs()` after exit; the cap bounds the disk a noisy
    # payload can fill (the harness keeps only the first MAX_CAPTURE_BYTES anyway).
    "log_config": {"type": "json-file", "config": {"max-size": "16m", "max-file": "2"}},
}

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

# Only what an installed package's user has: the wheel does not carry scripts/.
ENGINE_FIX: Final = (
    "start a Docker engine (Debian, as root: `apt-get install docker.io`, then "
    "`systemctl start docker` or `dockerd &`; from a clone of the project: "
    "`scripts/docker-engine.sh start`), or point DOCKER_HOST at a running engine"
)
SDK_FIX: Final = "install the docker SDK: pip install 'sandbox-attest[docker]'"
# How long a cell (or the run's cleanup) waits for an engine that stopped answering to answer
# again: a restart (`systemctl restart docker`, scripts/docker-engine.sh stop + start) takes a
# few seconds. Longer than that and the engine is down, not restarting.
ENGINE_RETURN_S: Final = 30.0


class DockerEngineError(BackendError):
    """The Docker engine refused or failed a request (create, start, wait, remove)."""


class DockerImageError(BackendError):
    """The image to run payloads in is missing or could not be built."""


def engine_socket_path() -> str:
    """The host path of the engine's unix socket (DOCKER_HOST when it names one)."""
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return host.removeprefix("unix://")
    return DEFAULT_ENGINE_SOCKET


def _check_engine_socket() -> None:
    """Fail fast, with the fix, when the engine's unix socket does not accept a connection.

    Besides the clearer message, this spares the SDK a connect that fails: it leaks the socket
    of a failed unix connection (closed only by the garbage collector).

    Raises:
        BackendUnavailable: the socket is missing or refuses connections.
    """
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return  # a TCP/SSH engine: the SDK's own connect reports it
    path = engine_socket_path()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(path)
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            raise BackendUnavailable(
                f"no Docker engine answers at unix://{path} ({name}: {exc.strerror}); " + ENGINE_FIX
            ) from exc


def _translate(exc: Exception, doing: str) -> BackendError:
    """One docker SDK (or transport) exception as a harness error that names the fix."""
    import docker.errors  # noqa: PLC0415  (optional extra, imported once the SDK is known)
    import requests  # noqa: PLC0415  (the SDK's transport, installed with it)

    if isinstance(exc, docker.errors.ImageNotFound):
        return DockerImageError(
            f"could not {doing}: {exc.explanation}; nothing is pulled here (no registry), so "
            "build or import the image locally, or omit image= to use the built-in one"
        )
    if isinstance(exc, requests.exceptions.ConnectionError):
        return BackendUnavailable(
            f"could not {doing}: no Docker engine answers at {engine_socket_path()} ({exc}); "
            + ENGINE_FIX
        )
    if isinstance(exc, docker.errors.APIError):
        return DockerEngineError(f"the Docker engine refused to {doing}: {exc.explanation}")
    if isinstance(exc, docker.errors.DockerException):
        if "Error while fetching server API version" in str(exc):
            return BackendUnavailable(f"no Docker engine answers ({exc}); {ENGINE_FIX}")
        return DockerEngineError(f"could not {doing}: {exc}")
    return DockerEngineError(f"could not {doing}: {exc!r}")


def _went_away(name: str, exc: BackendError) -> BackendUnavailable:
    """The error of a cell whose engine went away while its container ran."""
    return BackendUnavailable(
        f"the Docker engine went away while {name} ran (it was restarted or stopped "
        f"mid-run, which kills every container), so this cell was not judged: "
        f"{exc.diagnostics()}; rerun once `docker version` answers"
    )


@contextlib.contextmanager
def _engine(doing: str) -> Iterator[None]:
    """Translate SDK and transport exceptions raised inside the block into harness errors."""
    import docker.errors  # noqa: PLC0415
    import requests  # noqa: PLC0415

    try:
        yield
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise _translate(exc, doing) from exc


@dataclass(frozen=True)
class BindMount:
    """A host path bound into the container."""

    source: str
    target: str
    read_only: bool

    def flag(self) -> str:
        """The `--mount` value the CLI would take for this bind."""
        ro = ",readonly" if self.read_only else ""
        return f"type=bind,source={self.source},target={self.target}{ro}"


@dataclass
class ContainerSpec:
    """Everything one container is created with; rendered for the SDK and for the record."""

    image_id: str
    name: str
    command: list[str]
    user: str
    working_dir: str
    env: dict[str, str]
    mounts: list[BindMount]
    network_mode: str
    pids_limit: int | None  # None: no pids limit (only the "no-limits" weakening)
    labels: dict[str, str]
    group_add: list[str] = field(default_factory=list)
    pid_mode: str | None = None  # None: a private pid namespace (docker's default)
    seccomp: str | None = None  # the profile's JSON text; None: the engine's default profile
    ulimits: tuple[tuple[str, int], ...] = ()
    cap_add: list[str] = field(default_factory=list)  # only the "dac-read-search" weakening

    def security_opt(self) -> list[str]:
        """`no-new-privileges`, and our seccomp profile unless the engine's default is used."""
        opts = list(CONFINEMENT["security_opt"])
        if self.seccomp is not None:
            opts.append(f"seccomp={self.seccomp}")
        return opts

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `client.containers.create`."""
        from docker.types import LogConfig, Mount, Ulimit  # noqa: PLC0415

        log = CONFINEMENT["log_config"]
        kwargs: dict[str, Any] = {
            "image": self.image_id,
            "command": self.command,
            "name": self.name,
            "user": self.user,
            "working_dir": self.working_dir,
            "environment": self.env,
            "mounts": [
                Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in self.mounts
            ],
            "network_mode": self.network_mode,
            "labels": self.labels,
            "read_only": CONFINEMENT["read_only"],
            "cap_drop": CONFINEMENT["cap_drop"],
            "security_opt": self.security_opt(),
            "ipc_mode": CONFINEMENT["ipc_mode"],
            "privileged": CONFINEMENT["privileged"],
            "hostname": CONFINEMENT["hostname"],
            "log_config": LogConfig(type=log["type"], config=log["config"]),
            "stdin_open": False,
            "tty": False,
        }
        if self.pids_limit is not None:
            kwargs["pids_limit"] = self.pids_limit
        if self.ulimits:
            kwargs["ulimits"] = [Ulimit(name=n, soft=v, hard=v) for n, v in self.ulimits]
        if self.group_add:
            kwargs["group_add"] = self.group_add
        if self.pid_mode:
            kwargs["pid_mode"] = self.pid_mode
        if self.cap_add:
            kwargs["cap_add"] = self.cap_add
        return kwargs

    def docker_argv(self) -> list[str]:
        """The equivalent `docker run` command line, recorded as the run's argv."""
        argv = ["docker", "run", "--rm", "--name", self.name, "--network", self.network_mode]
        argv += ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        argv += [f"--cap-add={cap}" for cap in self.cap_add]
        if self.seccomp is not None:
            # The JSON itself is in the identity profile; the argv names it by digest.
            digest = hashlib.sha256(self.seccomp.encode()).hexdigest()
            argv += ["--security-opt", f"seccomp=sandbox-attest-seccomp.json#sha256:{digest}"]
        argv += ["--ipc", "private", "--hostname", CONFINEMENT["hostname"]]
        if self.pids_limit is not None:
            argv += ["--pids-limit", str(self.pids_limit)]
        argv += [f"--ulimit={name}={value}:{value}" for name, value in self.ulimits]
        argv += ["--user", self.user]
        argv += [f"--group-add={gid}" for gid in self.group_add]
        if self.pid_mode:
            argv += ["--pid", self.pid_mode]
        for mount in self.mounts:
            argv += ["--mount", mount.flag()]
        argv += ["--workdir", self.working_dir]
        for key, value in sorted(self.env.items()):
            argv += ["--env", f"{key}={value}"]
        for key, value in sorted(self.labels.items()):
            argv += ["--label", f"{key}={value}"]
        return [*argv, self.image_id, *self.command]


@dataclass(frozen=True)
class _Outcome:
    exit_code: int | None
    stdout: Capture
    stderr: Capture
    timed_out: bool
    duration: float


def _read_capped(chunks: Iterator[bytes]) -> Capture:
    """Keep the head of a log stream (where the marker and the JSON line are), up to the cap."""
    buffer = CappedBuffer()
    for chunk in chunks:
        if not buffer.feed(chunk):
            break  # a log stream can be left unread: the container is already gone
    return buffer.capture()


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-")[:48] or "cell"


def _runtime_programs(info: dict[str, Any]) -> list[str]:
    """The default OCI runtime's program, as the engine names it (`runc`, `runsc`...)."""
    runtimes = info.get("Runtimes") or {}
    default = runtimes.get(info.get("DefaultRuntime", "")) or {}
    path = default.get("path") if isinstance(default, dict) else None
    return [path] if isinstance(path, str) and path else []


class DockerBackend:
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

    def _client(self) -> Any:
        """The SDK client, created once; `BackendUnavailable` when the SDK or engine is missing."""
        if self._client_obj is not None:
            return self._client_obj
        try:
            import docker  # noqa: PLC0415  (optional extra)
        except ImportError as exc:
            raise BackendUnavailable(f"the docker SDK is not installed ({exc}); {SDK_FIX}") from exc
        _check_engine_socket()
        client = None
        try:
            with _engine("connect to the Docker engine"):
                client = docker.from_env(timeout=int(self.engine_timeout))
                client.ping()
        except BackendError:
            if client is not None:
                client.close()
            raise
        self._client_obj = client
        return client

    def image(self) -> ImageInfo:
        """The image payloads run in: the named one, or the skeleton built for this run."""
        with self._lock:
            if self._image is None:
                client = self._client()
                if self.image_ref is None:
                    with _engine("build the local skeleton image"):
                        self._image = build_hostroot_image(client, self.run_id, self.uid, self.gid)
                else:
                    with _engine(f"find the local image {self.image_ref!r}"):
                        self._image = describe_image(client, self.image_ref)
            return self._image

    def identity(self) -> Identity:
        """Who runs the payloads: engine version, image identity and every confinement option."""
        client = self._client()
        with _engine("read the engine's version and info"):
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
            policy=self.policy(),
            profile=profile,
            # The engine runs the container with its default runtime (runc, runsc...): that
            # binary is what confines, so it is pinned (resolved on the harness's PATH, where
            # a local engine finds it too); the image id is in the profile.
            executables=program_facts(*_runtime_programs(info)),
            runs_as=f"uid {self.uid}:{self.gid} in the container",
        )

    def policy(self) -> DeclaredPolicy:
        """The claim: proxy-only network, workspace-only writes, isolation, and the limits.

        The limits are declared even under the "no-limits" weakening, which is the point of it.
        """
        limits = (*LIMITS, ("forks", self.pids_limit))
        # --network none (a namespace of its own), a read-only image plus the workspace
        # mount, docker's seccomp profile (sandbox_attest/backends/docker_seccomp.py), a non-root
        # --user.
        return DeclaredPolicy(
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

    def _trial(self) -> _Outcome:
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

    def _await_engine(self, before: str, deadline: float) -> Any:
        """The client, once the engine answers a ping: waits out a restart of the engine.

        A restarted engine refuses the old client's connections, so on failure the client is
        dropped and a new one made each try. Containers the engine's absence kept us from
        removing are removed as soon as it answers.

        Raises:
            BackendUnavailable: it did not answer by `deadline`; the message says the engine
                went away during the run, and the fix.
        """
        while True:
            try:
                client = self._client()
                with _engine("ping the Docker engine"):
                    client.ping()
                break
            except BackendUnavailable as exc:
                self._disconnect()
                if time.monotonic() >= deadline:
                    raise BackendUnavailable(
                        f"the Docker engine stopped answering during the run and did not come "
                        f"back within {ENGINE_RETURN_S:.0f}s, so {before} could not run: "
                        f"{exc.diagnostics()}"
                    ) from exc
                time.sleep(0.5)
        self._remove_unremoved(client)
        return client

    def _through_restart(self, doing: str, step: Callable[[Any], T]) -> T:
        """`step(client)`, retried while the engine restarts (until ENGINE_RETURN_S).

        An engine on its way down can still answer the ping and then drop the request; the
        step is tried again on the engine that comes back.

        Raises:
            BackendUnavailable: the engine did not come back in time.
            DockerEngineError: the engine answered and refused (never retried).
        """
        deadline = time.monotonic() + ENGINE_RETURN_S
        while True:
            client = self._await_engine(doing, deadline)
            try:
                with _engine(doing):
                    return step(client)
            except BackendUnavailable:
                self._disconnect()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def _remove_unremoved(self, client: Any) -> None:
        """Remove the containers an absent engine kept us from removing (best effort)."""
        import docker.errors  # noqa: PLC0415
        import requests  # noqa: PLC0415

        with self._lock:
            names, self._unremoved = sorted(self._unremoved), set()
        for name in names:
            try:
                client.containers.get(name).remove(force=True, v=True)
            except docker.errors.NotFound:
                continue
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                with self._lock:
                    self._unremoved.add(name)

    def _run_container(self, spec: ContainerSpec, timeout: float) -> _Outcome:
        """Create, start, wait (kill at the deadline), read the logs, and always remove.

        An engine that goes away while the container runs (a restart of dockerd kills every
        container) makes the cell ERROR with a reason that says so; the container is removed
        once the engine is back.
        """
        kwargs = spec.create_kwargs()
        container = self._through_restart(
            f"create the container {spec.name}", lambda c: c.containers.create(**kwargs)
        )
        went_away: BackendUnavailable | None = None
        try:
            return self._wait_container(container, spec, timeout)
        except BackendUnavailable as exc:
            went_away = exc
            raise _went_away(spec.name, exc) from exc
        finally:
            try:
                with _engine(f"remove the container {spec.name}"):
                    container.remove(force=True, v=True)
            except BackendUnavailable as exc:
                with self._lock:
                    self._unremoved.add(spec.name)
                if went_away is None:
                    # The payload's exit and logs came back, but the engine is gone now: the
                    # container was most likely killed by the engine's shutdown, not by
                    # itself, so its output is not judged either.
                    raise _went_away(spec.name, exc) from exc

    def _wait_container(self, container: Any, spec: ContainerSpec, timeout: float) -> _Outcome:
        """Start the created container, wait (kill at the deadline) and read its logs."""
        import requests  # noqa: PLC0415  (the SDK's transport: a wait that timed out)

        timed_out = False
        exit_code: int | None = None
        start = time.monotonic()
        with _engine(f"start the container {spec.name}"):
            container.start()
        try:
            result = container.wait(timeout=max(timeout, 0.1))
            exit_code = int(result.get("StatusCode", -1))
        except requests.exceptions.RequestException as exc:
            if time.monotonic() - start < timeout - 0.5:
                # Too early for the read timeout (the SDK reports that one as a connection
                # error too): the engine dropped the connection, as a stopped or restarted
                # dockerd does, taking the container with it. Its output proves nothing.
                raise BackendUnavailable(
                    f"the connection to the Docker engine dropped while waiting for "
                    f"{spec.name} ({exc}); {ENGINE_FIX}"
                ) from exc
            # The read timed out: the payload outlived its deadline. Kill first, then ask
            # the engine what happened, so a payload that exited at the same instant keeps
            # its exit code.
            with _engine(f"kill the container {spec.name}"):
                container.reload()
                if container.status == "running":
                    timed_out = True
                    container.kill()
                result = container.wait(timeout=30)
                if not timed_out:
                    exit_code = int(result.get("StatusCode", -1))
        duration = time.monotonic() - start
        with _engine(f"read the logs of {spec.name}"):
            stdout = _read_capped(container.logs(stdout=True, stderr=False, stream=True))
            stderr = _read_capped(container.logs(stdout=False, stderr=True, stream=True))
        return _Outcome(exit_code, stdout, stderr, timed_out, duration)

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
        # and shared across runs; see docker_image), so images are listed both ways.
        tagged = {"reference": f"{DEFAULT_REPOSITORY}:{self.run_id}"}
        try:
            with _engine("list what this run created"):
                images = client.images.list(filters=label) + client.images.list(filters=tagged)
                return {
                    "containers": _container_names(client, label),
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

    def _disconnect(self) -> None:
        """Close the SDK client's connection pool (its sockets would otherwise leak)."""
        client, self._client_obj = self._client_obj, None
        if client is not None:
            client.close()

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


def _container_names(client: Any, filters: dict[str, str]) -> list[str]:
    """The names of the containers matching `filters`, from one listing call.

    The SDK's `containers.list` inspects each container it lists, and fails whole on one that
    its --rm removed in between; the listing alone cannot.
    """
    return [_row_name(r) for r in client.api.containers(all=True, filters=filters)]


def _row_name(row: dict[str, Any]) -> str:
    """A container's name from its listing row (its id when it has none)."""
    return str((row.get("Names") or [row.get("Id", "?")])[0]).lstrip("/")


def _stale_reason(
    labels: dict[str, str],
    created: float,
    dead_runs: set[str],
    live_runs: set[str],
    stale_age_s: float,
) -> str | None:
    """Why a container with these labels, made at `created` (epoch s), is a leftover, or None."""
    run = str(labels.get(RUN_LABEL, ""))
    if run in live_runs:
        return None
    if run in dead_runs:
        return f"labelled {RUN_LABEL}={run}, a run that is gone"
    age = time.time() - created
    if created <= 0 or age <= stale_age_s:
        return None
    return f"labelled {RUN_LABEL}={run}, claimed by no run, {age / 3600:.0f} h old"


def sweep_stale_containers(
    dead_runs: set[str], live_runs: set[str], stale_age_s: float
) -> list[tuple[str, str, bool]]:
    """Remove containers (and their volumes) labelled by a run that is gone; the next run's job.

    A run removes its containers itself (`close`); a SIGKILLed one cannot. `run.sweep`
    knows which run ids belonged to runs now dead (their journal entry's owner is gone) and
    which to live ones. A container of a live run is never touched; one whose run id no
    journal entry names (a harness that predates the journal, a test's backend) goes only
    when it was created more than `stale_age_s` ago.

    Args:
        dead_runs: run ids (the `sandbox-attest.run` label) of runs that are gone.
        live_runs: run ids of runs still running: never swept.
        stale_age_s: age after which an unclaimed container is taken as left behind.

    Returns:
        `(container name, why, removed)` for each one acted on; `[]` when the SDK or the
        engine is not there (nothing to sweep that this host could have made).
    """
    try:
        import docker  # noqa: PLC0415  (optional extra)
        import docker.errors  # noqa: PLC0415
    except ImportError:
        return []
    try:
        _check_engine_socket()
        client = docker.from_env(timeout=30)
    except (BackendError, docker.errors.DockerException):
        return []
    done: list[tuple[str, str, bool]] = []
    try:
        # One listing call, no inspect per container: the high-level list() inspects each one
        # and fails whole on a container that another run's --rm removed in between.
        for row in client.api.containers(all=True, filters={"label": RUN_LABEL}):
            name = _row_name(row)
            labels = row.get("Labels") or {}
            why = _stale_reason(
                labels, float(row.get("Created") or 0), dead_runs, live_runs, stale_age_s
            )
            if why is None:
                continue
            try:
                client.api.remove_container(row["Id"], force=True, v=True)
            except docker.errors.NotFound:
                done.append((name, f"{why}; already gone", True))
            except docker.errors.DockerException as exc:
                done.append((name, f"{why}; {exc}", False))
            else:
                done.append((name, why, True))
    except docker.errors.DockerException as exc:
        done.append(("(listing)", f"the engine refused to list containers: {exc}", False))
    finally:
        client.close()
    return done


def _tag_reason(
    tag: str, dead_runs: set[str], live_runs: set[str], stale_age_s: float
) -> str | None:
    """Why the per-run image tag `tag` (its run id) is a leftover, or None when it may be live."""
    if tag in live_runs:
        return None
    if tag in dead_runs:
        return f"the image tag of run {tag}, a run that is gone"
    try:
        # The run id starts with its local creation time (DockerBackend.__init__).
        born = time.mktime(time.strptime(tag.split("-", 1)[0], "%Y%m%dt%H%M%S"))
    except ValueError:
        return None
    age = time.time() - born
    if age <= stale_age_s:
        return None
    return f"the image tag of run {tag}, claimed by no run, {age / 3600:.0f} h old"


def sweep_stale_images(
    dead_runs: set[str], live_runs: set[str], stale_age_s: float
) -> list[tuple[str, str, bool]]:
    """Remove the per-run tags (`sandbox-attest/hostroot:<run id>`) that runs now gone left.

    A run untags its image in `close`; a SIGKILLed run (or one whose engine was away at the
    end) cannot, and the tags pile up. The same rules as `sweep_stale_containers`: a dead
    run's tag goes at once, an unclaimed one after `stale_age_s`, a live run's never. Only
    the tag is removed; the image itself stays while another tag or a container uses it.

    Returns:
        `(repo:tag, why, removed)` for each one acted on; `[]` without the SDK or engine.
    """
    try:
        import docker  # noqa: PLC0415  (optional extra)
        import docker.errors  # noqa: PLC0415
    except ImportError:
        return []
    try:
        _check_engine_socket()
        client = docker.from_env(timeout=30)
    except (BackendError, docker.errors.DockerException):
        return []
    done: list[tuple[str, str, bool]] = []
    try:
        for image in client.images.list(name=DEFAULT_REPOSITORY):
            for ref in image.tags:
                repo, _, tag = str(ref).rpartition(":")
                why = _tag_reason(tag, dead_runs, live_runs, stale_age_s)
                if repo != DEFAULT_REPOSITORY or why is None:
                    continue
                try:
                    client.images.remove(str(ref), noprune=False)
                except docker.errors.DockerException as exc:
                    done.append((str(ref), f"{why}; {exc}", False))
                else:
                    done.append((str(ref), why, True))
    except docker.errors.DockerException as exc:
        done.append(("(listing)", f"the engine refused to list images: {exc}", False))
    finally:
        client.close()
    return done


def main() -> int:
    """Print the backend's availability as JSON (a quick check: `python -m ...docker`)."""
    import json  # noqa: PLC0415

    with DockerBackend() as backend:
        avail = backend.availability()
        print(json.dumps({"ok": avail.ok, "reason": avail.reason,
                          "identity": avail.identity.as_dict() if avail.identity else None},
                         indent=2))  # fmt: skip
    return 0 if avail.ok else 1


if __name__ == "__main__":
    sys.exit(main())
