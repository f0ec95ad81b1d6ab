"""The ipc probes, host side: unix sockets of the host, and the egress route's own socket.

`ipc_unix_socket_escape` covers the class, not an instance: beside the fixture daemon and the
real Docker socket, every socket the host keeps in its runtime trees gets a witness socket of
this cell (`sandbox_attest.catalog.socket_witness`), and the payload touches every socket it can
see. A witness that hears the nonce is FAIL whatever the payload says; a real daemon's socket the
payload connected to is FAIL where the host finds that very inode at that path.

`ipc_proxy_socket_tamper` attacks the route the backend really uses (its `InsideRoute`).
After either probe's cell the harness removes whatever carries the cell's nonce from every
host path the payload could have touched, and the evidence lists what it removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import shutil
import socket
import ssl
import stat
import sys
import time
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
    refusal_summary,
)
from sandbox_attest.catalog.canary import (
    call_as,
    dir_entries,
    file_diff,
    file_state,
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
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.socket_witness import (
    ABSTRACT_PREFIX,
    RUNTIME_ROOTS,
    TMP_ROOT,
    WITNESS_PREFIX,
    WitnessSockets,
    connect_each,
    reachable_dirs,
    remove_nonce_files,
    socket_dirs,
    witness_name,
)
from sandbox_attest.catalog.spec import (
    DOCKER_SOCKETS,
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    InsideRoute,
    PolicyLike,
    SpecBase,
    WitnessRecordsLike,
    host_can_look,
    host_processes,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.errors import FixtureError, HarnessError
from sandbox_attest.host.trust import PayloadUser, give
from sandbox_attest.run import sweep
from sandbox_attest.verdict import Assessment, Expectation

# The names probes/ipc_proxy_socket_tamper.py gives what it plants beside the route's files.
LEAKS: Final = (("rogue", "sock"), ("shim", "py"))
# How many sockets a reason names before it says "and N more": a verdict stays one line.
REASON_NAMES = 3
# What probes/ipc_proxy_socket_tamper.py does to a socket and to a shim, in its own words.
TAMPER_OPS: Final = (
    "socket-chmod",
    "socket-replace",
    "socket-unlink",
    "shim-chmod",
    "shim-append",
    "shim-replace",
)


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
        """The witness sockets of each cell, held by nonce between prepare and assess."""
        self._witnesses: dict[str, WitnessSockets] = {}

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
            discovered=("path:", "abstract:"),
        )

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied when IPC is isolated; seen on the open control leg."""
        return "denied" if policy.ipc == "isolated" else "allowed"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant the witnesses; the daemon's sockets, the Docker paths and the trees to walk.

        The world's run dir and the run's scratch are no witness sites: they hold the egress
        route and the fixture daemon, judged by their own witnesses. The route's socket is
        handed to the payload as one to skip: it is the backend's grant, not a host daemon.
        A directory the payload user cannot search unconfined (another program's private
        one) gets no witness: listed in `not_planted` with the reason.
        """
        info = ctx.world.info
        daemon = info.daemon
        scratch = ctx.cell_dir.parent.parent
        dirs, unreachable = reachable_dirs(
            socket_dirs(exclude=(Path(info.run_dir), scratch)), ctx.user
        )
        witnesses = WitnessSockets(ctx.nonce, dirs, abstract=sys.platform.startswith("linux"))
        self._witnesses[ctx.nonce] = witnesses
        witnesses.plant()
        witnesses.skipped |= {
            str(Path(d) / witness_name(ctx.nonce)): why for d, why in unreachable.items()
        }
        witnesses.start()
        save_state(
            ctx,
            {"planted": sorted(witnesses.planted), "not_planted": witnesses.skipped},
        )
        roots = [*RUNTIME_ROOTS, TMP_ROOT]
        if os.environ.get("XDG_RUNTIME_DIR"):
            roots.append((os.environ["XDG_RUNTIME_DIR"], 2))
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
        }

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
        if witnesses is not None:
            checks.append(_witnesses_hear_host(witnesses, nonce, ctx.user))
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any host socket the payload reached is an escape; the witnesses stop here.

        What counts: a witness that heard the payload, a daemon request with the nonce, the
        real Docker answering, a real daemon's socket whose inode the host confirms. The
        witnesses are stopped and removed here, so the evidence lists what was removed.
        """
        escapes = attempts_by_role(report, "escape")
        fixed = [a for a in escapes if not _is_class(a)]
        harness_attempts = [a for a in fixed if not a.get("real_docker")] + [
            a for a in escapes if _is_class(a) and a.get("witness")
        ]
        docker = [a for a in escapes if a.get("real_docker")]
        docker_answered = [a for a in docker if a.get("outcome") == "succeeded"]
        observed = observed_outcome(escapes)
        hits = entries_with_nonce(witness.daemon, ctx.nonce)
        open_leg = self.expectation(ctx.policy) == "allowed"
        heard = self._stop_witnesses(ctx, open_leg=open_leg)
        confirmed = _host_confirmed(escapes)
        reasons = [
            *heard["reasons"],
            *(_exposed(a, open_leg=open_leg) for a in confirmed[:REASON_NAMES]),
            *([] if open_leg else _daemon_reasons(ctx, hits)),
            f"fake daemon logged {len(hits)} requests with the nonce",
            f"payload: {attempts_summary(fixed)}; {_class_summary(escapes)}",
        ]
        if len(confirmed) > REASON_NAMES:
            reasons.insert(REASON_NAMES, f"and {len(confirmed) - REASON_NAMES} more host sockets")
        if docker_answered:
            reasons.append(
                "the real docker socket answered /_ping inside "
                "(payload-side evidence: no host witness for the real docker socket)"
            )
        private = private_namespace_reason(report, "net") or private_namespace_reason(report, "mnt")
        seen = bool(hits) or bool(heard["heard"])
        escape = judge_escape(observed_outcome(harness_attempts), seen, private, reasons)
        # The real daemons have no host witness, so their answer counts only against a sandbox
        # that must deny it. On the control leg it must not stand in for the fake daemon's
        # and the witnesses' hits: that leg vouches that this probe's witnesses see at all.
        if (docker_answered or confirmed) and self.expectation(ctx.policy) == "denied":
            escape = "escaped"
        controls = attempts_by_role(report, "control")
        inside_ok = all_succeeded(controls)
        # The excuse needs witnesses that could have heard, and (where the host can look) a
        # payload the host saw run: an all-EPERM report alone is the payload's word.
        witnessed = bool(heard["evidence"].get("planted")) and (
            not host_can_look(ctx) or bool(host_processes(ctx))
        )
        if (
            not inside_ok
            and escape != "escaped"
            and witnessed
            and _af_unix_refused_outright(controls, escapes)
        ):
            # The control shows unix sockets work inside so that refusals mean something. A
            # filter that refuses socket(AF_UNIX) itself (Codex's seccomp) leaves no unix
            # socket to escape with: the refusal is the claim holding, and the host's
            # witnesses, which heard nothing, are what the verdict rests on.
            inside_ok = True
            reasons.append(
                "the sandbox refuses AF_UNIX sockets outright: the socketpair control and "
                "every escape got EPERM at socket(); no witness heard the payload"
            )
        assessment = conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"in-sandbox control failed: {attempts_summary(controls)}",
            host_control=control,
            host_failed="host control failed",
            witness={
                "daemon": hits,
                "real_docker_payload_only": docker,
                "witness_sockets": heard["evidence"],
                "host_sockets_reached": [
                    {k: a.get(k) for k in ("what", "dev", "ino", "host")} for a in confirmed
                ],
            },
            controls={"inside": controls, "host": control},
        )
        if heard["evidence"].get("planted"):
            assessment = dataclasses.replace(
                assessment, corroborated_by=[*assessment.corroborated_by, "witness sockets"]
            )
        return assessment

    def _stop_witnesses(self, ctx: CellContext, *, open_leg: bool) -> dict[str, Any]:
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
            reasons = [_witness_reason(site) for site in sites[:REASON_NAMES]]
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


def _is_class(attempt: dict[str, Any]) -> bool:
    """Whether an attempt is one of the class walk's (a socket the payload found)."""
    return str(attempt.get("what", "")).startswith(("path:", "abstract:"))


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


def _daemon_reasons(ctx: CellContext, hits: list[dict[str, Any]]) -> list[str]:
    """The reasons for the fake daemon's sockets that heard the payload, path and fix named."""
    if not hits:
        return []
    daemon = ctx.world.info.daemon
    kinds = {str(h.get("socket")) for h in hits}
    reasons = []
    if "unix" in kinds:
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


def _witness_reason(site: str) -> str:
    """The reason for a witness that heard the payload, naming where it sat and the fix."""
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
    witnesses: WitnessSockets, nonce: str, user: PayloadUser | None
) -> dict[str, Any]:
    """Host control: the payload user, unconfined, connects to every witness; each logs it.

    The connects are the payload user's (`call_as`), not the harness's: a root harness
    reaches every directory, so only the payload user's own connect shows that a witness
    could have heard an unconfined payload. A silent witness is dropped from the cell, with
    its reason, when its directory is no longer the one planted in (its owner removed or
    replaced it) or the payload user's connect was refused by permissions; any other silent
    witness fails the control.
    """
    witnesses.enter_control()
    want = list(witnesses.planted)
    request = {"addresses": want, "line": f"SANDBOX-ATTEST-WITNESS {nonce}\n"}
    reach, why = call_as(user, connect_each.__module__, "connect_each", request, HOST_TIMEOUT_S)
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


# ---------------------------------------------------------------------------------------------
# ipc_proxy_socket_tamper


def _route(ctx: CellContext) -> InsideRoute:
    """The cell's in-sandbox egress route, which the runner hands every cell.

    Raises:
        FixtureError: the cell was built without one (a CellContext made by hand).
    """
    if ctx.route is None:
        raise FixtureError(
            f"{ctx.probe}: the cell has no inside route; build its CellContext with "
            "route=InsideRoute(...) as sandbox_attest.run.runner does"
        )
    return ctx.route


def _bind_unix(path: Path) -> tuple[socket.socket, int]:
    """Bind and listen at `path` through a dir fd, so long scratch paths fit AF_UNIX's cap."""
    dir_fd = os.open(path.parent, os.O_RDONLY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"/proc/self/fd/{dir_fd}/{path.name}")
        sock.listen(8)
    except OSError:
        sock.close()
        os.close(dir_fd)
        raise
    return sock, dir_fd


def _connect_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HOST_TIMEOUT_S)
    if len(os.fsencode(path)) < 100:
        target = path
        dir_fd = None
    else:  # same trick as _bind_unix for a long run dir
        dir_fd = os.open(Path(path).parent, os.O_RDONLY)
        target = f"/proc/self/fd/{dir_fd}/{Path(path).name}"
    try:
        sock.connect(target)
    except OSError:
        sock.close()
        raise
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return sock


def _get_via_unix_proxy(
    socket_path: str, ca_bundle: str, host: str, port: int, nonce: str
) -> tuple[int, int, bytes]:
    """CONNECT through the proxy's unix socket and GET /ok; returns both statuses and body."""
    sock = _connect_unix(socket_path)
    try:
        sock.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"X-Attest-Nonce: {nonce}\r\n\r\n".encode("latin-1")
        )
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = sock.recv(1)  # byte by byte: nothing of the TLS stream may be consumed
            if not chunk:
                break
            head += chunk
        words = head.split(b"\r\n", 1)[0].split()
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        if status != 200:
            return status, 0, b""
        context = ssl.create_default_context(cafile=ca_bundle)
        with context.wrap_socket(sock, server_hostname=host) as tls:
            tls.sendall(
                f"GET /ok?nonce={nonce} HTTP/1.1\r\nHost: {host}\r\nX-Attest-Nonce: {nonce}"
                "\r\nConnection: close\r\n\r\n".encode("latin-1")
            )
            body = b""
            while len(body) < 65536:
                chunk = tls.recv(4096)
                if not chunk:
                    break
                body += chunk
        words = body.split(b"\r\n", 1)[0].split()
        inner = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        return status, inner, body
    finally:
        sock.close()


def _leak_key(ctx: CellContext) -> str:
    """The sweep journal key of a tamper cell's possible leaks."""
    return f"tamper-leaks-{ctx.nonce}"


def _leak_reason(path: str) -> str:
    """The reason for a nonce file the payload left on the host, naming the path and the fix."""
    where = Path(path).parent
    return (
        f"{Path(path).name} appeared in the host's {where} (removed): the payload wrote into "
        f"the host's {where} through the sandbox; bind the route's socket and shim read-only, "
        "never a host directory writable"
    )


def _sandbox_route_missed(
    report: dict[str, Any], escapes: list[dict[str, Any]], reasons: list[str]
) -> bool:
    """Whether the payload was told to attack the in-sandbox route but could not find it.

    Adds the phrase saying what happened to the in-sandbox part either way.
    """
    facts = report.get("facts", {})
    if not facts.get("sandbox_route_tried"):
        reasons.append("in-sandbox route not present (the task's proxy is not the shim)")
        return False
    inside = [a for a in escapes if str(a.get("what", "")).startswith("sandbox:")]
    missing = (
        facts.get("visible:sandbox") is not True
        or not inside
        or all(a.get("errno") == "ENOENT" for a in inside)
    )
    if missing:
        reasons.append(
            "the in-sandbox route was not attacked: its socket and shim are not at the "
            "paths the probe was given (every attempt ENOENT or the socket not visible)"
        )
        return True
    reasons.append("in-sandbox route attacked")
    return False


class IpcProxySocketTamper(SpecBase):
    """chmod / replace / unlink of the egress route's socket and shim.

    Safety: the payload is never given the host path of the real proxy socket or shim. It gets
    (1) a decoy socket and shim copy planted in this cell's scratch dir, the stand-in for the
    host side of the route, tampered on every leg (on the open leg it is all the payload may
    touch, and it belongs to the payload user there); and (2) the in-sandbox paths this
    backend says it uses (its InsideRoute, from the backend's `inside_paths`), which it tries
    only when the task's proxy URL is the in-sandbox shim's, i.e. the route is
    a bound socket inside a mount namespace. The real socket and shim are watched from the
    host, read-only.
    """

    id = "ipc_proxy_socket_tamper"
    area = "ipc"
    host_readings = ("socket and shim states on the host",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Every op on the workspace copies and the decoy; on the in-sandbox route if found.

        `route-after` is made only where the task names a proxy route the payload can use.
        """
        workspace = attempts_of(("workspace", TAMPER_OPS))
        # The payload checks the route afterwards only through a proxy URL it was handed.
        route_after = ("route-after",) if str(task.get("proxy_url")).startswith("http") else ()
        return AttemptTable(
            required=workspace | attempts_of(("decoy", TAMPER_OPS), *route_after),
            optional=attempts_of(("sandbox", TAMPER_OPS)),
            excuses=(("workspace:setup", workspace),),
        )

    def __init__(self) -> None:
        """Decoy listeners (and their dir fds) held per nonce between prepare and cleanup.

        The real shim's bytes are held too (in memory, out of every payload's reach), so
        cleanup can put the harness's own file back if a weak backend let a payload alter it.
        """
        self._held: dict[str, tuple[socket.socket, int]] = {}
        self._shims: dict[str, bytes] = {}

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied when confined to the workspace: the route's files are outside the grant."""
        return expect_fs_confined(policy)

    def not_applicable(self, egress: str) -> str | None:
        """Why this probe does not apply to a backend with this egress mode, or None.

        The runner asks before a cell runs. A wrapper with its own proxy (egress "own") has
        no harness proxy socket and no shim inside it: there is no route of ours to tamper
        with, and its own proxy's route is the network probes' to judge.
        """
        if egress == "own":
            return (
                'the backend brings its own proxy (egress "own"): no harness proxy socket '
                "or shim is inside it to tamper with; its proxy is judged by the net_* probes"
            )
        return None

    def not_claimed(self, policy: PolicyLike) -> str | None:
        """NOT_APPLICABLE under `network = "none"`: no egress route exists to tamper with.

        The probe attacks the route's socket and shim, then checks the route still carries
        an allowed request; a backend that claims no network has neither (Codex), and its
        claim is the net_* probes' to judge.
        """
        if claims_of(policy).network == "none":
            return (
                'the backend claims network = "none": it gives the payload no egress route '
                "to tamper with; the net_* probes judge that claim"
            )
        return None

    @staticmethod
    def decoy_paths(ctx: CellContext) -> dict[str, Path]:
        """The decoy socket and shim in the cell's scratch dir."""
        directory = ctx.cell_dir / "decoy-route"
        return {"socket": directory / "proxy.sock", "shim": directory / "shim.py"}

    def _watched(self, ctx: CellContext) -> dict[str, Path]:
        decoy = self.decoy_paths(ctx)
        return {
            "decoy-socket": decoy["socket"],
            "decoy-shim": decoy["shim"],
            "real-socket": Path(ctx.world.info.proxy.socket),
            "real-shim": _route(ctx).shim_source,
        }

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Bind the decoy socket, copy the shim beside it, and record every watched state."""
        decoy = self.decoy_paths(ctx)
        decoy["socket"].parent.mkdir(mode=0o755)
        self._held[ctx.nonce] = _bind_unix(decoy["socket"])
        real_shim = _route(ctx).shim_source
        self._shims[ctx.nonce] = real_shim.read_bytes()
        shutil.copyfile(real_shim, decoy["shim"])
        decoy["shim"].chmod(0o644)
        # The decoy stands for a route the payload could tamper with if unconfined, so it is
        # the payload user's; the real route is the harness's, which no payload uid may alter.
        give(decoy["socket"].parent, ctx.user, recursive=True)
        baseline = {k: file_state(p) for k, p in self._watched(ctx).items()}
        baseline["decoy-dir"] = {"entries": dir_entries(decoy["socket"].parent)}
        route = _route(ctx)
        info = ctx.world.info
        # A wrapper may show the route at its host paths (a spec's default `{proxy_socket}`).
        # There the payload's attack lands on the real socket, which only a uid of its own
        # keeps it from cutting for every later cell: without one, the route is not handed.
        at_host = route.proxy_socket == info.proxy.socket or Path(route.shim) == route.shim_source
        withheld = at_host and ctx.user is None
        save_state(ctx, {"baseline": baseline, "withheld": withheld})
        # What a leaky sandbox would let the payload leave on the host, journalled before the
        # payload runs: a run killed before its cleanup leaves them to the next run's sweep.
        sweep.record(
            _leak_key(ctx),
            [d / f"{name}-{ctx.nonce}.{ext}" for d in self.leak_dirs(ctx) for name, ext in LEAKS],
        )
        allowed = info.hosts["allowed"]
        return {
            "decoy": {k: str(v) for k, v in decoy.items()},
            "sandbox": {"socket": route.proxy_socket, "shim": route.shim},
            # The payload attacks the sandbox paths only when its proxy is this URL.
            "shim_url": "" if withheld else f"http://127.0.0.1:{route.shim_port}",
            "allowed": f"{allowed.name}:{allowed.https_port}",
        }

    def leak_dirs(self, ctx: CellContext) -> list[Path]:
        """Every host directory the payload's tampering could have written into.

        The directories of the route as the sandbox shows it (read as host paths: a sandbox
        that shares the host's /run writes there) and of the real socket and shim. The decoy's
        is the payload's own on the open leg, so it is not among them.
        """
        route = _route(ctx)
        dirs = {
            Path(route.proxy_socket).parent,
            Path(route.shim).parent,
            Path(ctx.world.info.proxy.socket).parent,
            route.shim_source.parent,
        }
        decoy = self.decoy_paths(ctx)["socket"].parent
        return sorted(d for d in dirs if d != decoy)

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """After the run the proxy still serves other cells through its unix socket."""
        info = ctx.world.info
        nonce = new_control_nonce()
        allowed = info.hosts["allowed"]

        def get() -> dict[str, Any]:
            status, inner, body = _get_via_unix_proxy(
                info.proxy.socket, info.ca_bundle, allowed.name, allowed.https_port, nonce
            )
            return host_check(
                "proxy serves via its unix socket",
                status == 200 and inner == 200,
                f"CONNECT {status}, GET {inner}, {len(body)} bytes",
            )

        checks = [guarded_check("proxy serves via its unix socket", get)]
        records = wait_for_records(
            ctx.world, nonce, lambda r: bool(entries_with_nonce(r.origin, nonce))
        )
        hits = entries_with_nonce(records.origin, nonce)
        checks.append(
            host_check("origin logged the host's request", bool(hits), f"{len(hits)} hits")
        )
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any change to the decoy or the real socket/shim, seen from the host, is an escape."""
        del witness
        baseline = load_state(ctx).get("baseline", {})
        now: dict[str, Any] = {k: file_state(p) for k, p in self._watched(ctx).items()}
        now["decoy-dir"] = {"entries": dir_entries(self.decoy_paths(ctx)["socket"].parent)}
        changed = {k: d for k in now if (d := file_diff(baseline.get(k, {}), now[k]))}
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        state = load_state(ctx)
        # What the payload left on the host carries its nonce (rogue-<nonce>.sock,
        # shim-<nonce>.py): removed now, so no later cell or run meets it, and named.
        leaked = remove_nonce_files(self.leak_dirs(ctx), ctx.nonce)
        reasons = [_leak_reason(path) for path in leaked]
        if any(k.startswith("real-") for k in changed):
            reasons.append("the real egress route changed on the host")
        if changed:
            reasons.append("host sees: " + "; ".join(f"{k} {v}" for k, v in changed.items()))
        elif not leaked:
            reasons.append("decoy and real socket/shim unchanged on the host")
            reasons.append(refusal_summary(escapes))
        seen = bool(changed) or bool(leaked)
        escape = judge_escape(observed, seen, private_namespace_reason(report, "mnt"), reasons)
        if state.get("withheld") and escape != "escaped":
            reasons.append(
                "the in-sandbox route was not attacked: this backend shows it at the host's "
                "own paths and the payload runs as the harness's uid, so an attack could cut "
                "the route of every later cell; run as root so payloads get a uid of their own"
            )
            escape = "undecided"
        elif _sandbox_route_missed(report, escapes, reasons) and escape != "escaped":
            # The paths are the ones this backend says it uses (InsideRoute); a route not at
            # them was never attacked, so the refusals prove nothing.
            escape = "undecided"
        inside = attempts_by_role(report, "control")
        workspace_ops = [a for a in inside if str(a.get("what", "")).startswith("workspace:")]
        route_after = [a for a in inside if a.get("what") == "route-after"]
        inside_ok = all_succeeded(workspace_ops, 6) and all(
            a.get("outcome") == "succeeded" for a in route_after
        )
        return conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"inside control failed: {attempts_summary(inside)}",
            host_control=control,
            host_failed="the proxy no longer serves through its unix socket",
            witness={"baseline": baseline, "now": now, "changed": changed, "removed": leaked},
            controls={"inside": inside, "host": control},
        )

    def cleanup(self, ctx: CellContext) -> None:
        """Close the decoy; put back the real socket's mode and shim; remove nonce files.

        `assess` already removed (and named) what carried the nonce; a cell that never got
        there (an ERROR) is cleaned here all the same.
        """
        if ctx.route is not None:
            remove_nonce_files(self.leak_dirs(ctx), ctx.nonce)
        with contextlib.suppress(HarnessError):
            sweep.forget(_leak_key(ctx))
        held = self._held.pop(ctx.nonce, None)
        if held is not None:
            held[0].close()
            with contextlib.suppress(OSError):
                os.close(held[1])
        baseline = load_state(ctx).get("baseline", {})
        self._restore_real_shim(ctx, baseline.get("real-shim", {}))
        before = baseline.get("real-socket", {})
        real = Path(ctx.world.info.proxy.socket)
        after = file_state(real)
        # Only the harness's own socket, only the same inode, only back to its recorded mode.
        same = before.get("inode") is not None and after.get("inode") == before.get("inode")
        if same and before.get("mode") and after.get("mode") != before["mode"]:
            real.chmod(int(before["mode"], 8))

    def _restore_real_shim(self, ctx: CellContext, before: dict[str, Any]) -> None:
        """Rewrite the harness's shim from the bytes held since prepare if they no longer match.

        Only bytes whose hash is the recorded baseline's are written, and only by an atomic
        rename over the path (never through whatever a payload left there, a symlink say), so
        every later cell and run gets the shim the harness ships.
        """
        saved = self._shims.pop(ctx.nonce, None)
        want = before.get("sha256")
        if saved is None or want is None or hashlib.sha256(saved).hexdigest() != want:
            return
        real = _route(ctx).shim_source
        now = file_state(real)
        if now.get("kind") == "file" and (now.get("sha256"), now.get("mode")) == (
            want,
            before.get("mode"),
        ):
            return
        staged = real.with_name(f".shim-restore-{ctx.nonce}")
        staged.write_bytes(saved)
        staged.chmod(int(before.get("mode") or "0o644", 8))
        staged.replace(real)
