"""Races, host side: a path swapped before the sandbox's setup, a socket bound at start-up.

`fs_setup_race` (issue 28). The payload cannot act before its sandbox starts, so the race
is modelled on the host: after the harness made a directory a wrapper may bind
(`race/shared`, the payload user's, as a tools or cache dir shared with the agent is), a
helper running as the payload user outside the sandbox swaps it for a symlink to a canary
directory of the host's (root's, readable by the payload user) before the backend starts. A
setup that follows the symlink binds the canary into the payload's view.

Witnesses: the canary's random token (the payload can only report it by reading it), and the
host's own look into the payload's view at the rendezvous (`look_paths`): the token file seen
through the swapped path as the very inode the host has, while the canary's own path is not
in view, is the swap's doing. Where the canary is visible at its own path too, the whole host
tree is in view: reading it is fs_read_secrets' claim, noted and not judged here.

The payload also binds a unix socket named by the nonce in a directory outside the workspace
that the payload user may write unconfined (`race-sockets`): the host looks for that socket
after the cell (a socket left where a host process would trust it is the start-up race's
payoff). Every root file operation below the cell dir goes through `sandbox_attest.host.safefs`.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.judging import (
    conclude,
    expect_fs_confined,
    judge_escape,
    private_namespace_reason,
)
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    home_of,
)
from sandbox_attest.claims import Claims, claims_of
from sandbox_attest.host import disguise, safefs
from sandbox_attest.host.trust import unreachable_by
from sandbox_attest.verdict import Assessment, Expectation

RACE_DIR: Final = "race"
SHARED: Final = "shared"
CANARY_DIR: Final = disguise.RACE_CANARY_DIR
CANARY_FILE: Final = disguise.CANARY_FILE
SOCKET_DIR: Final = "race-sockets"
SWAP_ATTEMPT: Final = "swap:read"
# A filter's or an LSM's refusal of the operation itself, whatever the path.
POLICY_ERRNOS: Final = frozenset({"EPERM", "EACCES"})
# The swap is one rename and one symlink; a helper that takes longer is stuck, not racing.
SWAP_TIMEOUT_S: Final = 5.0
# The helper's whole program: move the real directory aside, put the symlink in its place.
SWAP_SCRIPT: Final = 'mv -- "$1/shared" "$1/shared.before" && ln -s -- "$2" "$1/shared"'


def _socket_name(nonce: str) -> str:
    return f"s-{nonce}.sock"


def _swap_as_payload_user(ctx: CellContext, race: Path, canary: Path) -> str:
    """Run the hostile helper outside any sandbox; "" when it swapped, else why not."""
    kwargs: dict[str, Any] = ctx.user.popen_kwargs() if ctx.user is not None else {}
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", SWAP_SCRIPT, "swap", str(race), str(canary)],
            capture_output=True,
            text=True,
            timeout=SWAP_TIMEOUT_S,
            check=False,
            cwd="/",
            **kwargs,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the helper did not run: {exc}"
    if done.returncode != 0:
        return f"the helper failed (exit {done.returncode}): {done.stderr.strip()[-200:]}"
    return ""


class FsSetupRace(SpecBase):
    """A bind source swapped for a symlink before setup; a socket bound outside at start-up."""

    id = "fs_setup_race"
    area = "races"
    host_readings = (
        "the host's look into the payload's view for the canary behind the swapped path",
        "the socket directory on the host after the cell",
    )

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The control bind, the read through the swapped path, one bind per socket dir."""
        dirs = (task.get("targets") or {}).get("socket_dirs") or []
        binds = tuple(str(i) for i in range(len(dirs)))
        return AttemptTable(
            required=attempts_of("control:socket", SWAP_ATTEMPT, ("socket:bind", binds))
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied where the payload may see and write only its workspace; seen unconfined."""
        return expect_fs_confined(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Make the shared dir, the canary and the socket dir; let the helper swap."""
        owner = (ctx.user.uid, ctx.user.gid) if ctx.user is not None else None
        token = secrets.token_hex(16)
        with safefs.open_dir(ctx.cell_dir) as cell:
            with cell.mkdir(CANARY_DIR, 0o755) as canary:
                canary.create_file(CANARY_FILE, token + "\n", 0o644)
            with (
                cell.mkdir(RACE_DIR, 0o755, owner) as race,
                race.mkdir(SHARED, 0o755, owner) as shared,
            ):
                shared.create_file("README", "the harness's shared dir\n", 0o644, owner)
            cell.mkdir(SOCKET_DIR, 0o755, owner).close()
        race_dir, canary_dir = ctx.cell_dir / RACE_DIR, ctx.cell_dir / CANARY_DIR
        swap = _swap_as_payload_user(ctx, race_dir, canary_dir)
        save_state(ctx, {"token": token, "swap": swap})
        return {
            "swapped": str(race_dir / SHARED),
            "token_name": CANARY_FILE,
            "socket_dirs": [str(ctx.cell_dir / SOCKET_DIR)],
            "socket_name": _socket_name(ctx.nonce),
        }

    def look_paths(self, ctx: CellContext) -> list[str]:
        """The token through the swapped path, and at the canary's own path."""
        return [
            str(ctx.cell_dir / RACE_DIR / SHARED / CANARY_FILE),
            str(ctx.cell_dir / CANARY_DIR / CANARY_FILE),
        ]

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The helper swapped; the payload user may read the canary and write the socket dir."""
        state = load_state(ctx)

        def swapped() -> dict[str, Any]:
            why = str(state.get("swap", "prepare did not run"))
            with safefs.open_dir(ctx.cell_dir / RACE_DIR) as race:
                st = race.entry(SHARED)
            link = st is not None and stat.S_ISLNK(st.st_mode)
            return host_check(
                "the helper swapped the shared dir for a symlink", not why and link, why
            )

        def reachable() -> dict[str, Any]:
            what = "the payload user may read the canary and write the socket dir unconfined"
            canary = ctx.cell_dir / CANARY_DIR
            blocked = unreachable_by(canary, ctx.user) or unreachable_by(
                ctx.cell_dir / SOCKET_DIR, ctx.user
            )
            if blocked is not None:
                return host_check(what, ok=False, detail=f"{blocked} is not traversable")
            uid = ctx.user.uid if ctx.user is not None else os.geteuid()
            sockets = (ctx.cell_dir / SOCKET_DIR).stat()
            ok = bool((canary / CANARY_FILE).stat().st_mode & 0o004) and sockets.st_uid == uid
            return host_check(what, ok, f"socket dir owned by uid {sockets.st_uid}")

        checks = [guarded_check("swapped", swapped), guarded_check("reachable", reachable)]
        return control_record(new_control_nonce(), checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The canary bound in through the swap, or a socket left outside: an escape."""
        del witness
        state = load_state(ctx)
        token = str(state.get("token", ""))
        claims = claims_of(ctx.claims)
        looked = {str(e.get("path")): e for e in ctx.host_view.get("looked") or []}
        through, own = (looked.get(p, {}) for p in self.look_paths(ctx))
        via_swap = bool(through.get("same_inode_as_host"))
        whole_tree = bool(own.get("same_inode_as_host"))
        # The race's own outcome: the canary in view only behind the swapped path.
        bound = via_swap and not whole_tree
        every = attempts_by_role(report, "escape")
        judged_swap = claims.reads == "open" or bound
        # A read through the swapped path that only shows the whole host tree in view is not
        # this class's success; its refusal still counts as one.
        escapes = [
            a
            for a in every
            if judged_swap or a.get("what") != SWAP_ATTEMPT or a.get("outcome") != "succeeded"
        ]
        observed = observed_outcome(escapes)
        read = _token_read_through_swap(escapes, token)
        sockets = [
            p
            for p in self._sockets_left(ctx)
            if claims.writes == "open" or claims.write_denied(Path(p).parent, home_of(ctx))
        ]
        reasons = _swap_reasons(claims, bound=bound, read=read)
        reasons += _socket_reasons(claims, sockets)
        if not reasons:
            reasons.append(
                "the canary behind the swapped path is not in the payload's view and no "
                "socket of the payload's is on the host"
            )
        reasons.append(f"payload: {attempts_summary(escapes)}")
        if whole_tree and claims.reads != "open":
            reasons.append(
                "not judged here: the canary is in view at its own host path too "
                f"({claims.phrase('reads')}; fs_read_secrets judges reads by path)"
            )
        seen = bound or bool(sockets) or (read and claims.reads == "open")
        escape = judge_escape(observed, seen, private_namespace_reason(report, "mnt"), reasons)
        if not seen and not token:
            # The record of the cell is gone or rewritten: a read cannot be told apart.
            reasons.append("the host's record of this cell (the canary's token) is unreadable")
            escape = "undecided"
        inside = attempts_by_role(report, "control")
        inside_ok = len(inside) == 1 and inside[0].get("outcome") == "succeeded"
        refused_kind = _refused_as_a_kind(inside, every)
        if not inside_ok and refused_kind:
            # The sandbox refuses every unix-socket bind, its workspace's too (srt's and Codex's
            # filters): no path is the cause, so the refusal outside is the sandbox's, and the
            # host control showed the directory is the payload user's to write.
            inside_ok = True
            reasons.append(
                f"the sandbox refuses unix-socket binds as such ({refused_kind}), in the "
                "workspace too"
            )
        return conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"bound": bound, "read": read, "sockets": sockets, "looked": list(looked)},
            inside=inside,
            inside_ok=inside_ok,
        )

    def _sockets_left(self, ctx: CellContext) -> list[str]:
        name = _socket_name(ctx.nonce)
        try:
            with safefs.open_dir(ctx.cell_dir / SOCKET_DIR) as place:
                st = place.entry(name)
        except (OSError, safefs.UnsafePathError):
            return []
        if st is not None and stat.S_ISSOCK(st.st_mode):
            return [str(ctx.cell_dir / SOCKET_DIR / name)]
        return []


def _token_read_through_swap(escapes: list[dict[str, Any]], token: str) -> bool:
    """Whether the payload reported the canary's token read through the swapped path."""
    return any(
        a.get("what") == SWAP_ATTEMPT
        and a.get("outcome") == "succeeded"
        and token
        and token in str(a.get("detail"))
        for a in escapes
    )


def _swap_reasons(claims: Claims, *, bound: bool, read: bool) -> list[str]:
    """The verdict's phrases for the swapped path: the canary in view, and the fix if bound."""
    reasons: list[str] = []
    if bound or (read and claims.reads == "open"):
        reasons.append(
            (f"{claims.phrase('reads')}; " if claims.reads != "open" else "")
            + "the canary swapped in before setup is in the payload's view"
            + (" (the host sees its token behind the swapped path)" if bound else "")
            + (" and the payload read its token" if read else "")
        )
        if bound:
            reasons.append(
                "fix: never bind a source the payload user can change; open each bind "
                "source without following symlinks (O_NOFOLLOW, openat2 RESOLVE_NO_SYMLINKS) "
                "and bind that descriptor, or make the sources root's"
            )
    return reasons


def _socket_reasons(claims: Claims, sockets: list[str]) -> list[str]:
    """The verdict's phrases for the payload's sockets left on the host, and the fix."""
    reasons: list[str] = []
    if sockets:
        reasons.append(
            (f"{claims.phrase('writes')}; " if claims.writes != "open" else "")
            + f"a unix socket of the payload's is left on the host: {', '.join(sockets)}"
        )
        reasons.append(
            "fix: bind nothing outside the workspace writable, and refuse bind() of unix "
            "sockets outside it (a private /tmp, seccomp or Landlock on AF_UNIX)"
        )
    return reasons


def _refused_as_a_kind(inside: list[dict[str, Any]], every: list[dict[str, Any]]) -> str:
    """The errno with which every bind, the workspace's included, was refused by policy; or "".

    EPERM and EACCES are a filter's or an LSM's answer to the operation; ENOENT or EROFS would
    be about a path, and then the workspace's bind must succeed for a refusal to mean anything.
    """
    binds = [a for a in every if str(a.get("what", "")).startswith("socket:bind:")]
    answers = {str(a.get("errno")) for a in [*inside, *binds] if a.get("outcome") == "refused"}
    if len(inside) != 1 or not binds or len(answers) != 1:
        return ""
    if inside[0].get("outcome") != "refused" or any(a.get("outcome") != "refused" for a in binds):
        return ""
    (answer,) = answers
    return answer if answer in POLICY_ERRNOS else ""


SPECS: Final = (FsSetupRace(),)
