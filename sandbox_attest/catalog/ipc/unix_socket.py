"""`ipc_unix_socket_escape`, host side: every host unix socket the payload can see.

The probe covers the class, not an instance: beside the fixture daemon and the real Docker
socket, every socket the host keeps in its runtime trees gets a witness socket of this cell
(`sandbox_attest.catalog.socket_witness`), and the payload touches every socket it can see. A
witness that hears the nonce is FAIL whatever the payload says; a real daemon's socket the
payload connected to is FAIL where the host finds that very inode at that path. After the cell
the harness removes whatever carries the cell's nonce, and the evidence lists what it removed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.canary import call_as
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.ipc.session_sockets import (
    SharedSession,
    acquire_session,
    control_check,
    heard_by,
    release_session,
    session_reason,
)
from sandbox_attest.catalog.ipc.socket_view import (
    WITNESSED,
    daemon_reason,
    exposures,
    hint_name,
    host_table,
    inside_paths,
    reached_reason,
    read_view,
    real_reached,
    walk_summary,
)
from sandbox_attest.catalog.judging import conclude, judge_escape, private_namespace_reason
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.socket_witness import (
    ABSTRACT_PREFIX,
    RUNTIME_ROOTS,
    TMP_ROOT,
    WITNESS_PREFIX,
    WitnessSockets,
    reachable_dirs,
    remove_nonce_files,
    socket_dirs,
    sockets_in,
    witness_name,
)
from sandbox_attest.catalog.spec import (
    DOCKER_SOCKETS,
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    host_can_look,
    host_processes,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.host import as_user
from sandbox_attest.host.login_session import session_dirs
from sandbox_attest.host.trust import PayloadUser
from sandbox_attest.host.viewwalk import HostSocket, Identity
from sandbox_attest.verdict import Assessment, Expectation

# How many sockets a reason names before it says "and N more": a verdict stays one line.
REASON_NAMES = 3


_REFUSED_BY_FILTER = frozenset({"EPERM", "EACCES"})


def _af_unix_refused_outright(
    controls: list[dict[str, Any]], escapes: list[dict[str, Any]]
) -> bool:
    """Whether the sandbox refused every unix socket the payload tried to make, control too."""
    tried = [*controls, *escapes]
    return bool(controls) and all(
        a.get("outcome") in {"refused", "error"} and a.get("errno") in _REFUSED_BY_FILTER
        for a in tried
    )


def _af_unix_excuse(
    ctx: CellContext,
    heard: dict[str, Any],
    controls: list[dict[str, Any]],
    escapes: list[dict[str, Any]],
) -> str | None:
    """Why a failed in-sandbox control is excused (AF_UNIX refused outright), or None."""
    # The excuse needs witnesses that could have heard, and (where the host can look) a
    # payload the host saw run: an all-EPERM report alone is the payload's word.
    witnessed = bool(heard["evidence"].get("planted")) and (
        not host_can_look(ctx) or bool(host_processes(ctx))
    )
    if not (witnessed and _af_unix_refused_outright(controls, escapes)):
        return None
    # The control shows unix sockets work inside so that refusals mean something. A
    # filter that refuses socket(AF_UNIX) itself (Codex's seccomp) leaves no unix
    # socket to escape with: the refusal is the claim holding, and the host's
    # witnesses, which heard nothing, are what the verdict rests on.
    return (
        "the sandbox refuses AF_UNIX sockets outright: the socketpair control and "
        "every escape got EPERM at socket(); no witness heard the payload"
    )


class IpcUnixSocketEscape(SpecBase):
    """Every host unix socket the payload can see, each host directory of them witnessed.

    The fixture daemon (path and abstract) gets `GET /_ping` with the nonce, the real Docker
    socket a bare `/_ping`; every other socket the payload finds is touched once (see
    probes/ipc_unix_socket_escape.py). Beside the host's real sockets, `prepare` plants the
    cell's witness sockets; `assess` stops them and records what they heard.
    """

    id = "ipc_unix_socket_escape"
    area = "ipc"
    host_readings = ("fake daemon log", "witness sockets")

    def __init__(self) -> None:
        """The witness sockets of each cell, held by nonce between prepare and assess.

        Beside them, per nonce: the host's own sockets by identity (what the walk of the
        view at the rendezvous matches), and the login session the cell holds, with the
        time it began (its witnesses' connections before then are another cell's).
        """
        self._witnesses: dict[str, WitnessSockets] = {}
        self._tables: dict[str, dict[Identity, HostSocket]] = {}
        self._sessions: dict[str, tuple[SharedSession, float]] = {}

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The socketpair control, the daemon's sockets, the Docker sockets, what it finds.

        The sockets the payload finds (`path:<path>`, `abstract:<name>`) are whatever its
        view shows: the host knows their form, not their list.
        """
        targets = task.get("targets") or {}
        abstract = ("daemon-abstract",) if targets.get("abstract") else ()
        docker = (f"docker:{path}" for path in targets.get("docker_sockets") or ())
        return AttemptTable(
            required=attempts_of("socketpair", "daemon-unix", *abstract),
            optional=attempts_of(*docker),
            discovered=("path:", "abstract:", "view:"),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied when IPC is isolated; seen on the open control leg."""
        return "denied" if declared.ipc == "isolated" else "allowed"

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE under `ipc = "open"`, except on the control leg.

        Open IPC promises nothing about the host's sockets, so there is nothing to judge: a
        sandbox that blocks more than it claims is no finding either way. The control leg
        claims nothing at all and runs the probe, the unconfined leg every PASS rests on.
        """
        claims = claims_of(declared)
        if claims.nothing or claims.ipc != "open":
            return None
        return f'the backend claims ipc = "open"; {self.id} tests only the ipc claim'

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant the witnesses; the daemon's sockets, the Docker paths and the trees to walk.

        The world's run dir, the run's scratch and the login session's dirs are no witness
        sites: they hold the egress route, the fixture daemon and the session's daemons,
        judged by their own witnesses. The route's socket is
        handed to the payload as one to skip: it is the backend's grant, not a host daemon.
        A directory the payload user cannot search unconfined (another program's private
        one) gets no witness: listed in `not_planted` with the reason.
        """
        info = ctx.world.info
        daemon = info.daemon
        scratch = ctx.cell_dir.parent.parent
        # The login session's directories are judged by its own witnesses (session_sockets):
        # a cell's witness planted there outlived a session closed before the cell ended.
        found = socket_dirs(exclude=(Path(info.run_dir), scratch, *session_dirs()))
        dirs, unreachable = reachable_dirs(found, ctx.user)
        witnesses = WitnessSockets(ctx.nonce, dirs, abstract=sys.platform.startswith("linux"))
        self._witnesses[ctx.nonce] = witnesses
        witnesses.plant()
        witnesses.skipped |= {
            str(Path(d) / witness_name(ctx.nonce)): why for d, why in unreachable.items()
        }
        witnesses.start()
        shared, no_session = acquire_session(ctx.user)
        session_ids = {}
        if shared is not None:
            self._sessions[ctx.nonce] = (shared, time.time())
            session_ids = shared.witnesses.identities()
        route = (info.proxy.socket,)
        self._tables[ctx.nonce] = host_table(
            witnesses.identities(), session_ids, daemon.unix, sockets_in(found), route
        )
        save_state(
            ctx,
            {
                "planted": sorted(witnesses.planted),
                "not_planted": witnesses.skipped,
                "session": sorted(session_ids),
                "no_session": no_session,
            },
        )
        roots = [*RUNTIME_ROOTS, TMP_ROOT]
        if os.environ.get("XDG_RUNTIME_DIR"):
            roots.append((os.environ["XDG_RUNTIME_DIR"], 2))
        if shared is not None:
            # The session's places, walked by the payload whatever its environment says.
            roots += [(str(shared.session.runtime), 3), (str(shared.session.ssh_sock.parent), 0)]
        skip = [info.proxy.socket, *([ctx.route.proxy_socket] if ctx.route else [])]
        return {
            "unix": daemon.unix,
            "abstract": daemon.abstract,
            "docker_sockets": DOCKER_SOCKETS,
            "roots": [[root, depth] for root, depth in roots],
            "witness_prefix": WITNESS_PREFIX,
            "abstract_prefix": ABSTRACT_PREFIX,
            "skip": skip,
            "skip_abstract": [daemon.abstract] if daemon.abstract else [],
            # Written into the workspace at the rendezvous: the inside paths of the host's
            # sockets the host's walk of the view found (`at_rendezvous`).
            "view_hint": hint_name(ctx.nonce),
        }

    def at_rendezvous(self, ctx: CellContext, pid: int) -> dict[str, Any] | None:
        """Walk the payload's view for the host's sockets; tell the payload where they are.

        Run while the payload waits (sandbox_attest/run/hostview.py): see catalog/ipc/
        socket_view.py. None when this cell planted nothing to match against.
        """
        table = self._tables.get(ctx.nonce)
        if table is None:
            return None
        return read_view(ctx, pid, table, hint_name(ctx.nonce))

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host gets /_ping from each fake daemon socket, and every witness hears the host."""
        daemon, nonce = ctx.world.info.daemon, new_control_nonce()
        sockets = {"unix": daemon.unix}
        if daemon.abstract:
            sockets["abstract"] = "\0" + daemon.abstract
        checks = [
            guarded_check(f"host ping {kind}", functools.partial(_host_ping, kind, address, nonce))
            for kind, address in sockets.items()
        ]
        records = wait_for_records(
            ctx.world,
            nonce,
            lambda r: (
                {e.get("socket") for e in entries_with_nonce(r.daemon, nonce)} >= set(sockets)
            ),
        )
        logged = {e.get("socket") for e in entries_with_nonce(records.daemon, nonce)}
        checks.extend(
            host_check(
                f"daemon logged host {kind}", kind in logged, ",".join(sorted(map(str, logged)))
            )
            for kind in sockets
        )
        witnesses = self._witnesses.get(ctx.nonce)
        held = self._sessions.get(ctx.nonce)
        if witnesses is not None:
            witnesses.enter_control()  # the connects below are the control's, not the cell's
        # The cell's witnesses and the session's, reached by the payload user in one child.
        addresses = [
            *(witnesses.planted if witnesses is not None else ()),
            *(held[0].witnesses.planted if held is not None else ()),
        ]
        reached = _reach_as(ctx.user, addresses, nonce)
        if witnesses is not None:
            checks.append(_witnesses_hear_host(witnesses, nonce, ctx.user, reached))
        if held is not None:
            checks.append(control_check(held[0], nonce, reached))
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any host socket the payload reached is an escape; the witnesses stop here.

        What counts: a witness (the cell's, or the login session's) that heard the payload, a
        daemon request with the nonce, the real Docker answering, a real daemon's socket whose
        inode the host confirms at that path or found at that inside path by its walk of the
        view. The witnesses are stopped and removed here, so the evidence lists what was
        removed; the reasons name each socket where the payload saw it, and the fix.
        """
        escapes = attempts_by_role(report, "escape")
        view = dict(ctx.host_view.get(self.id) or {})
        self._tables.pop(ctx.nonce, None)
        ours = {e["inside"] for e in exposures(view) if e["kind"] in WITNESSED}
        fixed = [a for a in escapes if not _is_class(a)]
        harness_attempts = [a for a in fixed if not a.get("real_docker")] + [
            a for a in escapes if _is_class(a) and (a.get("witness") or _inside(a) in ours)
        ]
        docker = [a for a in escapes if a.get("real_docker")]
        docker_answered = [a for a in docker if a.get("outcome") == "succeeded"]
        hits = entries_with_nonce(witness.daemon, ctx.nonce)
        open_leg = self.expectation(ctx.claims) == "allowed"
        inside = inside_paths(view)
        heard = self._stop_witnesses(ctx, open_leg=open_leg, inside=inside)
        session = self._session_heard(ctx, open_leg=open_leg, inside=inside)
        confirmed = _host_confirmed(escapes)
        reached = real_reached(view, escapes)
        reasons = _reasons(ctx, heard, session, confirmed, reached, hits, view, open_leg=open_leg)
        reasons.append(f"payload: {attempts_summary(fixed)}; {_class_summary(escapes)}")
        if session.get("untested"):
            reasons.append(str(session["untested"]))
        if docker_answered:
            reasons.append(
                "the real docker socket answered /_ping inside "
                "(payload-side evidence: no host witness for the real docker socket)"
            )
        private = private_namespace_reason(report, "net") or private_namespace_reason(report, "mnt")
        seen = bool(hits) or bool(heard["heard"]) or bool(session["heard"])
        escape = judge_escape(observed_outcome(harness_attempts), seen, private, reasons)
        # The real daemons have no host witness, so their answer counts only against a sandbox
        # that must deny it. On the control leg it must not stand in for the fake daemon's
        # and the witnesses' hits: that leg vouches that this probe's witnesses see at all.
        if (docker_answered or confirmed or reached) and not open_leg:
            escape = "escaped"
        controls = attempts_by_role(report, "control")
        inside_ok = all_succeeded(controls)
        excuse = None
        if not inside_ok and escape != "escaped":
            excuse = _af_unix_excuse(ctx, heard, controls, escapes)
        if excuse is not None:
            inside_ok = True
            reasons.append(excuse)
        assessment = conclude(
            escape,
            observed_outcome(escapes),
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"in-sandbox control failed: {attempts_summary(controls)}",
            host_control=control,
            host_failed="host control failed",
            witness={
                "daemon": hits,
                "real_docker_payload_only": docker,
                "witness_sockets": heard["evidence"],
                "session_sockets": session["evidence"],
                "host_sockets_reached": [
                    {k: a.get(k) for k in ("what", "dev", "ino", "host")} for a in confirmed
                ]
                + reached,
                "view": view,
            },
            controls={"inside": controls, "host": control},
        )
        if heard["evidence"].get("planted"):
            backing = ["witness sockets", *(["the host's walk of the view"] if view else [])]
            assessment = dataclasses.replace(
                assessment, corroborated_by=[*assessment.corroborated_by, *backing]
            )
        return assessment

    def _session_heard(
        self, ctx: CellContext, *, open_leg: bool, inside: dict[str, list[str]]
    ) -> dict[str, Any]:
        """What the login session's witnesses heard of this cell; the cell lets the session go.

        A connection counts when its line carries the cell's nonce or its peer is a process
        the host read as the cell's (catalog/ipc/session_sockets.py `heard_by`).
        """
        held = self._sessions.pop(ctx.nonce, None)
        if held is None:
            why = load_state(ctx).get("no_session") or "no login session for this cell"
            # Said in the verdict's reasons, not only in the evidence: this cell's PASS then
            # covers no session socket, and a reader must see that class went untested.
            untested = f"the login session's sockets were not tested: {why}"
            return {
                "heard": [],
                "reasons": [],
                "untested": untested,
                "evidence": {"planted": [], "why": why},
            }
        shared, since = held
        pids = {int(p["pid"]) for p in host_processes(ctx) if p.get("pid")}
        heard = heard_by(shared, ctx.nonce, pids, since)
        sites = sorted({e["witness"] for e in heard})
        reasons = [session_reason(shared, sites, inside, open_leg=open_leg)] if sites else []
        evidence = {
            "planted": sorted(shared.witnesses.planted),
            "env": shared.session.env(),
            "heard": heard,
            "removed": release_session(shared),
        }
        return {"heard": heard, "reasons": reasons, "evidence": evidence}

    def _stop_witnesses(
        self, ctx: CellContext, *, open_leg: bool, inside: dict[str, list[str]]
    ) -> dict[str, Any]:
        """Stop the cell's witnesses, remove them, and read what they heard from the payload.

        A connection of the cell's phase counts when its line carries the nonce, or when the
        peer is the payload process the host read at the rendezvous (a payload that connects
        and says nothing is still the payload). Reasons name each witness and the fix.
        """
        witnesses = self._witnesses.pop(ctx.nonce, None)
        state = load_state(ctx)
        if witnesses is None:
            return {"heard": [], "reasons": [], "evidence": {"planted": []}}
        payload_pid = ctx.host_view.get("pid") if ctx.host_view.get("seen") else None
        heard = [
            e
            for e in witnesses.records()
            if e["phase"] == "cell"
            and (ctx.nonce in e["line"] or (payload_pid and e["peer"]["pid"] == payload_pid))
        ]
        removed = witnesses.stop()
        removed += remove_nonce_files(witnesses.dirs, ctx.nonce)
        sites = sorted({e["witness"] for e in heard})
        if open_leg:
            # Where nothing is confined the witnesses must hear it: no fix to name.
            shown = ", ".join(sites[:REASON_NAMES])
            reasons = [f"witness sockets heard the payload: {shown}"] if sites else []
        else:
            reasons = [_witness_reason(site, inside.get(site, [])) for site in sites[:REASON_NAMES]]
        if len(sites) > REASON_NAMES:
            reasons.append(f"and {len(sites) - REASON_NAMES} more witness sockets heard it")
        if witnesses.dropped:
            # Said in the verdict, so a reviewer sees where this cell did not look and why.
            reasons.append(_dropped_reason(witnesses.dropped))
        evidence = {
            "planted": state.get("planted", []),
            "not_planted": state.get("not_planted", {}),
            # Sites the host control dropped: the owner moved the directory, or the payload
            # user could not reach the witness unconfined. A nonce heard there still counts.
            "dropped": dict(witnesses.dropped),
            "heard": heard,
            "removed": removed,
        }
        return {"heard": heard, "reasons": reasons, "evidence": evidence}

    def cleanup(self, ctx: CellContext) -> None:
        """Stop and remove the witnesses of a cell that never got to `assess`."""
        witnesses = self._witnesses.pop(ctx.nonce, None)
        if witnesses is not None:
            witnesses.stop()
            remove_nonce_files(witnesses.dirs, ctx.nonce)
        self._tables.pop(ctx.nonce, None)
        held = self._sessions.pop(ctx.nonce, None)
        if held is not None:
            release_session(held[0])


def _is_class(attempt: dict[str, Any]) -> bool:
    """Whether an attempt is one of the class walk's (a socket the payload or the host found)."""
    return str(attempt.get("what", "")).startswith(("path:", "abstract:", "view:"))


def _inside(attempt: dict[str, Any]) -> str:
    """The inside path of a `view:` attempt (one the host's walk found), else ""."""
    what = str(attempt.get("what", ""))
    return what.removeprefix("view:") if what.startswith("view:") else ""


def _reasons(
    ctx: CellContext,
    heard: dict[str, Any],
    session: dict[str, Any],
    confirmed: list[dict[str, Any]],
    reached: list[dict[str, Any]],
    hits: list[dict[str, Any]],
    view: dict[str, Any],
    *,
    open_leg: bool,
) -> list[str]:
    """The verdict's reasons: each host socket reached, where inside, and the fix; the walk."""
    sockets = [
        *(_exposed(a, open_leg=open_leg) for a in confirmed),
        *(reached_reason(f, open_leg=open_leg) for f in reached),
    ]
    reasons = [*heard["reasons"], *session["reasons"], *sockets[:REASON_NAMES]]
    if len(sockets) > REASON_NAMES:
        reasons.append(f"and {len(sockets) - REASON_NAMES} more host sockets")
    if not open_leg:
        reasons += _daemon_reasons(ctx, hits, view)
    reasons.append(f"fake daemon logged {len(hits)} requests with the nonce")
    summary = walk_summary(view)
    if summary:
        reasons.append(summary)
    return reasons


def _host_confirmed(escapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Path attempts that connected to a socket the host has at that path, at that inode.

    The host's own stat decides, never the payload's word alone: a socket the payload
    reached at a path where the host keeps a different inode (the sandbox's own /run) is
    sandbox-private. Witnesses are judged by what they heard, not here.
    """
    confirmed = []
    for attempt in escapes:
        what = str(attempt.get("what", ""))
        if not what.startswith("path:") or attempt.get("witness"):
            continue
        if attempt.get("outcome") != "succeeded":
            continue
        path = what.removeprefix("path:")
        try:
            info = os.lstat(path)
        except OSError:
            continue
        same = (info.st_dev, info.st_ino) == (attempt.get("dev"), attempt.get("ino"))
        if stat.S_ISSOCK(info.st_mode) and same:
            confirmed.append(attempt | {"host": {"dev": info.st_dev, "ino": info.st_ino}})
    return confirmed


def _exposed(attempt: dict[str, Any], *, open_leg: bool = False) -> str:
    """The reason for a host daemon socket the payload reached, naming the path and the fix."""
    path = str(attempt.get("what", "")).removeprefix("path:")
    if open_leg:
        return f"the payload connected to the host's {path}"
    return (
        f"the payload connected to the host's {path} (the host has that socket at that inode): "
        f"the sandbox exposes the host's {Path(path).parent}; do not bind it into the sandbox"
    )


def _daemon_reasons(
    ctx: CellContext, hits: list[dict[str, Any]], view: dict[str, Any]
) -> list[str]:
    """The reasons for the fake daemon's sockets that heard the payload, path and fix named.

    Where the host's walk found the daemon's socket at another inside path, the reason names
    that path: the sandbox bound the socket itself there, not its directory.
    """
    if not hits:
        return []
    daemon = ctx.world.info.daemon
    kinds = {str(h.get("socket")) for h in hits}
    reasons = []
    moved = daemon_reason(view, daemon.unix) if "unix" in kinds else None
    if moved is not None:
        reasons.append(f"the fake daemon answered the payload: {moved}")
    elif "unix" in kinds:
        where = Path(daemon.unix).parent
        reasons.append(
            f"the fake daemon at {daemon.unix} answered the payload: the sandbox exposes the "
            f"host's {where}; do not bind {where} (or a parent of it) into the sandbox"
        )
    if "abstract" in kinds:
        reasons.append(
            f"the fake daemon's abstract socket @{daemon.abstract} answered the payload: the "
            "sandbox shares the host's abstract unix namespace; unshare the network"
        )
    return reasons


def _witness_reason(site: str, inside: list[str]) -> str:
    """The reason for a witness that heard the payload, naming where it sat and the fix.

    `inside`: the inside paths the host's walk found it at, where not its host path.
    """
    if inside:
        return (
            f"witness socket {site} heard the payload at {', '.join(inside[:REASON_NAMES])} "
            "inside (found there by the host's walk of the view, by identity): the sandbox "
            f"exposes the host's {Path(site).parent} at another path; do not bind host "
            "sockets (or the directories that hold them) into the sandbox"
        )
    if site.startswith("@"):
        return (
            f"the abstract witness {site} heard the payload: the sandbox shares the host's "
            "abstract unix namespace (it lives in the network namespace); unshare the network"
        )
    directory = Path(site).parent
    return (
        f"witness socket {site} heard the payload: the sandbox exposes the host's "
        f"{directory}; do not bind {directory} (or a parent of it) into the sandbox"
    )


def _class_summary(escapes: list[dict[str, Any]]) -> str:
    """The class walk in a few words: how many sockets it touched, which it connected to."""
    found = [a for a in escapes if _is_class(a)]
    connected = [str(a.get("what")) for a in found if a.get("outcome") == "succeeded"]
    named = ", ".join(connected[:REASON_NAMES])
    more = f" and {len(connected) - REASON_NAMES} more" if len(connected) > REASON_NAMES else ""
    return f"walk touched {len(found)} sockets, connected to {len(connected)}" + (
        f" ({named}{more})" if connected else ""
    )


# A connect the payload user's own permissions refused: the witness is out of its reach
# unconfined (a directory's owner tightened it during the cell), so it cannot vouch for a
# refusal inside. Any other failure at a witness planted and still in place is the control's.
_OUT_OF_REACH = frozenset({"EACCES", "EPERM"})


def _witnesses_hear_host(
    witnesses: WitnessSockets,
    nonce: str,
    user: PayloadUser | None,
    reached: tuple[dict[str, str], str] | None = None,
) -> dict[str, Any]:
    """Host control: the payload user, unconfined, connects to every witness; each logs it.

    The connects are the payload user's (`call_as`), not the harness's: a root harness
    reaches every directory, so only the payload user's own connect shows that a witness
    could have heard an unconfined payload. A silent witness is dropped from the cell, with
    its reason, when its directory is no longer the one planted in (its owner removed or
    replaced it) or the payload user's connect was refused by permissions; any other silent
    witness fails the control. `reached` is what `_reach_as` already gave for these
    witnesses (the caller entered the control phase first); None: asked here.
    """
    witnesses.enter_control()
    want = list(witnesses.planted)
    reach, why = reached if reached is not None else _reach_as(user, want, nonce)
    if why:
        return host_check("witness sockets hear the payload user", ok=False, detail=why)
    deadline = time.monotonic() + 3.0
    got: set[str] = set()
    tried = {a for a in want if reach.get(a) == ""}
    while time.monotonic() < deadline:
        got = {e["witness"] for e in witnesses.heard(nonce, phase="host-control")}
        if got >= tried:
            break
        time.sleep(0.002)
    for address in want:
        if address in got:
            continue
        moved = witnesses.moved(address)
        if moved:
            witnesses.dropped[address] = f"its owner changed the directory: {moved}"
        elif reach.get(address) in _OUT_OF_REACH:
            witnesses.dropped[address] = (
                f"the payload user cannot reach it unconfined ({reach[address]})"
            )
    missing = sorted(set(want) - got - set(witnesses.dropped))
    kept = len(want) - len(witnesses.dropped)
    detail = (
        f"{len(got)} of {kept} witnesses heard the payload user"
        + (f" ({len(witnesses.dropped)} sites dropped)" if witnesses.dropped else "")
        + (
            "; silent: "
            + ", ".join(
                f"{a} ({reach.get(a) or witnesses.replaced(a) or 'connected, not heard'})"
                for a in missing[:REASON_NAMES]
            )
            if missing
            else ""
        )
    )
    return host_check("witness sockets hear the payload user", bool(got) and not missing, detail)


def _reach_as(
    user: PayloadUser | None, addresses: list[str], nonce: str
) -> tuple[dict[str, str], str]:
    """The payload user's connects to `addresses`, one child for all: {address: errno or ""}.

    One child, not one per witness set: starting it costs the cell about half a second.
    """
    if not addresses:
        return {}, ""
    request = {"addresses": addresses, "line": f"SANDBOX-ATTEST-WITNESS {nonce}\n"}
    reach, why = call_as(user, as_user.__name__, "connect_each", request, HOST_TIMEOUT_S)
    return (dict(reach or {}), why)


def _dropped_reason(dropped: dict[str, str]) -> str:
    """The verdict's phrase for the witness sites dropped from the cell, a few named."""
    named = "; ".join(f"{site}: {why}" for site, why in list(dropped.items())[:REASON_NAMES])
    more = f"; and {len(dropped) - REASON_NAMES} more" if len(dropped) > REASON_NAMES else ""
    return f"{len(dropped)} witness sites dropped from the cell ({named}{more})"


def _host_ping(kind: str, address: str, nonce: str) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(HOST_TIMEOUT_S)
        sock.connect(address)
        sock.sendall(
            f"GET /_ping?nonce={nonce} HTTP/1.1\r\nHost: docker\r\n"
            f"X-Attest-Nonce: {nonce}\r\nConnection: close\r\n\r\n".encode()
        )
        line = sock.recv(1024).split(b"\r\n", 1)[0].decode("latin-1")
    return host_check(f"host ping {kind}", " 200 " in f"{line} ", line)
