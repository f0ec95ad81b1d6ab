"""Run one matrix cell end to end: stage, run, witness, judge, record.

This is the only place where a payload's run, the host witnesses, the host control and the
control leg meet. Every path out of `run_cell` produces a verdict; an exception anywhere is an
ERROR cell with the exception named, never a crash that loses the run or a silent pass.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import shutil
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, overload

from sandbox_attest.backends.base import (
    NAMESPACED_INSIDE_PATHS,
    PROXY_FROM_ENV,
    SHIM_PORT,
    START_MARKER,
    Availability,
    Backend,
    EgressRoute,
    Identity,
    ProbeRequest,
    ProbeRun,
    inside_paths_of,
    shim_path,
)
from sandbox_attest.catalog import (
    PROBES,
    CellContext,
    InsideRoute,
    ProbeSpec,
    around_the_proxy,
    probe_path,
    report_mismatch,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.errors import HarnessError, ProbeOutputError
from sandbox_attest.host import cellgroup
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.host.kernel import KernelWitness, cgroup_id, run_witness
from sandbox_attest.host.trust import (
    PayloadUser,
    give,
    home_identity,
    payload_user,
    require_reachable,
)
from sandbox_attest.paths import probes_dir
from sandbox_attest.payload import (
    INPUT_DIR,
    LAUNCHER_SOURCE,
    payload_env,
    stage_payload,
    stage_shim,
    staged_shim_path,
)
from sandbox_attest.report.evidence import CellEntry, CellFacts, RunFacts, cell_entry
from sandbox_attest.report.explain import with_fix
from sandbox_attest.run import hostview
from sandbox_attest.run.matrix import Cell
from sandbox_attest.verdict import Assessment, Decision, Expectation, Verdict, believe, decide
from sandbox_attest.world.core import WitnessRecords, World
from sandbox_attest.world.info import WorldInfo

# Seconds a probe keeps in reserve below the backend's hard timeout, so that a slow attempt
# ends with its own report instead of a kill.
PROBE_DEADLINE_MARGIN_S = 10.0
# How much of a run's stdout/stderr goes into the evidence (the head carries the facts).
EVIDENCE_TEXT_LIMIT = 16_384


@overload
def inside_route() -> InsideRoute: ...
@overload
def inside_route(backend: Backend, world: WorldInfo, cell_dir: Path) -> InsideRoute | None: ...
def inside_route(
    backend: Backend | None = None, world: WorldInfo | None = None, cell_dir: Path | None = None
) -> InsideRoute | None:
    """Where `backend` puts the sandbox's end of the egress route for one cell.

    The runner joins the backends and the catalogue, so the inside paths reach the specs from
    here, in each cell's context, and the catalogue never imports the backends. Each backend
    says where it really puts them (`sandbox_attest.backends.base.inside_paths_of`); None: it has no
    harness route inside (egress "own"). Without a backend: the namespaced backends' paths.
    """
    paths = (
        NAMESPACED_INSIDE_PATHS
        if backend is None or world is None or cell_dir is None
        else inside_paths_of(backend, world, cell_dir)
    )
    if paths is None:
        return None
    # A command wrapper runs the cell's staged copy (its `{shim}`, issue 23): that copy is the
    # route's shim on the host. The namespaced built-ins mount the installed one.
    staged = getattr(backend, "runs_staged_shim", False) and cell_dir is not None
    source = staged_shim_path(cell_dir) if staged and cell_dir is not None else shim_path()
    return InsideRoute(paths.proxy_socket, paths.shim, SHIM_PORT, source)


def parse_report(run: ProbeRun) -> dict[str, Any]:
    """The probe's one JSON line after its start marker.

    Raises:
        ProbeOutputError: no marker, no JSON line, more than one, or a malformed one.
    """
    lines = run.stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(START_MARKER)]
    if not marks:
        raise ProbeOutputError("no start marker on stdout")
    reports = []
    for line in lines[marks[0] + 1 :]:
        stripped = line.strip()
        if not stripped.startswith("{"):
            continue
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ProbeOutputError(f"malformed JSON line ({exc}): {stripped[:200]!r}") from exc
        if isinstance(value, dict) and "attempts" in value:
            reports.append(value)
    if len(reports) != 1:
        raise ProbeOutputError(f"expected exactly one JSON report line, found {len(reports)}")
    report = reports[0]
    if not isinstance(report["attempts"], list) or not report["attempts"]:
        raise ProbeOutputError("the report has no attempts")
    return report


def check_identity(report: dict[str, Any], probe: str, nonce: str) -> None:
    """The report must be this cell's: its probe and its nonce.

    A report carrying another nonce is a replayed or cached one (or a payload that never
    read its task), and its attempts say nothing about this cell.

    Raises:
        ProbeOutputError: naming both sides.
    """
    if report.get("nonce") != nonce or report.get("probe") != probe:
        raise ProbeOutputError(
            f"the report is not this cell's (got probe {report.get('probe')!r} nonce "
            f"{report.get('nonce')!r}, expected {probe!r} {nonce!r})"
        )


def _tail(text: str) -> str:
    return text if len(text) <= EVIDENCE_TEXT_LIMIT else "…" + text[-EVIDENCE_TEXT_LIMIT:]


def run_facts(run: ProbeRun | None) -> RunFacts:
    """The run as it goes into the evidence."""
    if run is None:
        return {"started": False}
    return {
        "started": run.started,
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "duration_s": round(run.duration_s, 3),
        "argv": run.argv,
        "stdout": _tail(run.stdout),
        "stderr": _tail(run.stderr),
        "helper_stderr": _tail(run.helper_stderr),
        "notes": run.notes,
    }


def run_failure(run: ProbeRun) -> Decision | None:
    """ERROR when the sandbox never started, timed out or broke the output contract."""
    helper = f"; helper said: {run.helper_stderr.strip()[-400:]}" if run.helper_stderr else ""
    if run.timed_out:
        return Decision(
            Verdict.ERROR,
            f"timed out after {run.duration_s:.1f}s; the process "
            f"tree was killed (started: {run.started}){helper}",
        )
    if not run.started:
        err = run.stderr.strip()[-600:] or "stderr empty"
        return Decision(
            Verdict.ERROR,
            f"the sandbox did not start the payload: no start marker "
            f"(exit {run.exit_code}; {err}){helper}",
        )
    return None


def _unless_home_moved(decision: Decision, home_moved: str) -> Decision:
    """A PASS becomes INCONCLUSIVE when the payload home moved: its canaries judge nothing."""
    if home_moved and decision.verdict == Verdict.PASS:
        return Decision(Verdict.INCONCLUSIVE, f"{home_moved}; was: {decision.reason}")
    return decision


def _home_moved(user: PayloadUser | None, before: tuple[int, int] | None, why_before: str) -> str:
    """Why the payload home is not the directory it was when the cell started, or "".

    The home's parent is root's (sandbox_attest/host/trust.py), so this should never fire; if it
    does, the canaries planted there were planted somewhere the payload user chose.
    """
    after, why = home_identity(user)
    if before is None or after is None:
        return f"the payload home could not be opened safely: {why_before or why}"
    if after != before:
        return (
            f"the payload home changed during the cell (inode {before[1]} -> {after[1]}): its "
            "canaries judge nothing"
        )
    return ""


def proxy_url_for(egress_mode: str, info: WorldInfo) -> str:
    """The proxy URL a payload is told, by its backend's egress mode."""
    return {
        "direct-tcp": info.proxy.url,
        "shim": f"http://127.0.0.1:{SHIM_PORT}",
        "own": PROXY_FROM_ENV,
    }[egress_mode]


def run_watched(
    backend: Backend, request: ProbeRequest, ctx: CellContext, task_path: Path
) -> ProbeRun:
    """Run the request while the host looks at the payload at its rendezvous.

    The readings go into `ctx.host_view` whatever happens to the run (run/hostview.py).
    The cell's spec says what else the host looks at while the payload waits: the paths of
    its `look_paths(ctx)`, and its own `at_rendezvous(ctx, pid)` reading, stored under the
    spec's id. Both are asked after `prepare`, which plants what they name.
    """
    if not hostview.supported():
        try:
            return backend.run(request)
        finally:
            ctx.host_view.update(
                {"seen": False, "supported": False, "why": "the host cannot read /proc here"}
            )
    spec = PROBES.get(ctx.probe)
    look = spec.look_paths(ctx) if spec is not None else []
    # A spec-owned reading (dev_access lists the payload's /dev) runs at the same rendezvous,
    # so no spec keeps a polling thread of its own to find the payload.
    hooks = {ctx.probe: functools.partial(spec.at_rendezvous, ctx)} if spec is not None else {}
    group = cellgroup.new_cell()
    kernel = KernelCell.register(group, unread=kernel_unread(spec, ctx))
    watch = hostview.Rendezvous(request.workspace, task_path, ctx.nonce, look, hooks, group=group)
    watch.start()
    try:
        return backend.run(request)
    finally:
        ctx.host_view.update(watch.finish())
        ctx.host_view["kernel"] = kernel.drain()


# Why a cell has no kernel witness reading though the witness runs: nothing would read it.
OWN_KERNEL_UNRECORDED = (
    'not recorded: the backend claims kernel = "own", so the host kernel sees only the '
    "sandbox's kernel at work (gVisor's Sentry and gofer), never the payload's syscalls"
)
PROBE_UNRECORDED = "not recorded: this probe does not judge by the kernel witness"


def kernel_unread(spec: ProbeSpec | None, ctx: CellContext) -> str:
    """Why no rule will read this cell's kernel events, or "" where one may.

    The kernel rule (catalog/witness/kernel.py) needs the payload's processes in the host's
    view, which a kernel of its own never shows, and only the specs that say
    `kernel_witness` apply it. Unread events still cost: each is a line the witness's reader
    parses beside the judging threads (a gVisor cell made 12,000; the run 113,000).
    """
    if claims_of(ctx.claims).own_kernel:
        return OWN_KERNEL_UNRECORDED
    if spec is None or not spec.kernel_witness:
        return PROBE_UNRECORDED
    return ""


@dataclass
class KernelCell:
    """One cell as the kernel witness records it: registered before its payload, then drained.

    What `drain` returns goes into `ctx.host_view["kernel"]`: the witness's status, and where
    it recorded this cell, every event (the catalogue reads them through
    sandbox_attest/catalog/witness/kernel.py; the evidence keeps a bounded part).
    """

    witness: KernelWitness | None
    cgroup: int = 0
    why: str = ""

    @classmethod
    def register(cls, group: cellgroup.CellGroup, *, unread: str = "") -> KernelCell:
        """Name the cell's cgroup to the run's witness, before anything runs in it.

        Not where `unread` says why nothing will read the cell's events (`kernel_unread`):
        the cell's reading then says that instead.
        """
        witness = run_witness()
        if unread and witness is not None:
            return cls(witness, why=unread)
        if witness is None or not witness.wait_attached():
            return cls(witness)
        if group.mechanism != cellgroup.CGROUP or group.path is None:
            return cls(witness, why=f"the cell has no cgroup of its own ({group.why})")
        cell = cls(witness, cgroup_id(group.path))
        if not witness.register(cell.cgroup):
            cell.why = witness.why
            cell.cgroup = 0
        return cell

    def drain(self) -> dict[str, Any]:
        """The witness's reading of the cell, or why there is none."""
        if self.witness is None:
            return {"status": "unavailable", "why": "no kernel witness was started for the run"}
        facts: dict[str, Any] = {"status": self.witness.status}
        if not self.cgroup:
            facts["why"] = self.why or self.witness.why
            return facts
        began = time.monotonic()
        got = self.witness.drain(self.cgroup)
        facts["drain_ms"] = round((time.monotonic() - began) * 1000, 2)
        if got is None:
            return {**facts, "status": self.witness.status, "why": self.witness.why}
        facts.update(
            recorded=True,
            cgroup=self.cgroup,
            dropped=got.dropped,
            events=[event.as_dict() for event in got.events],
        )
        return facts


def kernel_unseen(assessment: Assessment) -> list[str]:
    """Attempts the payload reports that the kernel never saw (catalog/witness/kernel.py).

    Such a report does not match the probe: the payload (or a wrapper rewriting its line)
    says it tried something the kernel has no trace of. An escape the host saw still wins.
    """
    if assessment.escape == "escaped":
        return []
    kernel = assessment.witness.get("kernel")
    unseen = kernel.get("unseen") if isinstance(kernel, dict) else None
    return [str(u) for u in unseen] if isinstance(unseen, list) else []


def applicable_here(cell: Cell) -> Cell:
    """`cell`, NOT_APPLICABLE with its probe's reason where this host cannot judge it.

    Decided before the cell is collected (the plugin shows the cell as this host can judge
    it), beside `CellRunner.run_cell`'s other NOT_APPLICABLE decisions.

    A probe whose control cannot work here (proc_namespace_escape's setns where the kernel
    refuses an unprivileged user: `not_applicable_here()` on its spec) would only ever be
    INCONCLUSIVE; its cells say why instead, and a policy that requires them fails with it.
    """
    if cell.not_applicable is not None:
        return cell
    spec = PROBES.get(cell.probe.id)
    reason = spec.not_applicable_here() if spec is not None else None
    if reason is None:
        return cell
    return replace(cell, not_applicable=str(reason))


@dataclass
class CellRunner:
    """Runs cells against one started world and a fixed set of backends."""

    world: World
    scratch: Path
    backends: dict[str, Backend]
    availability: dict[str, Availability]
    platform: str
    control_leg: str = "none"
    # Every sandboxed command runs as this user (None: no trust separation). By default the
    # payload user where the harness can switch to it: a runner built anywhere separates.
    user: PayloadUser | None = field(default_factory=payload_user)
    control_results: dict[str, CellEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """The scratch must be traversable by the payload user, or every cell measures modes.

        Raises:
            FixtureError: a directory on the way to the scratch is not searchable by it.
        """
        require_reachable(self.scratch, self.user, "the cell scratch")

    def run_cell(self, cell: Cell) -> CellEntry:
        """Run and judge one cell; always returns an evidence entry."""
        head = {"cell_id": cell.cell_id, "backend": cell.backend, "probe": cell.probe.id}
        not_run = self.not_run(cell)
        if not_run is not None:
            return cell_entry(**head, platform=self.platform, **not_run)
        try:
            facts = self._run_and_judge(cell)
        except Exception as exc:  # fail closed: any harness fault is an ERROR cell
            facts = {
                "verdict": Verdict.ERROR.value,
                "reason": f"harness error while running the cell: {type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
            }
        entry = cell_entry(**head, platform=self.platform, **facts)
        if cell.backend == self.control_leg:
            self.control_results[cell.probe.id] = entry
        else:
            self._apply_control_leg(entry)
        return entry

    def not_run(self, cell: Cell) -> CellFacts | None:
        """The verdict of a cell that is not run here (NOT_APPLICABLE, UNAVAILABLE), or None.

        With `applicable_here`, the one place a cell is found NOT_APPLICABLE: the matrix's
        reason, the backend's availability, its egress mode and the claims it makes.
        """
        if cell.not_applicable is not None:
            return {"verdict": Verdict.NOT_APPLICABLE.value, "reason": cell.not_applicable}
        avail = self.availability[cell.backend]
        if not avail.ok:
            return {"verdict": Verdict.UNAVAILABLE.value, "reason": avail.reason}
        # A probe that tests only something this backend's egress mode does not have (the
        # harness's in-sandbox route, under a wrapper's own proxy) says so, with the reason.
        spec = PROBES[cell.probe.id]
        egress = getattr(self.backends[cell.backend], "egress_mode", "")
        why = spec.not_applicable(egress)
        # A probe that tests only a claim this backend does not make (open reads, a
        # passthrough environment, no protected paths) is NOT_APPLICABLE, never FAIL.
        if not why and avail.identity is not None:
            why = spec.not_claimed(avail.identity.claims)
        if why:
            return {"verdict": Verdict.NOT_APPLICABLE.value, "reason": why}
        return None

    def _apply_control_leg(self, entry: CellEntry) -> None:
        """Downgrade a PASS when the control leg could not see this probe's escape."""
        if entry["verdict"] != Verdict.PASS.value:
            return
        control = self.control_results.get(entry["probe"])
        if control is None:
            entry["verdict"] = Verdict.INCONCLUSIVE.value
            entry["reason"] = (
                "the control leg did not run this probe, so nothing shows the "
                f"probe can see its escape; was: {entry['reason']}"
            )
        elif control["verdict"] != Verdict.PASS.value:
            entry["verdict"] = Verdict.INCONCLUSIVE.value
            entry["reason"] = (
                f"the control leg gave {control['verdict']} for this probe "
                f"({control['reason']}), so this PASS proves nothing; "
                f"was: {entry['reason']}"
            )

    def _run_and_judge(self, cell: Cell) -> CellFacts:
        spec = PROBES[cell.probe.id]
        backend = self.backends[cell.backend]
        identity = self.availability[cell.backend].identity
        assert identity is not None  # noqa: S101  (available backends always carry one)
        nonce = "n" + secrets.token_hex(8)
        cell_dir = self._make_cell_dir(nonce)
        workspace = cell_dir / "workspace"
        # The payload owns its workspace (the one writable grant), but only once `prepare` has
        # planted in it (below): while root writes there, a payload user's leftover helper
        # must not be able to swap a name in it for a symlink (issue 23). The cell dir stays
        # the harness's: host-side baselines and witnesses of the cell live there, and a
        # payload that could rename them could rewrite what it is judged by.
        # The payload home's identity, before and after the cell: a changed one is named.
        home_before, home_why = home_identity(self.user)
        ctx = CellContext(
            probe=cell.probe.id,
            backend=cell.backend,
            nonce=nonce,
            world=self.world,
            workspace=workspace,
            cell_dir=cell_dir,
            claims=identity.claims,
            user=self.user,
            # A wrapper with its own proxy (egress "own") has no harness route inside it: no
            # proxy socket, no shim. None tells the catalogue so (sandbox_attest/catalog/spec.py).
            route=inside_route(backend, self.world.info, cell_dir),
        )
        expected = spec.expectation(identity.claims)
        proxy_url = proxy_url_for(backend.egress_mode, self.world.info)
        run: ProbeRun | None = None
        try:
            targets = spec.prepare(ctx)
            # What the probe planted in the workspace is the payload's, as the workspace is.
            give(workspace, self.user, recursive=True)
            task, request, task_path = self._stage_request(cell, ctx, targets, proxy_url)
            # Wall clock, for the views (Allure's start and stop); durations stay monotonic.
            started_ms = time.time_ns() // 1_000_000
            run = run_watched(backend, request, ctx, task_path)
            # A fixture that died during the cell is named before the host control trips on
            # it: the ERROR says which fixture and the fix, not the control's raw exception.
            # Any check that began after the payload ended will do (the other worker's).
            self.world.check_health(since=time.monotonic())
            control = spec.host_control(ctx)
            witness = self.world.records(nonce)
            facts = run_facts(run)
            facts["started_ms"] = started_ms
            home_moved = _home_moved(self.user, home_before, home_why)
            # The judge's keys win (its `control` carries the host control and its reading).
            judged = self._judge_run(
                cell, ctx, task, run, witness, control, expected, identity, home_moved
            )
            return {
                "home_changed": home_moved,
                "nonce": nonce,
                "expected": expected,
                "run": facts,
                "control": control,
                "host_view": ctx.host_view,
                **judged,
            }
        finally:
            # Cleanup of canaries must not turn a verdict into a crash.
            with contextlib.suppress(OSError, HarnessError):
                spec.cleanup(ctx)
            shutil.rmtree(cell_dir, ignore_errors=True)

    def _make_cell_dir(self, nonce: str) -> Path:
        """The cell's dir, its workspace and its inputs dir, made 0755; the shim staged in it."""
        # Named by the nonce alone: the cell dir is the parent of the workspace (the payload's
        # cwd and HOME) and of its inputs, so a wrapper sees its name; the cell id would tell
        # it the escape being tried (issue 23). The evidence keys cells by id, not by this dir.
        cell_dir = self.scratch / "cells" / nonce
        workspace = cell_dir / "workspace"
        inputs = cell_dir / INPUT_DIR
        # Modes set explicitly, never left to the umask: the payload user must traverse the
        # cell dir and read its inputs, whatever umask this process (or a thread of a library
        # that changes it for a moment) has. A 0700 directory here makes a cell fail on file
        # modes, not on the sandbox.
        for directory in (self.scratch / "cells", cell_dir, workspace, inputs):
            directory.mkdir(exist_ok=directory == self.scratch / "cells")
            directory.chmod(0o755)
        # The shim a command wrapper's payload runs, under a neutral name (issue 23); before
        # the probe prepares, so a probe that watches the route watches this copy.
        stage_shim(cell_dir, shim_path())
        return cell_dir

    def _stage_request(
        self, cell: Cell, ctx: CellContext, targets: dict[str, Any], proxy_url: str
    ) -> tuple[dict[str, Any], ProbeRequest, Path]:
        """The cell's task, staged with the launcher and the probe, and the request to run it.

        Returns:
            The task, the request, and the staged task's path (the launcher's argument).
        """
        info = self.world.info
        workspace = ctx.workspace
        inputs = ctx.cell_dir / INPUT_DIR
        task = {
            "probe": cell.probe.id,
            "nonce": ctx.nonce,
            "cell_id": cell.cell_id,
            "workspace": str(workspace),
            "proxy_url": proxy_url,
            "ca_bundle": info.ca_bundle,
            "world": info.for_probe(),
            "targets": targets,
            "deadline_s": max(5.0, cell.probe.timeout - PROBE_DEADLINE_MARGIN_S),
            # The launcher waits this long for the host to look (0: it cannot here).
            "rendezvous_s": hostview.RENDEZVOUS_S if hostview.supported() else 0,
        }
        # The launcher and the probe are copied beside the task under neutral names
        # (`python .../input/main.py .../input/job.py .../input/config.json`): the
        # repository's paths would tell a wrapper it is under test (issue 23).
        staged = stage_payload(
            inputs, probes_dir() / LAUNCHER_SOURCE, probe_path(cell.probe.id), task
        )
        read_only = (
            # The interpreter the payload user can run (the harness's own, or the system's
            # where the harness is installed out of its reach: host/interpreter.py).
            *payload_interpreter(self.user).bind_paths(),
            inputs,  # the staged launcher, probe and task: nothing of probes/ itself
            Path(info.ca_bundle),
        )
        request = ProbeRequest(
            cell_id=cell.cell_id,
            argv=(
                payload_interpreter(self.user).path,
                str(staged.launcher),
                str(staged.program),
                str(staged.task),
            ),
            env=payload_env(None if proxy_url == PROXY_FROM_ENV else proxy_url, workspace),
            workspace=workspace,
            read_only=read_only,
            egress=EgressRoute(unix_socket=Path(info.proxy.socket), tcp_url=info.proxy.url),
            timeout=cell.probe.timeout,
            cell_dir=ctx.cell_dir,
            world=info,
            user=self.user,
            shim=staged_shim_path(ctx.cell_dir),
        )
        return task, request, staged.task

    def _judge_run(
        self,
        cell: Cell,
        ctx: CellContext,
        task: dict[str, Any],
        run: ProbeRun,
        witness: WitnessRecords,
        control: dict[str, Any],
        expected: Expectation,
        identity: Identity,
        home_moved: str,
    ) -> CellFacts:
        """The cell's verdict and what it rests on, from the run, its report and the witnesses."""
        spec = PROBES[cell.probe.id]
        failure = run_failure(run)
        if failure is not None:
            return {
                "verdict": failure.verdict.value,
                "reason": failure.reason,
                "observed": "error",
                "witness": vars(witness),
            }
        try:
            report = parse_report(run)
            check_identity(report, cell.probe.id, ctx.nonce)
        except ProbeOutputError as exc:
            return {
                "verdict": Verdict.ERROR.value,
                "observed": "error",
                "reason": f"probe {cell.probe.id} broke its output contract: "
                f"{exc} (exit {run.exit_code}); see run.stdout/stderr",
                "witness": vars(witness),
            }
        # Believed only as far as the host can check it: first, the report must list
        # exactly the attempts this probe makes for this task.
        mismatch = report_mismatch(spec, task, report)
        if mismatch is not None:
            return {
                "verdict": Verdict.ERROR.value,
                "observed": "error",
                "reason": mismatch,
                "attempts": report.get("attempts", []),
                "witness": vars(witness),
            }
        assessment: Assessment = spec.assess(ctx, report, witness, control)
        unseen = kernel_unseen(assessment)
        if unseen:
            return {
                "verdict": Verdict.ERROR.value,
                "observed": "error",
                "reason": "the payload's report does not match the probe: "
                + "; ".join(unseen)
                + " (kernel witness, attached to this cell)",
                "attempts": report.get("attempts", []),
                "witness": assessment.witness or vars(witness),
            }
        if not assessment.corroborated_by:
            assessment.corroborated_by = spec.corroboration(ctx, report)
        # A proxy's refusals count only where the proxy is the payload's one route out.
        assessment = around_the_proxy(ctx, assessment)
        # The report crossed a wrapper the harness does not control (a command wrapper,
        # the only kind with a spec file): there only a host reading makes a PASS.
        decision = _unless_home_moved(
            believe(
                decide(expected, assessment),
                assessment,
                crossed_wrapper=bool(identity.spec_sha256),
            ),
            home_moved,
        )
        return {
            "verdict": decision.verdict.value,
            # Every FAIL says what to change: the probe's usual fix (probes/docs.toml)
            # where the assessor's reason names none.
            "reason": with_fix(cell.probe.id, decision.reason)
            if decision.verdict is Verdict.FAIL
            else decision.reason,
            "observed": assessment.observed,
            "escape": assessment.escape,
            "corroborated_by": assessment.corroborated_by,
            "attempts": report.get("attempts", []),
            "probe_facts": report.get("facts", {}),
            "witness": assessment.witness or vars(witness),
            "control": {"host": control, "assessed": assessment.control},
        }
