"""`ipc_proxy_socket_tamper`, host side: chmod, replace, unlink of the egress route's files.

The probe attacks the route the backend really uses (its `InsideRoute`) and a decoy of it in the
cell's scratch dir; the host watches the real socket and shim read-only. After the cell the
harness removes whatever carries the cell's nonce from every host path the payload could have
touched, and the evidence lists what it removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import ssl
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
from sandbox_attest.catalog.canary import dir_entries, file_diff, file_state
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
from sandbox_attest.catalog.socket_witness import remove_nonce_files
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    InsideRoute,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.errors import FixtureError, HarnessError
from sandbox_attest.host import journal as sweep
from sandbox_attest.host.trust import give
from sandbox_attest.verdict import Assessment, Expectation

# The names probes/ipc_proxy_socket_tamper.py gives what it plants beside the route's files.
LEAKS: Final = (("rogue", "sock"), ("shim", "py"))
# What probes/ipc_proxy_socket_tamper.py does to a socket and to a shim, in its own words.
TAMPER_OPS: Final = (
    "socket-chmod",
    "socket-replace",
    "socket-unlink",
    "shim-chmod",
    "shim-append",
    "shim-replace",
)


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

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied when confined to the workspace: the route's files are outside the grant."""
        return expect_fs_confined(declared)

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

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE under `network = "none"`: no egress route exists to tamper with.

        The probe attacks the route's socket and shim, then checks the route still carries
        an allowed request; a backend that claims no network has neither (Codex), and its
        claim is the net_* probes' to judge.
        """
        if claims_of(declared).network == "none":
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
