"""`ipc_unix_socket_escape`'s look into the payload's view: the host's sockets wherever they sit.

A sandbox may bind the host's docker socket at `/run/host-docker.sock`, or the agent's whole
session at a path of its own. Looking up the path the payload connected to on the host finds
nothing there, and the cell passed. So at the rendezvous, while the payload waits, the host
walks the payload's root (`sandbox_attest.host.viewwalk`) and matches every socket it finds,
by (st_dev, st_ino), against the host's own (`host_table`): the cell's witness sockets, the
fake daemon, the session's witnesses, the real Docker sockets, every socket in the host's
runtime trees. A match is an exposure at that inside path.

An exposure alone is not the escape: the payload must have reached it. So the host hands the
payload the inside paths it found (`write_hint`, a file in its workspace written before the
payload goes on), and the payload tries each: to the harness's own sockets (witnesses, the
fake daemon) it sends the cell's nonce, and what decides is the host's log of that socket,
never the payload's report. A real daemon's socket has no log of ours: there the payload's
connect counts only where the host found, by identity, that the socket at that inside path
is the host's (the same standard the same-path check always had).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.catalog.spec import DOCKER_SOCKETS
from sandbox_attest.host import disguise
from sandbox_attest.host.safefs import UnsafePathError, open_dir
from sandbox_attest.host.viewwalk import Bounds, HostSocket, Identity, match_sockets, walk_view

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox_attest.catalog.spec import CellContext

# The kinds of host socket whose own log decides (the payload is told to send the nonce).
WITNESSED: Final = frozenset({"witness", "session", "daemon"})
# The walk's bounds at the rendezvous: the payload waits for it (hostview.RENDEZVOUS_S is 5 s).
WALK_BOUNDS: Final = Bounds(depth=12, entries=20000, seconds=0.5)
# How many names a reason lists before "and N more".
NAMES: Final = 3
FIX: Final = "do not bind host sockets (or the directories that hold them) into the sandbox"


def hint_name(nonce: str) -> str:
    """The file in the workspace that tells the payload where the host's sockets sit inside."""
    return f".{disguise.STEM}-map-{nonce}"


def host_table(
    witnesses: Mapping[str, Identity],
    session: Mapping[str, Identity],
    daemon: str,
    host_sockets: Mapping[Identity, str],
    route: tuple[str, ...],
) -> dict[Identity, HostSocket]:
    """The host's own sockets by identity: what a walk of the view is matched against.

    Args:
        witnesses: the cell's path witnesses, host path -> identity.
        session: the login session's witnesses (bus, gpg-agent, ssh-agent...), likewise.
        daemon: the fake daemon's socket path.
        host_sockets: every other socket in the host's runtime trees, identity -> path.
        route: the egress route's sockets: the backend's grant, never an exposure.
    """
    table = {ident: HostSocket(path, "host") for ident, path in host_sockets.items()}
    for path in DOCKER_SOCKETS:
        ident = _socket_identity(path)
        if ident is not None:
            table[ident] = HostSocket(path, "docker")
    ident = _socket_identity(daemon)
    if ident is not None:
        table[ident] = HostSocket(daemon, "daemon")
    table |= {ident: HostSocket(path, "session") for path, ident in session.items()}
    table |= {ident: HostSocket(path, "witness") for path, ident in witnesses.items()}
    for path in route:
        ident = _socket_identity(path)
        if ident is not None:
            table.pop(ident, None)
    return table


def _socket_identity(path: str) -> Identity | None:
    """(st_dev, st_ino) of the socket at `path` (not followed), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


def read_view(
    ctx: CellContext, pid: int, table: Mapping[Identity, HostSocket], hint: str
) -> dict[str, Any]:
    """Walk the payload's view, match the host's sockets, tell the payload where they are.

    Called at the rendezvous (the spec's `at_rendezvous`), before the payload goes on.

    Returns:
        {"walk": the walk's evidence, "exposed": the matches, "hinted": whether the payload
        was told, "why": why not}.
    """
    walk = walk_view(pid, known=[h.path for h in table.values()], bounds=WALK_BOUNDS)
    exposed = match_sockets(walk, table)
    view: dict[str, Any] = {"seen": walk.seen, "walk": walk.as_evidence(), "exposed": exposed}
    if not walk.seen:
        view["why"] = walk.why
        return view
    view["hinted"], why = write_hint(ctx.workspace, hint, exposed)
    if why:
        view["hint_why"] = why
    return view


def write_hint(workspace: Path, name: str, exposed: list[dict[str, Any]]) -> tuple[bool, str]:
    """Write the payload's list of inside paths to try, through safefs (the workspace is its).

    Each entry is [inside path, how]: "witness" (send the nonce line), "daemon" (a
    `GET /_ping` with the nonce) or "touch" (a real daemon: connect and close only).
    """
    how = {"witness": "witness", "session": "witness", "daemon": "daemon"}
    paths = [[e["inside"], how.get(str(e["kind"]), "touch")] for e in exposed]
    try:
        with open_dir(workspace) as place:
            place.create_file(name, json.dumps({"paths": paths}), 0o644)
    except (OSError, UnsafePathError) as exc:
        return False, f"could not write {name} into the workspace: {exc}"
    return True, ""


def exposures(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The host's sockets the walk found in the view (empty where there was no walk)."""
    return list(view.get("exposed") or [])


def inside_paths(view: Mapping[str, Any]) -> dict[str, list[str]]:
    """Host path -> the inside paths it was found at, other than its own path."""
    found: dict[str, list[str]] = {}
    for e in exposures(view):
        if e["inside"] != e["host"]:
            found.setdefault(str(e["host"]), []).append(str(e["inside"]))
    return found


def real_reached(view: Mapping[str, Any], escapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Real daemons' sockets (no log of ours) the payload connected to where the host found them.

    The payload's `view:<inside>` attempt succeeded, and the socket at that inside path is,
    by the host's own walk, the host's (identity, not path); the payload's reported dev/ino,
    where given, must agree.
    """
    by_inside = {e["inside"]: e for e in exposures(view) if e["kind"] not in WITNESSED}
    reached = []
    for attempt in escapes:
        what = str(attempt.get("what", ""))
        if not what.startswith("view:") or attempt.get("outcome") != "succeeded":
            continue
        found = by_inside.get(what.removeprefix("view:"))
        if found is None:
            continue
        said = (attempt.get("dev"), attempt.get("ino"))
        if said != (None, None) and said != (found["dev"], found["ino"]):
            continue
        reached.append(found)
    return reached


def reached_reason(found: Mapping[str, Any], *, open_leg: bool) -> str:
    """The reason for a real host socket the payload connected to, inside path and fix named."""
    inside, host = found["inside"], found["host"]
    where = host if inside == host else f"{host} (at {inside} inside)"
    if open_leg:
        return f"the payload connected to the host's {where}"
    return (
        f"the payload connected to the host's {where}: the host's walk of the view found that "
        f"very socket (inode {found['ino']}) at {inside}; {FIX}"
    )


def daemon_reason(view: Mapping[str, Any], daemon: str) -> str | None:
    """The reason naming where the fake daemon sat inside, if the walk found it elsewhere."""
    moved = inside_paths(view).get(daemon)
    if not moved:
        return None
    return (
        f"the fake daemon's socket {daemon} is in the payload's view at "
        f"{', '.join(moved[:NAMES])} (found by the host's walk, by identity): the sandbox binds "
        f"a host daemon socket at another path; {FIX}"
    )


def walk_summary(view: Mapping[str, Any]) -> str | None:
    """The walk in one phrase for the verdict: what it found, and what it did not cover."""
    walk = view.get("walk")
    if not walk:
        why = view.get("why")
        return f"the host did not walk the payload's view: {why}" if why else None
    if not walk.get("seen"):
        return f"the host did not walk the payload's view: {walk.get('why')}"
    found = exposures(view)
    text = (
        f"host walk of the view: {len(walk.get('sockets') or {})} sockets, {len(found)} of "
        f"them the host's ({walk.get('ms')} ms)"
    )
    gaps = list(walk.get("not_covered") or [])
    return text + (f"; not covered: {'; '.join(gaps)}" if gaps else "")
