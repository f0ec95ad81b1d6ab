"""One attestation run: the world, the backends, the cells, and what is written at the end.

`RunSession` is created by the pytest plugin (wiring only) and owns every decision about a
run's lifetime: when the world starts, which backends are asked, how an interrupted run keeps
its evidence, and what gets signed and rendered once the cells are done.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import shutil
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest import __version__
from sandbox_attest.backends import Backend, create_backend
from sandbox_attest.backends.base import Availability
from sandbox_attest.errors import ConfigError, FixtureError, HarnessError
from sandbox_attest.host.lifetime import RunInterrupted, caught_signal
from sandbox_attest.host.provenance import file_sha256
from sandbox_attest.host.trust import payload_user
from sandbox_attest.payload import SCRATCH_PREFIX
from sandbox_attest.report.evidence import EvidenceWriter
from sandbox_attest.report.policy import (
    Gate,
    Policy,
    cell_leg,
    claim_problems,
    evaluate,
    load_policy,
)
from sandbox_attest.run.matrix import BackendRow, Cell, Matrix, current_platform
from sandbox_attest.run.reach import Preflight, preflight, stage_payload_files, unstage
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.run.separation import trust_domains
from sandbox_attest.verdict import Verdict
from sandbox_attest.world.core import World, start_world
from sandbox_attest.world.lab import current_lab, world_fact

if TYPE_CHECKING:
    from sandbox_attest.attest.signer import Signer
    from sandbox_attest.report.build import Views
    from sandbox_attest.report.signature import SignerFacts


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus a random suffix."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


def with_spec_backends(
    matrix: Matrix, chosen: list[str], spec_files: list[str]
) -> tuple[Matrix, list[str]]:
    """Add command-wrapper specs to the matrix and to the chosen backends.

    A spec comes from `--backend-spec FILE`, or from a chosen name without a matrix row that
    names `matrix/backends/<name>.toml`. Each gets a row for the platforms it declares.

    Returns:
        The matrix with the specs' rows, and the chosen names with the specs' names added.
    """
    from sandbox_attest.backends import register_spec  # noqa: PLC0415
    from sandbox_attest.backends.command.spec_load import (
        load_spec,
        resolve_spec,
    )

    known = {row.name for row in matrix.backends}
    files = [
        *spec_files,
        *(
            str(path)
            for name in chosen
            if name not in known and (path := resolve_spec(name)) is not None
        ),
    ]
    rows = list(matrix.backends)
    names: list[str] = []
    for spec_file in files:
        spec = load_spec(Path(spec_file))
        register_spec(Path(spec_file))
        names.append(spec.name)
        if all(row.name != spec.name for row in rows):
            reason = f"{spec.name} ({spec_file}) is declared for {', '.join(spec.platforms)}"
            rows.append(BackendRow(spec.name, spec.platforms, reason))
    matrix = dataclasses.replace(matrix, backends=tuple(rows))
    return matrix, [*chosen, *(n for n in names if n not in chosen)]


# The runner a user needs for a backend that does not run here ("run it on a macOS runner").
RUNNER_NAMES = {"linux": "Linux", "darwin": "macOS", "windows": "Windows"}
# Verdicts of cells that were never judged: nothing ran, so they attest nothing.
UNJUDGED = (Verdict.NOT_APPLICABLE.value, Verdict.UNAVAILABLE.value)


def required_cells(policy: Policy, platform: str) -> set[tuple[str, str]]:
    """(backend, probe) pairs the release policy requires to PASS on this platform."""
    return {
        (req.backend, probe)
        for req in policy.requirements
        if req.platform == platform
        for probe in req.probes
    }


def check_names(matrix: Matrix, policy: Policy) -> None:
    """Every probe of the matrix, and every backend and probe the policy requires, exists.

    A policy naming a backend nobody can select ("dockr") would otherwise require nothing
    that any run produces, and a matrix probe missing from the catalogue would ERROR every
    cell; both are typos to report before any fixture starts.

    Raises:
        ConfigError: naming the unknown name, the file it is in, and the known names.
    """
    from sandbox_attest.backends.command.spec_load import resolve_spec, specs_dir  # noqa: PLC0415
    from sandbox_attest.catalog import PROBES  # noqa: PLC0415

    for row in matrix.probes:
        if row.id not in PROBES:
            raise ConfigError(
                f"{matrix.path}: probe {row.id!r} is not in the probe catalogue; "
                f"known probes: {', '.join(sorted(PROBES))}"
            )
    backends = [row.name for row in matrix.backends]
    probes = [row.id for row in matrix.probes]
    for req in policy.requirements:
        where = f"{policy.path}, [[require]] {req.platform}/{req.backend}"
        if req.backend not in backends and resolve_spec(req.backend) is None:
            raise ConfigError(
                f"{where}: backend {req.backend!r} is neither a [[backend]] of {matrix.path} "
                f"nor a spec in {specs_dir()}; known backends: {', '.join(backends)}"
            )
        unknown = [probe for probe in req.probes if probe not in probes]
        if unknown:
            raise ConfigError(
                f"{where}: probe {unknown[0]!r} is not a probe of {matrix.path}; "
                f"its probes: {', '.join(probes)}"
            )


@dataclass
class RunSession:
    """State of one run, shared by every matrix item of a pytest session."""

    matrix: Matrix
    backend_names: list[str]
    report_dir: Path
    policy_path: Path
    required_backends: set[str]
    # Backends the user named; every cell of theirs must PASS (an escape there fails the run).
    named_backends: set[str] = field(default_factory=set)
    key_path: Path | None = None
    platform: str = field(default_factory=current_platform)
    run_id: str = field(default_factory=new_run_id)
    world: World | None = None
    world_error: str | None = None
    runner: CellRunner | None = None
    scratch: Path | None = None
    finished: bool = False
    jobs: int = 1
    # Report files that could not be written (attestation, HTML, summary): the gate fails on
    # them, because a release cannot verify what was never signed.
    artifact_errors: list[str] = field(default_factory=list)
    # Matrix items pytest deselected (-k, --deselect): their cells never run, so the evidence
    # is incomplete and the gate fails (a filter must not be a way to drop a failing cell).
    deselected: list[str] = field(default_factory=list)
    futures: dict[str, Future[dict[str, Any]]] = field(default_factory=dict)
    # Set at signing when the run was not separated and a release key was given: the line
    # that says so, and whether --key insisted on it (the run then exits 2; cli.py).
    release_key_refused: str = ""
    release_key_insisted: bool = False

    def __post_init__(self) -> None:
        """Ask every backend whether it can run here, before any cell starts."""
        # Who runs the judged code: a dedicated unprivileged user where the harness is root.
        self.user = payload_user()
        # What the payload user must read (the CA bundle, task files, cell dirs) is made by
        # this process; a restrictive umask (077 in some CI shells) would make every cell
        # measure file modes. Secrets are never left to the umask: keys, the report dir and
        # its files get explicit modes (attest/keys.py, attest/reportfs.py).
        if self.user is not None:
            os.umask(0o022)
        self.trust_domains = trust_domains(self.user)
        # Before any backend is asked: the payload user must reach the interpreter and what
        # the backends bind, or every cell measures file modes (sandbox_attest/run/reach.py).
        self.reach: Preflight = preflight(self.user)
        self.backends: dict[str, Backend] = {}
        self.availability: dict[str, Availability] = {}
        names = [self.matrix.control, *[n for n in self.backend_names if n != self.matrix.control]]
        for name in names:
            backend = create_backend(name)
            self.backends[name] = backend
            self.availability[name] = backend.availability()
        self.policy = load_policy(self.policy_path)
        check_names(self.matrix, self.policy)
        self.required = required_cells(self.policy, self.platform)
        self.writer = EvidenceWriter(
            report_dir=self.report_dir,
            run_id=self.run_id,
            policy_path=self.policy_path,
            matrix_digest=self.matrix.digest,
            backends=[self._backend_record(n) for n in names],
            matrix_path=self.matrix.path,
            run_facts={"trust_domains": self.trust_domains, "world": world_fact()},
        )
        # Which Python ran the payloads, and why that one (sandbox_attest/host/interpreter.py).
        self.writer.run_facts["payload_interpreter"] = self.reach.python.as_dict()

    def _backend_record(self, name: str) -> dict[str, Any]:
        avail = self.availability[name]
        return {
            "name": name,
            "available": avail.ok,
            "reason": avail.reason,
            "identity": avail.identity.as_dict() if avail.identity else None,
            # In the set to show a verdict (matrix.toml's `demonstration`): a reader must not
            # take its FAIL for news about the sandbox (issue 29).
            **({"demonstration": demo} if (demo := self._demonstration(name)) else {}),
        }

    def _demonstration(self, name: str) -> str:
        """Why `name` is in the matrix as a demonstration, or "" (also for a spec's backend)."""
        return next((row.demonstration for row in self.matrix.backends if row.name == name), "")

    def cells(self) -> list[Cell]:
        """The cells of this run, control leg first."""
        return self.matrix.cells(list(self.backends), self.platform)

    def is_required(self, cell: Cell, verdict: str | None = None) -> bool:
        """Whether this cell must PASS: by policy, or because its backend was required.

        Naming a backend asks for every cell that applies to it. One the runner found
        NOT_APPLICABLE (a claim the backend does not make, an egress route it does not have)
        does not apply, so naming the backend does not require it; the policy still can,
        and is what keeps a backend from passing by claiming nothing (`[[require]] claims`).
        """
        applies = cell.not_applicable is None and verdict != Verdict.NOT_APPLICABLE.value
        return (
            (cell.backend, cell.probe.id) in self.required
            or cell.backend in self.required_backends
            or (cell.backend in self.named_backends and applies)
        )

    def _ensure_world(self) -> CellRunner | None:
        if self.runner is not None or self.world_error is not None:
            return self.runner
        self._sweep_leftovers()
        # A neutral name: every workspace lives under it, so a wrapper sees it (issue 23).
        self.scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        self._journal_scratch()
        # The scratch holds workspaces that non-root sandbox users must traverse.
        self.scratch.chmod(0o755)
        if not self._stage_payload_files(self.scratch):
            return None
        try:
            self.world = start_world(self.scratch / "world", lab=current_lab())
        except (HarnessError, OSError) as exc:
            self.world_error = f"the fixture world failed to start: {exc}"
            return None
        self.runner = CellRunner(
            world=self.world,
            scratch=self.scratch,
            backends=self.backends,
            availability=self.availability,
            platform=self.platform,
            control_leg=self.matrix.control,
            user=self.user,
        )
        return self.runner

    def _stage_payload_files(self, scratch: Path) -> bool:
        """Copy the payload files into `scratch` if the payload user cannot read the installed.

        Returns:
            False when the copy failed (the reason is the run's world error: every cell is
            ERROR with it, since no payload could start).
        """
        try:
            copy = stage_payload_files(scratch, self.reach)
        except OSError as exc:
            self.world_error = f"the payload files could not be copied into {scratch}: {exc}"
            return False
        if copy is not None:
            self.writer.run_facts["payload_files"] = {
                "copied_to": str(copy),
                # The first refusal says why and what would fix it; the rest share its cause.
                "because": next(p.line(self.user) for p in self.reach.copy_needed if self.user),
                "unreadable": len(self.reach.copy_needed),
            }
        return True

    def _judge(self, cell: Cell) -> dict[str, Any]:
        runner = self._ensure_world()
        reason = self.world_error
        if runner is not None and self.world is not None and cell.not_applicable is None:
            try:
                # A fixture that died in an earlier cell stays dead: this cell is not run
                # against it (its payload's attempts would go unwitnessed), only recorded.
                self.world.check_health()
            except FixtureError as exc:
                reason = f"not run: {exc}"
                runner = None
        if runner is None:
            return {
                "cell_id": cell.cell_id,
                "backend": cell.backend,
                "probe": cell.probe.id,
                "platform": self.platform,
                "verdict": Verdict.ERROR.value,
                "reason": reason,
            }
        return runner.run_cell(cell)

    def plan(self, cells: list[Cell]) -> None:
        """With jobs > 1, start running `cells` in a pool: the control leg first, then the rest.

        Later legs are judged against the control leg, so phase two starts only when every
        control cell is done. Each cell has its own nonce, so the shared world's logs never
        mix. Items still report (and evidence is still appended) in collection order.
        """
        if self.jobs <= 1 or self.futures:
            return
        self._ensure_world()
        self.futures = {cell.cell_id: Future() for cell in cells}
        control = [c for c in cells if c.backend == self.matrix.control]
        rest = [c for c in cells if c.backend != self.matrix.control]

        def run_into(cell: Cell) -> None:
            future = self.futures[cell.cell_id]
            cut = caught_signal()
            if cut is not None:
                # A signal ends the run: queued cells are not started (their items record
                # them as cut short), so the interrupted run stops instead of finishing.
                future.set_exception(cut)
                return
            try:
                future.set_result(self._judge(cell))
            except BaseException as exc:  # surfaced to the waiting item, never swallowed
                future.set_exception(exc)

        def orchestrate() -> None:
            with ThreadPoolExecutor(self.jobs, thread_name_prefix="cell") as pool:
                list(pool.map(run_into, control))
                list(pool.map(run_into, rest))

        threading.Thread(target=orchestrate, name="cell-pool", daemon=True).start()

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        """Run (or, when planned in parallel, await) one cell and record it durably."""
        future = self.futures.get(cell.cell_id)
        entry = future.result() if future is not None else self._judge(cell)
        entry["required"] = self.is_required(cell, entry.get("verdict"))
        self._journal(entry)
        return entry

    def _journal(self, entry: dict[str, Any]) -> None:
        """Append a judged cell to evidence.jsonl; a write that fails is said, never raised.

        The cell is kept in memory either way, so the run goes on and its gate names the
        failure: a full disk must end in a gate line and a non-zero exit, not a traceback
        that loses the cells judged so far. After the first failure nothing more is appended:
        a line torn by the full disk must not be glued to the next cell's line.
        """
        from sandbox_attest.report import files as reportfs  # noqa: PLC0415
        from sandbox_attest.report.evidence import JOURNAL_NAME  # noqa: PLC0415

        if getattr(self, "_journal_failed", False):
            self.writer.cells.append(entry)
            return
        try:
            self.writer.add_cell(entry)  # appends to .cells first, then writes
        except OSError as exc:
            self._journal_failed = True
            message = reportfs.write_failure(self.report_dir, JOURNAL_NAME, exc)
            self.artifact_errors.append(
                f"{message} (the cells judged before {entry['cell_id']} are in it)"
            )
            print(f"sandbox-attest: {self.artifact_errors[-1]}", flush=True)

    def record_aborted(self, cell: Cell, exc: BaseException) -> None:
        """Record an ERROR for a cell whose run was cut short (pytest-timeout, Ctrl-C).

        Without it the cell would leave no evidence entry at all; a cell that already has
        one (the exception came after it was recorded) keeps it.
        """
        if any(c["cell_id"] == cell.cell_id for c in self.writer.cells):
            return
        if isinstance(exc, RunInterrupted):
            # The signal's name is the reason: "cut short by SIGTERM" tells a reader that
            # `timeout` or a CI cancel ended the run, not a fault of the sandbox.
            reason = f"cut short by {exc.signame} before it was judged"
        else:
            reason = (
                f"the cell was cut short before it was judged: {type(exc).__name__}: "
                f"{str(exc)[:400]}"
            )
        entry = {
            "cell_id": cell.cell_id,
            "backend": cell.backend,
            "probe": cell.probe.id,
            "platform": self.platform,
            "verdict": Verdict.ERROR.value,
            "reason": reason,
            "required": self.is_required(cell),
        }
        # The entry is kept in memory even when the journal write fails; evidence.json gets it.
        self._journal(entry)

    def expected_required(self) -> set[tuple[str, str]]:
        """Every (backend, probe) this run must produce: the policy's, and the named ones'."""
        policy = {pair for pair in self.required if pair[0] in self.backends}
        return policy | {(c.backend, c.probe.id) for c in self.cells() if self.is_required(c)}

    def missing_required(self) -> list[str]:
        """Required cells of this run's backends that the run never produced."""
        seen = {(str(c["backend"]), str(c["probe"])) for c in self.writer.cells}
        return sorted(f"{b}-{p}" for b, p in self.expected_required() - seen)

    def not_attested(self) -> list[str]:
        """Backends the policy requires on this platform that this run did not select.

        A CI leg attests one backend and the release merge checks that every leg is there, so
        these are listed for the reader; they never count as a PASS.
        """
        return sorted({backend for backend, _ in self.required} - set(self.backends))

    def unrunnable_named(self) -> list[str]:
        """Backends the user named that cannot run on this platform at all.

        Every cell of theirs is NOT_APPLICABLE, so naming one attests nothing; the user meant
        to attest it and must be told where it runs.
        """
        lines = []
        for name in sorted((self.named_backends | self.required_backends) & set(self.backends)):
            row = self.matrix.backend(name)
            if self.platform in row.platforms:
                continue
            runners = " or ".join(RUNNER_NAMES.get(p, p) for p in row.platforms)
            lines.append(
                f"backend {name} runs on {', '.join(row.platforms)} only; "
                f"run it on a {runners} runner"
            )
        return lines

    def environment(self) -> dict[str, str]:
        """Who ran what, for allure's environment.properties."""
        env = {
            "run_id": self.run_id,
            "platform": self.platform,
            "policy": f"{self.policy_path} sha256:{file_sha256(self.policy_path)}",
            "matrix": f"sha256:{self.matrix.digest}",
            "harness": __version__,
        }
        for name, avail in self.availability.items():
            ident = avail.identity
            env[f"backend.{name}"] = (
                f"{ident.version}; {ident.profile_digest}"
                if ident
                else f"UNAVAILABLE: {avail.reason}"
            )
        return env

    def gate_warnings(self) -> list[str]:
        """What nothing required but a reader must see: shown, never hidden.

        Cells that did not PASS, and backends that were skipped as UNAVAILABLE (one line per
        backend: its cells attest nothing, whatever the grid's other columns say). Cells
        with the same verdict and the same reason are one line with their count, so one
        broken wrapper does not repeat its reason for every probe.
        """
        groups: dict[tuple[str, str, str], list[str]] = {}
        for c in self.writer.cells:
            if c.get("required") or c["verdict"] not in ("FAIL", "INCONCLUSIVE", "ERROR"):
                continue
            if c["backend"] == self.matrix.control:
                hint = f"control leg: add it to a [[require]] of {self.policy_path} to require it"
            else:
                hint = f"name --backend {c['backend']} to require it"
            key = (str(c["verdict"]), hint, " ".join(str(c["reason"]).split()))
            groups.setdefault(key, []).append(str(c["cell_id"]))
        lines = []
        for (verdict, hint, reason), ids in groups.items():
            if len(ids) == 1:
                lines.append(f"{ids[0]} is {verdict} (not required: {hint}): {reason}")
            else:
                lines.append(
                    f"{len(ids)} cells are {verdict} for the same reason (not required: "
                    f"{hint}): {reason} [{', '.join(ids)}]"
                )
        skipped: dict[str, list[dict[str, Any]]] = {}
        # A backend with a required UNAVAILABLE cell is a gate failure (`gate_failures` says
        # it once, counting all its cells); a warning here too would contradict it (issue 29).
        failing = set(self._unavailable_required())
        for c in self.writer.cells:
            if c["backend"] in failing:
                continue
            if not c.get("required") and c["verdict"] == Verdict.UNAVAILABLE.value:
                skipped.setdefault(str(c["backend"]), []).append(c)
        for backend, cells in skipped.items():
            n = len(cells)
            lines.append(
                f"backend {backend} is UNAVAILABLE, so its {n} {'cell' if n == 1 else 'cells'} "
                f"attest{'s' if n == 1 else ''} nothing (not required: name --backend {backend} "
                f"to require it): {cells[0]['reason']}"
            )
        return lines

    def _unavailable_required(self) -> dict[str, str]:
        """Backends that could not run although some of their cells are required: one line each.

        The line counts every cell of the backend and says who requires them, so the
        warning list (which skips these backends) and the gate never disagree on either.
        """
        lines: dict[str, str] = {}
        for backend in dict.fromkeys(str(c["backend"]) for c in self.writer.cells):
            cells = [c for c in self.writer.cells if c["backend"] == backend]
            required = [
                c for c in cells if c.get("required") and c["verdict"] == Verdict.UNAVAILABLE.value
            ]
            if not required:
                continue
            if backend in self.named_backends | self.required_backends:
                who = "you named it"
                fix = "make it available here, or leave it out of --backend"
            else:
                who = f"the release policy {self.policy_path} requires them"
                others = [b for b in self.backends if b not in (backend, self.matrix.control)]
                fix = (
                    "make it available here, or attest the others without it ("
                    + " ".join(f"--backend {b}" for b in others[:3])
                    + f"; a release then needs a {backend} leg from elsewhere)"
                )
            lines[backend] = (
                f"backend {backend} is UNAVAILABLE and {len(required)} of its "
                f"{len(cells)} {'cell' if len(cells) == 1 else 'cells'} "
                f"{'is' if len(required) == 1 else 'are'} required "
                f"({who}): {required[0]['reason']}; {fix}"
            )
        return lines

    def signed_gate(self, *, complete: bool = True) -> Gate:
        """The gate the attestation signs: `evaluate` over these cells with this policy."""
        return evaluate(
            self.writer.cells,
            self.policy,
            default_platform=self.platform,
            complete=complete,
            world=str(self.writer.run_facts.get("world", {}).get("kind")),
        )

    def gate_failures(self) -> list[str]:
        """Why the release gate does not hold for this run; empty when it holds.

        Only required cells (the policy's, or a named backend's) decide the gate: a FAIL in a
        backend nobody requires is reported in the grid and the evidence, never hidden, but it
        does not make the run's exit status non-zero. An empty requirement never holds, and
        neither does a run in which no sandbox backend was judged: the control leg alone
        attests nothing. The signed gate (`evaluate`) is checked too, so the exit status and
        the attestation cannot disagree.
        """
        if not self.required and not self.required_backends:
            return ["the policy requires no cell on this platform; nothing can be attested"]
        failures = self.unrunnable_named()
        judged = [
            c
            for c in self.writer.cells
            if c.get("required")
            and c["backend"] != self.matrix.control
            and c["verdict"] not in UNJUDGED
        ]
        if not judged:
            selected = ", ".join(self.backends)
            failures.append(
                "no sandbox backend the policy requires ran: no required cell of a sandbox "
                "backend was judged, and the control leg alone attests nothing "
                f"(selected: {selected})"
            )
        failures += [f"missing required cell {cell_id}" for cell_id in self.missing_required()]
        unavailable = self._unavailable_required()
        failures += [
            f"required cell {c['cell_id']} is {c['verdict']}: {c['reason']}"
            for c in self.writer.cells
            if c.get("required")
            and c["verdict"] != "PASS"
            and not (c["verdict"] == Verdict.UNAVAILABLE.value and c["backend"] in unavailable)
        ]
        failures += list(unavailable.values())
        # The claims the policy requires of a leg: `verify` holds the signed identities to
        # them, and the run's own exit status must say the same.
        claims = {
            name: avail.identity.policy.claims()
            for name, avail in self.availability.items()
            if avail.identity is not None
        }
        legs = {cell_leg(c, self.platform) for c in self.writer.cells}
        failures += claim_problems(self.policy, claims, legs)
        if self.deselected:
            failures.append(
                f"{len(self.deselected)} cells were deselected (-k/--deselect), so the "
                f"evidence is incomplete: {', '.join(self.deselected[:5])}"
            )
        if not failures:
            failures = [f"the signed gate is FAILED: {p}" for p in self.signed_gate().problems]
        return failures

    def finish(self, *, complete: bool) -> list[str]:
        """Stop the world, write evidence.json, then sign and render. Idempotent.

        Returns:
            Lines for the user: where the report is, how it was signed, what failed.
        """
        if self.finished:
            return []
        self.finished = True
        if self.world is not None:
            self.world.stop()
        for backend in self.backends.values():
            # Backends that create engine objects (docker's per-run image tag) remove them.
            close = getattr(backend, "close", None)
            if callable(close):
                try:
                    close()
                except (HarnessError, OSError) as exc:
                    print(f"sandbox-attest: cleanup of backend {backend.name} failed: {exc}")
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self._unjournal_scratch()
            unstage()  # the copy of the payload files went with the scratch
        # Measured now that every cell is judged: who each backend's processes ran as
        # (sandbox_attest/run/separation.py). The signer refuses a release key for a run that is
        # not separated (`_sign_and_render`).
        try:
            self.trust_domains = trust_domains(self.user, self.backends, self.writer.cells)
        except Exception as exc:  # a fault here must not cost the report
            # Fail closed: an unmeasured fact is never separated, and the run still signs.
            self.trust_domains = {
                "separated": False,
                "measured": False,
                "reason": f"the trust domains could not be measured: {type(exc).__name__}: {exc}",
            }
        self.writer.run_facts["trust_domains"] = self.trust_domains
        try:
            evidence = self.writer.write(complete=complete and not self.deselected)
        except HarnessError as exc:
            # Nothing can be signed that is not on disk: the report stays as it is (the
            # journal keeps the cells written before), and the gate fails naming why.
            self.artifact_errors.append(
                f"the report was neither signed nor rendered: {exc.diagnostics()}"
            )
            self._close_own_signer()
            return [*self.swept_lines, f"evidence NOT written: {exc.diagnostics()}"]
        return [
            *self.swept_lines,
            f"evidence: {self.report_dir / 'evidence.json'}",
            *self._sign_and_render(evidence),
        ]

    # -- what killed runs leave (sandbox_attest/run/sweep.py)
    # -------------------------------------------

    def _sweep_leftovers(self) -> None:
        """Remove what runs that are gone left on this host, before this run makes anything.

        Recorded in the evidence as `swept` (what, target, why, removed) and said in the
        run's output: a cell must never depend on an earlier run's leftovers, and a reader
        must see that the host was cleaned. Never a live run's (see sandbox_attest/run/sweep.py).
        """
        from sandbox_attest.run import sweep  # noqa: PLC0415

        homes = [self.user.home] if self.user is not None else [Path.home()]
        owners = {os.geteuid(), *([self.user.uid] if self.user is not None else [])}
        try:
            swept = sweep.sweep(homes=homes, owners=owners, docker=True)
        except (HarnessError, OSError) as exc:
            self.swept_lines = [f"swept: the sweep of earlier runs' leftovers failed: {exc}"]
            self.writer.run_facts["swept"] = [
                {"what": "sweep", "target": "", "why": str(exc), "removed": False}
            ]
            return
        self.writer.run_facts["swept"] = [dataclasses.asdict(s) for s in swept]
        self.swept_lines = [s.line() for s in swept]

    @property
    def swept_lines(self) -> list[str]:
        """The sweep's lines for the run's output (empty before the world starts)."""
        return list(getattr(self, "_swept_lines", []))

    @swept_lines.setter
    def swept_lines(self, lines: list[str]) -> None:
        self._swept_lines = lines

    def _journal_key(self) -> str:
        return f"run-{self.run_id}"

    def _journal_scratch(self) -> None:
        """Journal the scratch directory (and docker run ids) before anything is put in it.

        A SIGKILLed run cannot remove its scratch or containers; the next run's sweep finds
        them through this entry once this process is gone.
        """
        from sandbox_attest.host import journal as sweep  # noqa: PLC0415

        if self.scratch is None:
            return
        # Docker labels its containers with the backend's own run id, not the session's.
        ids = (getattr(b, "run_id", None) for b in self.backends.values())
        docker_ids = [i for i in ids if isinstance(i, str)]
        try:
            sweep.record(
                self._journal_key(), [self.scratch], run_id=self.run_id, docker_run_ids=docker_ids
            )
        except (HarnessError, OSError) as exc:
            self.swept_lines = [*self.swept_lines, f"swept: scratch not journalled: {exc}"]

    def _unjournal_scratch(self) -> None:
        from sandbox_attest.host import journal as sweep  # noqa: PLC0415

        try:
            sweep.forget(self._journal_key())
        except (HarnessError, OSError) as exc:
            print(f"sandbox-attest: journal entry of {self.scratch} not removed: {exc}")

    def use_signer(self, signer: Signer | None = None) -> Signer:
        """Attach the run's signer process (starting one if none is given); call before cells.

        Starting it removes `$SANDBOX_ATTEST_SIGNING_KEY` from `os.environ`, so no cell,
        wrapper or helper started later inherits it. The policy's bytes are read here too, and
        must be the ones the run loaded: the signer re-derives the gate from exactly them.

        Args:
            signer: one started already (`sandbox-attest run` starts it before pytest); it
                stays the caller's to close. Without it one is started with `key_path` and
                closed when the run finishes.

        Returns:
            The attached signer.

        Raises:
            ConfigError: the key is unusable (the message names the fix), or the policy file
                changed since the run loaded it.
            ReportError: the signer process did not start.
        """
        from sandbox_attest.attest.signer import Signer  # noqa: PLC0415  (only a run signs)

        existing: Signer | None = getattr(self, "_signer", None)
        if existing is not None and signer is None:
            return existing
        data = Path(self.policy_path).read_bytes()
        if hashlib.sha256(data).hexdigest() != self.policy.sha256:
            raise ConfigError(
                f"{self.policy_path} changed since this run loaded it; the run is judged by the "
                "policy it started with, so re-run with the policy you mean"
            )
        self._policy_bytes = data
        self._owns_signer = signer is None
        attached = signer if signer is not None else Signer.start(self.key_path, os.environ)
        self._signer: Signer | None = attached
        return attached

    def _render_views(self, evidence: dict[str, Any], signer: SignerFacts | None) -> Views:
        """Every view of the judged evidence, rendered once by `report.build.render_views`."""
        from sandbox_attest.report.build import render_views  # noqa: PLC0415

        return render_views(evidence, signer, self.policy, also_missing=self.missing_required())

    def _sign_and_render(self, evidence_bytes: bytes) -> list[str]:
        """Render the views from the judged evidence and have the signer write and sign all.

        The signer gets the exact bytes: evidence.json as serialized once, and junit.xml,
        report.html and summary.md rendered here from that evidence (`_render_views`), the
        policy bytes and this session's gate. allure-results/ is rendered from the same
        evidence and written first, so the signer's tree digest covers it. A report that
        could not be signed still gets its views, saying NOT SIGNED, and the failure fails
        the run.
        """
        import json  # noqa: PLC0415

        from sandbox_attest.report.build import write_allure  # noqa: PLC0415
        from sandbox_attest.report.files import EVIDENCE, HTML, JUNIT, SUMMARY  # noqa: PLC0415
        from sandbox_attest.report.views.summary import append_step_summary  # noqa: PLC0415

        lines: list[str] = []
        evidence = json.loads(evidence_bytes)
        # The gate the console prints (`signed_gate`), over the cells just serialized; the
        # signer refuses to sign if the bytes it gets give another.
        gate = self.signed_gate(complete=evidence.get("complete") is True).result
        views: dict[str, bytes] = {}
        try:
            signer = self.use_signer()
            if self.trust_domains.get("separated") is not True:
                # Before rendering: the views name the key that signs (issue 23).
                refusal = signer.refuse_release(str(self.trust_domains.get("reason", "")))
                if refusal:
                    lines.append(refusal)
            rendered = self._render_views(evidence, signer.facts)
            views = rendered.files
            write_allure(self.report_dir, rendered)
            reply = signer.sign_report(
                self.report_dir,
                {EVIDENCE: evidence_bytes, **views},
                policy_bytes=self._policy_bytes,
                policy_path=str(self.policy_path),
                gate=gate,
            )
            lines.append(f"attestation: {reply.attestation}")
            if signer.refusal and signer.refusal not in lines:
                lines.append(signer.refusal)
            self.release_key_refused = signer.refusal
            self.release_key_insisted = bool(signer.refusal) and signer.requested == "--key"
        except (HarnessError, OSError) as exc:
            self.artifact_errors.append(f"the attestation was not written: {exc}")
            lines.append(f"attestation NOT written: {exc}")
            views = self._write_unsigned_views(evidence)
        finally:
            self._close_own_signer()
        lines.extend(
            f"{name.split('.')[0]}: {self.report_dir / name}"
            for name in (JUNIT, HTML, SUMMARY)
            if name in views
        )
        if SUMMARY in views:
            try:
                append_step_summary(views[SUMMARY].decode("utf-8"))
            except OSError as exc:
                lines.append(f"$GITHUB_STEP_SUMMARY not appended to: {exc}")
        return lines

    def _write_unsigned_views(self, evidence: dict[str, Any]) -> dict[str, bytes]:
        """Write junit.xml, report.html, summary.md and allure-results/ saying NOT SIGNED.

        Returns:
            The files written (allure-results/ not included).
        """
        from sandbox_attest.report import files as reportfs  # noqa: PLC0415
        from sandbox_attest.report.build import write_allure  # noqa: PLC0415

        written: dict[str, bytes] = {}
        rendered = self._render_views(evidence, None)
        try:
            dir_fd = reportfs.open_report_dir(self.report_dir)
        except HarnessError as exc:
            self.artifact_errors.append(f"the report views were not written: {exc}")
            return written
        try:
            for name, data in rendered.files.items():
                try:
                    reportfs.write_new(dir_fd, name, data)
                except (HarnessError, OSError) as exc:
                    self.artifact_errors.append(f"{name} was not written: {exc}")
                else:
                    written[name] = data
        finally:
            os.close(dir_fd)
        try:
            write_allure(self.report_dir, rendered)
        except (HarnessError, OSError) as exc:
            self.artifact_errors.append(f"{reportfs.ALLURE_DIR}/ was not written: {exc}")
        return written

    def _close_own_signer(self) -> None:
        """Close the signer if this session started it (the caller closes one it handed in)."""
        signer: Signer | None = getattr(self, "_signer", None)
        if signer is not None and getattr(self, "_owns_signer", False):
            signer.close()
            self._signer = None
