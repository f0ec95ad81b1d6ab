"""The evidence file: every cell as it completes, then the whole run.

Cells are appended to `evidence.jsonl` (one line each, fsynced) the moment they are judged, so
a run interrupted midway keeps what it gathered; `evidence.json` is serialized once from those
cells at the end, or on interrupt with `"complete": false`, and those bytes are what the signer
signs. Both files are written only through descriptors (`sandbox_attest.report.files`).
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
from typing import Any

from sandbox_attest.host.provenance import file_sha256, harness_provenance
from sandbox_attest.report import files as reportfs

SCHEMA = "sandbox-attest/evidence/v1"
EVIDENCE_NAME = "evidence.json"
JOURNAL_NAME = "evidence.jsonl"


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
    cells: list[dict[str, Any]] = field(default_factory=list)
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

    def add_cell(self, cell: dict[str, Any]) -> None:
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
