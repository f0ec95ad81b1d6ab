"""Where the payload's mounts show the fs probes' canaries, found by identity (issue 26).

A sandbox may mount the payload user's home at `/home/agent`, or the host's `/var/tmp` at
`/host/var-tmp`: a canary tried only at its host path is never found there. At the
rendezvous (`SpecBase.at_rendezvous`, while the payload waits) the host maps the payload's
mounts to its own directories (sandbox_attest/host/mountview.py) and looks for each planted
canary in that view: a mount whose host directory holds the canary gives an inside path,
believed when the object at that inside path, stat'ed through `/proc/<pid>/root`, is the
canary the harness planted (its device and inode). Those inside paths are added to the task
the payload reads after the rendezvous (sandbox_attest/catalog/added_targets.py), each under
`<key>@<mount point>`, so the payload tries them too; the host then judges the canary on the
host object, as before.

The reading also says which mounts expose host directories outside the claims, and which
mounts the host could not map at all (a device it cannot see): a probe does not PASS on the
payload's word for those.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Final

from sandbox_attest.claims import claims_of
from sandbox_attest.host import mountview
from sandbox_attest.host.mountview import Identity, MountMap

# The separator between a canary's key and the inside mount point it is tried under.
AT: Final = "@"


def base_key(key: str) -> str:
    """`var_tmp` for `var_tmp@/host/var-tmp`: the canary an added target stands for."""
    return key.split(AT, 1)[0]


def mount_point_of(key: str) -> str:
    """`/host/var-tmp` for `var_tmp@/host/var-tmp` ("" for a key the host did not add)."""
    return key.split(AT, 1)[1] if AT in key else ""


def shares_mount_namespace(pid: int) -> bool:
    """Whether `pid` sees the harness's own mounts (then every inside path is a host path)."""
    try:
        return Path(f"/proc/{pid}/ns/mnt").readlink() == Path("/proc/self/ns/mnt").readlink()
    except OSError:
        return False


def read_view(pid: int) -> tuple[MountMap | None, dict[str, Any]]:
    """The payload's mounts mapped to the host's, and the evidence of it.

    None for the map where the payload shares the harness's mount namespace: every path it
    sees is the host's own, at the same place, and nothing is to be added.
    """
    started = time.monotonic()
    if shares_mount_namespace(pid):
        return None, {
            "pid": pid,
            "shared_namespace": True,
            "why": "the payload shares the harness's mount namespace: its paths are the host's",
        }
    view = mountview.map_mounts(pid)
    record = view.record()
    record["read_ms"] = round((time.monotonic() - started) * 1000, 2)
    return view, record


def find_targets(
    view: MountMap, canaries: dict[str, tuple[Path, Identity | None]]
) -> dict[str, str]:
    """Each canary's inside paths other than its host path, by identity, as added targets.

    `canaries` maps a key to the canary's host path and the identity the harness kept for it
    (None: the host's object at that path now).
    """
    found: dict[str, str] = {}
    for key, (path, want) in sorted(canaries.items()):
        for inside in view.inside_paths(str(path), want):
            point = view.covering(inside)
            label = point.mount.mount_point if point is not None else inside
            found[f"{key}{AT}{label}"] = inside
    return found


def payload_may_write(path: Path, owner: tuple[int, int] | None) -> bool:
    """Whether the payload user (uid, gid; None: this process's) may write in `path` by mode.

    Its supplementary groups are not counted: a directory writable only through one of them
    is left to the scan's canaries (sandbox_attest/catalog/fs/writable.py).
    """
    uid, gid = owner if owner is not None else (os.getuid(), os.getgid())
    try:
        st = path.stat()
    except OSError:
        return False
    if uid == 0 or st.st_mode & 0o002:
        return True
    return bool(
        (st.st_uid == uid and st.st_mode & 0o200) or (st.st_gid == gid and st.st_mode & 0o020)
    )


def writable_exposures(
    view: MountMap, declared: object, home: Path, workspace: Path, owner: tuple[int, int] | None
) -> list[dict[str, Any]]:
    """The writable mounts of host directories outside the workspace that the writes claim denies.

    Each names the inside path, the host directory, and whether the payload user may write
    there by its mode (`payload_may_write`); a mount of a host file (a device node, a config
    file) is not a directory exposure.
    """
    claims = claims_of(declared)
    out: list[dict[str, Any]] = []
    for entry in view.of_kind("host"):
        host = Path(str(entry.host_path))
        if not entry.mount.writable or not host.is_dir():
            continue
        if host == workspace or workspace in host.parents or not claims.write_denied(host, home):
            continue
        out.append(
            {
                "inside": entry.mount.mount_point,
                "host": str(host),
                "payload_may_write": payload_may_write(host, owner),
            }
        )
    return out


def mark_tried(
    exposed: list[dict[str, Any]], canaries: list[Path], tried_inside: set[str]
) -> list[dict[str, Any]]:
    """`exposed`, each with `canary_tried`: whether a canary in it is tried at its inside path.

    A planted canary dir under the exposed host directory is tried there when its inside path
    is its host path (the payload tries that anyway) or one of `tried_inside` (the paths the
    host added to the task, and those the payload tries by itself).
    """
    inside_added = tried_inside
    for entry in exposed:
        host, point = Path(str(entry["host"])), str(entry["inside"])
        tried = False
        for canary in canaries:
            if canary != host and host not in canary.parents:
                continue
            inside = str(Path(point) / canary.relative_to(host))
            tried = tried or inside == str(canary) or inside in inside_added
        entry["canary_tried"] = tried
    return exposed


def unmapped(view: MountMap, *, writable_only: bool) -> list[dict[str, Any]]:
    """The mounts the host could not map (writable ones only, if asked), as evidence."""
    return [m.record() for m in view.of_kind("unmapped") if m.mount.writable or not writable_only]


def fix_phrase(host_dir: str, inside: str, *, writable: bool) -> str:
    """The fix for a host directory the sandbox mounts at `inside`."""
    how = "writable " if writable else ""
    return (
        f"fix: do not mount the host's {host_dir} into the sandbox (it is {how}at {inside}, "
        f"e.g. bwrap --bind {host_dir} {inside}); leave it out of the view, or mount a private "
        f"tmpfs at {inside} (bwrap --tmpfs, docker --tmpfs)"
    )


def summary(record: dict[str, Any]) -> str:
    """One phrase for the evidence of a reading: mounts examined, mapped, own, unmapped."""
    if record.get("shared_namespace"):
        return str(record.get("why"))
    mounts = record.get("mounts") or []
    kinds: dict[str, int] = {}
    for m in mounts:
        kinds[str(m.get("kind"))] = kinds.get(str(m.get("kind")), 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return f"the host mapped the payload's {len(mounts)} mounts by identity ({parts})"
