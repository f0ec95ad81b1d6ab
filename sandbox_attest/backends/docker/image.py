"""The docker backend's default image, built locally: no registry is reachable, nothing is pulled.

The image is a *skeleton*: an imported tarball with the directory layout, the merged-/usr
symlinks, an `/etc/passwd` naming the unprivileged sandbox user and a copy of the host's loader
cache. It holds no programs. At run time the backend mounts the host's interpreter roots
(`/usr`, plus any of `/bin`, `/lib`... that are real directories on this host) read-only over
it, so the payload runs the host's own interpreter exactly as bubblewrap does, while Docker does
the confining. Why not copy the host's `/usr` in: it is gigabytes here, and a copy would be a
second interpreter to keep in step with the host.

The tarball is deterministic (fixed mtimes, owners, order) and the image is loaded from a
hand-made archive with a fixed creation time, so the image id is a digest of the content and is
the same on every run on the same host layout; it goes into the backend identity. The run is
carried by the image's tag (`sandbox-attest/hostroot:<run id>`), removed when the run ends.

A user can name any local image instead (`DockerBackend(image=...)`); `describe_image` records
its id and repo digests.

Functions here let docker SDK exceptions propagate; the backend translates them into harness
errors at its boundary (`sandbox_attest.backends.docker.engine`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import platform
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

# Top-level directories that are symlinks into /usr on merged-/usr hosts (Debian 12) and real
# directories elsewhere: symlinked in the skeleton in the first case, mounted in the second.
SYSTEM_ROOTS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Empty mount points and scratch directories the skeleton carries.
SKELETON_DIRS: Final = ("dev", "etc", "proc", "sys", "tmp", "usr", "run", "home", "var")
DEFAULT_REPOSITORY: Final = "sandbox-attest/hostroot"
RUN_LABEL: Final = "sandbox-attest.run"
IMAGE_KIND_LABEL: Final = "sandbox-attest.image"
# The host's loader cache: without it the dynamic loader does not search the multiarch
# directories (/usr/lib/x86_64-linux-gnu) and no interpreter starts.
LOADER_CACHE: Final = Path("/etc/ld.so.cache")


@dataclass(frozen=True)
class ImageInfo:
    """A local image the backend runs payloads in.

    Attributes:
        ref: what the user or the builder named it (`repo:tag` or an id).
        id: the engine's image id (`sha256:...`), the identity that matters.
        repo_digests: registry digests, if the image ever came from one (empty when built here).
        content_sha256: sha256 of the skeleton tarball (built images only).
        host_roots: host directories mounted read-only at the same path in every container.
        built_here: this backend built it, so it removes it at the end of the run.
        labels: the image's labels.
    """

    ref: str
    id: str
    repo_digests: tuple[str, ...] = ()
    content_sha256: str = ""
    host_roots: tuple[str, ...] = ()
    built_here: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The image as plain JSON data for the identity profile."""
        return {
            "ref": self.ref,
            "id": self.id,
            "repo_digests": list(self.repo_digests),
            "content_sha256": self.content_sha256,
            "host_roots": list(self.host_roots),
            "built_here": self.built_here,
        }


def host_root_layout() -> tuple[dict[str, str], tuple[str, ...]]:
    """How this host lays out its system roots.

    Returns:
        The symlinks to recreate in the skeleton (`{"/bin": "usr/bin"}`) and the directories to
        mount read-only (always `/usr`, plus every system root that is a real directory).
    """
    links: dict[str, str] = {}
    mounts = ["/usr"]
    for root in SYSTEM_ROOTS:
        path = Path(root)
        if path.is_symlink():
            links[root] = str(path.readlink())
        elif path.is_dir():
            mounts.append(root)
    return links, tuple(mounts)


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def skeleton_tar(uid: int, gid: int, links: dict[str, str]) -> bytes:
    """The skeleton root filesystem as a deterministic tarball.

    Args:
        uid: the unprivileged user the containers run as (named `sandbox` in /etc/passwd).
        gid: its group.
        links: top-level symlinks to recreate (from `host_root_layout`).

    Returns:
        The tar bytes; equal inputs (and an equal host loader cache) give equal bytes.
    """
    buf = io.BytesIO()
    # tarfile's defaults are already mtime 0, uid/gid 0 and empty names for TarInfo objects we
    # build ourselves; USTAR keeps pax headers (which could carry times) out.
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in SKELETON_DIRS:
            _add_dir(tar, name, 0o1777 if name == "tmp" else 0o755)
        for root, target in sorted(links.items()):
            info = tarfile.TarInfo(root.lstrip("/"))
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        passwd = (
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{uid}:{gid}::/tmp:/usr/sbin/nologin\n"
        )
        group = f"root:x:0:\nsandbox:x:{gid}:\n"
        _add_file(tar, "etc/passwd", passwd.encode())
        _add_file(tar, "etc/group", group.encode())
        _add_file(tar, "etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files\n")
        if LOADER_CACHE.is_file():
            _add_file(tar, "etc/ld.so.cache", LOADER_CACHE.read_bytes())
    return buf.getvalue()


def _docker_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def image_archive(layer: bytes, ref: str, labels: dict[str, str]) -> tuple[bytes, str]:
    """A `docker save`-format archive holding one image whose id is a digest of its content.

    `docker import` stamps the import time into the image config, so every build gets a new id
    and the identity digest would change on every run. Loading a hand-made archive instead, with
    a fixed creation time, makes the id a pure function of the layer and the labels: the same
    host layout gives the same image id on every run, and a reviewer can compare it across runs.

    Args:
        layer: the root filesystem tarball (the only layer).
        ref: `repository:tag` to give the loaded image.
        labels: the image config's labels.

    Returns:
        The archive bytes and the image id the engine will report (`sha256:<config digest>`).
    """
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": _docker_arch(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Labels": labels, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "sandbox-attest skeleton"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    layer_name = f"{diff_id.removeprefix('sha256:')}/layer.tar"
    manifest = [{"Config": f"{config_digest}.json", "RepoTags": [ref], "Layers": [layer_name]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _add_dir(tar, diff_id.removeprefix("sha256:"))
        _add_file(tar, layer_name, layer)
        _add_file(tar, f"{config_digest}.json", config_bytes)
        _add_file(tar, "manifest.json", json.dumps(manifest).encode())
    return buf.getvalue(), f"sha256:{config_digest}"


def build_hostroot_image(client: Any, run_id: str, uid: int, gid: int) -> ImageInfo:
    """Load the skeleton image and tag it `sandbox-attest/hostroot:<run_id>`.

    The image id is stable across runs (see `image_archive`), so the run is carried by the tag,
    not by a label: each run adds its own tag and removes only that tag at the end, and the
    engine deletes the image when the last run using it lets go. Concurrent runs (xdist workers)
    therefore never pull the image out from under each other.

    Args:
        client: a `docker.DockerClient`.
        run_id: the run's id, carried by the tag.
        uid: the sandbox user's uid (written into the image's /etc/passwd).
        gid: its gid.

    Returns:
        The built image, with the host roots every container must mount.

    Raises:
        docker.errors.DockerException: the engine refused the load.
    """
    links, mounts = host_root_layout()
    layer = skeleton_tar(uid, gid, links)
    content = "sha256:" + hashlib.sha256(layer).hexdigest()
    ref = f"{DEFAULT_REPOSITORY}:{run_id}"
    labels = {IMAGE_KIND_LABEL: "hostroot", "sandbox-attest.content": content}
    archive, image_id = image_archive(layer, ref, labels)
    client.images.load(archive)
    image = client.images.get(ref)
    if str(image.id) != image_id:
        # The engine computed another id than the content digest: record what it says, since
        # that is what containers will reference, but keep the mismatch visible.
        labels = {**labels, "sandbox-attest.expected-id": image_id}
    return ImageInfo(
        ref=ref,
        id=str(image.id),
        repo_digests=tuple(image.attrs.get("RepoDigests") or ()),
        content_sha256=content,
        host_roots=mounts,
        built_here=True,
        labels={**dict(image.labels or {}), **labels},
    )


def describe_image(client: Any, ref: str) -> ImageInfo:
    """Record a local image the user named (it must contain the interpreter the payload uses).

    Raises:
        docker.errors.ImageNotFound: no such local image (nothing is pulled).
    """
    image = client.images.get(ref)
    return ImageInfo(
        ref=ref,
        id=str(image.id),
        repo_digests=tuple(image.attrs.get("RepoDigests") or ()),
        labels=dict(image.labels or {}),
    )


def remove_image(client: Any, info: ImageInfo) -> None:
    """Remove this run's tag of an image it built; images it was given are never touched.

    Raises:
        docker.errors.DockerException: the engine refused (other than "already gone").
    """
    if not info.built_here:
        return
    import docker.errors  # noqa: PLC0415  (the SDK is an optional extra; imported on use)

    # By tag and without force: only this run's tag goes; the engine deletes the image itself
    # once no other run's tag (or container) holds it.
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(info.ref)
