"""One attestation run: the world, the backends, the cells, and what is written at the end.

`RunSession` is created by sandbox_attest/run/setup.py (for the CLI and the pytest plugin
alike) and owns every decision about a run's lifetime: which backends are asked
(run/availability.py), when the world starts (run/world.py), how cells run (run/pool.py),
what the gate requires (run/requirements.py), how an interrupted run keeps its evidence, and
what gets signed and rendered once the cells are done.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest import __version__
from sandbox_attest.catalog import PROBES
from sandbox_attest.errors import ConfigError, HarnessError
from sandbox_attest.host import cellgroup, kernel
from sandbox_attest.host.lifetime import RunInterrupted, caught_signal
from sandbox_attest.host.provenance import file_sha256
from sandbox_attest.host.separation import trust_domains
from sandbox_attest.host.trust import payload_user
from sandbox_attest.report.evidence import CellEntry, EvidenceWriter, cell_entry
from sandbox_attest.report.policy import Gate, Policy, gate_for, load_policy
from sandbox_attest.run.availability import ask_backends, backend_record, close_backends
from sandbox_attest.run.matrix import Cell, Matrix, current_platform
from sandbox_attest.run.pool import CellPool
from sandbox_attest.run.reach import Preflight, preflight
from sandbox_attest.run.requirements import Requirements, check_names
from sandbox_attest.run.world import RunWorld
from sandbox_attest.verdict import Verdict
from sandbox_attest.world.lab import world_fact

if TYPE_CHECKING:
    from sandbox_attest.attest.signer import Signer
    from sandbox_attest.backends import Backend
    from sandbox_attest.backends.base import Availability
    from sandbox_attest.host.trust import PayloadUser
    from sandbox_attest.report.build import Views
    from sandbox_attest.report.signature import SignerFacts


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus a random suffix."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


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
    finished: bool = False
    jobs: int = 1
    # Report files that could not be written (attestation, HTML, summary): the gate fails on
    # them, because a release cannot verify what was never signed.
    artifact_errors: list[str] = field(default_factory=list)
    # Matrix items pytest deselected (-k, --deselect): their cells never run, so the evidence
    # is incomplete and the gate fails (a filter must not be a way to drop a failing cell).
    deselected: list[str] = field(default_factory=list)
    # Set at signing when the run was not separated and a release key was given: the line
    # that says so, and whether --key insisted on it (the run then exits 2; cli.py).
    release_key_refused: str = ""
    release_key_insisted: bool = False
    # Set up by __post_init__, before any cell starts.
    user: PayloadUser | None = field(init=False)
    trust_domains: dict[str, Any] = field(init=False)
    reach: Preflight = field(init=False)
    backends: dict[str, Backend] = field(init=False)
    availability: dict[str, Availability] = field(init=False)
    policy: Policy = field(init=False)
    rules: Requirements = field(init=False)
    writer: EvidenceWriter = field(init=False)
    world: RunWorld = field(init=False)
    pool: CellPool = field(init=False)
    # The signer (`use_signer`), whether this session started it (then it closes it), and
    # the policy's bytes as the run loaded them (the signer re-derives the gate from them).
    _signer: Signer | None = field(default=None, init=False)
    _owns_signer: bool = field(default=False, init=False)
    _policy_bytes: bytes = field(default=b"", init=False)
    # A write to evidence.jsonl failed: nothing more is appended to it (`_journal`).
    _journal_failed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        """Ask every backend whether it can run here, before any cell starts."""
        self.start_kernel_witness()
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
        self.reach = preflight(self.user)
        self.backends, self.availability = ask_backends(self.matrix, self.backend_names)
        self.policy = load_policy(self.policy_path)
        check_names(self.matrix, self.policy)
        self.rules = Requirements(
            matrix=self.matrix,
            policy=self.policy,
            policy_path=self.policy_path,
            platform=self.platform,
            backends=list(self.backends),
            availability=self.availability,
            required_backends=self.required_backends,
            named_backends=self.named_backends,
        )
        self.writer = EvidenceWriter(
            report_dir=self.report_dir,
            run_id=self.run_id,
            policy_path=self.policy_path,
            matrix_digest=self.matrix.digest,
            backends=[backend_record(self.matrix, n, a) for n, a in self.availability.items()],
            matrix_path=self.matrix.path,
            run_facts={"trust_domains": self.trust_domains, "world": world_fact()},
        )
        # Which Python ran the payloads, and why that one (sandbox_attest/host/interpreter.py).
        self.writer.run_facts["payload_interpreter"] = self.reach.python.as_dict()
        self.world = RunWorld(
            run_id=self.run_id,
            user=self.user,
            reach=self.reach,
            backends=self.backends,
            availability=self.availability,
            platform=self.platform,
            control_leg=self.matrix.control,
            run_facts=self.writer.run_facts,
        )
        self.pool = CellPool(self.world, self.jobs, self.matrix.control)
        self.writer.run_facts["kernel_witness"] = self.kernel_facts()

    @staticmethod
    def start_kernel_witness() -> None:
        """Start the kernel witness first (sandbox_attest/host/kernel/).

        bpftrace compiles and attaches while the backends are asked and the world is set up;
        the first cell waits for it. Cells are filtered by their cgroup, so the run cgroup is
        made now (it would be at the first cell). Where no witness can run, the evidence says
        why and verdicts use the host's other readings.
        """
        run, why = cellgroup.run_cgroup()
        kernel.start_run(run is not None, why)

    @staticmethod
    def kernel_facts(notes: list[str] | None = None) -> dict[str, Any]:
        """The kernel witness's status as the evidence carries it."""
        witness = kernel.run_witness()
        facts = witness.facts() if witness is not None else {"status": "unavailable"}
        return {**facts, "notes": notes} if notes else facts

    # -- the gate's rules (sandbox_attest/run/requirements.py), over the cells judged so far

    @property
    def required(self) -> set[tuple[str, str]]:
        """(backend, probe) pairs the release policy requires to PASS on this platform."""
        return self.rules.required

    def cells(self) -> list[Cell]:
        """The cells of this run, control leg first."""
        return self.rules.cells()

    def is_required(self, cell: Cell, verdict: str | None = None) -> bool:
        """Whether this cell must PASS (`Requirements.is_required`)."""
        return self.rules.is_required(cell, verdict)

    def expected_required(self) -> set[tuple[str, str]]:
        """Every (backend, probe) this run must produce: the policy's, and the named ones'."""
        return self.rules.expected_required()

    def missing_required(self) -> list[str]:
        """Required cells of this run's backends that the run never produced."""
        return self.rules.missing_required(self.writer.cells)

    def not_attested(self) -> list[str]:
        """Backends the policy requires on this platform that this run did not select."""
        return self.rules.not_attested()

    def unrunnable_named(self) -> list[str]:
        """Backends the user named that cannot run on this platform at all."""
        return self.rules.unrunnable_named()

    def gate_warnings(self) -> list[str]:
        """What nothing required but a reader must see (`Requirements.gate_warnings`)."""
        return self.rules.gate_warnings(self.writer.cells)

    def signed_gate(self, *, complete: bool = True) -> Gate:
        """The gate the attestation signs: `gate_for` over the evidence as it stands.

        The signer and `verify` derive it with the same function from the serialised evidence.
        """
        return gate_for(self.writer.gate_input(complete=complete), self.policy)

    def gate_failures(self) -> list[str]:
        """Why the release gate does not hold for this run (`Requirements.gate_failures`)."""
        return self.rules.gate_failures(
            self.writer.cells, self.deselected, signed=self.signed_gate()
        )

    # -- the cells: run (in the pool once planned) and recorded durably

    def plan(self, cells: list[Cell]) -> None:
        """With jobs > 1, start running `cells` in a pool: the control leg first, then the rest.

        First each planned probe may begin a host measurement its cells share (`warm_up`:
        fs_write_outside's scan for writable places), off the first cell's path.
        """
        for probe in dict.fromkeys(c.probe.id for c in cells if c.not_applicable is None):
            PROBES[probe].warm_up(self.user)
        self.pool.plan(cells)

    def run_cell(self, cell: Cell) -> CellEntry:
        """Run (or, when planned in parallel, await) one cell and record it durably.

        Raises:
            RunInterrupted: a run signal arrived while the cell ran. The handler raises it
                once, but code on the way may have turned it into another exception (a
                cleanup that failed as the signal cut it, which the runner then judged an
                ERROR cell) or swallowed it: the recorded signal, not the exception's
                fate, ends the run, so an interrupted run never goes on to call itself
                complete.
        """
        entry = self.pool.result(cell)
        cut = caught_signal()
        if cut is not None:
            raise cut
        entry["required"] = self.is_required(cell, entry.get("verdict"))
        self._journal(entry)
        return entry

    def _journal(self, entry: CellEntry) -> None:
        """Append a judged cell to evidence.jsonl; a write that fails is said, never raised.

        The cell is kept in memory either way, so the run goes on and its gate names the
        failure: a full disk must end in a gate line and a non-zero exit, not a traceback
        that loses the cells judged so far. After the first failure nothing more is appended:
        a line torn by the full disk must not be glued to the next cell's line.
        """
        from sandbox_attest.report import files as reportfs  # noqa: PLC0415
        from sandbox_attest.report.evidence import JOURNAL_NAME  # noqa: PLC0415

        if self._journal_failed:
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
        entry = cell_entry(
            cell_id=cell.cell_id,
            backend=cell.backend,
            probe=cell.probe.id,
            platform=self.platform,
            verdict=Verdict.ERROR.value,
            reason=reason,
            required=self.is_required(cell),
        )
        # The entry is kept in memory even when the journal write fails; evidence.json gets it.
        self._journal(entry)

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

    # -- the end of the run: the evidence written, signed and rendered

    def finish(self, *, complete: bool) -> list[str]:
        """Stop the world, write evidence.json, then sign and render. Idempotent.

        Returns:
            Lines for the user: where the report is, how it was signed, what failed.
        """
        if self.finished:
            return []
        self.finished = True
        # The witness goes first: a signal that ends the run must not leave bpftrace running
        # or a tracefs mount this run made (its notes are in the evidence). bpftrace detaches
        # its probes (about 0.4 s) while the world's fixtures stop.
        kernel.interrupt_run()
        try:
            self.world.stop()
        finally:
            self.writer.run_facts["kernel_witness"] = self.kernel_facts(kernel.stop_run())
        close_backends(self.backends)
        self.world.remove_scratch()
        # Measured now that every cell is judged: who each backend's processes ran as
        # (sandbox_attest/host/separation.py). The signer refuses a release key for a run that is
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
            return [*self.world.swept_lines, f"evidence NOT written: {exc.diagnostics()}"]
        return [
            *self.world.swept_lines,
            f"evidence: {self.report_dir / 'evidence.json'}",
            *self._sign_and_render(evidence),
        ]

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

        existing = self._signer
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
        self._signer = attached
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
        signer = self._signer
        if signer is not None and self._owns_signer:
            signer.close()
            self._signer = None
