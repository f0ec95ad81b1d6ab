"""The run's gate rules: which cells a run must produce and PASS, and why its gate holds or not.

The release policy requires cells by (platform, backend, probe); naming a backend on the
command line requires every cell of it that applies. `Requirements` holds both for one run
and reads its judged cells (the evidence entries) against them: what is required, what is
missing, what only warns, and the gate that is signed. `RunSession` asks it with the cells it
has judged so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_attest.errors import ConfigError
from sandbox_attest.report.policy import (
    WARNED_VERDICTS,
    Gate,
    Policy,
    cell_leg,
    claim_problems,
)
from sandbox_attest.verdict import Verdict

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandbox_attest.backends.base import Availability
    from sandbox_attest.report.evidence import CellEntry
    from sandbox_attest.run.matrix import Cell, Matrix

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
class Requirements:
    """What one run must produce and PASS: the release policy's cells and the named backends'.

    Attributes:
        matrix: the run's matrix (its control leg and backend rows).
        policy: the release policy the run is judged by, loaded from `policy_path`.
        platform: this machine's platform.
        backends: every backend the run selected, control leg first.
        availability: each selected backend's answer to whether it runs here.
        required_backends: backends whose every cell is required (--require-backend).
        named_backends: backends the user named; every cell of theirs that applies must PASS.
        required: (backend, probe) pairs the policy requires to PASS on this platform.
    """

    matrix: Matrix
    policy: Policy
    policy_path: Path
    platform: str
    backends: list[str]
    availability: Mapping[str, Availability]
    required_backends: set[str]
    named_backends: set[str]
    required: set[tuple[str, str]] = field(init=False)

    def __post_init__(self) -> None:
        """The policy's cells for this platform."""
        self.required = required_cells(self.policy, self.platform)

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

    def expected_required(self) -> set[tuple[str, str]]:
        """Every (backend, probe) this run must produce: the policy's, and the named ones'."""
        policy = {pair for pair in self.required if pair[0] in self.backends}
        return policy | {(c.backend, c.probe.id) for c in self.cells() if self.is_required(c)}

    def missing_required(self, entries: list[CellEntry]) -> list[str]:
        """Required cells of this run's backends that the run never produced."""
        seen = {(str(c["backend"]), str(c["probe"])) for c in entries}
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

    def gate_warnings(self, entries: list[CellEntry]) -> list[str]:
        """What nothing required but a reader must see: shown, never hidden.

        Cells that did not PASS, and backends that were skipped as UNAVAILABLE (one line per
        backend: its cells attest nothing, whatever the grid's other columns say). Cells
        with the same verdict and the same reason are one line with their count, so one
        broken wrapper does not repeat its reason for every probe.
        """
        groups: dict[tuple[str, str, str], list[str]] = {}
        for c in entries:
            if c.get("required") or c["verdict"] not in WARNED_VERDICTS:
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
        skipped: dict[str, list[CellEntry]] = {}
        # A backend with a required UNAVAILABLE cell is a gate failure (`gate_failures` says
        # it once, counting all its cells); a warning here too would contradict it (issue 29).
        failing = set(self._unavailable_required(entries))
        for c in entries:
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

    def _unavailable_required(self, entries: list[CellEntry]) -> dict[str, str]:
        """Backends that could not run although some of their cells are required: one line each.

        The line counts every cell of the backend and says who requires them, so the
        warning list (which skips these backends) and the gate never disagree on either.
        """
        lines: dict[str, str] = {}
        for backend in dict.fromkeys(str(c["backend"]) for c in entries):
            cells = [c for c in entries if c["backend"] == backend]
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

    def gate_failures(
        self, entries: list[CellEntry], deselected: list[str], *, signed: Gate
    ) -> list[str]:
        """Why the release gate does not hold for this run; empty when it holds.

        Only required cells (the policy's, or a named backend's) decide the gate: a FAIL in a
        backend nobody requires is reported in the grid and the evidence, never hidden, but it
        does not make the run's exit status non-zero. An empty requirement never holds, and
        neither does a run in which no sandbox backend was judged: the control leg alone
        attests nothing. `signed` is the gate the attestation signs (the session's
        `signed_gate`, the same `gate_for` the signer and `verify` use): its problems are the
        last word, so the exit status and the attestation cannot disagree.
        """
        if not self.required and not self.required_backends:
            return ["the policy requires no cell on this platform; nothing can be attested"]
        failures = self.unrunnable_named()
        judged = [
            c
            for c in entries
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
        failures += [
            f"missing required cell {cell_id}" for cell_id in self.missing_required(entries)
        ]
        unavailable = self._unavailable_required(entries)
        failures += [
            f"required cell {c['cell_id']} is {c['verdict']}: {c['reason']}"
            for c in entries
            if c.get("required")
            and c["verdict"] != "PASS"
            and not (c["verdict"] == Verdict.UNAVAILABLE.value and c["backend"] in unavailable)
        ]
        failures += list(unavailable.values())
        # The claims the policy requires of a leg: `verify` holds the signed identities to
        # them, and the run's own exit status must say the same.
        claims = {
            name: avail.identity.claims.claims()
            for name, avail in self.availability.items()
            if avail.identity is not None
        }
        legs = {cell_leg(c, self.platform) for c in entries}
        failures += claim_problems(self.policy, claims, legs)
        if deselected:
            failures.append(
                f"{len(deselected)} cells were deselected (-k/--deselect), so the "
                f"evidence is incomplete: {', '.join(deselected[:5])}"
            )
        if not failures:
            failures = [f"the signed gate is FAILED: {p}" for p in signed.problems]
        return failures
