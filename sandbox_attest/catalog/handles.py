"""File handles, host side: open_by_handle_at must not reach a host file outside the view.

A mount namespace hides paths, not files: open_by_handle_at(2) opens a file by a handle
relative to any descriptor on the same filesystem, so a sandbox whose payload holds
CAP_DAC_READ_SEARCH in the initial user namespace reads any file of every filesystem it has
a mount of (the "Shocker" escape, issue 28).

The canary is harness-made, outside the view, on the workspace's filesystem, readable by the
payload user; its token exists nowhere else, so a payload that reports it read the file. The
host hands over the canary's handle (which it computes itself) and never its content.

Controls: the host opens the canary by that handle through the workspace's directory, which
shows the handle leads to the file for whoever holds the capability; on an open host the
payload user reads it by path (the control leg's escape). No unconfined payload user holds
CAP_DAC_READ_SEARCH, so a refusal of open-by-handle is judged by its errno together with the
host's reading of the capability: a process of the cell that holds it in the host's user
namespace is the escape's precondition, reported whatever the payload says.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import struct
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.judging import conclude, judge_escape
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    home_of,
    host_processes,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.host import disguise, safefs
from sandbox_attest.verdict import Assessment, Expectation

__all__ = ["LINUX_ONLY_REASON", "SPECS", "FsOpenByHandle", "name_to_handle", "open_by_handle"]

LINUX_ONLY_REASON: Final = (
    "name_to_handle_at/open_by_handle_at are Linux syscalls; macOS and Windows have no file "
    "handles of this kind"
)
CAP_DAC_READ_SEARCH: Final = 2
AT_FDCWD: Final = -100
MAX_HANDLE_SZ: Final = 128
_DIR: Final = disguise.HANDLE_CANARY_DIR
_FILE: Final = disguise.CANARY_FILE
_FIX: Final = (
    "drop CAP_DAC_READ_SEARCH (docker --cap-drop ALL, never --cap-add DAC_READ_SEARCH or "
    "--privileged) and refuse open_by_handle_at in the seccomp filter (docker's default "
    "profile does unless the capability is added); a user namespace (bwrap) never holds it"
)


def _libc_call(name: str) -> Any:
    func = getattr(ctypes.CDLL(None, use_errno=True), name, None)
    if func is None:
        raise OSError(38, f"libc has no {name}")  # ENOSYS
    func.restype = ctypes.c_int
    return func


def _raise_errno() -> None:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code))


def name_to_handle(path: str) -> tuple[int, bytes]:
    """The file handle of `path` (type, bytes), as name_to_handle_at(2) gives it.

    Raises:
        OSError: the call failed (the filesystem may not export handles).
    """
    raw = struct.pack("=Ii", MAX_HANDLE_SZ, 0) + b"\0" * MAX_HANDLE_SZ
    buf = ctypes.create_string_buffer(raw, len(raw))
    mount_id = ctypes.c_int()
    if _libc_call("name_to_handle_at")(AT_FDCWD, path.encode(), buf, ctypes.byref(mount_id), 0):
        _raise_errno()
    size, kind = struct.unpack("=Ii", buf.raw[:8])
    return kind, buf.raw[8 : 8 + size]


def open_by_handle(mount_dir: str, kind: int, data: bytes, limit: int = 256) -> bytes:
    """Read up to `limit` bytes of the file behind the handle, through `mount_dir`'s mount.

    Raises:
        OSError: the call failed (EPERM without CAP_DAC_READ_SEARCH).
    """
    raw = struct.pack("=Ii", len(data), kind) + data
    buf = ctypes.create_string_buffer(raw, len(raw))
    mount_fd = os.open(mount_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = _libc_call("open_by_handle_at")(mount_fd, buf, os.O_RDONLY)
        if fd < 0:
            _raise_errno()
    finally:
        os.close(mount_fd)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _holders(processes: list[dict[str, Any]]) -> str:
    """The cell's processes holding CAP_DAC_READ_SEARCH in the host's user namespace, or ""."""
    found = []
    for process in processes:
        if "user" not in (process.get("shared_with_harness") or []):
            continue  # a capability of a user namespace of its own opens no host file
        try:
            cap_eff = int(str((process.get("status") or {}).get("CapEff", "0")), 16)
        except ValueError:
            continue
        if cap_eff >> CAP_DAC_READ_SEARCH & 1:
            found.append(f"host pid {process.get('pid', '?')}")
    return ", ".join(found)


class FsOpenByHandle(SpecBase):
    """Reach a host canary outside the view by its file handle (open_by_handle_at)."""

    id = "fs_open_by_handle"
    area = "handles"
    host_readings = ("canary token", "host view of the payload's capabilities")

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """One context reading of its own handle, two attempts at the canary."""
        del task
        return AttemptTable(
            required=attempts_of("name-to-handle-self", "read-by-path", "open-by-handle")
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever reads are claimed at all: a handle passes every path-based rule."""
        return "denied" if claims_of(declared).reads != "open" else "allowed"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant the canary beside the workspace (same filesystem) and compute its handle."""
        token = secrets.token_hex(16)
        with safefs.open_dir(ctx.cell_dir) as cell, cell.mkdir(_DIR, 0o755) as place:
            place.create_file(_FILE, token + "\n", 0o644)
        canary = ctx.cell_dir / _DIR / _FILE
        kind, data = name_to_handle(str(canary))
        save_state(ctx, {"token": token})
        return {"canary": str(canary), "handle_type": kind, "handle_hex": data.hex()}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host opens the canary by its handle through the workspace's mount."""
        token = str(load_state(ctx).get("token", ""))
        canary = ctx.cell_dir / _DIR / _FILE

        def by_handle() -> dict[str, Any]:
            kind, data = name_to_handle(str(canary))
            read = open_by_handle(str(ctx.workspace), kind, data).decode("ascii", "replace")
            same = ctx.workspace.stat().st_dev == canary.stat().st_dev
            ok = bool(token) and read.strip() == token and same
            detail = f"token read by handle: {read.strip() == token}; same filesystem: {same}"
            return host_check("host opens the canary by its handle", ok, detail)

        return control_record(
            new_control_nonce(), [guarded_check("host opens the canary by handle", by_handle)]
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The canary's token reported, or the capability seen by the host, is an escape."""
        del witness  # the canary's token and the host's capability reading are the witnesses
        token = str(load_state(ctx).get("token", ""))
        claims = claims_of(ctx.claims)
        canary = ctx.cell_dir / _DIR / _FILE
        # The canary's path is the harness's scratch: a reads deny-list (~/.ssh, /home) does not
        # cover it, so reading it by path breaks no claim there; its handle still does, since a
        # handle reaches every file of the filesystem, the denied ones included.
        by_path_counts = claims.reads == "open" or claims.read_denied(canary, home_of(ctx))
        escapes = [
            a
            for a in attempts_by_role(report, "escape")
            if by_path_counts or a.get("what") != "read-by-path"
        ]
        observed = observed_outcome(escapes)
        facts = report.get("facts") or {}
        kinds = ("read_by_path", "by_handle") if by_path_counts else ("by_handle",)
        read = [k for k in kinds if token and facts.get(k) == token]
        holders = _holders(host_processes(ctx))
        reasons = [
            (
                f"canary token read via {', '.join(read) or 'nothing'}; CAP_DAC_READ_SEARCH in "
                f"the host's user namespace: {holders or 'no process of the cell'}"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        if not by_path_counts:
            reasons.append(f"{claims.phrase('reads')}: reading {canary} by path is not judged")
        escape = judge_escape(observed, bool(read), None, reasons)
        denied = self.expectation(ctx.claims) == "denied"
        if denied and (escape == "escaped" or holders):
            escape = "escaped"
            how = (
                "read the canary outside its view by its file handle"
                if "by_handle" in read
                else (
                    "read the canary outside its view by its path"
                    if read
                    else f"holds CAP_DAC_READ_SEARCH in the host's user namespace ({holders})"
                )
            )
            fix = (
                _FIX
                if "by_handle" in read or holders
                else "keep the host's directories out of the view (a private /tmp, no host binds)"
            )
            reasons.insert(
                0, f"{claims_of(ctx.claims).phrase('reads')}; the payload {how}; fix: {fix}"
            )
        return conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"read_via": read, "cap_holders": holders},
        )


SPECS: Final = (FsOpenByHandle(),)
