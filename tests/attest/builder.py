"""Synthetic report directories: evidence.json + junit.xml for chosen cells and verdicts.

The run that writes real evidence lives elsewhere; these builders follow the format in
reports/README.md (schema `sandbox-attest/evidence/v1`) so attestation and rendering can be
tested without starting sandboxes.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape, quoteattr

if TYPE_CHECKING:
    from pathlib import Path

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
) -> dict[str, Any]:
    """One evidence cell shaped like the run writes it, with attempts, witness and control."""
    control_leg = backend == "none"
    refused = verdict == "PASS" and not control_leg
    return {
        "cell_id": f"{backend}-{probe}",
        "backend": backend,
        "probe": probe,
        "platform": platform,
        "verdict": verdict,
        "reason": reason or ("proxy answered 403" if refused else "escape observed as expected"),
        "expected": "allowed" if control_leg else "denied",
        "observed": "refused" if refused else "succeeded",
        "nonce": hashlib.sha256(f"{backend}{probe}".encode()).hexdigest()[:16],
        "attempts": [
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
        "witness": {"origin_hits": 0 if refused else 1, "proxy": ["deny denied.test:443"]},
        "control": {"host_connect": "succeeded"},
        "run": {
            "started": True,
            "exit_code": 0,
            "timed_out": False,
            "duration_s": 0.41,
            "argv": ["bwrap", "--unshare-net", "python3", f"probes/{probe}.py"],
            "stderr": "",
            "helper_stderr": "",
        },
        "notes": [],
    }


def make_cells(
    backends: tuple[str, ...] = ("none", "bubblewrap"),
    probes: tuple[str, ...] = CORE_PROBES,
    verdicts: dict[str, str] | None = None,
    *,
    platform: str = "linux",
    required: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
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


def write_junit(path: Path, cells: list[dict[str, Any]]) -> None:
    """A junit.xml with one testcase per cell (failure for FAIL/ERROR, skip for the rest)."""
    cases = []
    for c in cells:
        body = ""
        if c["verdict"] in ("FAIL", "ERROR"):
            body = f"<failure message={quoteattr(c['reason'])}>{escape(c['reason'])}</failure>"
        elif c["verdict"] != "PASS":
            body = f"<skipped message={quoteattr(c['verdict'])}/>"
        name = quoteattr(c["cell_id"])
        cases.append(f'<testcase classname="matrix" name={name} time="0.41">{body}</testcase>')
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="sandbox-attest" '
        f'tests="{len(cells)}">' + "".join(cases) + "</testsuite></testsuites>\n"
    )


def build_report(
    report_dir: Path,
    policy_path: Path,
    cells: list[dict[str, Any]] | None = None,
    *,
    platform: str = "linux",
    complete: bool = True,
    run_id: str = "20261130T050102Z-3f2a",
) -> Path:
    """Write evidence.json and junit.xml for `cells` (default: every core cell PASS)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    cells = make_cells(platform=platform) if cells is None else cells
    backends = sorted({c["backend"] for c in cells})
    evidence = {
        "schema": "sandbox-attest/evidence/v1",
        "run_id": run_id,
        "complete": complete,
        "started_at": "2026-11-30T05:01:02Z",
        "finished_at": "2026-11-30T05:01:20Z",
        "harness": {"version": "0.1.0"},
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
        "matrix": {"sha256": hashlib.sha256(b"matrix").hexdigest()},
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
                },
            }
            for b in backends
        ],
        "cells": cells,
    }
    (report_dir / "evidence.json").write_text(json.dumps(evidence, indent=2, sort_keys=True))
    write_junit(report_dir / "junit.xml", cells)
    return report_dir
