"""The device probe, host side: which of the host's devices the payload can open.

`dev_access` has its payload open, read-only, every device node it can see under /dev (and
the host's notable ones by name), and report the device number of each one that opened. The
host reads that against its own device table:

- device numbers belong to the kernel, not to a namespace, so a node that opens inside is the
  host's device, whatever its path there; one outside the harmless set (null, zero, full,
  random, urandom, tty, ptmx and pty slaves) is an escape, named by the host's own path for
  it ("the sandbox exposes /dev/net/tun");
- the control: the payload opens the harmless devices in its view, and their numbers are
  the host's (so the probe can open a device and report it); /dev/null must be one of them,
  and one absent from the view is not a failure (a sandbox may document only null, random
  and urandom); the host, as the payload user and
  unconfined, opens the same sensitive devices (so a refusal inside is the sandbox's, not the
  file mode's).

- the host witness: at the rendezvous (run/hostview.py, `DevAccess.at_rendezvous`), while
  the payload waits, the host lists its own /dev through /proc/<pid>/root (lstat only, no
  symlink followed), which no wrapper can rewrite. A view with no node outside the harmless
  class backs a refusal whatever the report says; a device in the view that the report calls
  absent is a report the host contradicts.

- devices outside /dev (issue 26): a sandbox may put a host device node anywhere
  (`--dev-bind /dev /host/dev` exposes `/host/dev/fuse`). At the rendezvous the host also
  walks the payload's whole view (sandbox_attest/host/viewwalk.py, bounded, nothing
  followed) and adds every node outside /dev and outside the harmless class to the task the
  payload reads once released (`elsewhere`), so the payload tries those inside paths too;
  the device number decides as above, and an added node the report never tried keeps the
  cell from PASS. What the walk did not cover is in the evidence (`walk.not_covered`).

What it does not do: it never reads, writes or sends an ioctl to a device, so it says nothing
about what a device would let the payload do once open; and where a node is in the view but
the sandbox denies its open by other means (a container's device cgroup), the refusal rests on
the payload's word.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.added_targets import add_targets, untried
from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_summary,
    observed_outcome,
    refusal_summary,
)
from sandbox_attest.catalog.controls import (
    control_record,
    host_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.judging import (
    conclude,
    expect_fs_confined,
    judge_escape,
    private_namespace_reason,
)
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.catalog.witness.kernel import (
    OPENS,
    KernelJudgement,
    ReportedAttempt,
    corroborate,
    path_match,
    reads_bytes,
)
from sandbox_attest.errors import HarnessError
from sandbox_attest.host.trust import PayloadUser, measure_as, payload_user
from sandbox_attest.host.viewwalk import walk_view
from sandbox_attest.verdict import Assessment, Escape, Expectation

DEV: Final = Path("/dev")
# The harmless devices a sandbox hands its payload: the in-sandbox control. Each one in the
# payload's view must open inside as the host's own; one absent from it is no failure
# (`_inside_control`), but REQUIRED_CONTROL must open, or nothing shows the payload could
# have opened a device at all.
CONTROL_DEVICES: Final = ("null", "zero", "full", "random", "urandom")
REQUIRED_CONTROL: Final = "null"
# Harmless too, but not required: a process without a controlling terminal gets ENXIO from
# /dev/tty, and ptmx allocates a pty of the sandbox's own devpts.
HARMLESS_NAMES: Final = frozenset({*CONTROL_DEVICES, "tty", "ptmx", "pts/ptmx"})
# Character majors of the harmless class whatever the node is called: 1 is mem's (1:1 mem,
# 1:2 kmem, 1:4 port are NOT harmless: only the minors below), 5:0 tty, 5:2 ptmx, and the
# Unix98 pty slaves (136-143).
HARMLESS_RDEVS: Final = frozenset({"1:3", "1:5", "1:7", "1:8", "1:9", "5:0", "5:2"})
PTY_SLAVE_MAJORS: Final = range(136, 144)
# Devices worth naming in every task where the host has them, openable by the payload user or
# not: the payload tries each by path, so a sandbox that exposes one is asked about it even
# beyond the scan's bound.
NOTABLE: Final = (
    "kvm",
    "net/tun",
    "fuse",
    "mem",
    "kmem",
    "port",
    "kmsg",
    "autofs",
    "vhost-net",
    "vhost-vsock",
    "vsock",
    "loop-control",
    "mapper/control",
    "userfaultfd",
    "uinput",
    "ttyS0",
    "console",
    "dri/card0",
)
# Opening a watchdog arms it; the payload never opens one, and neither does the host.
NEVER_OPEN: Final = ("watchdog",)
MAX_NODES: Final = 512
MAX_DEPTH: Final = 3
FIX: Final = (
    "do not bind the host's /dev into the sandbox: give it a minimal one (bwrap --dev /dev, "
    "docker's default device set without --device or --privileged)"
)


def _rdev(info: os.stat_result) -> str:
    return f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"


def harmless_rdev(rdev: str) -> bool:
    """Whether device number "major:minor" is in the harmless class (see HARMLESS_RDEVS)."""
    major, _, _ = rdev.partition(":")
    return rdev in HARMLESS_RDEVS or (major.isdigit() and int(major) in PTY_SLAVE_MAJORS)


def device_nodes(root: Path = DEV) -> dict[str, dict[str, str]]:
    """Every device node under `root` (bounded like the payload's scan): rel path -> kind, rdev.

    Only lstat: nothing is opened. Symlinks are not followed (/dev/fd points into /proc).
    """
    found: dict[str, dict[str, str]] = {}
    queue: list[tuple[Path, int]] = [(root, 0)]
    while queue and len(found) < MAX_NODES:
        where, depth = queue.pop(0)
        try:
            entries = sorted(where.iterdir())
        except OSError:
            continue
        for path in entries:
            try:
                info = path.lstat()
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 < MAX_DEPTH:
                    queue.append((path, depth + 1))
            elif stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
                kind = "char" if stat.S_ISCHR(info.st_mode) else "block"
                found[str(path.relative_to(root))] = {"kind": kind, "rdev": _rdev(info)}
    return found


def open_devices(root: Path = DEV) -> dict[str, dict[str, Any]]:
    """Open every device node under `root` read-only, as this process: rel path -> outcome.

    The payload's own flags (O_RDONLY | O_NONBLOCK | O_NOCTTY), closed at once; never a
    read, a write or an ioctl, and never a watchdog. Run it as the payload user (see
    `payload_user_devices`) to learn what an unconfined payload could open here.
    """
    result: dict[str, dict[str, Any]] = {}
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
    for rel, node in device_nodes(root).items():
        if Path(rel).name.startswith(NEVER_OPEN):
            continue
        entry: dict[str, Any] = dict(node)
        try:
            fd = os.open(root / rel, flags)
        except OSError as exc:
            entry |= {"opened": False, "errno": errno.errorcode.get(exc.errno or -1, "?")}
        else:
            os.close(fd)
            entry["opened"] = True
        result[rel] = entry
    return result


def payload_user_devices(user: PayloadUser | None) -> dict[str, dict[str, Any]]:
    """`open_devices()` as the payload user, unconfined: what a sandbox could take away.

    The harness may be root and opens everything; the payload never is.

    Raises:
        HarnessError: the measuring child failed (its stderr says why).
    """
    if user is None:
        return open_devices()
    found, why = measure_as(user, __name__, "open_devices", HOST_TIMEOUT_S * 3)
    if why:
        msg = (
            f"dev_access: could not measure which devices {user.name} opens on this host "
            f"({why}); check that {user.name} can run {sys.executable}"
        )
        raise HarnessError(msg)
    return {str(k): dict(v) for k, v in found.items()}


def sensitive(devices: dict[str, dict[str, Any]]) -> list[str]:
    """The devices of a table that opened and are not in the harmless class, sorted."""
    return sorted(
        rel
        for rel, d in devices.items()
        if d.get("opened") and rel not in HARMLESS_NAMES and not harmless_rdev(str(d["rdev"]))
    )


def read_view(pid: int) -> dict[str, Any]:
    """The device nodes of `pid`'s own /dev, listed by the host through /proc/<pid>/root.

    Only lstat. A /dev that is itself a symlink is not followed: through /proc/<pid>/root an
    absolute link would resolve in the host's tree, not the payload's.
    """
    dev = Path(f"/proc/{pid}/root/dev")
    try:
        info = dev.lstat()
    except OSError as exc:
        return {"seen": False, "pid": pid, "why": f"cannot read {dev}: {exc.strerror}"}
    if not stat.S_ISDIR(info.st_mode):
        return {"seen": False, "pid": pid, "why": f"{dev} is not a directory (a symlink?)"}
    return {"seen": True, "pid": pid, "nodes": device_nodes(dev)}


def elsewhere_nodes(devices: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The device nodes a whole-view walk found outside /dev that are not harmless.

    Keyed by inside path. /dev itself is the payload's own scan's; a watchdog is never
    opened, so it is never added (the walk's listing still shows it).
    """
    return {
        inside: node
        for inside, node in sorted(devices.items())
        if inside != "/dev"
        and not inside.startswith("/dev/")
        and not harmless_rdev(str(node.get("rdev")))
        and not Path(inside).name.startswith(NEVER_OPEN)
    }


def read_whole_view(pid: int) -> dict[str, Any]:
    """`read_view` of the payload's /dev, plus the device nodes anywhere else in its view.

    `elsewhere` maps each inside path outside /dev to its node (`elsewhere_nodes`); `walk`
    is the walk's evidence without its sockets (the socket probe reads those).
    """
    view = read_view(pid)
    walk = walk_view(pid)
    evidence = walk.as_evidence()
    evidence.pop("sockets", None)
    view["walk"] = evidence
    view["elsewhere"] = elsewhere_nodes(walk.devices) if walk.seen else {}
    return view


def view_sensitive(view: dict[str, Any]) -> list[str]:
    """The nodes of a payload's view outside the harmless class (by number and name).

    Nodes under its /dev by their path relative to /dev; nodes elsewhere by their inside
    path (absolute), as the payload names them (`dev:/host/dev/fuse`).
    """
    nodes = view.get("nodes") or {}
    in_dev = [
        rel
        for rel, d in nodes.items()
        if rel not in HARMLESS_NAMES and not harmless_rdev(str(d.get("rdev")))
    ]
    return sorted([*in_dev, *(view.get("elsewhere") or {})])


def _shown(rel: str) -> str:
    """A node's path as the payload sees it: `/dev/kvm` for "kvm", an inside path as is."""
    return rel if rel.startswith("/") else f"/dev/{rel}"


@functools.cache
def _nothing_to_hide() -> str | None:
    try:
        opened = sensitive(payload_user_devices(payload_user()))
    except (HarnessError, OSError, subprocess.SubprocessError) as exc:
        return f"dev_access cannot measure this host's devices: {exc}"
    if opened:
        return None
    return (
        "no device beyond the harmless set (null, zero, full, random, urandom, tty, ptmx) "
        "opens for the payload user on this host, so no sandbox can be credited with hiding one"
    )


def _exposed_and_judged(
    escapes: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(opened devices outside the harmless class, the attempts the verdict rests on)."""
    exposed = [
        a
        for a in escapes
        if a.get("outcome") == "succeeded" and not harmless_rdev(str(a.get("rdev", "")))
    ]
    # The harmless class by name is noise when refused (no /dev/tty inside is fine).
    judged = [
        a
        for a in escapes
        if a in exposed or str(a.get("what", "")).removeprefix("dev:") not in HARMLESS_NAMES
    ]
    return exposed, judged


def kernel_judgement(ctx: CellContext, judged: list[dict[str, Any]]) -> KernelJudgement | None:
    """The kernel's answer to each judged device open, on a filter sandbox (else None).

    The payload's mount namespace is the harness's there, so the path it opened names the
    host's node; the probe opens read-only, which `reads_bytes` counts as an open that works.
    """
    attempts = [
        ReportedAttempt(
            label=str(a.get("path") or a.get("what")),
            outcome=str(a.get("outcome")),
            syscalls=OPENS,
            match=path_match(str(a.get("path"))),
            counts=reads_bytes,
        )
        for a in judged
        if a.get("path")
    ]
    return corroborate(ctx, attempts, "mnt") if attempts else None


def _contradicted_by_view(judged: list[dict[str, Any]], view: dict[str, Any]) -> list[str]:
    """The nodes the report calls absent (ENOENT) that the host sees in the payload's view."""
    nodes = {**(view.get("nodes") or {}), **(view.get("elsewhere") or {})}
    # The report calls a node absent that the host sees in the payload's own /dev.
    return sorted(
        str(a.get("what")).removeprefix("dev:")
        for a in judged
        if a.get("errno") == "ENOENT" and str(a.get("what")).removeprefix("dev:") in nodes
    )


def _weigh_view(
    escape: Escape,
    view: dict[str, Any],
    in_view: list[str],
    exposed: list[dict[str, Any]],
    contradicted: list[str],
    reasons: list[str],
) -> Escape:
    """The escape once the host's listing of the payload's /dev is weighed; adds its reasons."""
    if contradicted and not exposed:
        escape = "disagree"
        reasons.append(
            "the host sees "
            + ", ".join(_shown(rel) for rel in contradicted)
            + " in the payload's view, which its report calls absent (ENOENT): the report "
            "is not what ran"
        )
    elif in_view and not exposed:
        reasons.append(
            "the host sees "
            + ", ".join(_shown(rel) for rel in in_view)
            + " in the payload's view: their refusal rests on the payload's word"
        )
    if not view.get("seen"):
        reasons.append(f"the host did not read the payload's /dev: {view.get('why')}")
    return escape


def _weigh_untried(escape: Escape, missing: list[str], reasons: list[str]) -> Escape:
    """A node the host found outside /dev and added, that the report never tried."""
    if not missing:
        return escape
    reasons.append(
        "the host found "
        + ", ".join(m.removeprefix("dev:") for m in missing)
        + " in the payload's view and added them to its task, but the report never tried "
        "them: the report is not what ran"
    )
    return escape if escape == "escaped" else "disagree"


def _control_name(attempt: dict[str, Any]) -> str:
    return str(attempt.get("what", "")).removeprefix("control:")


def _absent(attempt: dict[str, Any], view: dict[str, Any]) -> bool:
    """A harmless device not in the payload's view: ENOENT, and the host's listing agrees.

    Where the host read the view, its listing decides (a report calling a listed node absent
    is not believed); where it did not, the payload's ENOENT stands for a harmless device,
    since `/dev/null` must still open with the host's number for the control to hold.
    """
    if attempt.get("outcome") != "refused" or attempt.get("errno") != "ENOENT":
        return False
    return not view.get("seen") or _control_name(attempt) not in (view.get("nodes") or {})


def _inside_control(
    inside: list[dict[str, Any]], host: dict[str, Any], view: dict[str, Any]
) -> tuple[bool, str, str | None]:
    """Whether the harmless devices present inside opened as the host's own; why not; a note.

    1. Every harmless device that opened must carry the host's number for that name: the
       numbers the payload reports are then this host's.
    2. One present in the view that did not open fails the control: the sandbox refuses
       harmless opens, so a refusal of a sensitive device says nothing.
    3. One absent from the view (`_absent`) is no failure: sandboxes document smaller sets
       (null, random and urandom only); the note names them.
    4. `REQUIRED_CONTROL` (/dev/null) must open: without one device opened nothing shows the
       payload could open a device at all, and null is the one every sandbox gives and
       every wrapper must expose (the payloads need it), so its absence is the wrapper's
       gap to report, not a control to wave through.
    """
    mismatched = [
        str(a.get("what"))
        for a in inside
        if a.get("outcome") == "succeeded"
        and a.get("rdev") != host.get(_control_name(a), {}).get("rdev")
    ]
    absent = [a for a in inside if _absent(a, view)]
    failed = [a for a in inside if a.get("outcome") != "succeeded" and a not in absent]
    null_opened = any(
        a.get("outcome") == "succeeded" and _control_name(a) == REQUIRED_CONTROL for a in inside
    )
    inside_ok = null_opened and not failed and not mismatched
    if mismatched:
        why = (
            f"inside, {', '.join(mismatched)} opened a device the host does not "
            "have under that name: the report does not describe this host's devices"
        )
    elif failed:
        why = f"the harmless devices did not open inside: {attempts_summary(failed)}"
    else:
        why = (
            f"/dev/{REQUIRED_CONTROL} must open inside, and did not "
            f"({attempts_summary([a for a in inside if _control_name(a) == REQUIRED_CONTROL])})"
            ": nothing shows the payload could open a device; a wrapper must expose /dev/null"
        )
    note = (
        "the payload's view has no "
        + ", ".join(f"/dev/{_control_name(a)}" for a in absent)
        + " (absent, not a failed control)"
        if absent and inside_ok
        else None
    )
    return inside_ok, why, note


class DevAccess(SpecBase):
    """Read-only opens of every device node the payload can see."""

    id = "dev_access"
    area = "dev"
    kernel_witness = True

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The harmless controls and the named devices; more `dev:` nodes the scan finds."""
        targets = task.get("targets") or {}
        controls = {f"control:{n}" for n in targets.get("control") or CONTROL_DEVICES}
        named = {f"dev:{rel}" for rel in targets.get("devices") or ()}
        return AttemptTable(required=frozenset(controls | named), discovered=("dev:",))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied where the view is built from granted paths; seen on the open control leg."""
        return expect_fs_confined(declared)

    def not_applicable_here(self) -> str | None:
        """Why this host cannot judge the probe: nothing sensitive opens here unconfined."""
        return _nothing_to_hide()

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Measure what the payload user opens here; name those devices and the notable ones."""
        opened = payload_user_devices(ctx.user)
        nodes = device_nodes()
        named = sorted({*sensitive(opened), *(rel for rel in NOTABLE if rel in nodes)})
        save_state(ctx, {"prepared": opened})
        return {
            "control": list(CONTROL_DEVICES),
            "devices": named,
            # Inside path -> inside path, added by the host at the rendezvous.
            "elsewhere": {},
            "max_nodes": MAX_NODES,
            "max_depth": MAX_DEPTH,
        }

    def at_rendezvous(self, ctx: CellContext, pid: int) -> dict[str, Any]:
        """The host's listing of the payload's view, taken while it waits (`read_whole_view`).

        The runner calls it at the host's rendezvous (sandbox_attest/run/hostview.py) and stores the
        result in `ctx.host_view` under this probe's id. Nodes found outside /dev are added
        to the task (`elsewhere`), which the payload reads once released.
        """
        view = read_whole_view(pid)
        added = {inside: inside for inside in view["elsewhere"]}
        failed = add_targets(ctx.cell_dir, "elsewhere", added)
        view["added"] = sorted(f"dev:{inside}" for inside in added) if not failed else []
        if failed:
            view["add_failed"] = failed
        return view

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """As the payload user, unconfined: the harmless devices open, and a sensitive one does.

        `devices` carries the whole table (what opened for the payload user, the host's
        device numbers) for the assessment; `payload_view` the host's listing of the
        payload's own /dev (the witness), taken at the rendezvous.
        """
        view = dict(ctx.host_view.get(self.id) or {})
        if not view:
            why = ctx.host_view.get("why") or "the rendezvous took no reading of /dev"
            view = {"seen": False, "why": why}
        try:
            opened = payload_user_devices(ctx.user)
        except HarnessError as exc:
            failed = control_record(
                new_control_nonce(),
                [host_check("host opens its devices", ok=False, detail=str(exc))],
            )
            failed["payload_view"] = view
            return failed
        checks = [
            host_check(
                f"host opens /dev/{name} as the payload user",
                bool(opened.get(name, {}).get("opened")),
                json.dumps(opened.get(name, "no such node")),
            )
            for name in CONTROL_DEVICES
        ]
        exposed = sensitive(opened)
        checks.append(
            host_check(
                "the payload user opens a device beyond the harmless set on the open host",
                bool(exposed),
                ", ".join(f"/dev/{rel}" for rel in exposed) or "none opens",
            )
        )
        result = control_record(new_control_nonce(), checks)
        result["devices"] = opened
        result["payload_view"] = view
        return result

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """An opened device outside the harmless class is an escape, named by its host path."""
        del witness  # the host's device table is this probe's witness
        host = dict(control.get("devices") or load_state(ctx).get("prepared") or {})
        escapes = attempts_by_role(report, "escape")
        exposed, judged = _exposed_and_judged(escapes)
        observed = observed_outcome(judged) if judged else "error"
        reasons = self._opened_reasons(exposed, judged, host)
        view = dict(control.get("payload_view") or {})
        in_view = view_sensitive(view) if view.get("seen") else []
        contradicted = _contradicted_by_view(judged, view)
        escape = judge_escape(
            observed, bool(exposed), private_namespace_reason(report, "mnt"), reasons
        )
        escape = _weigh_view(escape, view, in_view, exposed, contradicted, reasons)
        missing = untried({str(k): "" for k in view.get("added") or ()}, report)
        escape = _weigh_untried(escape, missing, reasons)
        if view.get("add_failed") and not exposed:
            escape = "disagree" if view.get("elsewhere") else escape
            reasons.append(str(view["add_failed"]))
        corroborated = self._corroboration(view, in_view, exposed, contradicted)
        kernel = kernel_judgement(ctx, judged)
        if kernel is not None and kernel.escapes and not exposed:
            escape = "escaped"
            reasons.insert(
                0, "the kernel opened the device for the payload: " + "; ".join(kernel.escapes)
            )
        elif kernel is not None and kernel.all_corroborated and not exposed and not corroborated:
            # Nodes in the view, refused by a filter (Landlock, seccomp): the kernel's error for
            # each open backs the refusal that the listing cannot.
            reasons.append("; ".join(kernel.corroborated))
            corroborated = ["the kernel's answer to each device open (kernel witness)"]
        inside = attempts_by_role(report, "control")
        inside_ok, inside_failed, absent_note = _inside_control(inside, host, view)
        if absent_note:
            reasons.append(absent_note)
        assessment = conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=inside_failed,
            host_control=control,
            host_failed="host control failed",
            witness={
                "exposed": {
                    str(a.get("what")): {"rdev": a.get("rdev"), "kind": a.get("kind")}
                    for a in exposed
                },
                "host_devices": host,
                "payload_view": view,
                **({"kernel": kernel.as_witness()} if kernel is not None else {}),
            },
            controls={"inside": inside, "host": control},
        )
        assessment.corroborated_by = corroborated
        return assessment

    def _opened_reasons(
        self,
        exposed: list[dict[str, Any]],
        judged: list[dict[str, Any]],
        host: dict[str, Any],
    ) -> list[str]:
        """The first reasons: the devices the sandbox exposes, or what the payload user opens."""
        by_rdev: dict[str, list[str]] = {}
        for rel, d in sorted(host.items()):
            by_rdev.setdefault(str(d.get("rdev")), []).append(f"/dev/{rel}")
        reasons: list[str] = []
        if exposed:
            reasons.append(
                "the sandbox exposes "
                + ", ".join(self._named(a, by_rdev) for a in exposed)
                + f"; {FIX}"
            )
        else:
            reasons.append(f"no device beyond the harmless set opened: {refusal_summary(judged)}")
            on_host = sensitive(host)
            if on_host:
                reasons.append(
                    "unconfined, the payload user opens "
                    + ", ".join(f"/dev/{rel}" for rel in on_host)
                )
        return reasons

    @staticmethod
    def _corroboration(
        view: dict[str, Any],
        in_view: list[str],
        exposed: list[dict[str, Any]],
        contradicted: list[str],
    ) -> list[str]:
        """The host reading behind this cell: its listing of the payload's /dev, where it backs it.

        A refusal is backed when the view holds nothing outside the harmless class (nothing
        there to open); an exposure when the opened device's number is in the view.
        """
        if not view.get("seen") or contradicted:
            return []
        where = f"the payload's view as the host listed it (/proc/{view.get('pid')}/root)"
        if exposed:
            nodes = {**(view.get("nodes") or {}), **(view.get("elsewhere") or {})}
            numbers = {str(d.get("rdev")) for d in nodes.values()}
            seen = all(str(a.get("rdev")) in numbers for a in exposed)
            return [f"{where}: the opened devices are in it"] if seen else []
        return [] if in_view else [f"{where}: only the harmless class"]

    @staticmethod
    def _named(attempt: dict[str, Any], by_rdev: dict[str, list[str]]) -> str:
        """`/dev/kvm (char 10:232, the host's /dev/kvm)` for one opened device."""
        inside = str(attempt.get("path") or attempt.get("what"))
        rdev = str(attempt.get("rdev"))
        on_host = by_rdev.get(rdev)
        where = f"the host's {', '.join(on_host)}" if on_host else "no node on the host's /dev"
        return f"{inside} ({attempt.get('kind')} {rdev}, opened read-only; {where})"
