"""The payload user's login session, with witness sockets where its daemons keep theirs.

`ipc_unix_socket_escape` asks whether a sandbox exposes the agent's session: the D-Bus session
bus, gpg-agent, rootless docker and podman under `$XDG_RUNTIME_DIR`, and the ssh-agent socket
`SSH_AUTH_SOCK` names (sandbox_attest/host/login_session.py makes those places). A witness
socket listens at each, under the daemon's own name, since a sandbox that forwards one
socket (`--bind $SSH_AUTH_SOCK ...`) exposes exactly that name.

Those names are fixed, so cells running at once share one set: the session is opened by the
first cell that needs it and closed (witnesses removed, directories removed) when the last
one is done (`acquire_session` / `release_session`). A cell's connections are told apart by
what the host knows of the cell, never by time alone: the cell's nonce in the line, or a peer
pid the host read as one of the cell's processes (`heard_by`). The host control's connections
carry its own nonce.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.catalog.controls import host_check
from sandbox_attest.catalog.socket_witness import WitnessSockets
from sandbox_attest.host.login_session import LoginSession, open_session
from sandbox_attest.host.safefs import UnsafePathError

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.host.trust import PayloadUser

# How many sockets a reason names before "and N more".
NAMES: Final = 3
# How long the host control waits for every session witness to log its connection.
HEAR_S: Final = 3.0
FIX: Final = (
    "do not bind $XDG_RUNTIME_DIR (/run/user/<uid>), $SSH_AUTH_SOCK or any socket in them "
    "into the sandbox"
)


@dataclass
class SharedSession:
    """The run's session and its witnesses, and how many cells hold it now."""

    session: LoginSession
    witnesses: WitnessSockets
    users: int = 0

    def what(self, site: str) -> str:
        """Which daemon keeps its socket at `site` ("" if none of the session's)."""
        return {str(p): w for p, w in self.session.sites().items()}.get(site, "")


_lock = threading.Lock()
_shared: SharedSession | None = None


def acquire_session(user: PayloadUser | None) -> tuple[SharedSession | None, str]:
    """The session with its witnesses listening, held for one more cell; or None and why."""
    global _shared  # noqa: PLW0603  (one session per process, shared by concurrent cells)
    if user is None:
        return None, "no payload user: the harness's own login session is not planted in"
    with _lock:
        if _shared is None:
            try:
                session = open_session(user)
            except (OSError, UnsafePathError) as exc:
                return None, f"the payload user's login session could not be made: {exc}"
            sites: list[Path] = list(session.sites())
            witnesses = WitnessSockets(
                f"session-{secrets.token_hex(6)}", [], abstract=False, sites=sites
            )
            witnesses.plant()
            witnesses.start()
            _shared = SharedSession(session, witnesses)
        _shared.users += 1
        return _shared, ""


def release_session(shared: SharedSession) -> list[str]:
    """One cell is done with the session; the last one stops and removes it all.

    Returns:
        What was removed (witness sockets, then directories), empty while others hold it.
    """
    global _shared  # noqa: PLW0603  (see acquire_session)
    with _lock:
        shared.users -= 1
        if shared.users > 0:
            return []
        if _shared is shared:
            _shared = None
    removed = shared.witnesses.stop()
    return removed + shared.session.close()


def heard_by(
    shared: SharedSession, nonce: str, pids: set[int], since: float
) -> list[dict[str, Any]]:
    """The session witnesses' connections that were this cell's payload's.

    A line carrying the cell's nonce, or a peer the host read as one of the cell's processes,
    heard after the cell began.
    """
    return [
        e
        for e in shared.witnesses.records()
        if e["time"] >= since and (nonce in e["line"] or e["peer"]["pid"] in pids)
    ]


def control_check(
    shared: SharedSession, nonce: str, reached: tuple[dict[str, str], str]
) -> dict[str, Any]:
    """Host control: the payload user, unconfined, reached every session witness; each logs it.

    `reached` is the payload user's connects, made by the caller in a child as that user
    (`connect_each`, the line carrying `nonce`): {address: "" or the errno}, and why the
    child could not run.
    """
    want = list(shared.witnesses.planted)
    reach, why = reached
    if why:
        return host_check("the login session's sockets hear the payload user", ok=False, detail=why)
    deadline = time.monotonic() + HEAR_S
    got: set[str] = set()
    while time.monotonic() < deadline:
        got = {e["witness"] for e in shared.witnesses.heard(nonce)}
        if got >= set(want):
            break
        time.sleep(0.005)
    missing = [f"{a} ({reach.get(a) or 'connected, not heard'})" for a in want if a not in got]
    detail = f"{len(got)} of {len(want)} session sockets heard the payload user" + (
        f"; silent: {', '.join(missing)}" if missing else ""
    )
    return host_check(
        "the login session's sockets hear the payload user", bool(want) and not missing, detail
    )


def session_reason(
    shared: SharedSession, sites: list[str], inside: dict[str, list[str]], *, open_leg: bool
) -> str:
    """The reason for the session sockets that heard the payload: which, where inside, the fix."""
    named = []
    for site in sites[:NAMES]:
        at = inside.get(site) or []
        where = f" (at {', '.join(at)} inside)" if at else ""
        named.append(f"{shared.what(site) or 'a session daemon'} {site}{where}")
    more = f" and {len(sites) - NAMES} more" if len(sites) > NAMES else ""
    said = f"the login session's sockets heard the payload: {'; '.join(named)}{more}"
    if open_leg:
        return said
    return f"{said}: the sandbox exposes the agent's login session; {FIX}"
