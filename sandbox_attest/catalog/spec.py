"""What a probe's host side is.

The ProbeSpec protocol with every hook the runner calls, the cell context it is handed, and
SpecBase's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from sandbox_attest.claims import claims_of, unclaimed
from sandbox_attest.errors import FixtureError
from sandbox_attest.host.trust import PayloadUser
from sandbox_attest.paths import probes_dir
from sandbox_attest.verdict import Assessment, Expectation

if TYPE_CHECKING:
    from sandbox_attest.world.info import WorldInfo


HOST_TIMEOUT_S = 10.0


DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


class WitnessRecordsLike(Protocol):
    """The shape of `sandbox_attest.world.WitnessRecords`: fixture log entries for one nonce."""

    @property
    def origin(self) -> list[dict[str, Any]]:
        """Origin access-log entries (`host`, `path`, `status`, `bytes_sent`, `complete`...)."""
        ...

    @property
    def dns(self) -> list[dict[str, Any]]:
        """DNS fixture queries (`name`, `qtype`, `transport`)."""
        ...

    @property
    def proxy(self) -> list[dict[str, Any]]:
        """Proxy decisions (`decision`, `status`, `host`, `port`, `reason`, `nonce`)."""
        ...

    @property
    def direct_tcp(self) -> list[dict[str, Any]]:
        """Direct-egress TCP connections (`peer`, `data`)."""
        ...

    @property
    def direct_udp(self) -> list[dict[str, Any]]:
        """Direct-egress UDP datagrams (`peer`, `data`)."""
        ...

    @property
    def daemon(self) -> list[dict[str, Any]]:
        """Fake daemon requests (`socket`, `request_line`, `nonce`)."""
        ...


class ClaimsLike(Protocol):
    """The shape of `sandbox_attest.backends.base.DeclaredClaims`: the claim a verdict holds to.

    A protocol, not the class, so that the catalogue never imports the backends: the
    backends sit beside the catalogue, and only the runner, above both, joins them.
    """

    @property
    def network(self) -> str:
        """The network claim: open, proxy or none."""
        ...

    @property
    def filesystem(self) -> str:
        """The filesystem claim: open or workspace."""
        ...

    @property
    def ipc(self) -> str:
        """The ipc claim: open or isolated."""
        ...

    @property
    def limits(self) -> tuple[tuple[str, int], ...]:
        """The resource limits claimed, as (name, value) pairs; empty: none claimed."""
        ...


@dataclass(frozen=True)
class InsideRoute:
    """Where the sandbox's end of the egress route sits, as the backends lay it out.

    The runner fills it from `sandbox_attest.backends.base`; the catalogue reads it from the cell
    instead of importing the backends.

    Attributes:
        proxy_socket: the proxy's unix socket as a namespaced sandbox sees it.
        shim: the shim script as a namespaced sandbox sees it.
        shim_port: the loopback port the shim listens on inside.
        shim_source: the host path of the shim script every backend mounts.
    """

    proxy_socket: str
    shim: str
    shim_port: int
    shim_source: Path


class WorldLike(Protocol):
    """The shape of a running `sandbox_attest.world.World` that the specs rely on."""

    @property
    def info(self) -> WorldInfo:
        """Where every fixture listens (with the proxy secret)."""
        ...

    def records(self, nonce: str) -> WitnessRecordsLike:
        """Every fixture log's entries attributed to `nonce`."""
        ...


@dataclass(frozen=True)
class CellContext:
    """One matrix cell as the spec sees it.

    Attributes:
        probe: the probe id.
        backend: the backend name.
        nonce: the per-cell nonce the payload tags everything with.
        world: the running world.
        workspace: host path of the cell's workspace (empty dir, created by the runner).
        cell_dir: host-only scratch for this cell; canaries are planted below it.
        claims: the backend's declared confinement.
        host_view: the host's readings of the payload process (see sandbox_attest/run/hostview.py).
        route: where the sandbox's end of the egress route sits (see InsideRoute).
        user: the unprivileged user the payload runs as (None: the harness's own user). What
            an unconfined payload must reach (canaries, anchors, host baselines) is planted
            or started for this user, so a denial is the sandbox's doing, not permissions.
    """

    probe: str
    backend: str
    nonce: str
    world: WorldLike
    workspace: Path
    cell_dir: Path
    claims: ClaimsLike
    user: PayloadUser | None = None
    # The in-sandbox end of the egress route (None: the runner did not say, and a probe that
    # attacks the route cannot run).
    route: InsideRoute | None = None
    # What the host read of the confined payload at its rendezvous (sandbox_attest/run/hostview.py),
    # filled in by the runner after the run: the witness no wrapper can rewrite.
    host_view: dict[str, Any] = field(default_factory=dict)


def home_of(ctx: CellContext) -> Path:
    """The home of whoever runs the payload: where an ordinary user's secrets would live.

    With trust separation that is the payload user's own home (host/trust.py), so a run
    never plants fake secrets in a real person's home; without it, the harness user's.
    """
    return ctx.user.home if ctx.user is not None else Path.home()


class ProbeSpec(Protocol):
    """The host side of one probe: every hook the runner and the plugin call, by name.

    A spec subclasses SpecBase, which gives the optional hooks (`corroboration`,
    `look_paths`, `cleanup`, `not_applicable_here`, `not_applicable`, `not_claimed`,
    `at_rendezvous`) defaults that change nothing; the rest each spec writes itself.
    """

    id: str
    area: str  # net / dns / ipc / fs / env / proc / lifecycle / pkg: its module here
    kernel_witness: bool  # whether it judges by the kernel witness (only its cells recorded)

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """What the declared claims say must happen to the attempt."""
        ...

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant what the payload needs; returns the task's `targets`."""
        ...

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host-side positive control: `{"ok", "nonce", "checks": [{what, ok, detail}]}`."""
        ...

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The attempts the payload makes for `task` (its targets): what its report must list."""
        ...

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host readings that back this cell's reading; empty: the payload's word alone."""
        ...

    def warm_up(self, user: PayloadUser | None) -> None:
        """Start a run-wide host measurement in the background (see `SpecBase.warm_up`)."""
        ...

    def look_paths(self, ctx: CellContext) -> list[str]:
        """Host paths the host looks for in the payload's view at its rendezvous.

        Called after `prepare`; the readings land in `ctx.host_view["looked"]` (see
        sandbox_attest/run/pathview.py `look_at`).
        """
        ...

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Read the payload's report against the host witnesses and the control."""
        ...

    def cleanup(self, ctx: CellContext) -> None:
        """Remove what `prepare` planted outside `cell_dir` (the runner removes cell_dir)."""
        ...

    def not_applicable_here(self) -> str | None:
        """Why this host cannot judge the probe at all (its control cannot work here), or None.

        Asked before the run (sandbox_attest.run.runner.applicable_here): every cell of the probe
        is then NOT_APPLICABLE with this reason instead of INCONCLUSIVE.
        """
        ...

    def not_applicable(self, egress: str) -> str | None:
        """Why the probe tests nothing under a backend of this egress mode, or None.

        `egress` is the backend's `egress_mode` ("direct-tcp", "shim", "own"); a reason
        makes the cell NOT_APPLICABLE before anything is planted.
        """
        ...

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """Why the probe tests only a claim `declared` does not make, or None.

        A reason makes the cell NOT_APPLICABLE, never FAIL (asked after `not_applicable`).
        """
        ...

    def at_rendezvous(self, ctx: CellContext, pid: int) -> dict[str, Any] | None:
        """The spec's own host reading of the payload (host pid `pid`) while it waits.

        Called at the host's rendezvous (sandbox_attest/run/hostview.py); a dict is stored in
        `ctx.host_view` under the probe's id, None means the spec takes no reading.
        """
        ...


# Probes whose payload is shared: the attempt inside is the same, only the host-built targets and
# the reading differ. Every other probe's payload is probes/<id>.py.
SHARED_PAYLOADS: dict[str, str] = {
    "net_host_canonical": "net_proxy_requests",
    "net_proxy_confusion": "net_proxy_requests",
    "net_private_address": "net_proxy_requests",
    "net_proxy_smuggling": "net_proxy_wire",
    "net_proxy_upgrade": "net_proxy_wire",
    "net_dns_rebinding": "net_proxy_wire",
    "net_proxy_relay": "net_proxy_wire",
}


def probe_path(probe_id: str) -> Path:
    """The payload script of `probe_id` (in the clone or the installed wheel)."""
    return probes_dir() / f"{SHARED_PAYLOADS.get(probe_id, probe_id)}.py"


# Every payload reports a crash of its own code as one `error` attempt by this name; the
# attempts it did not get to are then missing for a reason the report states.
CRASH_ATTEMPT: Final = "probe"


@dataclass(frozen=True)
class AttemptTable:
    """The attempts one payload makes for one task: what its report must list, exactly.

    A report is believed only as far as the host can check it; the first check is that it
    lists the attempts this probe makes and no others. A wrapper that invents a report (one
    `{"what": "all", "outcome": "refused"}`) or drops the attempt that escaped is caught here.
    You get one from a spec's `attempt_table(task)`; `mismatch` does the check.

    Attributes:
        required: names every report must carry.
        optional: names the payload makes only when it finds something inside (a Docker socket
            that exists there, a route only a namespaced sandbox has); allowed, not required.
        discovered: prefixes of names built from what the payload finds inside (its own
            addresses): the host cannot list them beforehand, only their form.
        excuses: an `error` attempt named K (the payload could not set up, or had no route)
            stands for the names excuses[K], which the report then need not carry.
    """

    required: frozenset[str]
    optional: frozenset[str] = frozenset()
    discovered: tuple[str, ...] = ()
    excuses: tuple[tuple[str, frozenset[str]], ...] = ()

    def mismatch(self, attempts: list[dict[str, Any]]) -> str | None:
        """Why `attempts` are not this table's, as the ERROR reason; None when they are.

        Names missing for a stated reason (the crash attempt, or an excuse given as an
        `error`) are not missing. Nothing excuses a name the probe never makes, nor a name
        listed twice: each attempt is made once.
        """
        names = [str(a.get("what")) for a in attempts]
        errors = {str(a.get("what")) for a in attempts if a.get("outcome") == "error"}
        excused: set[str] = set()
        if CRASH_ATTEMPT in errors:
            excused |= self.required
        for name, stands_for in self.excuses:
            if name in errors:
                excused |= stands_for
        known = self.required | self.optional | {n for n, _ in self.excuses} | {CRASH_ATTEMPT}
        missing = sorted(self.required - set(names) - excused)
        unexpected = sorted(
            {n for n in names if n not in known and not n.startswith(self.discovered)}
            | {f"{n} (listed {names.count(n)} times)" for n in names if names.count(n) > 1}
        )
        if not missing and not unexpected:
            return None
        return (
            f"report does not match probe: missing [{', '.join(missing)}], "
            f"unexpected [{', '.join(unexpected)}]"
        )


def host_processes(ctx: CellContext) -> list[dict[str, Any]]:
    """Every payload process the host read at the rendezvous; empty when it saw none."""
    view = ctx.host_view
    if not view.get("seen"):
        return []
    return [view, *(view.get("others") or [])]


def host_seen_own_network(ctx: CellContext) -> str:
    """A host reading that the payload had a network of its own, without a way out; or "".

    Every process the host read at the rendezvous must be in a network namespace other than
    the harness's, with no default route in it: then nothing it opens there reaches the host.
    """
    processes = host_processes(ctx)
    if not processes:
        return ""
    for process in processes:
        if "net" in (process.get("shared_with_harness") or []) or process.get("default_routes"):
            return ""
    return "host view: own network namespace, no default route"


def own_kernel_ran(ctx: CellContext) -> bool:
    """Whether a payload on a kernel of its own reached the workspace rendezvous.

    Under `kernel = "own"` (gVisor, a microVM) the host reads no payload process: the Sentry
    or the guest kernel runs it, out of /proc's view. What the host has instead is the
    launcher's ready file, named for this cell's nonce, on its own disk in the workspace
    (sandbox_attest/run/hostview.py `workspace_rendezvous`): something inside ran this cell's
    task, so the witnesses outside the sandbox (fixtures' logs, canaries, witness sockets, the
    workspace) heard, or did not hear, a payload that was there to be heard.
    """
    if not claims_of(ctx.claims).own_kernel:
        return False
    rendezvous = ctx.host_view.get("workspace_rendezvous")
    return isinstance(rendezvous, dict) and bool(rendezvous.get("seen"))


def host_can_look(ctx: CellContext) -> bool:
    """Whether a host reading of the payload was possible here (Linux /proc)."""
    return bool(ctx.host_view.get("supported", True))


class SpecBase:
    """Defaults shared by the specs."""

    id: str = ""
    area: str = ""
    # The host readings this probe's assessment always rests on, whatever the payload says
    # (a listener's log, a canary's state on the host). Empty: its reading is the payload's.
    host_readings: tuple[str, ...] = ()
    # Whether this probe judges by the kernel witness's events (catalog/witness/kernel.py).
    # Only such cells are recorded: every event of a cell is a line the witness's reader
    # parses beside the judging threads, and the others' were never read.
    kernel_witness: bool = False

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host readings that back this cell: `host_readings`, once the payload ran.

        A witness that heard nothing backs a refusal only if there was a payload to refuse:
        where the host can look (Linux), it must have seen the payload at its rendezvous, or a
        wrapper that never ran it would be credited with the silence. A sandbox with its own
        kernel shows the host no process at all; there the payload's ready file in the
        workspace is what says it ran (`own_kernel_ran`).
        """
        del report
        if host_can_look(ctx) and not host_processes(ctx) and not own_kernel_ran(ctx):
            return []
        return list(self.host_readings)

    def look_paths(self, ctx: CellContext) -> list[str]:
        """No path is looked at by default: the rendezvous reads only the process."""
        del ctx
        return []

    def warm_up(self, user: PayloadUser | None) -> None:
        """Start, in the background, a host measurement every cell of the run shares.

        Called once a run knows its cells, before the first starts; nothing by default.
        """
        del user

    def cleanup(self, ctx: CellContext) -> None:
        """Nothing is planted outside `cell_dir` by default."""
        del ctx

    def not_applicable_here(self) -> str | None:
        """Every host can judge the probe by default."""
        return None

    def not_applicable(self, egress: str) -> str | None:
        """The probe applies under every egress mode by default."""
        del egress
        return None

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """The claim table's reason (`sandbox_attest.claims.unclaimed`), or None.

        Most probes test no claim a backend may leave out, and the table says nothing of
        them; the ones it names (a write-only probe under open writes, a probe only a host
        view of the process could judge under `kernel = "own"`) need no hook of their own.
        """
        return unclaimed(self.id, claims_of(declared))

    def at_rendezvous(self, ctx: CellContext, pid: int) -> dict[str, Any] | None:
        """No reading of the spec's own at the rendezvous by default (nothing is stored)."""
        del ctx, pid
        return None

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """No default: each spec lists its payload's attempts itself.

        Raises:
            FixtureError: this spec does not say which attempts its payload makes.
        """
        del task
        raise FixtureError(
            f"probe {self.id}: its spec declares no attempt table, so no report of it can be "
            "checked; add attempt_table() listing the attempts probes/<id>.py makes"
        )
