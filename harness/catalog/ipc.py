"""The unix-socket escape probe, host side: fake daemons on host sockets."""

from __future__ import annotations

import functools
import socket
from typing import TYPE_CHECKING, Any

from harness.catalog.base import _all_succeeded
from harness.verdict import Assessment, Expectation

if TYPE_CHECKING:
    from harness.backends.base import DeclaredPolicy
from harness.catalog.base import (
    DOCKER_SOCKETS,
    HOST_TIMEOUT_S,
    CellContext,
    WitnessRecordsLike,
    _attempts,
    _check,
    _conclude,
    _control,
    _control_nonce,
    _guarded,
    _judge,
    _observed,
    _private_namespace,
    _Spec,
    _summary,
    _wait_for,
    _with_nonce,
)


class IpcUnixSocketEscape(_Spec):
    """GET /_ping on the host's fake daemon sockets (path and abstract) and the real Docker."""

    id = "ipc_unix_socket_escape"
    area = "ipc"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
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
