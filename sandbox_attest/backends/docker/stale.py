"""What runs that are gone left in the engine: their containers and their image tags.

A run removes what it made itself (`DockerBackend.close`); a SIGKILLed one cannot. The next
run's sweep (`sandbox_attest.run.sweep`) knows which run ids belonged to runs now dead and
asks here.
"""

from __future__ import annotations

import time
from typing import Any

from sandbox_attest.backends.docker.engine import check_engine_socket
from sandbox_attest.backends.docker.image import DEFAULT_REPOSITORY, RUN_LABEL
from sandbox_attest.errors import BackendError


def container_names(client: Any, filters: dict[str, str]) -> list[str]:
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
        check_engine_socket()
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
        check_engine_socket()
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
