"""The evidence file: every cell as it completes, then the whole run.

Cells are appended to `evidence.jsonl` (one line each, fsynced) the moment they are judged, so
a run interrupted midway keeps what it gathered; `evidence.json` is serialized once from those
cells at the end, or on interrupt with `"complete": false`, and those bytes are what the signer
signs. Both files are written only through descriptors (`sandbox_attest.report.files`).

A cell's entry has one shape, `CellEntry`: every producer builds it with `cell_entry`, every
reader of evidence read back from disk gets it from `parse_cells`, and `add_cell` / `document`
are the only places it is serialised.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack

from sandbox_attest.errors import HarnessError, ReportError
from sandbox_attest.host.provenance import file_sha256, harness_provenance
from sandbox_attest.report import files as reportfs

SCHEMA = "sandbox-attest/evidence/v1"
EVIDENCE_NAME = "evidence.json"
JOURNAL_NAME = "evidence.jsonl"


class RunFacts(TypedDict, total=False):
    """A cell's payload run as the evidence records it (`started` alone: it never ran)."""

    started: Required[bool]
    exit_code: int | None
    timed_out: bool
    duration_s: float
    argv: list[str]
    stdout: str  # the tail, at most run/runner.py's EVIDENCE_TEXT_LIMIT characters
    stderr: str
    helper_stderr: str
    notes: list[str]
    started_ms: int  # wall clock, for the views (Allure's start and stop)


class CellFacts(TypedDict, total=False):
    """What a cell's entry says beyond its head: the verdict, its reason, and what they rest on.

    Only `verdict` and `reason` are in every entry; a cell that never ran (NOT_APPLICABLE,
    UNAVAILABLE, cut short) has nothing else, and each judge path adds what it saw.
    """

    verdict: Required[str]  # a `Verdict` value
    reason: Required[str]
    # The run's decision (the policy's, or a named backend's): set by the session.
    required: bool
    traceback: str  # a harness fault while running the cell (an ERROR)
    home_changed: str  # why the payload home moved during the cell, or ""
    nonce: str
    expected: str  # an `Expectation`: "denied" or "allowed"
    run: RunFacts
    # The host control's result; once judged, `{"host": ..., "assessed": ...}`.
    control: dict[str, Any]
    host_view: dict[str, Any]
    observed: str
    escape: str
    corroborated_by: list[str]
    attempts: list[Any]
    probe_facts: dict[str, Any]
    witness: dict[str, Any]
    # Set by `merge` on a control cell: the leg that carried it (`report.policy.CARRIER_KEY`).
    _carrier: str


class CellEntry(CellFacts):
    """One cell of the evidence: its head (which cell, where) and its `CellFacts`."""

    cell_id: str  # `<backend>-<probe>`
    backend: str
    probe: str
    platform: str


# The keys `parse_cells` requires of every cell read back from disk (`CellEntry`'s required
# keys), in the order a missing one is named.
CELL_KEYS: tuple[str, ...] = ("cell_id", "backend", "probe", "platform", "verdict", "reason")


def cell_entry(
    *, cell_id: str, backend: str, probe: str, platform: str, **facts: Unpack[CellFacts]
) -> CellEntry:
    """A cell's evidence entry: the one place its head is made (every producer calls this)."""
    if isinstance(facts.get("host_view"), dict):
        facts["host_view"] = bounded_host_view(facts["host_view"])
    return {"cell_id": cell_id, "backend": backend, "probe": probe, "platform": platform, **facts}


# How many of a cell's kernel events the host view keeps (sandbox_attest/host/kernel/
# records up to 4096 per cell); the events that judged the cell are in its `witness`.
KERNEL_EVENTS_KEPT = 24
# Refusals that every payload's start-up makes (a library or locale file not there): counted,
# not listed.
_ROUTINE_ERRORS = frozenset({"ENOENT", "ENOTTY", "ENXIO", "EAGAIN", "EINPROGRESS"})


def bounded_host_view(view: dict[str, Any]) -> dict[str, Any]:
    """The host view with its kernel witness reading bounded: counts, and a few refusals.

    Every event is counted by syscall and answer; the first `KERNEL_EVENTS_KEPT` refusals
    that are not routine (see `_ROUTINE_ERRORS`) are kept whole, in the order they came.
    """
    kernel = view.get("kernel")
    if not isinstance(kernel, dict) or not isinstance(kernel.get("events"), list):
        return view
    events = [e for e in kernel["events"] if isinstance(e, dict)]
    counts: dict[str, int] = {}
    for event in events:
        key = f"{event.get('syscall')} -> {event.get('error') or 'ok'}"
        counts[key] = counts.get(key, 0) + 1
    refusals = [e for e in events if e.get("error") and e.get("error") not in _ROUTINE_ERRORS]
    bounded = {k: v for k, v in kernel.items() if k != "events"}
    bounded.update(
        events_total=len(events),
        answers=dict(sorted(counts.items())),
        refusals=refusals[:KERNEL_EVENTS_KEPT],
        refusals_left_out=max(0, len(refusals) - KERNEL_EVENTS_KEPT),
    )
    return {**view, "kernel": bounded}


def parse_cells(
    value: object, where: str, error: type[HarnessError] = ReportError
) -> list[CellEntry]:
    """An evidence document's `cells` as read back from disk, each checked to be a `CellEntry`.

    Args:
        value: the parsed `cells` value.
        where: the file it came from, named in the error.
        error: the error type the caller's command reports (verify's ReportError, diff's
            ConfigError).

    Raises:
        HarnessError: `error`, naming the file, the cell and the missing key, when `cells` is
            not a list of objects or a cell lacks a key every entry has.
    """
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise error(f"{where}: `cells` must be a list of objects")
    for i, cell in enumerate(value):
        missing = [key for key in CELL_KEYS if key not in cell]
        if missing:
            raise error(
                f"{where}: cell #{i + 1} ({cell.get('cell_id') or 'no cell_id'}) has no "
                f"{missing[0]!r}; every evidence cell has {', '.join(CELL_KEYS)} (the file "
                "was not written by sandbox-attest, or was edited)"
            )
    cells: list[CellEntry] = value
    return cells


def utc_now() -> str:
    """An RFC 3339 UTC timestamp, seconds precision."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def platform_facts() -> dict[str, str]:
    """The platform fields of the evidence header."""
    return {
        "system": platform.system().lower(),
        "release": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "executable": sys.executable,
    }


def run_inputs(writer: EvidenceWriter) -> dict[str, dict[str, str]]:
    """The files a run is judged by, each `{"path", "sha256"}`: the policy and the matrix.

    The policy is hashed as it is now (the bytes the gate is derived with). The matrix
    digest is the one the session loaded.
    """
    return {
        "policy": {"path": str(writer.policy_path), "sha256": file_sha256(writer.policy_path)},
        "matrix": {"path": str(writer.matrix_path or ""), "sha256": writer.matrix_digest},
    }


@dataclass
class EvidenceWriter:
    """Accumulates cells and writes them; see the module docstring for the two files."""

    report_dir: Path
    run_id: str
    policy_path: Path
    matrix_digest: str
    backends: list[dict[str, Any]] = field(default_factory=list)
    cells: list[CellEntry] = field(default_factory=list)
    started_at: str = field(default_factory=utc_now)
    matrix_path: Path | None = None
    # Facts about the whole run that the statement signs: `trust_domains` (who ran the judged
    # code, sandbox_attest/host/trust.py) and `world` (where the fixture hosts lived).
    run_facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Open the report directory (creating it 0700) and create the journal in it.

        Both stay open for the writer's life: the journal is appended through the descriptor
        created here (`O_EXCL | O_NOFOLLOW`), never re-opened by name, and evidence.json is
        written relative to the directory descriptor (`reportfs`).

        Raises:
            ConfigError: the report directory is not the harness's own or is writable by
                others (see `reportfs.open_report_dir`).
            ReportError: the directory already holds a journal (another run's, or planted).
        """
        self._dir_fd = reportfs.ensure_report_dir(self.report_dir)
        weakref.finalize(self, os.close, self._dir_fd)
        self.journal = self.report_dir / JOURNAL_NAME
        self._journal_fd = reportfs.create_append(self._dir_fd, JOURNAL_NAME)
        weakref.finalize(self, os.close, self._journal_fd)

    def add_cell(self, cell: CellEntry) -> None:
        """Record one judged cell durably, right now (appended and fsynced)."""
        self.cells.append(cell)
        line = memoryview((json.dumps(cell, sort_keys=True) + "\n").encode("utf-8"))
        while line:
            line = line[os.write(self._journal_fd, line) :]
        os.fsync(self._journal_fd)

    def document(self, *, complete: bool) -> dict[str, Any]:
        """The whole evidence document as it stands.

        `harness` pins what ran (see `host.provenance.harness_provenance`) and `inputs`
        the files the run was judged by; `policy` and `matrix` repeat them at the top level
        for the renderers and older readers.
        """
        inputs = run_inputs(self)
        return {
            "schema": SCHEMA,
            "run_id": self.run_id,
            "complete": complete,
            "started_at": self.started_at,
            "finished_at": utc_now(),
            "harness": harness_provenance(),
            "platform": platform_facts(),
            "inputs": inputs,
            "policy": dict(inputs["policy"]),
            "matrix": dict(inputs["matrix"]),
            "backends": self.backends,
            **self.run_facts,
            "cells": self.cells,
        }

    def gate_input(self, *, complete: bool) -> dict[str, Any]:
        """The keys of `document` that `report.policy.gate_for` reads, without the rest.

        The session's gate is `gate_for` over this, and the signer's and `verify`'s are
        `gate_for` over the serialised `document`: one function, the same facts.
        """
        return {
            "platform": platform_facts(),
            "complete": complete,
            **self.run_facts,
            "cells": self.cells,
        }

    def write(self, *, complete: bool) -> bytes:
        """Serialize the document once, write it as evidence.json, and return those bytes.

        The returned bytes are the ones the session renders from and hands to the signer,
        which writes them again itself before signing them: nothing re-reads evidence.json by
        name. Written here too, so a signer that fails still leaves the evidence on disk.

        Raises:
            ReportError: evidence.json could not be written.
        """
        data = json.dumps(self.document(complete=complete), indent=2, sort_keys=True)
        encoded = data.encode("utf-8")
        reportfs.write_new(self._dir_fd, EVIDENCE_NAME, encoded)
        return encoded
