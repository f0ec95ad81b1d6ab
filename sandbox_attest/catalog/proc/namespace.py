"""proc_namespace_escape: setns into another process's namespaces; mount power inside.

The target is an anchor in namespaces of its own, owned by the payload user
(`sandbox_attest.catalog.proc.anchor`). The host witnesses: a nonce file in a host-only
canary dir (setns-mnt) or in the read-only-bound task dir (a remount), and a line the anchor's
own loopback listener heard (setns-net). `setns_control_refused` says where this host cannot
run the control at all.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
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
    new_control_nonce,
)
from sandbox_attest.catalog.judging import judge_escape
from sandbox_attest.catalog.proc.anchor import ANCHOR_NAMESPACES, AnchoredSpec
from sandbox_attest.catalog.proc.baseline import conclude_with_controls, confines_anything
from sandbox_attest.catalog.records import poll_until
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    WitnessRecordsLike,
    host_processes,
    own_kernel_ran,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.host import disguise, lifetime, safefs
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.host.trust import give
from sandbox_attest.verdict import Assessment, Expectation

__all__ = ["NEEDS_ROOT", "TASK_DIR", "ProcNamespaceEscape", "setns_control_refused"]

# The runner's task dir under cell_dir (run.runner `inputs`), bound read-only into every
# sandbox: the place the remount attempt writes to. This probe hands it to the payload user,
# so that on an open host nothing but the read-only bind stands between the two.
TASK_DIR: Final = "input"


# The reason a proc_namespace_escape cell is NOT_APPLICABLE where its control cannot work: the
# words a policy that requires it then fails with.
NEEDS_ROOT: Final = "needs root for its setns control; run as root"
# The control's own steps, run once as the payload user: join the user, mount and network
# namespaces of a process that user created (ctypes: os.setns is Python 3.12+).
_SETNS_CHECK: Final = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
for kind, flag in (("user", 0x10000000), ("mnt", 0x00020000), ("net", 0x40000000)):
    try:
        fd = os.open("/proc/%d/ns/%s" % (pid, kind), os.O_RDONLY)
    except OSError as exc:
        print("open(/proc/%d/ns/%s): %s" % (pid, kind, errno.errorcode.get(exc.errno, "?")))
        sys.exit(0)
    if libc.setns(fd, flag) != 0:
        print("setns(%s): %s" % (kind, errno.errorcode.get(ctypes.get_errno(), "?")))
        sys.exit(0)
print("ok")
"""


@functools.cache
def setns_control_refused() -> str | None:
    """Why this host refuses proc_namespace_escape's setns control, or None when it works.

    The control is an unprivileged user joining namespaces it created itself (see
    `ANCHOR_NAMESPACES`). Where the kernel lets it, as on Debian or Ubuntu with
    `kernel.apparmor_restrict_unprivileged_userns=0`, the probe runs as root or not. Where it
    refuses (AppArmor's restriction on Ubuntu 24.04 leaves such a namespace without
    capabilities: setns fails EPERM) nothing could see the escape succeed, so the cells are
    NOT_APPLICABLE with the reason instead of INCONCLUSIVE. Checked once per process, with
    the control's own steps, as the user that runs the control.
    """
    if sys.platform != "linux":
        return None
    from sandbox_attest.host.trust import payload_user  # noqa: PLC0415  (only where the probe runs)

    user = payload_user()
    as_user = user.popen_kwargs() if user is not None else {}
    anchor_code = "import sys, time; print('ready', flush=True); time.sleep(30)"
    try:
        anchor = subprocess.Popen(
            [*ANCHOR_NAMESPACES, payload_interpreter(user).path, "-c", anchor_code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **as_user,
            **lifetime.popen_kwargs(),
        )
    except OSError as exc:
        return f"{NEEDS_ROOT} (here {ANCHOR_NAMESPACES[0]} did not start: {exc})"
    try:
        assert anchor.stdout is not None  # noqa: S101  (stdout=PIPE above)
        if anchor.stdout.readline().strip() != b"ready":
            assert anchor.stderr is not None  # noqa: S101  (stderr=PIPE above)
            said = anchor.stderr.read(400).decode(errors="replace").strip()
            return f"{NEEDS_ROOT} (here an unprivileged user namespace could not be made: {said})"
        check = subprocess.run(
            [payload_interpreter(user).path, "-c", _SETNS_CHECK, str(anchor.pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            **as_user,
        )
        said = check.stdout.strip() or check.stderr.strip()[-300:]
        return None if said == "ok" else f"{NEEDS_ROOT} (here {said})"
    finally:
        anchor.kill()
        anchor.wait(timeout=10)
        for stream in (anchor.stdout, anchor.stderr):
            if stream is not None:
                stream.close()


class ProcNamespaceEscape(AnchoredSpec):
    """setns into the host's namespaces; mount power in a private namespace."""

    id = "proc_namespace_escape"
    area = "proc"
    host_readings = ("anchor's canary dir and listener",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Own ids and a fork, setns into the anchor, unshare; the mounts only once inside.

        The forked children report a failure of their own as one `child` error.
        """
        del task
        inner = ("make-private", "abort", "mount-tmpfs", "pivot-root")
        optional = {f"inner:{step}:{how}" for step in inner for how in ("mnt", "userns")}
        optional |= {"remount-rw:mnt", "remount-rw:userns"}
        forked = attempts_of(
            "fork-child", "setns-mnt", "setns-net", "inner:unshare-mnt", "inner:unshare-userns"
        )
        return AttemptTable(
            required=forked | {"read-own-ns"},
            optional=frozenset(optional),
            excuses=(("child", forked),),
        )

    def not_applicable_here(self) -> str | None:
        """Why this probe cannot be judged on this host (see `setns_control_refused`)."""
        return setns_control_refused()

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied wherever anything is confined: a joined host namespace undoes all of it."""
        return "denied" if confines_anything(declared) else "allowed"

    @staticmethod
    def canary_dir(ctx: CellContext) -> Path:
        """A host-only directory (never bound into a sandbox) the setns-mnt child writes to."""
        return ctx.cell_dir / disguise.NS_CANARY_DIR

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Start the anchor in its own namespaces, plant the canary dir, name its listener."""
        anchor = self._start_anchor(ctx, own_namespaces=True)
        self.canary_dir(ctx).mkdir(parents=True, exist_ok=True)
        # Writable to the payload user, so the only thing between the payload and this dir
        # is whether it can see the host's mount tree (the setns-mnt escape), not permissions;
        # the same for the task dir and the read-only bind a remount must undo.
        give(self.canary_dir(ctx), ctx.user)
        give(ctx.cell_dir / TASK_DIR, ctx.user)
        return {
            "marker": anchor.marker,
            "anchor_pid": anchor.pid,
            "canary_dir": str(self.canary_dir(ctx)),
            # The anchor's own loopback listener: reachable only from inside its namespace.
            "listener": f"127.0.0.1:{anchor.port}",
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The anchor is in namespaces of its own; the canary dir and its listener work."""
        nonce = new_control_nonce()
        checks = self._anchor_checks(ctx)
        anchor = self._anchor(ctx)

        def namespaces() -> dict[str, Any]:
            pid = anchor.pid if anchor else 0
            kinds = ("user", "mnt", "net")
            ours = [str(Path(f"/proc/self/ns/{k}").readlink()) for k in kinds]
            theirs = [str(Path(f"/proc/{pid}/ns/{k}").readlink()) for k in kinds]
            owner = Path(f"/proc/{pid}").stat().st_uid
            want = ctx.user.uid if ctx.user is not None else os.geteuid()
            ok = all(a != b for a, b in zip(ours, theirs, strict=True)) and owner == want
            return host_check(
                "anchor is in user/mnt/net namespaces of the payload user's",
                ok,
                f"{theirs} owned by uid {owner}",
            )

        def canary() -> dict[str, Any]:
            # Through the dir's descriptor (sandbox_attest/host/safefs.py): the payload user owns
            # NS_CANARY_DIR and may have planted a link at any name in it.
            name = f"{nonce}.host"
            try:
                with safefs.open_dir(self.canary_dir(ctx)) as directory:
                    directory.create_file(name, nonce, 0o600)
                    directory.unlink(name)
            except safefs.UnsafePathError as exc:
                return host_check("host writes the canary dir", ok=False, detail=str(exc))
            return host_check(
                "host writes the canary dir", ok=True, detail=str(self.canary_dir(ctx))
            )

        def listener() -> dict[str, Any]:
            heard = anchor.reported("conn") if anchor else []
            return host_check(
                "anchor's listener heard its self-test", "self-test" in heard, f"{heard[:3]}"
            )

        checks += [
            guarded_check("anchor namespaces", namespaces),
            guarded_check("host writes the canary dir", canary),
            guarded_check("anchor's listener", listener),
        ]
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A nonce file in the canary or task dir, or a setns-net connection, is an escape."""
        del witness  # the anchor's own listener witnesses setns-net, not the world's
        escapes = [
            a
            for a in attempts_by_role(report, "escape")
            if not str(a.get("what")).startswith("inner:")
        ]
        inner = [
            a for a in attempts_by_role(report, "escape") if str(a.get("what")).startswith("inner:")
        ]
        observed = observed_outcome(escapes)
        mnt_file = self.canary_dir(ctx) / f"{ctx.nonce}.setns-mnt"
        # Only the task dir counts: a sandbox binds it read-only, while the workspace beside
        # it is the payload's to write, so a nonce file there proves nothing.
        remount_file = ctx.cell_dir / TASK_DIR / f"{ctx.nonce}.remount"
        remounts = [str(remount_file)] if remount_file.exists() else []
        anchor = self._anchor(ctx)
        sent = f"nonce={ctx.nonce} via=setns-net"
        claimed = any(
            a.get("what") == "setns-net" and a.get("outcome") == "succeeded" for a in escapes
        )

        def hits() -> list[str]:
            heard = anchor.reported("conn") if anchor is not None else []
            return [line for line in heard if sent in line]

        # The anchor prints what it heard a moment after the payload sent it: wait for it when
        # the payload says it got there, as every witness read does.
        net_hits = poll_until(hits, bool) if claimed else hits()
        seen = mnt_file.exists() or bool(remounts) or bool(net_hits)
        reasons = [
            (
                f"host saw: setns-mnt file {mnt_file.exists()}, remount files {len(remounts)}, "
                f"setns-net connections heard by the anchor {len(net_hits)}"
            ),
            f"payload: {attempts_summary(escapes)}",
        ]
        escape = judge_escape(observed, seen, None, reasons)
        believed = escape == "disagree" and self.expectation(ctx.claims) == "denied"
        if believed:
            # setns into the verified anchor's namespace, or a remount of the read-only task
            # dir, reported with no file to show for it: a report against the sandbox is
            # believed (package docstring). Not on the open leg, which must show its witness.
            reasons.append("believed: a report against the sandbox")
            escape = "escaped"
        gap = _namespace_gap(report)
        if gap and own_kernel_ran(ctx) and not host_processes(ctx):
            # Its namespaces are its own kernel's: the files this control reads need not
            # exist there, and no escape is judged by them; the host's witnesses decide.
            report = _without_own_ns_control(report)
            reasons.append(
                f"{gap}; under {claims_of(ctx.claims).phrase('kernel')} that is its kernel's "
                "own business, and the host's witnesses (the anchor's canary dir, the task "
                "dir and the anchor's listener) judge the escape"
            )
        elif gap:
            reasons.insert(0, gap)
        powers = [str(a.get("what")) for a in inner if a.get("outcome") == "succeeded"]
        if powers:
            reasons.append(f"exposure, not an escape (private to the payload): {', '.join(powers)}")
        assessment = conclude_with_controls(
            escape,
            observed,
            reasons,
            report,
            control,
            {
                "setns_mnt_file": mnt_file.exists(),
                "remount_files": remounts,
                "setns_net": net_hits,
                "inner": inner,
            },
        )
        # No file and no connection showed it: the FAIL is the payload's word, and says so.
        assessment.reported_only = believed
        return assessment


def _namespace_gap(report: dict[str, Any]) -> str:
    """The namespace files the payload could not read inside, in words; "" when it read all.

    The `read-own-ns` control reads /proc/self/ns/{mnt,net,user} (facts `mntns`...; None for
    one it could not read). A kernel of the sandbox's own (a user-space kernel, a microVM)
    may not provide them: the control then fails and the cell is INCONCLUSIVE; this names the
    files it lacks, never an escape.
    """
    facts = report.get("facts") or {}
    if not any(
        a.get("what") == "read-own-ns" and a.get("outcome") == "error"
        for a in attempts_by_role(report, "control")
    ):
        return ""
    missing = [
        f"/proc/self/ns/{kind}"
        for kind in ("mnt", "net", "user")
        if f"{kind}ns" in facts and not facts[f"{kind}ns"]
    ]
    if not missing:
        return ""
    return (
        f"the sandbox gives the payload no {', '.join(missing)} (a kernel of its own may not "
        "provide them): its own namespaces cannot be read, so no change of them can be told"
    )


def _without_own_ns_control(report: dict[str, Any]) -> dict[str, Any]:
    """`report` without its `read-own-ns` control: for a payload on a kernel of its own.

    That control shows the payload can read its own namespace ids, so a change of them can be
    told; a sandbox's own kernel (gVisor's Sentry) need not provide /proc/self/ns at all, and
    no verdict under `kernel = "own"` rests on those ids. Every other control stays.
    """
    attempts = [
        a
        for a in report.get("attempts", [])
        if not (
            isinstance(a, dict) and a.get("role") == "control" and a.get("what") == "read-own-ns"
        )
    ]
    return {**report, "attempts": attempts}
