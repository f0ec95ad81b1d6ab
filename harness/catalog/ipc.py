"""The unix-socket escape probe, host side: fake daemons on host sockets."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import socket
import ssl
from pathlib import Path
from typing import Any, Final

from harness.catalog.base import (
    DOCKER_SOCKETS,
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    InsideRoute,
    PolicyLike,
    WitnessRecordsLike,
    _all_succeeded,
    _attempts,
    _check,
    _conclude,
    _control,
    _control_nonce,
    _fs_confined,
    _guarded,
    _judge,
    _load_state,
    _observed,
    _private_namespace,
    _refusals,
    _save_state,
    _Spec,
    _summary,
    _wait_for,
    _with_nonce,
    attempts_of,
)
from harness.catalog.canary import (
    dir_entries,
    file_diff,
    file_state,
)
from harness.errors import FixtureError
from harness.trust import give
from harness.verdict import Assessment, Expectation

# What probes/ipc_proxy_socket_tamper.py does to a socket and to a shim, in its own words.
TAMPER_OPS: Final = (
    "socket-chmod",
    "socket-replace",
    "socket-unlink",
    "shim-chmod",
    "shim-append",
    "shim-replace",
)


class IpcUnixSocketEscape(_Spec):
    """GET /_ping on the host's fake daemon sockets (path and abstract) and the real Docker."""

    id = "ipc_unix_socket_escape"
    area = "ipc"

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The socketpair control, the daemon's sockets, and the Docker sockets that exist."""
        targets = task.get("targets") or {}
        abstract = ("daemon-abstract",) if targets.get("abstract") else ()
        docker = (f"docker:{path}" for path in targets.get("docker_sockets") or ())
        return AttemptTable(
            required=attempts_of("socketpair", "daemon-unix", *abstract),
            optional=attempts_of(*docker),
        )

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied when IPC is isolated; seen on the open control leg."""
        return "denied" if policy.ipc == "isolated" else "allowed"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The fake daemon's sockets and the real Docker socket paths to try."""
        daemon = ctx.world.info.daemon
        return {"unix": daemon.unix, "abstract": daemon.abstract, "docker_sockets": DOCKER_SOCKETS}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host gets /_ping from each fake daemon socket and each request is logged."""
        daemon, nonce = ctx.world.info.daemon, _control_nonce()
        sockets = {"unix": daemon.unix}
        if daemon.abstract:
            sockets["abstract"] = "\0" + daemon.abstract
        checks = [
            _guarded(f"host ping {kind}", functools.partial(_host_ping, kind, address, nonce))
            for kind, address in sockets.items()
        ]
        records = _wait_for(
            ctx.world,
            nonce,
            lambda r: {e.get("socket") for e in _with_nonce(r.daemon, nonce)} >= set(sockets),
        )
        logged = {e.get("socket") for e in _with_nonce(records.daemon, nonce)}
        checks.extend(
            _check(f"daemon logged host {kind}", kind in logged, ",".join(sorted(map(str, logged))))
            for kind in sockets
        )
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A daemon request with the nonce, or a real Docker answer, is an escape."""
        escapes = _attempts(report, "escape")
        harness_attempts = [a for a in escapes if not a.get("real_docker")]
        docker = [a for a in escapes if a.get("real_docker")]
        docker_answered = [a for a in docker if a.get("outcome") == "succeeded"]
        observed = _observed(escapes)
        hits = _with_nonce(witness.daemon, ctx.nonce)
        reasons = [
            f"fake daemon logged {len(hits)} requests with the nonce",
            f"payload: {_summary(escapes)}",
        ]
        if docker_answered:
            reasons.append(
                "the real docker socket answered /_ping inside "
                "(payload-side evidence: no host witness for the real docker socket)"
            )
        private = _private_namespace(report, "net") or _private_namespace(report, "mnt")
        escape = _judge(_observed(harness_attempts), bool(hits), private, reasons)
        # The real daemon has no host witness, so its answer counts only against a sandbox
        # that must deny it. On the control leg it must not stand in for the fake daemon's
        # hits: that leg vouches that this probe's witness can see an escape at all.
        if docker_answered and self.expectation(ctx.policy) == "denied":
            escape = "escaped"
        controls = _attempts(report, "control")
        inside_ok = _all_succeeded(controls)
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"in-sandbox control failed: {_summary(controls)}",
            host_control=control,
            host_failed="host control failed",
            witness={"daemon": hits, "real_docker_payload_only": docker},
            controls={"inside": controls, "host": control},
        )


def _host_ping(kind: str, address: str, nonce: str) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(HOST_TIMEOUT_S)
        sock.connect(address)
        sock.sendall(
            f"GET /_ping?nonce={nonce} HTTP/1.1\r\nHost: docker\r\n"
            f"X-Attest-Nonce: {nonce}\r\nConnection: close\r\n\r\n".encode()
        )
        line = sock.recv(1024).split(b"\r\n", 1)[0].decode("latin-1")
    return _check(f"host ping {kind}", " 200 " in f"{line} ", line)


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
            "route=InsideRoute(...) as harness.runner does"
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


class IpcProxySocketTamper(_Spec):
    """chmod / replace / unlink of the egress route's socket and shim.

    Safety: the payload is never given the host path of the real proxy socket or shim. It gets
    (1) a decoy socket and shim copy planted in this cell's scratch dir, the stand-in for the
    host side of the route, tampered on every leg (on the open leg it is all the payload may
    touch, and it belongs to the payload user there); and (2) the in-sandbox mount paths,
    which it tries only when the task's proxy URL is the in-sandbox shim's, i.e. the route is
    a bound socket inside a mount namespace. The real socket and shim are watched from the
    host, read-only.
    """

    id = "ipc_proxy_socket_tamper"
    area = "ipc"

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
        return _fs_confined(policy)

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
        _save_state(ctx, {"baseline": baseline})
        route = _route(ctx)
        allowed = ctx.world.info.hosts["allowed"]
        return {
            "decoy": {k: str(v) for k, v in decoy.items()},
            "sandbox": {"socket": route.proxy_socket, "shim": route.shim},
            "shim_url": f"http://127.0.0.1:{route.shim_port}",
            "allowed": f"{allowed.name}:{allowed.https_port}",
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """After the run the proxy still serves other cells through its unix socket."""
        info = ctx.world.info
        nonce = _control_nonce()
        allowed = info.hosts["allowed"]

        def get() -> dict[str, Any]:
            status, inner, body = _get_via_unix_proxy(
                info.proxy.socket, info.ca_bundle, allowed.name, allowed.https_port, nonce
            )
            return _check(
                "proxy serves via its unix socket",
                status == 200 and inner == 200,
                f"CONNECT {status}, GET {inner}, {len(body)} bytes",
            )

        checks = [_guarded("proxy serves via its unix socket", get)]
        records = _wait_for(ctx.world, nonce, lambda r: bool(_with_nonce(r.origin, nonce)))
        hits = _with_nonce(records.origin, nonce)
        checks.append(_check("origin logged the host's request", bool(hits), f"{len(hits)} hits"))
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any change to the decoy or the real socket/shim, seen from the host, is an escape."""
        del witness
        baseline = _load_state(ctx).get("baseline", {})
        now: dict[str, Any] = {k: file_state(p) for k, p in self._watched(ctx).items()}
        now["decoy-dir"] = {"entries": dir_entries(self.decoy_paths(ctx)["socket"].parent)}
        changed = {k: d for k in now if (d := file_diff(baseline.get(k, {}), now[k]))}
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        reasons = []
        if any(k.startswith("real-") for k in changed):
            reasons.append("the real egress route changed on the host")
        if changed:
            reasons.append("host sees: " + "; ".join(f"{k} {v}" for k, v in changed.items()))
        else:
            reasons.append("decoy and real socket/shim unchanged on the host")
            reasons.append(_refusals(escapes))
        escape = _judge(observed, bool(changed), _private_namespace(report, "mnt"), reasons)
        if _sandbox_route_missed(report, escapes, reasons) and escape != "escaped":
            # The paths are bubblewrap's and docker's mount points; a wrapper that shows the
            # route elsewhere never had its route attacked, so its refusals prove nothing.
            escape = "undecided"
        inside = _attempts(report, "control")
        workspace_ops = [a for a in inside if str(a.get("what", "")).startswith("workspace:")]
        route_after = [a for a in inside if a.get("what") == "route-after"]
        inside_ok = _all_succeeded(workspace_ops, 6) and all(
            a.get("outcome") == "succeeded" for a in route_after
        )
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"inside control failed: {_summary(inside)}",
            host_control=control,
            host_failed="the proxy no longer serves through its unix socket",
            witness={"baseline": baseline, "now": now, "changed": changed},
            controls={"inside": inside, "host": control},
        )

    def cleanup(self, ctx: CellContext) -> None:
        """Close the decoy listener; put back the real socket's mode and the real shim."""
        held = self._held.pop(ctx.nonce, None)
        if held is not None:
            held[0].close()
            with contextlib.suppress(OSError):
                os.close(held[1])
        baseline = _load_state(ctx).get("baseline", {})
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
