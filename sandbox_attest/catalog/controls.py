"""Host-side positive controls.

Checks the host runs right after the payload, each with its own nonce (never one containing the
cell's, so a listener's substring match cannot mistake the host's attempt for the payload's),
and the cell state prepare keeps for them.
"""

from __future__ import annotations

import http.client
import json
import secrets
import shlex
import ssl
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_attest.catalog.attempts import all_succeeded, attempts_by_role, attempts_summary
from sandbox_attest.catalog.proxyclient import https_via_proxy
from sandbox_attest.catalog.records import entries_with_nonce, wait_for_records
from sandbox_attest.catalog.spec import HOST_TIMEOUT_S, CellContext, probe_path
from sandbox_attest.host import lifetime, safefs
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.host.trust import give

if TYPE_CHECKING:
    from collections.abc import Callable


def failed_checks(control: dict[str, Any]) -> str:
    """Which checks of a host control failed and why, for a verdict's reason."""
    checks = control.get("checks") or []
    if not checks:
        return "it ran no check"
    failed = [f"{c.get('what')} ({c.get('detail')})" for c in checks if not c.get("ok")]
    return "; ".join(failed) or "no check failed, yet it is not ok"


def host_control_failed(control: dict[str, Any]) -> str:
    """The reason for a failed host control, naming each failed check and its detail."""
    return f"host control failed: {failed_checks(control)}"


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
    """One host check of a control: what was tried, whether it held, and what was seen."""
    return {"what": what, "ok": ok, "detail": detail}


def control_record(nonce: str, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """A host control: its own nonce and checks; it holds only when every check does."""
    return {"ok": bool(checks) and all(c["ok"] for c in checks), "nonce": nonce, "checks": checks}


def new_control_nonce() -> str:
    """A nonce for a host control, never one containing a cell's (see the module's note)."""
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


def guarded_check(what: str, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one host check; a failure of the host's own attempt is a failed check, not a crash."""
    try:
        return action()
    except (OSError, ssl.SSLError, http.client.HTTPException, ValueError) as exc:
        return host_check(what, ok=False, detail=f"host attempt failed: {exc!r}")


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
    """What `save_state` kept for this cell; empty when prepare never ran or it is unreadable."""
    try:
        loaded = json.loads((ctx.cell_dir / _STATE).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def baseline_control(run_baseline: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The host control of a self-reporting probe: its own file, run unsandboxed on the host.

    `run_baseline` runs it (as the payload user, `run_payload_on_host`) and returns its report;
    the control holds when every control attempt of that report succeeded, and carries the
    report as `baseline` for the assessor to compare the sandboxed one with.
    """
    nonce = new_control_nonce()
    try:
        baseline = run_baseline()
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        control = control_record(
            nonce, [host_check("host baseline ran", ok=False, detail=repr(exc))]
        )
        control["baseline"] = None
        return control
    inside = attempts_by_role(baseline, "control")
    # With no control attempt the baseline broke before its controls: say what it did report
    # (a crash is its `probe` error attempt), so the cause is in the evidence, not guessed.
    detail = (
        attempts_summary(inside)
        if inside
        else "no control attempt; it reported: "
        + (attempts_summary(list(baseline.get("attempts") or [])) or "nothing")
    )
    control = control_record(
        nonce, [host_check("host baseline ran", all_succeeded(inside), detail)]
    )
    control["baseline"] = baseline
    return control
