"""The release-core probes, host side: what each expects, plants, controls and concludes.

Each payload in `probes/` runs inside the sandbox and only reports what it saw. Its spec here
runs on the host: it derives the expectation from the backend's declared policy, plants the
targets (canaries), runs the host-side positive control right after the payload, and reads the
payload's report against the host witnesses. The reading follows ARCHITECTURE.md "Which
witness decides": a host witness that saw the escape wins over the payload; a refusal counts
only when the host control shows the same witness would have seen it.

Host controls use their own nonce (never a string containing the cell's nonce) so the
listener's substring match cannot mistake the host's own attempt for the payload's.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import shlex
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise, lifetime, safefs
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.host.trust import PayloadUser, give
from sandbox_attest.paths import probes_dir
from sandbox_attest.verdict import Assessment, Escape, Expectation

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox_attest.world.info import WorldInfo

__all__ = [
    "AttemptTable",
    "CellContext",
    "InsideRoute",
    "PolicyLike",
    "ProbeSpec",
    "WitnessRecordsLike",
    "WorldLike",
    "probe_path",
]

T = TypeVar("T")

HOST_TIMEOUT_S = 10.0
# Fixture logs are written by server threads; give them this long to show a host control.
WITNESS_WAIT_S = 3.0
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


class PolicyLike(Protocol):
    """The shape of `sandbox_attest.backends.base.DeclaredPolicy`: the claim a verdict holds to.

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
        world: the running fixture world.
        workspace: host path of the cell's workspace (empty dir, created by the runner).
        cell_dir: host-only scratch for this cell; canaries are planted below it.
        policy: the backend's declared confinement.
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
    policy: PolicyLike
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
    """The host side of one probe."""

    id: str
    area: str  # net / dns / ipc / fs / env / proc / lifecycle / pkg: its module here

    def expectation(self, policy: PolicyLike) -> Expectation:
        """What the declared policy says must happen to the attempt."""
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

    def look_paths(self, ctx: CellContext) -> list[str]:
        """Host paths the host looks for in the payload's view at its rendezvous.

        Called after `prepare`; the readings land in `ctx.host_view["looked"]` (see
        sandbox_attest/run/hostview.py `look_at`).
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


# ---------------------------------------------------------------------------------------------
# Small shared readings of a report and the witnesses.


def attempts_by_role(report: dict[str, Any], role: str, prefix: str = "") -> list[dict[str, Any]]:
    return [
        a
        for a in report.get("attempts", [])
        if isinstance(a, dict)
        and a.get("role") == role
        and str(a.get("what", "")).startswith(prefix)
    ]


def observed_outcome(attempts: list[dict[str, Any]]) -> Any:
    """The payload's side in one word: any success wins, then refusals, else error."""
    outcomes = {a.get("outcome") for a in attempts}
    if "succeeded" in outcomes:
        return "succeeded"
    if outcomes == {"refused"}:
        return "refused"
    return "error"


# How much of a failed attempt's own explanation a reason carries: enough to name the cause
# ("No module named pip", "socket() refused: EPERM"), short enough to keep a verdict one line.
SUMMARY_DETAIL_CHARS = 80


def attempts_summary(attempts: list[dict[str, Any]]) -> str:
    """Each attempt as `what outcome (errno|status)`, plus a short detail when it failed."""
    parts = []
    for a in attempts:
        fact = a.get("errno") or a.get("status") or ""
        part = f"{a.get('what')} {a.get('outcome')}{f' ({fact})' if fact else ''}"
        detail = " ".join(str(a.get("detail") or "").split())
        if a.get("outcome") != "succeeded" and detail:
            part += f": {detail[:SUMMARY_DETAIL_CHARS]}"
        parts.append(part)
    return ", ".join(parts) or "no attempts reported"


def entries_with_nonce(entries: list[dict[str, Any]], nonce: str) -> list[dict[str, Any]]:
    """Entries attributed to `nonce` by their `nonce` field or, failing that, their bytes."""
    return [
        e
        for e in entries
        if e.get("nonce") == nonce or (e.get("nonce") is None and nonce in str(e.get("data", "")))
    ]


def host_namespace(kind: str) -> str | None:
    """The host's own namespace id (`net:[...]`), to compare with what the payload saw."""
    try:
        return str(Path(f"/proc/self/ns/{kind}").readlink())
    except OSError:
        return None


def private_namespace_reason(report: dict[str, Any], kind: str) -> str | None:
    """A reason phrase when the payload ran in a namespace other than the host's, else None."""
    theirs = report.get("facts", {}).get(f"{kind}ns")
    ours = host_namespace(kind)
    if theirs and ours and theirs != ours:
        return f"payload's {kind} namespace {theirs} is not the host's {ours}"
    return None


def judge_escape(observed: str, seen: bool, private: str | None, reasons: list[str]) -> Escape:
    """The shared decision table of a negative probe (ARCHITECTURE "Which witness decides")."""
    if seen:
        return "escaped"
    if observed == "refused":
        return "refused"
    if observed == "error":
        # decide() says "the attempt could not be made"; the payload summary says why.
        return "undecided"
    if private is not None:
        reasons.append(f"the success stayed inside the sandbox: {private}")
        return "contained"
    reasons.append("the payload reports success but no host witness saw it")
    return "disagree"


def conclude(
    escape: Escape,
    observed: Any,
    reasons: list[str],
    *,
    host_control: dict[str, Any],
    witness: dict[str, Any],
    inside: list[dict[str, Any]] | None = None,
    inside_ok: bool | None = None,
    inside_failed: str | None = None,
    host_failed: str = "host control failed",
    controls: dict[str, Any] | None = None,
) -> Assessment:
    """The assessment once the escape is read: both controls must hold for it to count.

    `inside` is the payload's in-sandbox control attempts (None: the probe has none, only the
    host control counts) and `inside_ok` whether they held (required with `inside`). The
    messages and the recorded controls follow from them; `inside_failed`, `host_failed` and
    `controls` override them for callers that word their controls differently. `controls_ok`
    is the in-sandbox control AND the host control, the one rule every assessor shares.
    """
    if inside is not None and inside_ok is None:
        msg = "conclude: `inside` was given without `inside_ok` (whether those controls held)"
        raise TypeError(msg)
    inside_held = True if inside_ok is None else inside_ok
    host_ok = bool(host_control.get("ok"))
    if not inside_held:
        reasons.append(
            inside_failed or f"in-sandbox control failed: {attempts_summary(inside or [])}"
        )
    if not host_ok:
        reasons.append(f"{host_failed}: {_failed_checks(host_control)}")
    if controls is None:
        controls = (
            {"host": host_control} if inside is None else {"inside": inside, "host": host_control}
        )
    return Assessment(
        escape=escape,
        controls_ok=inside_held and host_ok,
        reasons=reasons,
        observed=observed,
        witness=witness,
        control=controls,
    )


def all_succeeded(attempts: list[dict[str, Any]], count: int | None = None) -> bool:
    """Every attempt succeeded (and, if given, there were exactly `count` of them)."""
    if count is not None and len(attempts) != count:
        return False
    return bool(attempts) and all(a.get("outcome") == "succeeded" for a in attempts)


def _failed_checks(control: dict[str, Any]) -> str:
    """Which checks of a host control failed and why, for a verdict's reason."""
    checks = control.get("checks") or []
    if not checks:
        return "it ran no check"
    failed = [f"{c.get('what')} ({c.get('detail')})" for c in checks if not c.get("ok")]
    return "; ".join(failed) or "no check failed, yet it is not ok"


def host_control_failed(control: dict[str, Any]) -> str:
    """The reason for a failed host control, naming each failed check and its detail."""
    return f"host control failed: {_failed_checks(control)}"


def host_writes_check(what: str, directory: Path, nonce: str) -> dict[str, Any]:
    """Host control: the host creates, reads back and removes a nonce file in `directory`.

    It shows the place a payload was refused is writable at all, so the refusal is the
    sandbox's. Errors become a failed check (never an exception).
    """

    def write() -> dict[str, Any]:
        # Through the directory's descriptor (sandbox_attest/host/safefs.py): the payload user may
        # have made `directory` (or a dir above it) a symlink by now; root never writes there.
        name = f"host-control-{nonce}.txt"
        try:
            with safefs.open_dir(directory) as place:
                place.create_file(name, nonce, 0o600)
                ok = place.read_bytes(name) == nonce.encode()
                place.unlink(name)
        except safefs.UnsafePathError as exc:
            return host_check(what, ok=False, detail=str(exc))
        return host_check(what, ok, str(directory))

    return guarded_check(what, write)


def host_check(what: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"what": what, "ok": ok, "detail": detail}


def control_record(nonce: str, checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"ok": bool(checks) and all(c["ok"] for c in checks), "nonce": nonce, "checks": checks}


def new_control_nonce() -> str:
    return "h" + secrets.token_hex(8)


def run_payload_on_host(
    ctx: CellContext, targets: dict[str, Any], nonce: str | None = None
) -> tuple[int, dict[str, Any]]:
    """Run the probe's own payload file unsandboxed, as the payload user; its pid and report.

    The same file, the same attempts: a difference between this baseline and the sandboxed
    report is the sandbox's doing, not a difference in how the two sides looked. It runs as the
    payload user because the sandbox is judged against that user's own rights on this host,
    never against root's. Its directory is the cell dir's `host-control` (root's); the
    workspace is made there before `trust.give` hands it over.

    Raises:
        ValueError: the payload did not print exactly one report (a broken probe); the message
            carries the argv and task to rerun it by hand, since the cell dir is gone by then.
    """
    directory = ctx.cell_dir / "host-control"
    workspace = directory / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    give(workspace, ctx.user)
    task = {
        "probe": ctx.probe,
        "nonce": nonce or new_control_nonce(),
        "workspace": str(workspace),
        "targets": targets,
    }
    task_path = directory / "task.json"
    task_path.write_text(json.dumps(task))
    argv = [payload_interpreter(ctx.user).path, str(probe_path(ctx.probe)), str(task_path)]
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        cwd=workspace,
        **(ctx.user.popen_kwargs() if ctx.user is not None else {}),
        **lifetime.popen_kwargs(),  # a killed harness must not leave the baseline running
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=HOST_TIMEOUT_S * 3)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
    reports = [ln for ln in stdout.splitlines() if ln.startswith("{") and '"attempts"' in ln]
    if len(reports) != 1:
        raise ValueError(
            f"the {ctx.probe} payload printed {len(reports)} reports on the host "
            f"(exit {process.returncode}, stderr {stderr[-300:]!r}); to see why, write this "
            f"task to task.json and run {shlex.join(argv[:2])} task.json: {json.dumps(task)}"
        )
    report: dict[str, Any] = json.loads(reports[0])
    return process.pid, report


def poll_until(read: Callable[[], T], found: Callable[[T], bool]) -> T:
    """Call `read` until `found` holds for its result or WITNESS_WAIT_S passes; the last result.

    Witness logs are written by server threads, so a host control's entry may lag its answer.
    """
    deadline = time.monotonic() + WITNESS_WAIT_S
    result = read()
    while not found(result) and time.monotonic() < deadline:
        time.sleep(0.05)
        result = read()
    return result


def wait_for_records(
    world: WorldLike, nonce: str, found: Callable[[WitnessRecordsLike], bool]
) -> WitnessRecordsLike:
    """Poll the world's records for `nonce` until `found` holds or WITNESS_WAIT_S passes."""
    return poll_until(lambda: world.records(nonce), found)


def split_hostport(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


# ---------------------------------------------------------------------------------------------
# Host-side HTTP through the egress proxy (the same route the payloads take).


def connect_tunnel(
    proxy_url: str, host: str, port: int, nonce: str
) -> tuple[socket.socket, int, str]:
    """CONNECT through the proxy; returns the socket, the status and the deny reason."""
    parts = urlsplit(proxy_url)
    lines = [f"CONNECT {host}:{port} HTTP/1.1", f"Host: {host}:{port}", f"X-Attest-Nonce: {nonce}"]
    if parts.username is not None:
        cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        lines.append("Proxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode())
    sock = socket.create_connection((parts.hostname or "", parts.port or 80), HOST_TIMEOUT_S)
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        buf = b""
        while b"\r\n\r\n" not in buf and len(buf) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    except OSError:
        sock.close()
        raise
    head = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    words = head[0].split()
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    reason = next(
        (
            line.split(":", 1)[1].strip()
            for line in head[1:]
            if line.lower().startswith(f"{disguise.PROXY_DENY_HEADER.lower()}:")
        ),
        "",
    )
    return sock, status, reason


def https_via_proxy(info: WorldInfo, url: str, nonce: str) -> tuple[int, bytes, str]:
    """GET `url` (https, fixture host) through the proxy; returns status, body, deny reason."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    sock, status, reason = connect_tunnel(info.proxy.url, host, port, nonce)
    if status != 200:
        sock.close()
        return status, b"", reason
    ctx = ssl.create_default_context(cafile=info.ca_bundle)
    conn = http.client.HTTPConnection(host, port, timeout=HOST_TIMEOUT_S)
    try:
        conn.sock = ctx.wrap_socket(sock, server_hostname=host)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"X-Attest-Nonce": nonce})
        response = conn.getresponse()
        return response.status, response.read(), ""
    finally:
        conn.close()
        sock.close()


def guarded_check(what: str, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one host check; a failure of the host's own attempt is a failed check, not a crash."""
    try:
        return action()
    except (OSError, ssl.SSLError, http.client.HTTPException, ValueError) as exc:
        return host_check(what, ok=False, detail=f"host attempt failed: {exc!r}")


# ---------------------------------------------------------------------------------------------
# What a report must list: the probe's own table of attempts.

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


def attempts_of(*groups: tuple[str, tuple[str, ...]] | str) -> frozenset[str]:
    """Attempt names: plain names, and `(key, ops)` pairs spelled `key:op` as payloads do."""
    names: set[str] = set()
    for group in groups:
        if isinstance(group, str):
            names.add(group)
        else:
            key, ops = group
            names |= {f"{key}:{op}" for op in ops}
    return frozenset(names)


def report_mismatch(spec: ProbeSpec, task: dict[str, Any], report: dict[str, Any]) -> str | None:
    """The one check that a report lists exactly the attempts `spec`'s payload makes for `task`.

    The runner calls it on every parsed report before any assessor reads it, so no probe can
    skip it; a mismatch is the cell's ERROR reason.
    """
    attempts = report.get("attempts")
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        return "report does not match probe: its attempts are not a list of objects"
    return spec.attempt_table(task).mismatch(attempts)


# ---------------------------------------------------------------------------------------------
# The specs' shared defaults.


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

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host readings that back this cell: `host_readings`, once the payload ran.

        A witness that heard nothing backs a refusal only if there was a payload to refuse:
        where the host can look (Linux), it must have seen the payload at its rendezvous, or a
        wrapper that never ran it would be credited with the silence.
        """
        del report
        if host_can_look(ctx) and not host_processes(ctx):
            return []
        return list(self.host_readings)

    def look_paths(self, ctx: CellContext) -> list[str]:
        """No path is looked at by default: the rendezvous reads only the process."""
        del ctx
        return []

    def cleanup(self, ctx: CellContext) -> None:
        """Nothing is planted outside `cell_dir` by default."""
        del ctx

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


def expect_confined_network(policy: PolicyLike) -> Expectation:
    return "denied" if policy.network != "open" else "allowed"


def expect_capability(policy: PolicyLike) -> Expectation:
    return "denied" if policy.network == "none" else "allowed"


def capability_escape(observed: str, seen: bool, reasons: list[str]) -> Escape:
    """A capability counts only when the payload and the host witness both saw it."""
    if observed == "succeeded" and seen:
        return "escaped"
    if observed == "refused" and not seen:
        return "refused"
    if observed == "error" and not seen:
        return "undecided"
    reasons.append("payload and origin log tell different stories")
    return "disagree"


def origin_control_checks(
    ctx: CellContext, nonce: str, url: str, host_key: str
) -> list[dict[str, Any]]:
    """The host GETs `url` through the proxy; checks its 200 and the origin's log entry."""
    info = ctx.world.info

    def get() -> dict[str, Any]:
        status, body, reason = https_via_proxy(info, url, nonce)
        return host_check(f"host get {host_key}", status == 200, f"{status} {reason} {body[:60]!r}")

    checks = [guarded_check(f"host get {host_key}", get)]
    records = wait_for_records(
        ctx.world,
        nonce,
        lambda r: any(o.get("host") == host_key for o in entries_with_nonce(r.origin, nonce)),
    )
    hits = [o for o in entries_with_nonce(records.origin, nonce) if o.get("host") == host_key]
    checks.append(host_check(f"{host_key} origin logged the host", bool(hits), f"{len(hits)} hits"))
    return checks


_STATE = "host-state.json"


def save_state(ctx: CellContext, state: dict[str, Any]) -> None:
    """Keep what prepare planted in the cell's scratch dir (the spec objects are shared)."""
    path = ctx.cell_dir / _STATE
    path.write_text(json.dumps(state, indent=1, sort_keys=True))


def load_state(ctx: CellContext) -> dict[str, Any]:
    try:
        loaded = json.loads((ctx.cell_dir / _STATE).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def refusal_summary(attempts: list[dict[str, Any]]) -> str:
    refused = [a for a in attempts if a.get("outcome") == "refused"]
    errnos = sorted({str(a.get("errno")) for a in refused})
    return f"{len(refused)} of {len(attempts)} attempts refused ({','.join(errnos) or '-'})"


def expect_fs_confined(policy: PolicyLike) -> Expectation:
    # "workspace" promises the workspace is the payload's only writable grant. Every backend
    # that makes that promise builds the view by granting paths (bwrap binds, docker mounts,
    # seatbelt's profile), so the host's secret folders, its scratch dirs and the host side of
    # the egress route are outside the view too; the open control leg promises nothing.
    return "denied" if policy.filesystem == "workspace" else "allowed"
