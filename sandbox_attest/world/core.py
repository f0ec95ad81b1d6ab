"""The world, started and stopped as one unit, and `sandbox-attest serve`.

`start_world(run_dir)` brings up, in order: the PKI, the DNS fixture, the origins, the
direct-egress listener, the fake daemons, the canary wheel (published on the index and files
hosts) and the egress proxy. Everything it writes stays under `run_dir`. If a step fails,
whatever already started is stopped and the `FixtureError` names the step.

`World.records(nonce)` is the witness side of a cell: every fixture log filtered to one nonce.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise
from sandbox_attest.host.trust import payload_user, require_reachable
from sandbox_attest.paths import fixtures_dir
from sandbox_attest.world.blob import load_blob_spec
from sandbox_attest.world.dns import DnsFixture, resolve
from sandbox_attest.world.egress.rules import Rule
from sandbox_attest.world.faults import FaultHook, fault_dir
from sandbox_attest.world.info import (
    PROBE_NAME_SUFFIX,
    BlobInfo,
    DaemonInfo,
    DirectEgressInfo,
    DnsInfo,
    IndexInfo,
    ProxyInfo,
    WorldInfo,
)
from sandbox_attest.world.lab import (
    DNS_ADDRESS,
    INTERNET_NET,
    INTERNET_NET6,
    ORIGIN_ADDRESS,
    ORIGIN_ADDRESS6,
    WITNESS_ADDRESS,
    Lab,
    LabError,
    WorldMode,
    ensure_lab,
)
from sandbox_attest.world.listeners import LOOPBACK, DirectEgressListener, FakeDaemon
from sandbox_attest.world.origins import Origins, load_hosts
from sandbox_attest.world.pki import Pki
from sandbox_attest.world.wheel import build_canary_wheel, load_canary_metadata

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import FrameType

    from sandbox_attest.world.blob import BlobSpec
    from sandbox_attest.world.egress.config import ProxyConfig
    from sandbox_attest.world.egress.proxy import ProxyProcess
    from sandbox_attest.world.origins import FixtureHost

# The roles the proxy admits, with exactly their origin ports. `denied` has no rule on purpose:
# every request to it must end in the proxy's 403.
_ALLOWED_ROLES = ("allowed", "index", "files")
# Names below this zone pass the allowlist (on the allowed origin's ports) WITHOUT
# allow_private, and nothing answers for them until a probe plants an answer with
# `world.dns.set_answers` (net_private_address plants loopback/link-local/private addresses):
# the proxy must refuse each one after resolving it and before dialing.
PRIVATE_NAME_SUFFIX = "private.test"
_UNIX_PATH_MAX = 103  # sun_path is 104 bytes on macOS, 108 on Linux, NUL included
# How long a health probe waits for the DNS fixture or an origin: they answer on the same
# machine in milliseconds, so seconds mean a hung fixture, not a slow one.
HEALTH_TIMEOUT_S = 2.0


@dataclass
class WitnessRecords:
    """Every fixture log filtered to one nonce: what the host saw of one cell."""

    origin: list[dict[str, Any]]
    dns: list[dict[str, Any]]
    proxy: list[dict[str, Any]]
    direct_tcp: list[dict[str, Any]]
    direct_udp: list[dict[str, Any]]
    daemon: list[dict[str, Any]]

    def is_empty(self) -> bool:
        """Whether no witness saw anything carrying the nonce."""
        return not any(
            (self.origin, self.dns, self.proxy, self.direct_tcp, self.direct_udp, self.daemon)
        )


@dataclass
class World:
    """The running world. No public constructor: get one from `start_world`.

    Use as a context manager (stops on exit) or call `stop()`, which is idempotent.
    """

    info: WorldInfo
    pki: Pki
    dns: DnsFixture
    proxy: ProxyProcess
    origins: Origins
    listener: DirectEgressListener
    daemons: tuple[FakeDaemon, ...]
    wheel: Path
    _stop_stack: contextlib.ExitStack = field(repr=False)
    # In the lab: the host side's own witness (its lab address and loopback), beside
    # `listener` on the internet side; the same ports, so one target names both.
    extra_listeners: tuple[DirectEgressListener, ...] = ()
    lab: Lab | None = None
    _stopped: bool = field(default=False, repr=False)
    # The first fault `check_health` found: a fixture that died stays dead for the run, and
    # every later cell is told which one and when (not a fresh guess per cell).
    _fault: str | None = field(default=None, repr=False)
    _health_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # When the last check that found every fixture up began (`time.monotonic()`), if any.
    _up_at: float | None = field(default=None, repr=False)

    def __enter__(self) -> Self:
        """Return the (already running) world."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the world."""
        self.stop()

    def records(self, nonce: str) -> WitnessRecords:
        """Every fixture log filtered to `nonce`.

        Origins, proxy and daemons match their `nonce` field exactly; DNS matches when the
        nonce appears in the queried name (case-insensitively: DNS names are); the
        listeners match when the nonce's bytes appear in what they received.
        """
        # Witness logs of a dead fixture are silent, and silence reads as "no escape". The
        # fixtures were found up after the payload ended (the runner's check_health with
        # `since`), and a fixture that dies stays dead, so what they logged for the run is
        # whole; here a fault already found still stops the read. A host control's own
        # requests, read after that check, are its control's to find (they must be logged).
        self.check_health(since=ANY_CHECK)
        lowered = nonce.lower()
        direct = self.listener.records_with(nonce)
        for extra in self.extra_listeners:
            more = extra.records_with(nonce)
            direct = {kind: [*direct[kind], *more[kind]] for kind in ("tcp", "udp")}
        return WitnessRecords(
            origin=self.origins.records(nonce),
            dns=[q for q in self.dns.queries() if lowered in str(q.get("name", "")).lower()],
            proxy=[d for d in self.proxy.decisions() if d.get("nonce") == nonce],
            direct_tcp=direct["tcp"],
            direct_udp=direct["udp"],
            daemon=sorted(
                (r for d in self.daemons for r in d.records(nonce)), key=lambda r: r["time"]
            ),
        )

    def problems(self, timeout: float = HEALTH_TIMEOUT_S) -> list[str]:
        """What is wrong with the world's fixtures right now, one phrase each with its fix.

        1. the egress proxy process has exited (its decision log is the witness of every
           proxied attempt);
        2. the DNS fixture is stopped, or does not answer a query for a fixture host;
        3. an origin stopped accepting, or accepts and never answers `HEAD /`;
        4. a direct-egress listener or a fake daemon's thread ended.

        Probing costs a DNS query and one HTTP request per origin, none carrying a nonce, so
        no cell's witness sees them. Empty: every witness is up.
        """
        found = []
        code = self.proxy.exit_status()
        if code is not None:
            how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit {code}"
            found.append(
                f"the egress proxy (pid {self.proxy.pid}) died ({how}, exit {code}); its stderr "
                f"ends {self.proxy.stderr_tail(300)!r}; find who killed it (an OOM kill is in "
                "the kernel log) and rerun"
            )
        why = self.dns.not_serving()
        if why is None:
            try:
                resolve((self.dns.host, self.dns.port), self.origins.hosts[0].name, timeout)
            except FixtureError as exc:
                why = f"does not answer ({exc})"
        if why is not None:
            found.append(f"the DNS fixture ({self.dns.host}:{self.dns.port}) {why}; rerun")
        found += [f"the {p}; rerun" for p in self.origins.not_serving(timeout)]
        for listener in (self.listener, *self.extra_listeners):
            if not listener.is_serving():
                found.append(
                    f"the direct-egress listener (port {listener.tcp_port}) stopped; rerun"
                )
        found += [
            f"the fake daemon at {daemon.address} stopped; rerun"
            for daemon in self.daemons
            if not daemon.is_serving()
        ]
        return found

    def check_health(self, since: float | None = None) -> None:
        """Raise if a fixture is dead: a cell judged against a dead witness could PASS falsely.

        The first fault found is kept for the rest of the run: later cells name the same
        fixture and when it was found, without probing again.

        Args:
            since: a `time.monotonic()` instant (a payload's end). A check that began at or
                after it and found every fixture up is enough, without probing again: a
                fixture that dies stays dead (its fault is kept), so that check shows them up
                all the way to `since`. None: probe now.

        Raises:
            FixtureError: naming each dead fixture, what it was, and the fix.
        """
        with self._health_lock:
            fresh = since is not None and self._up_at is not None and self._up_at >= since
            if self._fault is None and not self._stopped and not fresh:
                began = time.monotonic()
                problems = self.problems()
                if not problems:
                    self._up_at = began
                else:
                    when = time.strftime("%H:%M:%S", time.gmtime())
                    self._fault = (
                        f"a fixture of the world failed (found {when} UTC): "
                        + "; and ".join(problems)
                        + "; a dead witness logs nothing, and nothing must not read as "
                        "'no escape', so no cell is judged from then on"
                    )
            fault = self._fault
        if fault is not None:
            raise FixtureError(fault)

    def stop(self) -> None:
        """Stop everything in reverse start order; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_stack.close()


# `check_health(since=...)` that any check which found the fixtures up satisfies.
ANY_CHECK: float = float("-inf")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > _UNIX_PATH_MAX:
        raise FixtureError(
            f"unix socket path {str(path)!r} is longer than {_UNIX_PATH_MAX} bytes; "
            "pass a shorter run directory (e.g. under /tmp)"
        )


def _socket_dir(path: Path) -> None:
    """Check `path` fits AF_UNIX and make its own directory, traversable but not listable."""
    _check_socket_path(path)
    path.parent.mkdir(exist_ok=True)
    path.parent.chmod(0o711)


def _unlink_quietly(path: Path) -> Callable[[], None]:
    def unlink() -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    return unlink


def _world_info(
    *,
    run_dir: Path,
    pki: Pki,
    dns: DnsFixture,
    proxy: ProxyProcess,
    origins: Origins,
    listener: DirectEgressListener,
    daemons: list[FakeDaemon],
    wheel_nonce: str,
    lab: Lab | None,
) -> WorldInfo:
    """Fill `WorldInfo` from the running parts."""
    if proxy.url is None or proxy.port is None or proxy.socket is None:
        raise FixtureError("the egress proxy must listen on both its unix socket and TCP")
    meta = load_canary_metadata(fixtures_dir() / "canary_wheel")
    witness = WITNESS_ADDRESS if lab is not None else LOOPBACK
    blob = origins.blob
    published = origins.published_wheels()[0]
    index_base = origins.base_url("index")
    denied_base = origins.base_url("denied")
    unix = next(d for d in daemons if d.path is not None)
    abstract = next((d.abstract for d in daemons if d.abstract is not None), None)
    return WorldInfo(
        proxy=ProxyInfo(url=proxy.url, socket=str(proxy.socket), port=proxy.port),
        ca_bundle=str(pki.ca_bundle),
        dns=DnsInfo(host=dns.host, port=dns.port),
        hosts={h.key: origins.host_info(h.key) for h in origins.hosts},
        blob=BlobInfo(
            url=f"{origins.base_url('allowed')}/blob", size=blob.size, sha256=blob.sha256
        ),
        index=IndexInfo(
            url_template=f"{index_base}/c/{{nonce}}/simple/",
            denied_url_template=f"{denied_base}/c/{{nonce}}/simple/",
            package=meta.name,
            module=meta.wheel_stem,
            version=meta.version,
            wheel_nonce=wheel_nonce,
        ),
        direct_egress=DirectEgressInfo(
            tcp=f"{witness}:{listener.tcp_port}", udp=f"{witness}:{listener.udp_port}"
        ),
        daemon=DaemonInfo(unix=str(unix.path), abstract=abstract),
        run_dir=str(run_dir),
        extra={
            "wheel": {"filename": published.filename, "sha256": published.sha256},
            "world": lab.facts() if lab is not None else {"kind": "loopback"},
            # Every address a sandbox could dial toward the world (net_direct_egress tries
            # each at the witness ports): the lab's, or the loopback one.
            "lab_addresses": lab.addresses() if lab is not None else [],
        },
    )


def _start_daemons(path: Path, stack: contextlib.ExitStack) -> list[FakeDaemon]:
    """The fake daemons on a socket path and (Linux) an abstract name, stopped by `stack`."""
    daemons: list[FakeDaemon] = [FakeDaemon(path=path)]
    if sys.platform.startswith("linux"):
        daemons.append(
            FakeDaemon(abstract=f"{disguise.DAEMON_ABSTRACT_PREFIX}{secrets.token_hex(8)}")
        )
    for daemon in daemons:
        daemon.start()
        stack.callback(daemon.stop)
        if daemon.path is not None:
            # A real daemon's socket is reachable by ordinary users (docker.sock by its
            # group): the unconfined payload user must reach this one, or the control leg
            # proves nothing about ipc_unix_socket_escape.
            daemon.path.chmod(0o666)
    return daemons


def _start_listeners(
    lab: Lab | None, stack: contextlib.ExitStack
) -> tuple[DirectEgressListener, tuple[DirectEgressListener, ...]]:
    """The direct-egress witnesses: on loopback, or on every address of both lab sides.

    In the lab one listener answers every internet-side address (origins, DNS, witness, the
    veth peer) and another, on the same ports, every host-side one (its lab address and its
    loopback): a sandbox that reaches any of them, by whatever address it picked, is seen.
    """
    if lab is None:
        listener = DirectEgressListener(LOOPBACK)
        listener.start()
        stack.callback(listener.stop)
        return listener, ()
    every = "::" if lab.ipv6 else "0.0.0.0"
    internet = DirectEgressListener(every)
    with lab.internet():
        internet.start()
    stack.callback(internet.stop)
    host_side = DirectEgressListener(every, tcp_port=internet.tcp_port, udp_port=internet.udp_port)
    host_side.start()
    stack.callback(host_side.stop)
    return internet, (host_side,)


def _proxy_config(
    origins: Origins, dns: DnsFixture, proxy_sock: Path, run_dir: Path, lab: Lab | None
) -> ProxyConfig:
    """The allowlist and resolver of the world's proxy.

    On loopback the fixture origins need a carve-out (`allow_private`); in the lab they are
    remote hosts, and the proxy's address rules apply as they would in production.
    """
    from sandbox_attest.world.egress.config import ProxyConfig  # noqa: PLC0415  (see _start_proxy)

    rules = (
        *(
            Rule(
                host=origins.host_info(role).name,
                ports=(origins.port(role, "https"), origins.port(role, "http")),
                allow_private=lab is None,
            )
            for role in _ALLOWED_ROLES
        ),
        Rule(
            host=PRIVATE_NAME_SUFFIX,
            suffix=True,
            ports=(origins.port("allowed", "https"), origins.port("allowed", "http")),
            allow_private=False,  # the point: a non-global answer must be refused
        ),
    )
    return ProxyConfig(
        rules=rules,
        dns=(dns.host, dns.port),
        unix_socket=proxy_sock,
        tcp=True,
        decision_log=run_dir / "proxy-decisions.jsonl",
        remote_networks=(INTERNET_NET, INTERNET_NET6) if lab is not None else (),
        lab_namespaces=(lab.host_netns,) if lab is not None else (),
    )


def _start_fault_hook(dns: DnsFixture, origins: Origins, stack: contextlib.ExitStack) -> None:
    """Watch for a test's fault triggers; inert unless a test set the variable (faults.py)."""
    directory = fault_dir()
    if directory is None:
        return
    hook = FaultHook(
        directory,
        {
            "dns-stop": dns.stop,
            "origins-stop-accepting": origins.stop_accepting,
            "origins-stop-answering": origins.stop_answering,
        },
    )
    hook.start()
    stack.callback(hook.stop)


def _prepare_run_dir(run_dir: Path) -> tuple[Path, Path]:
    """Make `run_dir` and a directory per socket in it; return the proxy's and daemon's paths."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # Traversable, not listable, and writable only by the harness: the payload user (who
    # runs every sandboxed command) must open the CA bundle and connect to the sockets by
    # their names, and must never rename or replace a witness log.
    run_dir.chmod(0o711)
    require_reachable(run_dir, payload_user(), "the world's run directory")
    # Each socket in a directory of its own: a wrapper that binds "the egress socket's
    # directory" must get the egress socket, never the fake daemon (a host daemon to the
    # probes) or the CA bundle's neighbours with it. Traversable, not listable, as above.
    proxy_sock = run_dir / "egress" / "proxy.sock"
    daemon_sock = run_dir / "daemons" / "daemon.sock"
    for path in (proxy_sock, daemon_sock):
        _socket_dir(path)
    return proxy_sock, daemon_sock


def _start_dns(
    hosts: Sequence[FixtureHost], address: str, lab: Lab | None, stack: contextlib.ExitStack
) -> DnsFixture:
    """The DNS fixture answering every fixture host with `address`, stopped by `stack`."""
    dns = DnsFixture(
        records={h.name: address for h in hosts},
        wildcard={PROBE_NAME_SUFFIX: address},
        host=DNS_ADDRESS if lab is not None else LOOPBACK,
        # The system resolver (the lab's resolv.conf) can only name port 53.
        port=53 if lab is not None else 0,
    )
    with _on_internet_side(lab):
        dns.start()
    stack.callback(dns.stop)
    return dns


def _start_origins(
    pki: Pki,
    hosts: Sequence[FixtureHost],
    blob: BlobSpec,
    address: str,
    lab: Lab | None,
    stack: contextlib.ExitStack,
) -> Origins:
    """The HTTPS/HTTP fixture hosts on `address`, stopped by `stack`."""
    origins = Origins(pki, hosts, blob=blob, address=address)
    with _on_internet_side(lab):
        origins.start()
    stack.callback(origins.stop)
    return origins


def _on_internet_side(lab: Lab | None) -> contextlib.AbstractContextManager[None]:
    """Where a fixture host binds: in the lab, its internet side; without one, right here."""
    return lab.internet() if lab is not None else contextlib.nullcontext()


def _publish_canary_wheel(run_dir: Path, origins: Origins) -> tuple[str, Path]:
    """Build the canary wheel with a fresh nonce and publish it; returns (nonce, wheel)."""
    wheel_nonce = f"w{secrets.token_hex(8)}"
    wheel = build_canary_wheel(fixtures_dir() / "canary_wheel", run_dir / "wheels", wheel_nonce)
    origins.publish_wheel(wheel)
    return wheel_nonce, wheel


def _start_proxy(
    config: ProxyConfig, proxy_sock: Path, stack: contextlib.ExitStack
) -> ProxyProcess:
    """The world's egress proxy, stopped by `stack` (its socket removed after)."""
    # Imported here: world.egress.proxy is loaded lazily by its package (it also runs as
    # its own process), and a world is the only thing that needs it.
    from sandbox_attest.world.egress.proxy import start_proxy  # noqa: PLC0415

    proxy = start_proxy(config)
    stack.callback(_unlink_quietly(proxy_sock))
    stack.callback(proxy.stop)
    return proxy


def start_world(run_dir: Path, lab: Lab | None = None) -> World:
    """Start the whole world with its files under `run_dir`.

    Args:
        run_dir: a directory for the CA bundle, the wheel, the proxy's decision log, the
            proxy's socket (in `egress/`) and the fake daemon's (in `daemons/`) (created if
            missing; keep its path short, unix socket paths are limited to ~100 bytes).
        lab: the lab this process entered (`sandbox_attest.world.lab.enter_lab`): the fixture hosts
        then
            live on its internet side. None: the loopback world.

    Returns:
        The running `World`; stop it with `stop()` or a `with` block.

    Raises:
        FixtureError: a step failed; the message names it, and nothing is left running.
    """
    run_dir = run_dir.resolve()
    stack = contextlib.ExitStack()
    step = "run directory"
    try:
        proxy_sock, daemon_sock = _prepare_run_dir(run_dir)
        hosts = load_hosts()
        blob = load_blob_spec()
        # In the lab the fixture hosts live on the internet side: bound there, on addresses
        # the lab assigned; without one, on loopback as before.
        address = ORIGIN_ADDRESS if lab is not None else LOOPBACK
        step = "pki"
        extra = (ORIGIN_ADDRESS, ORIGIN_ADDRESS6) if lab is not None else ()
        pki = Pki.create(run_dir, [h.name for h in hosts], extra_identities=extra)
        step = "dns"
        dns = _start_dns(hosts, address, lab, stack)
        step = "origins"
        origins = _start_origins(pki, hosts, blob, address, lab, stack)
        step = "direct-egress listener"
        listener, extra_listeners = _start_listeners(lab, stack)
        step = "fake daemons"
        daemons = _start_daemons(daemon_sock, stack)
        step = "canary wheel"
        wheel_nonce, wheel = _publish_canary_wheel(run_dir, origins)
        step = "egress proxy"
        config = _proxy_config(origins, dns, proxy_sock, run_dir, lab)
        proxy = _start_proxy(config, proxy_sock, stack)
        step = "test fault hook"
        _start_fault_hook(dns, origins, stack)
        step = "world info"
        info = _world_info(
            run_dir=run_dir,
            pki=pki,
            dns=dns,
            proxy=proxy,
            origins=origins,
            listener=listener,
            daemons=daemons,
            wheel_nonce=wheel_nonce,
            lab=lab,
        )
    except BaseException as exc:
        stack.close()
        if isinstance(exc, Exception):
            raise FixtureError(f"the world failed to start at step {step!r}: {exc}") from exc
        raise
    return World(
        info=info,
        pki=pki,
        dns=dns,
        proxy=proxy,
        origins=origins,
        listener=listener,
        daemons=tuple(daemons),
        wheel=wheel,
        _stop_stack=stack,
        extra_listeners=extra_listeners,
        lab=lab,
    )


def serve(run_dir: Path | None, world: WorldMode = "auto") -> int:
    """Run the world until SIGINT/SIGTERM: `sandbox-attest serve`.

    Prints `WorldInfo` as one JSON line on stdout (it contains the proxy secret), then blocks.
    Without `run_dir`, a temporary directory is used and removed at exit. In the lab the
    fixture hosts are reachable only from inside it: the line's `extra.serve_pid` names
    this process, so `nsenter --target PID --net --mount curl ...` talks to them.

    Returns:
        0 after a clean stop, 1 if the world could not start (the reason is on stderr).
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001  (signal API)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    own_dir = run_dir is None
    directory = Path(tempfile.mkdtemp(prefix="sa-world-")) if run_dir is None else run_dir
    try:
        try:
            running = start_world(directory, lab=ensure_lab(world))
        except (FixtureError, LabError) as exc:
            print(exc.diagnostics(), file=sys.stderr)
            return 1
        with running:
            described = running.info.to_json_dict()
            described.setdefault("extra", {})["serve_pid"] = os.getpid()
            print(json.dumps(described), flush=True)
            while not stop.wait(1.0):
                pass
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
