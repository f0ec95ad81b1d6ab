"""What the host's mapping of the payload's mounts adds to an fs verdict (issue 26).

`fs_write_outside` and `fs_read_secrets` take a reading of the payload's mounts at the
rendezvous (sandbox_attest/catalog/fs/exposure.py). Here that reading is read into the
verdict:

- a canary the host saw escape (changed on the host, or its bytes read) through a mount of
  its place at another path is named with that inside path, the host directory and the fix;
- while the escape is not yet seen, the cell cannot PASS where the host could not map a mount
  that could hold what the probe guards (a device it cannot see), where it added inside
  paths to the task that the payload's report never tried, or where a writable host directory
  outside the claims, which the payload user may write, is in the view with no canary tried
  in it: the refusal there would rest on the payload's word alone.
"""

from __future__ import annotations

from typing import Any

from sandbox_attest.catalog.added_targets import untried
from sandbox_attest.catalog.fs.exposure import (
    base_key,
    fix_phrase,
    mount_point_of,
    summary,
)
from sandbox_attest.verdict import Escape


def _host_of(mounts: dict[str, Any], point: str) -> str:
    for entry in mounts.get("mounts") or []:
        if entry.get("inside") == point and entry.get("host"):
            return str(entry["host"])
    return "?"


def _writable(mounts: dict[str, Any], point: str) -> bool:
    return any(bool(e.get("rw")) for e in mounts.get("mounts") or [] if e.get("inside") == point)


def exposure_reasons(
    mounts: dict[str, Any], escaped: list[str], places: dict[str, str], verb: str
) -> list[str]:
    """For each escaped canary seen at an inside path: the mount, the host dir and the fix."""
    added: dict[str, str] = dict(mounts.get("added") or {})
    reasons: list[str] = []
    fixes: list[str] = []
    for key in sorted(added):
        if base_key(key) not in escaped:
            continue
        point = mount_point_of(key)
        host = _host_of(mounts, point)
        rw = _writable(mounts, point)
        reasons.append(
            f"the sandbox mounts the host's {host} at {point}"
            + (" (writable)" if rw else "")
            + f": the canary {base_key(key)} ({places.get(base_key(key), '?')}) is at "
            f"{added[key]} in the payload's view, where the payload {verb} it"
        )
        fix = fix_phrase(host, point, writable=rw)
        if fix not in fixes:
            fixes.append(fix)
    named = {base_key(key) for key in added}
    for key in sorted(set(escaped) - named):
        # A canary the payload found at an inside path it tries by itself (`/host/...`), so
        # the host added nothing for it: the mount map still names where the host dir is.
        for entry in _elsewhere(mounts, places.get(key, "")):
            point, host, rw = str(entry["inside"]), str(entry["host"]), bool(entry.get("rw"))
            reasons.append(
                f"the sandbox mounts the host's {host} at {point}"
                + (" (writable)" if rw else "")
                + f": the canary {key} ({places[key]}) is in the payload's view there"
            )
            fix = fix_phrase(host, point, writable=rw)
            if fix not in fixes:
                fixes.append(fix)
    return reasons + fixes


def _elsewhere(mounts: dict[str, Any], place: str) -> list[dict[str, Any]]:
    """The host's mounts shown at another inside path whose host dir holds `place`."""
    if not place.startswith("/"):
        return []
    found = []
    for entry in mounts.get("mounts") or []:
        host, inside = str(entry.get("host") or ""), str(entry.get("inside") or "")
        if entry.get("kind") != "host" or not host or inside == host:
            continue
        if (place == host or place.startswith(host.rstrip("/") + "/")) and entry not in found:
            found.append(entry)
    # The deepest host dir names the mount that shows the canary (/dev/shm, not /dev).
    deepest = max((len(str(e["host"])) for e in found), default=0)
    return [e for e in found if len(str(e["host"])) == deepest][:1]


def mount_judgement(
    escape: Escape,
    mounts: dict[str, Any],
    report: dict[str, Any],
    reasons: list[str],
    *,
    judged: bool,
    changed: list[str],
    places: dict[str, str],
    verb: str = "wrote",
) -> Escape:
    """`escape`, with the mount reading's reasons added; "undecided" where it cannot pass.

    Args:
        escape: the probe's escape decision so far.
        mounts: the probe's own rendezvous reading (`ctx.host_view[probe id]`), {} if none.
        report: the payload's report.
        reasons: the verdict's reasons, extended here.
        judged: whether the claims deny what the probe tries (False on the control leg).
        changed: the canary keys the host saw escape.
        places: each canary key's host place, for naming.
        verb: what the payload did to an escaped canary ("wrote", "read").
    """
    if not mounts:
        return escape
    if mounts.get("seen") is False:  # the spec's reading itself failed (hostview's record)
        reasons.append(f"the host's mapping of the payload's mounts failed: {mounts.get('why')}")
        return "undecided" if judged and escape != "escaped" else escape
    reasons.extend(exposure_reasons(mounts, changed, places, verb))
    added: dict[str, str] = dict(mounts.get("added") or {})
    if added:
        reasons.append(
            "the host found canaries at other paths in the payload's view, by (device, "
            "inode), and had the payload try them too: "
            + ", ".join(f"{k} at {v}" for k, v in sorted(added.items()))
        )
    reasons.append(summary(mounts))
    if not judged or escape == "escaped":
        return escape
    blockers = []
    if mounts.get("add_failed"):
        blockers.append(str(mounts["add_failed"]))
    missing = untried(added, report)
    if missing:
        blockers.append(
            "the payload's report has no attempt at the inside paths the host added to its "
            f"task: {', '.join(missing)}"
        )
    open_dirs = [
        e
        for e in mounts.get("exposed") or []
        if e.get("payload_may_write") and not e.get("canary_tried")
    ]

    if open_dirs:
        blockers.append(
            "the payload's view holds writable host directories outside the claims where no "
            "canary was tried: "
            + "; ".join(f"{e.get('host')} at {e.get('inside')}" for e in open_dirs)
        )
    lost = mounts.get("unmapped") or []
    if lost:
        blockers.append(
            f"the host could not map {len(lost)} mounts of the payload's view to its own "
            "directories: "
            + "; ".join(f"{m.get('inside')} ({m.get('why')})" for m in lost)
            + "; a refusal there rests on the payload's word"
        )
    if not blockers:
        return escape
    reasons.extend(blockers)
    return "undecided"
