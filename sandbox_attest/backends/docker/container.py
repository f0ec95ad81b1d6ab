"""One container: what it is created with, and running it on an engine that may restart.

`ContainerSpec` is everything a container is created with, rendered for the SDK and, as the
equivalent `docker run` command line, for the record. `ContainerRunner` holds the SDK client
and runs one container from create to remove, waiting out a restart of the engine; the
backend (`sandbox_attest.backends.docker.backend`) is one.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

from sandbox_attest.backends.capture import CappedBuffer
from sandbox_attest.backends.docker.engine import (
    ENGINE_FIX,
    ENGINE_RETURN_S,
    SDK_FIX,
    check_engine_socket,
    engine_errors,
    went_away_error,
)
from sandbox_attest.backends.process import Capture
from sandbox_attest.errors import BackendError, BackendUnavailable
from sandbox_attest.host import disguise

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

T = TypeVar("T")

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
class ContainerOutcome:
    """How one container's run ended, and its capped output."""

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


class ContainerRunner:
    """Runs containers through one SDK client, waiting out a restart of the engine.

    The backend that inherits it sets the attributes below in its `__init__` (their meaning
    is written there).
    """

    engine_timeout: float
    _client_obj: Any
    _lock: threading.Lock
    _unremoved: set[str]

    def _client(self) -> Any:
        """The SDK client, created once; `BackendUnavailable` when the SDK or engine is missing."""
        if self._client_obj is not None:
            return self._client_obj
        try:
            import docker  # noqa: PLC0415  (optional extra)
        except ImportError as exc:
            raise BackendUnavailable(f"the docker SDK is not installed ({exc}); {SDK_FIX}") from exc
        check_engine_socket()
        client = None
        try:
            with engine_errors("connect to the Docker engine"):
                client = docker.from_env(timeout=int(self.engine_timeout))
                client.ping()
        except BackendError:
            if client is not None:
                client.close()
            raise
        self._client_obj = client
        return client

    def _awaitengine_errors(self, before: str, deadline: float) -> Any:
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
                with engine_errors("ping the Docker engine"):
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
            client = self._awaitengine_errors(doing, deadline)
            try:
                with engine_errors(doing):
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

    def _run_container(self, spec: ContainerSpec, timeout: float) -> ContainerOutcome:
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
            raise went_away_error(spec.name, exc) from exc
        finally:
            try:
                with engine_errors(f"remove the container {spec.name}"):
                    container.remove(force=True, v=True)
            except BackendUnavailable as exc:
                with self._lock:
                    self._unremoved.add(spec.name)
                if went_away is None:
                    # The payload's exit and logs came back, but the engine is gone now: the
                    # container was most likely killed by the engine's shutdown, not by
                    # itself, so its output is not judged either.
                    raise went_away_error(spec.name, exc) from exc

    def _wait_container(
        self, container: Any, spec: ContainerSpec, timeout: float
    ) -> ContainerOutcome:
        """Start the created container, wait (kill at the deadline) and read its logs."""
        import requests  # noqa: PLC0415  (the SDK's transport: a wait that timed out)

        timed_out = False
        exit_code: int | None = None
        start = time.monotonic()
        with engine_errors(f"start the container {spec.name}"):
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
            with engine_errors(f"kill the container {spec.name}"):
                container.reload()
                if container.status == "running":
                    timed_out = True
                    container.kill()
                result = container.wait(timeout=30)
                if not timed_out:
                    exit_code = int(result.get("StatusCode", -1))
        duration = time.monotonic() - start
        with engine_errors(f"read the logs of {spec.name}"):
            stdout = _read_capped(container.logs(stdout=True, stderr=False, stream=True))
            stderr = _read_capped(container.logs(stdout=False, stderr=True, stream=True))
        return ContainerOutcome(exit_code, stdout, stderr, timed_out, duration)

    def _disconnect(self) -> None:
        """Close the SDK client's connection pool (its sockets would otherwise leak)."""
        client, self._client_obj = self._client_obj, None
        if client is not None:
            client.close()
