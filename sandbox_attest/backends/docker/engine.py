"""The docker backend's boundary with the engine: where it is, and its errors in our words.

Docker SDK and transport (`requests`) exceptions become `BackendError` subclasses here, each
naming the fix, so nothing above `sandbox_attest.backends.docker` ever catches a Docker
exception.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from typing import TYPE_CHECKING, Final

from sandbox_attest.errors import BackendError, BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterator

DEFAULT_ENGINE_SOCKET: Final = "/var/run/docker.sock"

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


def check_engine_socket() -> None:
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


def translate_error(exc: Exception, doing: str) -> BackendError:
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


def went_away_error(name: str, exc: BackendError) -> BackendUnavailable:
    """The error of a cell whose engine went away while its container ran."""
    return BackendUnavailable(
        f"the Docker engine went away while {name} ran (it was restarted or stopped "
        f"mid-run, which kills every container), so this cell was not judged: "
        f"{exc.diagnostics()}; rerun once `docker version` answers"
    )


@contextlib.contextmanager
def engine_errors(doing: str) -> Iterator[None]:
    """Translate SDK and transport exceptions raised inside the block into harness errors."""
    import docker.errors  # noqa: PLC0415
    import requests  # noqa: PLC0415

    try:
        yield
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise translate_error(exc, doing) from exc
