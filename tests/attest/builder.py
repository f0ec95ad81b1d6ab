"""Synthetic report directories: every subject a run writes, for chosen cells and verdicts.

The run that writes real evidence lives elsewhere; these builders follow the format in
reports/README.md (schema `sandbox-attest/evidence/v1`) so attestation and rendering can be
tested without starting sandboxes. A built report holds all five subjects (evidence.json,
junit.xml, report.html, summary.md, allure-results/) rendered by the run's own renderers, so
they have the real shapes, a harness commit and run times close to now, so `verify`'s
default --max-age holds.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import ATTESTATION_NAME, policy_from_evidence, sign_report
from sandbox_attest.attest.statement import EVIDENCE_PREDICATE
from sandbox_attest.attest.subjects import ALLURE_DIR
from sandbox_attest.host.separation import Launch, backend_fact, summarize
from sandbox_attest.host.trust import PayloadUser
from sandbox_attest.report.allure import render_allure
from sandbox_attest.report.evidence import CellEntry, cell_entry
from sandbox_attest.report.junit import render_junit
from sandbox_attest.report.outcomes import run_outcomes
from sandbox_attest.report.sarif import render_sarif
from sandbox_attest.report.views import render_html, render_summary

if TYPE_CHECKING:
    from sandbox_attest.attest.keys import SigningKey
    from sandbox_attest.report.policy import Policy

COMMIT = "5f3c9a1e2b4d6f8091a2b3c4d5e6f708192a3b4c"
# The payload user of a built run (nobody), as the host reads it: real, effective, saved, fs.
PAYLOAD_UID = 65534
PAYLOAD_IDS = " ".join([str(PAYLOAD_UID)] * 4)
PACKAGE_SHA256 = hashlib.sha256(b"package").hexdigest()
PROBES_SHA256 = hashlib.sha256(b"probes").hexdigest()

CORE_PROBES = (
    "net_denied_host",
    "net_direct_egress",
    "dns_resolution",
    "ipc_unix_socket_escape",
    "fs_write_outside",
    "net_transfer_18mib",
    "pkg_pip_install",
)


def write_policy(
    path: Path,
    legs: tuple[tuple[str, str], ...] = (("linux", "none"), ("linux", "bubblewrap")),
    probes: tuple[str, ...] = CORE_PROBES,
) -> Path:
    """Write a release policy requiring `probes` to PASS on every leg in `legs`."""
    lines = ['[policy]\nname = "test"\nversion = 1\n']
    for platform, backend in legs:
        listed = ", ".join(f'"{p}"' for p in probes)
        lines.append(
            f'[[require]]\nplatform = "{platform}"\nbackend = "{backend}"\nprobes = [{listed}]\n'
        )
    path.write_text("\n".join(lines))
    return path


def make_cell(
    backend: str,
    probe: str,
    verdict: str = "PASS",
    *,
    platform: str = "linux",
    reason: str = "",
) -> CellEntry:
    """One evidence cell shaped like the run writes it, with attempts, witness and control."""
    control_leg = backend == "none"
    refused = verdict == "PASS" and not control_leg
    return cell_entry(
        cell_id=f"{backend}-{probe}",
        backend=backend,
        probe=probe,
        platform=platform,
        verdict=verdict,
        reason=reason or ("proxy answered 403" if refused else "escape observed as expected"),
        expected="allowed" if control_leg else "denied",
        observed="refused" if refused else "succeeded",
        nonce=hashlib.sha256(f"{backend}{probe}".encode()).hexdigest()[:16],
        attempts=[
            {
                "what": "connect-denied",
                "role": "escape",
                "outcome": "refused" if refused else "succeeded",
                "errno": "ECONNREFUSED" if refused else None,
                "status": 403 if refused else 200,
                "detail": "egress denied to 'denied.test:443': no rule matched",
            },
            {
                "what": "get-allowed",
                "role": "control",
                "outcome": "succeeded",
                "errno": None,
                "status": 200,
                "detail": "ok",
            },
        ],
        witness={"origin_hits": 0 if refused else 1, "proxy": ["deny denied.test:443"]},
        control={"host_connect": "succeeded"},
        run={
            "started": True,
            "exit_code": 0,
            "timed_out": False,
            "duration_s": 0.41,
            "argv": ["bwrap", "--unshare-net", "python3", f"probes/{probe}.py"],
            "stderr": "",
            "helper_stderr": "",
            "notes": [],
        },
        # The host's reading of the payload at its rendezvous: it ran as the payload user.
        host_view={
            "seen": True,
            "pid": 4242,
            "status": {"Uid": PAYLOAD_IDS, "Gid": PAYLOAD_IDS},
        },
    )


def measured_domains(cells: list[CellEntry], launched_uid: int = PAYLOAD_UID) -> dict[str, Any]:
    """The trust-domains fact a root run measures over `cells` (sandbox_attest/host/separation.py).

    Every backend's commands were started as `launched_uid` (the payload user `nobody` by
    default); the harness is uid 0.
    """
    backends = sorted({str(c["backend"]) for c in cells})
    launch = Launch(launched_uid, PAYLOAD_UID, "the run's payload user nobody")
    facts = {
        b: backend_fact(b, [c for c in cells if c["backend"] == b], launch, (0, 0))
        for b in backends
    }
    user = PayloadUser("nobody", PAYLOAD_UID, PAYLOAD_UID, frozenset(), Path("/nonexistent"))
    return summarize(facts, (0, 0), user)


def make_cells(
    backends: tuple[str, ...] = ("none", "bubblewrap"),
    probes: tuple[str, ...] = CORE_PROBES,
    verdicts: dict[str, str] | None = None,
    *,
    platform: str = "linux",
    required: tuple[str, ...] = (),
) -> list[CellEntry]:
    """Cells for every backend x probe, PASS unless `verdicts` maps a cell id to another.

    Cells of the backends in `required` are marked `"required": true`, as a run marks the
    backend a CI leg names (`--backend B --require-backend`).
    """
    verdicts = verdicts or {}
    cells = [
        make_cell(b, p, verdicts.get(f"{b}-{p}", "PASS"), platform=platform)
        for b in backends
        for p in probes
    ]
    for cell in cells:
        if cell["backend"] in required:
            cell["required"] = True
    return cells


def write_junit(path: Path, evidence: dict[str, Any], policy: Policy | None = None) -> None:
    """junit.xml as a run renders it (`report.junit.render_junit`), from `evidence`."""
    path.write_bytes(render_junit(evidence, run_outcomes(evidence, policy)))


def rfc3339(when: datetime) -> str:
    """An RFC 3339 UTC timestamp, seconds precision, as the evidence writer formats it."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_readables(
    report_dir: Path, evidence: dict[str, Any], policy: Policy | None = None
) -> None:
    """report.html, summary.md and allure-results/, rendered as a run renders them.

    The pages say NOT SIGNED, as before signing (`sign` re-renders them with the signer).
    """
    (report_dir / "report.html").write_text(render_html(evidence, None, policy))
    (report_dir / "summary.md").write_text(render_summary(evidence, None, policy))
    (report_dir / "results.sarif").write_bytes(render_sarif(evidence))
    allure = report_dir / ALLURE_DIR
    for name, data in render_allure(evidence, run_outcomes(evidence, policy)).items():
        (allure / name).parent.mkdir(parents=True, exist_ok=True)
        (allure / name).write_bytes(data)
    # One file no render writes, as another allure writer (a plugin) may leave one: signing
    # keeps it and the tree digest covers it (tests edit it to change the tree).
    (allure / "attachments").mkdir(exist_ok=True)
    (allure / "attachments" / "stderr.txt").write_text("probe stderr\n")


def build_report(
    report_dir: Path,
    policy_path: Path,
    cells: list[CellEntry] | None = None,
    *,
    platform: str = "linux",
    complete: bool = True,
    run_id: str = "20261130T050102Z-3f2a",
    finished_at: datetime | None = None,
    commit: str | None = COMMIT,
    probes_sha256: str = PROBES_SHA256,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write every subject of a report for `cells` (default: every core cell PASS).

    Args:
        report_dir: created if missing.
        policy_path: the policy the evidence names (and whose digest it records).
        cells: the evidence cells.
        platform: the run's platform.
        complete: False for an interrupted run.
        run_id: the run's id.
        finished_at: when the run ended (default: 2 s ago); it started 18 s before that.
        commit: the harness commit (None: a wheel install).
        probes_sha256: the digest of the probes the harness ran.
        extra: top-level evidence fields to add or replace (e.g. `trust_domains`, `world`).
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    cells = make_cells(platform=platform) if cells is None else cells
    backends = sorted({c["backend"] for c in cells})
    finished = finished_at or datetime.now(UTC) - timedelta(seconds=2)
    evidence = {
        "schema": "sandbox-attest/evidence/v1",
        "run_id": run_id,
        "complete": complete,
        "started_at": rfc3339(finished - timedelta(seconds=18)),
        "finished_at": rfc3339(finished),
        "harness": {
            "version": "0.1.0",
            "commit": commit,
            "dirty": None if commit is None else False,
            "package_sha256": PACKAGE_SHA256,
            "probes_sha256": probes_sha256,
        },
        "trust_domains": measured_domains(cells),
        "platform": {
            "system": platform,
            "release": "6.1.0",
            "machine": "x86_64",
            "python": "3.11.7",
        },
        "policy": {
            "path": str(policy_path),
            "sha256": hashlib.sha256(policy_path.read_bytes()).hexdigest(),
        },
        "matrix": {"path": "matrix/linux.toml", "sha256": hashlib.sha256(b"matrix").hexdigest()},
        "backends": [
            {
                "name": b,
                "available": True,
                "reason": "",
                "identity": {
                    "name": b,
                    "version": "0.8.0",
                    "platform": f"{platform} 6.1.0 x86_64",
                    "policy": {
                        "network": "open" if b == "none" else "proxy",
                        "filesystem": "open" if b == "none" else "workspace",
                        "ipc": "open" if b == "none" else "isolated",
                    },
                    "profile": {"argv": [b]},
                    "profile_digest": "sha256:" + hashlib.sha256(b.encode()).hexdigest(),
                    "executables": {
                        b: {
                            "argv0": b,
                            "path": f"/usr/bin/{b}",
                            "realpath": f"/usr/bin/{b}",
                            "sha256": hashlib.sha256(f"exe {b}".encode()).hexdigest(),
                        }
                    },
                },
            }
            for b in backends
        ],
        "cells": cells,
    }
    evidence["inputs"] = {"policy": evidence["policy"], "matrix": evidence["matrix"]}
    evidence.update(extra or {})
    (report_dir / "evidence.json").write_text(json.dumps(evidence, indent=2, sort_keys=True))
    policy = policy_from_evidence(evidence)
    write_junit(report_dir / "junit.xml", evidence, policy)
    write_readables(report_dir, evidence, policy)
    return report_dir


def read_statements(report_dir: Path) -> list[dict[str, Any]]:
    """Every statement of a report's attestation, in line order (payloads not verified)."""
    lines = (report_dir / ATTESTATION_NAME).read_text().splitlines()
    return [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in lines]


def evidence_statement(report_dir: Path) -> dict[str, Any]:
    """The report's evidence statement (its subjects are the report files)."""
    return next(s for s in read_statements(report_dir) if s["predicateType"] == EVIDENCE_PREDICATE)


def sandbox_statement(report_dir: Path, backend: str) -> dict[str, Any]:
    """The report's test-result statement about `backend`'s sandbox."""
    for stmt in read_statements(report_dir):
        entry = next(
            (c for c in stmt["predicate"].get("configuration") or [] if c["name"] == "sandbox"),
            None,
        )
        if entry is not None and entry["annotations"]["backend"] == backend:
            return stmt
    raise AssertionError(f"no test-result statement about {backend} in {report_dir}")


def signed_subjects(report_dir: Path) -> list[str]:
    """The report files the attestation covers: the evidence statement's subject names."""
    return [str(s["name"]) for s in evidence_statement(report_dir)["subject"]]


def sign(report_dir: Path, key: SigningKey, *, policy: Policy | None = None) -> Path:
    """Sign a built report the way a run signs it (no Sigstore): the real `sign_report`.

    It re-renders junit.xml, allure-results/, report.html and summary.md from evidence.json
    and signs all five subjects (and writes signing.json).
    """
    return sign_report(report_dir, key, policy=policy, env={})
