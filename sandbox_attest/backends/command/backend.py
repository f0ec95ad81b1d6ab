"""The command-wrapper backend: attest any third-party sandbox CLI described by a spec file.

The spec (`spec.py`, loaded by `spec_load.py`) says how to find the wrapper, the argv around the
payload, the files it needs per cell, how egress reaches the world and what it claims
to enforce. This module turns one `ProbeRequest` into that command line and runs it the way
real wrappers demand:

* a fresh working directory per cell (some wrappers fail at random when parallel runs share
  one), holding the files rendered for that cell;
* the wrapper in its own session, the whole group SIGKILLed at the deadline (some wrappers exit
  0 on SIGTERM, and a timeout is recorded by us, never inferred from their exit status);
* after every run, a sweep for anything the run started that is still alive (`leftovers.py`).

The wrapper starts with an environment like an agent's (`env.py`), and is AVAILABLE only once
a test command started under it (`check.py`).

The wrapper's exit status is never the probe's: the runner reads the start marker and the JSON
line, and a wrapper that refuses to start is an ERROR with its stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from sandbox_attest.backends.base import (
    SHIM_PORT,
    Availability,
    InsidePaths,
    ProbeRequest,
    ProbeRun,
    shim_path,
)
from sandbox_attest.backends.command.check import check_availability
from sandbox_attest.backends.command.env import WRAPPER_ENV_FILE, plant_canaries
from sandbox_attest.backends.command.leftovers import LeftoverWatcher
from sandbox_attest.backends.command.spec import (
    ALLOWED_ROLES,
    HOST_ROLES,
    RenderContext,
    json_list,
    payload_ids,
    sample_context,
    shell_join,
)
from sandbox_attest.backends.command.spec_load import load_spec
from sandbox_attest.backends.command.wrapper import SpecWrapper
from sandbox_attest.backends.process import run_process
from sandbox_attest.errors import BackendError
from sandbox_attest.host import cellgroup
from sandbox_attest.host.journal import record_leftovers
from sandbox_attest.host.trust import give
from sandbox_attest.payload import staged_shim_path
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX

if TYPE_CHECKING:
    from sandbox_attest.world.info import WorldInfo

# How long a cell's shim waits for 127.0.0.1:SHIM_PORT while another listener holds it. A
# wrapper that shares the harness's network namespace (a hole the probes FAIL) puts every
# cell's shim in one namespace: the port passes from cell to cell, and each payload, started
# only once its own shim listens, still reaches the proxy by the URL its task names. Under the
# 10 s a probe's deadline keeps below the cell's timeout (run/runner.py
# PROBE_DEADLINE_MARGIN_S), so a wait never turns into a killed cell.
SHIM_PORT_WAIT_S = 6.0
# One cell at a time holds 127.0.0.1:SHIM_PORT in the harness's own network namespace: taken by
# the cells of every harness-unix wrapper whose test command ran there, so that a long probe's
# shim never makes the next cell's wait run out (the wait stays for namespaces shared unseen).
_HARNESS_NET_SHIM_PORT = threading.Lock()


class CommandBackend(SpecWrapper):
    """A third-party sandbox CLI driven by a spec file."""

    # `{shim}` is the cell's staged copy (ProbeRequest.shim), wherever a spec shows it inside:
    # the runner watches that copy as the route's shim (sandbox_attest/run/runner.py inside_route).
    runs_staged_shim = True

    # Whether the availability check's test command ran in the harness's network namespace.
    shares_harness_network = False

    @classmethod
    def from_path(cls, path: Path) -> CommandBackend:
        """Load the spec at `path` (ConfigError naming the file, key and fix if invalid)."""
        return cls(load_spec(path))

    def inside_paths(self, world: WorldInfo, cell_dir: Path) -> InsidePaths | None:
        """Where this wrapper shows the payload the route: its spec's `[run] *_inside`.

        Rendered as the cell will render them (`context`): the world's paths, this cell's run
        dir and workspace; the rest of the placeholders take their sample values, which no
        sane inside path names. None under egress "own": no harness route is inside.
        """
        if self.egress_mode == "own":
            return None
        sample = sample_context()
        scalars = sample.scalars | {
            "proxy_socket": world.proxy.socket,
            # The copy the cell stages under a neutral name (`context`), the one really run.
            "shim": str(staged_shim_path(cell_dir)),
            "shim_port": str(SHIM_PORT),
            "world_dir": world.run_dir,
            "ca_bundle": world.ca_bundle,
            "run_dir": str(cell_dir / f"run-{self.name}"),
            "workspace": str(cell_dir / "workspace"),
            **self.spec.static_scalars(),
        }
        ctx = RenderContext(scalars, sample.lists, [])
        src = self.spec.source
        return InsidePaths(
            proxy_socket=ctx.render(
                self.spec.proxy_socket_inside, f"{src}: [run] proxy_socket_inside"
            ),
            shim=ctx.render(self.spec.shim_inside, f"{src}: [run] shim_inside"),
        )

    # -- availability ------------------------------------------------------------------

    def availability(self) -> Availability:
        """Find the wrapper on its PATH, run its check, then a test command under its argv.

        AVAILABLE means the test command started under the wrapper and reported what it
        saw; what it saw (a private network namespace or the harness's, seccomp, no new
        privileges) goes into the identity as facts, for the probes to judge.
        """
        avail = check_availability(self)
        facts = avail.identity.profile.get("test_command", {}) if avail.identity else {}
        self.shares_harness_network = facts.get("network_namespace") == "the harness's own"
        return avail

    def cell_lock(self) -> contextlib.AbstractContextManager[Any]:
        """What a cell holds while it runs: the harness namespace's shim port, if it needs it.

        A harness-unix wrapper whose test command ran in the harness's network namespace (a
        hole its net probes FAIL) puts each cell's shim on the same 127.0.0.1:SHIM_PORT, so its
        cells take turns; every other wrapper's cells run side by side.
        """
        if self.egress_mode == "shim" and self.shares_harness_network:
            return _HARNESS_NET_SHIM_PORT
        return contextlib.nullcontext()

    # -- rendering ---------------------------------------------------------------------

    def context(self, request: ProbeRequest, run_dir: Path) -> RenderContext:
        """Every placeholder's value for one cell."""
        world = request.world
        if world is None:
            raise BackendError(
                f"the {self.name} command backend renders fixture addresses "
                "and needs ProbeRequest.world; run it through the CellRunner"
            )
        proxy = urlsplit(world.proxy.url)
        scalars: dict[str, str] = {
            "workspace": str(request.workspace),
            "run_dir": str(run_dir),
            "cell_id": request.cell_id,
            "python": request.argv[0],
            "probe_argv": shell_join(list(request.argv)),
            "proxy_url": world.proxy.url,
            "proxy_host": proxy.hostname or "127.0.0.1",
            "proxy_port": str(world.proxy.port),
            "proxy_user": unquote(proxy.username or ""),
            "proxy_secret": unquote(proxy.password or ""),
            "proxy_socket": world.proxy.socket,
            # The cell's staged copy: the installed path names the harness (issue 23).
            "shim": str(request.shim or shim_path()),
            "shim_port": str(SHIM_PORT),
            "ca_bundle": world.ca_bundle,
            "dns_host": world.dns.host,
            "dns_port": str(world.dns.port),
            "world_dir": world.run_dir,
            "wrapper_home": str(self.wrapper_home(request)),
            **payload_ids(request.user),
            **self.spec.static_scalars(),
        }
        for role in HOST_ROLES:
            host = world.hosts[role]
            scalars |= {
                f"{role}_host": host.name,
                f"{role}_ip": host.address,
                f"{role}_https_port": str(host.https_port),
                f"{role}_http_port": str(host.http_port),
            }
        lists = _cell_lists(request, world)
        for name, values in lists.items():
            scalars[f"{name}_json"] = json_list(values)
            scalars[f"{name}_csv"] = ",".join(values)
        base = RenderContext(scalars, lists, [])
        scalars["proxy_socket_inside"] = base.render(
            self.spec.proxy_socket_inside, f"{self.spec.source}: [run] proxy_socket_inside"
        )
        scalars["shim_inside"] = base.render(
            self.spec.shim_inside, f"{self.spec.source}: [run] shim_inside"
        )
        payload = list(request.argv)
        if self.spec.egress == "harness-unix" and request.egress is not None:
            # The shim listens before it starts the payload, so the payload never races it; it
            # runs under the payload's own interpreter, which the wrapper must expose anyway.
            payload = [
                payload[0],
                scalars["shim_inside"],
                "--unix",
                scalars["proxy_socket_inside"],
                "--port",
                str(SHIM_PORT),
                "--wait-port",
                str(SHIM_PORT_WAIT_S),
                "--",
                *payload,
            ]
        scalars["payload_shell"] = shell_join(payload)
        return RenderContext(scalars, lists, payload).with_spec_lists(self.spec)

    def build_env(self, request: ProbeRequest, ctx: RenderContext) -> dict[str, str]:
        """The wrapper's environment for one cell, its canaries recorded in the cell dir."""
        canaries = plant_canaries()
        record = {"canaries": canaries, "wrapper_only": sorted(self.spec.env_wrapper)}
        target = request.cell_dir / WRAPPER_ENV_FILE
        # The harness's alone: the payload user must not read the values it is tested on.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(record, out)
        return self.wrapper_env(dict(request.env), ctx, canaries)

    def prepare(self, request: ProbeRequest) -> tuple[list[str], dict[str, str], Path, str]:
        """Make the cell's run dir, render its files; return (argv, env, cwd, token).

        The token is a per-cell random name (the leftover watcher's thread is named by it);
        it is in no environment.
        """
        run_dir = request.cell_dir / f"run-{self.name}"
        run_dir.mkdir(parents=True)  # fresh per cell: an existing one is a harness bug
        ctx = self.context(request, run_dir)
        self.render_files(ctx, run_dir)
        # The wrapper runs as the payload user: its cwd and the files rendered for it are its.
        give(run_dir, self.user(request), recursive=True)
        tag = secrets.token_hex(12)
        env = self.build_env(request, ctx)
        return ctx.render_argv(self.spec), env, self.cwd(ctx), tag

    # -- run ---------------------------------------------------------------------------

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run the payload under the wrapper; kill its group at the deadline, then sweep."""
        with self.cell_lock():
            return self._run(request)

    def _run(self, request: ProbeRequest) -> ProbeRun:
        argv, env, cwd, tag = self.prepare(request)
        # The cell's group: the rendezvous's where the runner opened one (the host reads the
        # same members), else one of its own for this run.
        with cellgroup.open_cell() as group:
            # What the spec says the wrapper runs ([detect] executables: srt's node and bwrap,
            # a helper proxy) is the sandbox's own; a member running one is a supervisor, not
            # the payload (anything that can run Python never is: cellgroup.pin_supervisor).
            for exe in self.spec.executables:
                group.pin_supervisor(
                    self.spec.render_static(exe, f"{self.spec.source}: [detect] executables"),
                    self.run_path(),
                )
            # The watcher must run *during* the run: a leftover that holds our stdout/stderr
            # pipes open would otherwise keep the output readers (and the run) from finishing.
            watcher = LeftoverWatcher(group, tag)
            watcher.start()
            try:
                run = run_process(
                    request.cell_id, argv, env, cwd, request.timeout, user=self.user(request)
                )
            finally:
                watcher.finish()
        # What the sweep had to kill is the sandbox's escape, not its credit: lifecycle_orphans
        # reads it from the cell dir (sandbox_attest/host/journal.py).
        record_leftovers(request.cell_dir, watcher.killed)
        if watcher.killed:
            run.notes.append(
                f"killed {len(watcher.killed)} process(es) the run left behind: "
                + "; ".join(watcher.killed.values())
            )
        if watcher.surviving:
            run.notes.append("STILL ALIVE after the sweep: " + "; ".join(watcher.surviving))
        return run


def _cell_lists(request: ProbeRequest, world: WorldInfo) -> dict[str, list[str]]:
    """The built-in lists of one cell: its read-only paths and env, the world's hosts."""
    denied_roles = [r for r in HOST_ROLES if r not in ALLOWED_ROLES]
    return {
        "read_only": [str(p) for p in request.read_only],
        "payload_env": [f"{k}={v}" for k, v in request.env.items()],
        "allowed_hosts": [world.hosts[r].name for r in ALLOWED_ROLES],
        "allowed_host_ports": _host_ports(world.hosts, ALLOWED_ROLES),
        # The whole allowlist as domain patterns, the suffix rule for the names a probe
        # plants (net_private_address) included: what a wrapper's own proxy must admit.
        "allowed_domains": [
            *_host_ports(world.hosts, ALLOWED_ROLES),
            f"*.{PRIVATE_NAME_SUFFIX}:{world.hosts['allowed'].https_port}",
            f"*.{PRIVATE_NAME_SUFFIX}:{world.hosts['allowed'].http_port}",
        ],
        "allowed_addresses": _addresses(world.hosts, ALLOWED_ROLES),
        "denied_hosts": [world.hosts[r].name for r in denied_roles],
        "denied_addresses": _addresses(world.hosts, denied_roles),
    }


def _host_ports(hosts: dict[str, Any], roles: list[str] | tuple[str, ...]) -> list[str]:
    """`name:port` for each role's HTTPS and HTTP port: the harness allowlist, by name."""
    out = []
    for role in roles:
        host = hosts[role]
        out += [f"{host.name}:{host.https_port}", f"{host.name}:{host.http_port}"]
    return out


def _addresses(hosts: dict[str, Any], roles: list[str] | tuple[str, ...]) -> list[str]:
    out = []
    for role in roles:
        host = hosts[role]
        out += [f"{host.address}:{host.https_port}", f"{host.address}:{host.http_port}"]
    return out
