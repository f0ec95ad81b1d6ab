"""One attestation run: the world, the backends, the cells, and what is written at the end.

`RunSession` is created by the pytest plugin (wiring only) and owns every decision about a
run's lifetime: when the world starts, which backends are asked, how an interrupted run keeps
its evidence, and what gets signed and rendered once the cells are done.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import __version__
from harness.backends import Backend, create_backend
from harness.backends.base import Availability
from harness.errors import HarnessError
from harness.evidence import EvidenceWriter, file_sha256
from harness.matrix import BackendRow, Cell, Matrix, current_platform
from harness.runner import CellRunner
from harness.verdict import Verdict
from harness.world import World, start_world


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
    from harness.backends import register_spec  # noqa: PLC0415
    from harness.backends.command import resolve_spec  # noqa: PLC0415
    from harness.backends.spec import load_spec  # noqa: PLC0415

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


def required_cells(policy_path: Path, platform: str) -> set[str]:
    """Cell ids the release policy requires to PASS on this platform."""
    from harness.attest.policy import load_policy  # noqa: PLC0415  (keeps import cycles out)

    policy = load_policy(policy_path)
    return {
        f"{req.backend}-{probe}"
        for req in policy.requirements
        if req.platform == platform
        for probe in req.probes
    }


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
    futures: dict[str, Future[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Ask every backend whether it can run here, before any cell starts."""
        self.backends: dict[str, Backend] = {}
        self.availability: dict[str, Availability] = {}
        names = [self.matrix.control, *[n for n in self.backend_names if n != self.matrix.control]]
        for name in names:
            backend = create_backend(name)
            self.backends[name] = backend
            self.availability[name] = backend.availability()
        self.required = required_cells(self.policy_path, self.platform)
        self.writer = EvidenceWriter(
            report_dir=self.report_dir,
            run_id=self.run_id,
            policy_path=self.policy_path,
            matrix_digest=self.matrix.digest,
            backends=[self._backend_record(n) for n in names],
        )

    def _backend_record(self, name: str) -> dict[str, Any]:
        avail = self.availability[name]
        return {
            "name": name,
            "available": avail.ok,
            "reason": avail.reason,
            "identity": avail.identity.as_dict() if avail.identity else None,
        }

    def cells(self) -> list[Cell]:
        """The cells of this run, control leg first."""
        return self.matrix.cells(list(self.backends), self.platform)

    def is_required(self, cell: Cell) -> bool:
        """Whether this cell must PASS: by policy, or because its backend was required."""
        return (
            cell.cell_id in self.required
            or cell.backend in self.required_backends
            or (cell.backend in self.named_backends and cell.not_applicable is None)
        )

    def _ensure_world(self) -> CellRunner | None:
        if self.runner is not None or self.world_error is not None:
            return self.runner
        self.scratch = Path(tempfile.mkdtemp(prefix="sandbox-attest-"))
        # The scratch holds workspaces that non-root sandbox users must traverse.
        self.scratch.chmod(0o755)
        try:
            self.world = start_world(self.scratch / "world")
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
        )
        return self.runner

    def _judge(self, cell: Cell) -> dict[str, Any]:
        runner = self._ensure_world()
        if runner is None:
            return {
                "cell_id": cell.cell_id,
                "backend": cell.backend,
                "probe": cell.probe.id,
                "platform": self.platform,
                "verdict": Verdict.ERROR.value,
                "reason": self.world_error,
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
        entry["required"] = self.is_required(cell)
        self.writer.add_cell(entry)
        return entry

    def _backend_of(self, cell_id: str) -> str:
        """The backend part of `<backend>-<probe>` (backend names may contain dashes)."""
        for row in self.matrix.probes:
            if cell_id.endswith(f"-{row.id}"):
                return cell_id[: -len(row.id) - 1]
        return cell_id.rsplit("-", 1)[0]

    def missing_required(self) -> list[str]:
        """Required cells of this run's backends that the run never produced."""
        seen = {c["cell_id"] for c in self.writer.cells}
        return sorted(c for c in self.required - seen if self._backend_of(c) in self.backends)

    def not_attested(self) -> list[str]:
        """Backends the policy requires on this platform that this run did not select.

        A CI leg attests one backend and the release merge checks that every leg is there, so
        these are listed for the reader; they never count as a PASS.
        """
        return sorted({self._backend_of(c) for c in self.required} - set(self.backends))

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
        """Cells that did not PASS in backends nothing required: shown, never hidden."""
        return [
            f"{c['cell_id']} is {c['verdict']} (not required: name --backend "
            f"{c['backend']} to require it): {c['reason']}"
            for c in self.writer.cells
            if not c.get("required") and c["verdict"] in ("FAIL", "INCONCLUSIVE", "ERROR")
        ]

    def gate_failures(self) -> list[str]:
        """Why the release gate does not hold for this run; empty when it holds.

        Only required cells (policy or --require-backend) decide the gate: a FAIL in a backend
        nobody requires is reported in the grid and the evidence, never hidden, but it does
        not make the run's exit status non-zero. An empty requirement never holds.
        """
        if not self.required and not self.required_backends:
            return ["the policy requires no cell on this platform; nothing can be attested"]
        sandboxes = {
            c["backend"]
            for c in self.writer.cells
            if c.get("required") and c["backend"] != self.matrix.control
        }
        if not sandboxes and not (self.required_backends | self.named_backends) - {
            self.matrix.control
        }:
            selected = ", ".join(self.backends)
            why = "the control leg alone attests nothing"
            return [f"no sandbox backend the policy requires ran: {why} (selected: {selected})"]
        failures = [f"missing required cell {cell_id}" for cell_id in self.missing_required()]
        failures += [
            f"required cell {c['cell_id']} is {c['verdict']}: {c['reason']}"
            for c in self.writer.cells
            if c.get("required") and c["verdict"] != "PASS"
        ]
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
        self.writer.write(complete=complete)
        return [f"evidence: {self.report_dir / 'evidence.json'}", *self._sign_and_render()]

    def _sign_and_render(self) -> list[str]:
        from harness.attest import load_signing_key, sign_report  # noqa: PLC0415
        from harness.render import write_html, write_summary  # noqa: PLC0415

        lines = []
        try:
            key = load_signing_key(self.key_path, os.environ)
            lines.append(f"attestation: {sign_report(self.report_dir, key)}")
        except (HarnessError, OSError) as exc:
            self.artifact_errors.append(f"the attestation was not written: {exc}")
            lines.append(f"attestation NOT written: {exc}")

        for writer in (write_html, write_summary):
            try:
                lines.append(f"{writer.__name__[6:]}: {writer(self.report_dir)}")
            except (HarnessError, OSError) as exc:
                self.artifact_errors.append(f"{writer.__name__} failed: {exc}")
                lines.append(f"{writer.__name__} failed: {exc}")
        return lines
