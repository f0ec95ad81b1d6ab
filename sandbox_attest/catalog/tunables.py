"""Kernel tunables and the host's control files, host side (issue 28).

A payload that can write the host's cgroup hierarchy, `/proc/sys`, `core_pattern`,
`/proc/sysrq-trigger` or a cgroup v1 `release_agent` controls the host's kernel: the classic
container escapes go through exactly these files. None of them may be changed to find out, so
the probe splits them by what the host can see:

- **The cgroup hierarchy**, with a real target and a real witness. The harness makes one v2
  cgroup per cell inside its own group and hands it to the payload user (a delegated group,
  the one place in the host's hierarchy that user may change unconfined). The payload tries
  to make a nonce-named group in it by its host path; the host looks for that group in its
  own cgroupfs. The positive control is the payload user, unconfined, making one there.
- **The tunables and control files**, as an exposure reading. Writing any of them is root's
  alone on an open host, so no unconfined payload user can show the write works, and the
  probe never writes: it opens each write-only and closes it at once. An open that succeeds
  is believed (a report against the sandbox); a refusal counts only where the host's own
  reading of the payload's credentials shows why the kernel refuses it (no process of the
  cell runs as host uid 0), never on the payload's word.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
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
from sandbox_attest.catalog.judging import conclude, expect_fs_confined, judge_escape
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise, lifetime, safefs
from sandbox_attest.host.cellgroup import run_cgroup
from sandbox_attest.host.cgroupfs import own_v2_dir, remove_cgroup_tree
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.verdict import Assessment, Escape, Expectation

__all__ = ["LINUX_ONLY_REASON", "ProcKernelTunables"]

LINUX_ONLY_REASON: Final = (
    "cgroupfs, /proc/sys and /proc/sysrq-trigger exist only on Linux; macOS and Windows "
    "keep their kernel settings elsewhere and need their own probe"
)
# The control files opened write-only (and closed at once); the payload's attempt names.
EXPOSURES: Final = (
    "cgroup-procs-open",
    "release-agent-open",
    "core-pattern-open",
    "sysrq-trigger-open",
    "sysctl-open",
)
# Files whose presence on the host the control records, beside the payload's exposure reading.
HOST_FILES: Final = ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger")
_FIX_CGROUP: Final = (
    "do not bind the host's /sys/fs/cgroup into the sandbox; give it a cgroup namespace with "
    "a read-only cgroupfs of its own (docker's default) or none at all (bwrap)"
)
_FIX_FILES: Final = (
    "mount /proc/sys read-only and mask /proc/sysrq-trigger and cgroupfs (docker's default), "
    "and never run the payload as host root"
)


# Run as the payload user, unconfined: the host control's proof that the delegated group is
# that user's to change, so a refusal inside is the sandbox's. Prints "ok" or the errno name.
_MAKE_GROUP: Final = """
import errno, os, sys
try:
    os.mkdir(os.path.join(sys.argv[1], sys.argv[2]), 0o755)
except OSError as exc:
    print(errno.errorcode.get(exc.errno, repr(exc)))
else:
    print("ok")
"""


def _make_group_as_user(ctx: CellContext, group: Path, name: str) -> str:
    """Make the group `name` in `group` as the payload user, unconfined; "ok" or why not."""
    done = subprocess.run(
        [payload_interpreter(ctx.user).path, "-c", _MAKE_GROUP, str(group), name],
        capture_output=True,
        text=True,
        timeout=HOST_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        check=False,
        **(ctx.user.popen_kwargs() if ctx.user is not None else {}),
        **lifetime.popen_kwargs(),
    )
    return done.stdout.strip() or f"exit {done.returncode}: {done.stderr.strip()[-200:]}"


def _host_root(processes: list[dict[str, Any]]) -> str:
    """The cell's processes the host read running as host uid 0 (any of real/effective), or ""."""
    found = []
    for process in processes:
        uids = str((process.get("status") or {}).get("Uid", "")).split()
        if "0" in uids[:2]:
            found.append(f"host pid {process.get('pid', '?')}")
    return ", ".join(found)


class ProcKernelTunables(SpecBase):
    """Make a group in the host's cgroupfs; open the host's kernel control files for writing."""

    id = "proc_kernel_tunables"
    area = "tunables"
    host_readings = ("host cgroupfs (the nonce-named group)", "host view of the payload's uids")

    def not_applicable_here(self) -> str | None:
        """Why this host cannot judge the probe: no cgroup v2 group of the harness's to hand on."""
        if os.geteuid() != 0:
            return "only root can hand a cgroup to the payload user (run the harness as root)"
        if own_v2_dir() is None:
            return "no cgroup v2 hierarchy shows the harness's own group (mount cgroup2)"
        return None

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The group in the delegated cgroup, then the five control files."""
        del task
        return AttemptTable(required=attempts_of("cgroup-mkdir", *EXPOSURES))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied where the workspace is the only writable grant; seen on the open leg."""
        return expect_fs_confined(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Make the cell's delegated group (the payload user's) inside the harness's own.

        Raises:
            FixtureError: there is no cgroup v2 group of the harness's here.
        """
        # Inside the run's own cgroup (sandbox_attest/host/cellgroup.py): journalled before it was
        # made, so a killed run's delegated groups are swept by the next run, never left behind.
        parent, why = run_cgroup()
        if parent is None:
            msg = f"proc_kernel_tunables: no run cgroup to delegate a group from ({why})"
            raise FixtureError(msg)
        name = f"{disguise.TUNABLES_PREFIX}{ctx.nonce}"
        owner = (ctx.user.uid, ctx.user.gid) if ctx.user is not None else None
        with safefs.open_dir(parent) as place:
            place.mkdir(name, 0o755, owner).close()
        save_state(ctx, {"group": str(parent / name)})
        return {"cgroup_dir": str(parent / name), "cgroup_name": f"escape-{ctx.nonce}"}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The payload user makes a group in its delegated cgroup; the host sees it there."""
        nonce = new_control_nonce()
        group = Path(str(load_state(ctx).get("group", "")))
        name = f"control-{nonce}"

        def delegated() -> dict[str, Any]:
            made = _make_group_as_user(ctx, group, name)
            seen = (group / name).is_dir()
            remove_cgroup_tree(group / name)
            detail = f"payload user's mkdir: {made}; host sees {group / name}: {seen}"
            return host_check("payload user makes a group, the host sees it", seen, detail)

        control = control_record(nonce, [guarded_check("payload user makes a group", delegated)])
        # Recorded, not required: a kernel without CONFIG_MAGIC_SYSRQ has no sysrq-trigger,
        # and then the payload's ENOENT for it is the host's truth too.
        control["host_files"] = {path: Path(path).exists() for path in HOST_FILES}
        return control

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A nonce group in the host's cgroupfs, or a control file opened for writing, escapes."""
        del witness  # the host's cgroupfs is this probe's witness
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        group = Path(str(load_state(ctx).get("group", "")))
        made = group / f"escape-{ctx.nonce}"
        seen = made.is_dir()
        opened = [
            str(a.get("what"))
            for a in escapes
            if a.get("what") in EXPOSURES and a.get("outcome") == "succeeded"
        ]
        root = _host_root(host_processes(ctx))
        reasons = [
            f"host cgroupfs: {made} {'exists' if seen else 'absent'}",
            f"payload: {attempts_summary(escapes)}",
        ]
        escape: Escape
        if opened:
            reasons.append(
                "the payload reports it opened the host's control files for writing (a report "
                "against the sandbox is believed)"
            )
            escape = "escaped"
        else:
            escape = judge_escape(observed, seen, None, reasons)
        if escape == "refused" and root:
            # Root in the host's user namespace may open every one of them unless a mount or
            # filter stops it, and the host cannot see which: the refusal is the payload's word.
            reasons.append(
                f"{root} runs as host uid 0, so only the payload says the control files were "
                "refused; run the payload as an unprivileged uid"
            )
            escape = "undecided"
        if escape == "escaped" and self.expectation(ctx.claims) == "denied":
            fixes = ([_FIX_CGROUP] if seen else []) + ([_FIX_FILES] if opened else [])
            what = ([f"made the group {made} in the host's cgroupfs"] if seen else []) + (
                [f"opened for writing: {', '.join(opened)}"] if opened else []
            )
            reasons.insert(
                0,
                f"{claims_of(ctx.claims).phrase('writes')}; the payload {'; '.join(what)}; "
                f"fix: {'; '.join(fixes) or _FIX_FILES}",
            )
        assessment = conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"group": str(made), "group_made": seen, "opened": opened, "host_root": root},
        )
        # Control files opened are the payload's word; a group the host found is its own.
        assessment.reported_only = escape == "escaped" and not seen
        return assessment

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the cell's delegated group and whatever the payload made in it."""
        group = load_state(ctx).get("group")
        if group:
            with contextlib.suppress(OSError):
                remove_cgroup_tree(Path(str(group)))


SPECS: Final = (ProcKernelTunables(),)
