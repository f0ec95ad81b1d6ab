"""resource_limits: bounded fork, memory, file-size and open-file loops against declared limits.

The host counts what two loops left in the workspace (forked children's files, the fsize
file's size) and reads each payload process's rlimits and cgroup caps at the rendezvous; how
far the other loops got is the payload's word. The effect decides: a limit the host counted
holding is held even where it reads no rlimit or cap for it (a sandbox with its own kernel or
a supervisor applies it by other means), and the mechanism reading backs it where it exists;
a declared limit that neither the host's count nor its reading backs, read unset, is FAIL.
Every loop stops at `BOUNDS` even where nothing caps it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import control_record, host_writes_check, new_control_nonce
from sandbox_attest.catalog.proc.baseline import conclude_with_controls, confines_anything
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.verdict import Assessment, Escape, Expectation

__all__ = [
    "BOUNDS",
    "HOST_COUNTS",
    "LIMIT_ERRNOS",
    "ResourceLimits",
    "ResourceLimitsSpec",
    "declared_limits",
    "unapplied_limits",
]


@dataclass(frozen=True)
class ResourceLimits:
    """What a backend declares it caps; None = no claim.

    Attributes:
        forks: children the payload can have alive at once.
        memory_mib: MiB the payload can allocate on top of its interpreter.
        fsize_mib: MiB a single file can grow to.
        nofile: descriptors the payload can open on top of the ones it starts with.
    """

    forks: int | None = None
    memory_mib: int | None = None
    fsize_mib: int | None = None
    nofile: int | None = None

    def claims(self) -> dict[str, int]:
        """The declared limits only."""
        return {k: v for k, v in asdict(self).items() if v is not None}


# Every loop stops here even where nothing caps it: the control leg runs unsandboxed on a
# shared machine. A declared limit at or above its bound cannot be tested (reported, not judged).
BOUNDS: Final = {"forks": 64, "memory_mib": 256, "fsize_mib": 32, "nofile": 512}


# What the kernel answers when each declared limit stops its loop (the payload reports a
# MemoryError as ENOMEM and ignores SIGXFSZ so RLIMIT_FSIZE shows as EFBIG). Any other stop
# (ENOSPC on a full disk, ENFILE on a full system table, a crash) is some other wall: it says
# nothing about the declared limit.
LIMIT_ERRNOS: Final = {
    "forks": "EAGAIN",
    "memory_mib": "ENOMEM",
    "fsize_mib": "EFBIG",
    "nofile": "EMFILE",
}
# A loop starts with part of each resource already used (the interpreter's own descriptors,
# memory and process), so it stops somewhat below the declared value; stopping below half of
# it means something else stopped it first.
NEAR_FRACTION: Final = 0.5
# The payload's loop names, as the keys of `ResourceLimits`.
_LOOP_KEYS: Final = {
    "forks": "forks",
    "memory": "memory_mib",
    "fsize": "fsize_mib",
    "nofile": "nofile",
}


def _pairs(values: dict[str, Any]) -> str:
    """`{"fsize_mib": 8, "nofile": 64}` as "fsize_mib=8, nofile=64" for a reason."""
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _unexplained_stop(key: str, declared: int, reached: int, loop: dict[str, Any]) -> str:
    """Why a loop's stop is not the declared limit holding, or "" when it is."""
    want = LIMIT_ERRNOS[key]
    got = loop.get("errno")
    if loop.get("outcome") != "refused" or got != want:
        return f"{key} stopped with {got or loop.get('outcome')}, not the limit's {want}"
    if reached < declared * NEAR_FRACTION:
        return f"{key} stopped at {reached}, far below the declared {declared}"
    return ""


def _held_to_declared(
    backend: str,
    declared: dict[str, int],
    reached: dict[str, int],
    loops: dict[str, dict[str, Any]],
    reasons: list[str],
) -> Escape:
    """A confining backend's reading: each testable declared limit stopped its loop, or not."""
    testable = {k: v for k, v in declared.items() if v < BOUNDS[k]}
    if not testable:
        reasons.append(
            f"backend {backend!r} declares no limit below the probe's bounds "
            f"(declared {_pairs(declared) or 'nothing'}): nothing to hold it to; declare "
            "[claims] limits in the backend spec (e.g. limits = {fsize_mib = 16})"
        )
        return "undecided"
    exceeded = {k: reached.get(k) for k, v in testable.items() if reached.get(k, 0) > v}
    if exceeded:
        reasons.insert(
            0, f"went past the declared limits ({_pairs(testable)}): reached {_pairs(exceeded)}"
        )
        return "escaped"
    unexplained = [
        why
        for k, v in testable.items()
        if (why := _unexplained_stop(k, v, reached.get(k, 0), loops.get(k, {})))
    ]
    if unexplained:
        reasons.insert(0, f"not stopped by the declared limit: {'; '.join(unexplained)}")
        return "undecided"
    reasons.insert(0, f"every declared limit held: {_pairs(testable)}")
    return "refused"


MIB: Final = 1024 * 1024
# Where the host sees each declared limit on the payload (run/hostview.py): its row of
# /proc/<pid>/limits, the unit of that row per unit of the limit, and the cgroup v2 file that
# caps the same resource for the payload's whole group (None: no cgroup caps it).
HOST_LIMITS: Final = {
    "forks": ("Max processes", 1, "pids.max"),
    "memory_mib": ("Max address space", MIB, "memory.max"),
    "fsize_mib": ("Max file size", MIB, None),
    "nofile": ("Max open files", 1, None),
}
HOST_COUNTS: Final = "the host's count of forked children and of the fsize file's size"


def _limit_state(key: str, value: int, process: dict[str, Any]) -> tuple[str, str]:
    """One declared limit on one payload process: ("applied" | "unset" | "unknown", seen).

    Applied when its rlimit's soft value, or the tightest cgroup cap above the payload, is
    at or below the declared value. Memory is the exception: the declared MiB are on top of
    the interpreter's own address space, so any finite RLIMIT_AS or memory cap counts (the
    memory loop itself tests the size). Unknown, never unset, where the rlimit does not
    hold it and the cgroup that might is one the host cannot read.
    """
    row, unit, cgroup_file = HOST_LIMITS[key]
    soft = ((process.get("limits") or {}).get(row) or {}).get("soft")
    cap = (process.get("cgroup_limits") or {}).get(cgroup_file) if cgroup_file else None
    seen = f"{row} {'unlimited' if soft is None else soft}"
    if cgroup_file:
        seen += f", {cgroup_file} {'max' if cap is None else cap}"
    caps = [v for v in (soft, cap) if isinstance(v, int)]
    held = bool(caps) if key == "memory_mib" else any(v <= value * unit for v in caps)
    if held:
        return "applied", seen
    return ("unknown" if isinstance(cap, str) else "unset"), seen


def unapplied_limits(
    declared: dict[str, int], process: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """The declared limits the host sees unset on one payload process, and those it cannot tell.

    Each is named with what the host saw ("fsize_mib=16 (Max file size unlimited)"); see
    `_limit_state`. `process` is one reading of `sandbox_attest.run.hostview.read_process`.
    """
    unset: list[str] = []
    unknown: list[str] = []
    for key, value in sorted(declared.items()):
        state, seen = _limit_state(key, value, process)
        if state != "applied":
            (unset if state == "unset" else unknown).append(f"{key}={value} ({seen})")
    return unset, unknown


def declared_limits(declared: ClaimsLike) -> ResourceLimits:
    """The limits a backend's declared claims name (none when it claims nothing)."""
    return ResourceLimits(**dict(declared.limits))


class ResourceLimitsSpec(SpecBase):
    """Bounded fork, memory, file-size and open-file loops against the declared limits."""

    id = "resource_limits"
    area = "proc"

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The write-and-fork control and one loop per bounded resource."""
        del task
        return AttemptTable(
            required=attempts_of("write-and-fork-once", "forks", "memory", "fsize", "nofile")
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied (held to its declared limits) wherever anything is confined.

        The open control leg declares no limit and must be seen running every loop to its
        bound, which proves the loops can exceed a limit that is not enforced.
        """
        return "denied" if confines_anything(declared) else "allowed"

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE where the backend confines something but declares no limit.

        This probe tests the limits claim alone; a backend that makes none has nothing to
        be held to (the release policy, which requires the claim, is what catches that).
        The control leg confines nothing and always runs.
        """
        if confines_anything(declared) and not declared.limits:
            return "the backend declares no resource limits"
        return None

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host readings behind this cell: its counts, and the payload's limits it read.

        See `host_limits`: only where every declared limit is backed by the host's count of
        its effect (`counted_held`) or seen applied on every payload process it read.
        """
        return self.host_limits(ctx, self.counted_held(ctx, report))[0]

    def host_limits(
        self, ctx: CellContext, counted: dict[str, int] | None = None
    ) -> tuple[list[str], list[str], list[str]]:
        """The host's reading of the declared limits: (corroborated_by, unset, unknown).

        Two host readings back a declared limit: its effect, where the host counts it
        (`counted`, see `counted_held`: the forked children's files, the fsize file's size),
        and its mechanism, each payload process's rlimits and cgroup caps read at the
        rendezvous. The cell is corroborated only when every declared limit is backed by
        one of them; the mechanism reading is named for each limit where it shows it.
        `unset` names each declared limit the host neither counted holding nor saw applied
        (with the pid and what it saw instead), `unknown` each it could not tell (a cgroup
        it cannot read). A limit the host counted holding is never `unset`: the sandbox
        applied it by means the host does not read (its own kernel, a supervisor).
        """
        declared = declared_limits(ctx.claims).claims()
        counted = counted or {}
        read = [p for p in host_processes(ctx) if p.get("limits")]
        by_count = HOST_COUNTS + "".join(
            f"{': ' if i == 0 else ', '}{k}={n} against the declared {declared[k]}"
            for i, (k, n) in enumerate(sorted(counted.items()))
        )
        if not declared:
            return [], [], []
        if not read:
            return ([by_count] if set(declared) <= set(counted) else []), [], []
        unset: list[str] = []
        unknown: list[str] = []
        for process in read:
            not_set, not_known = unapplied_limits(declared, process)
            unset += [f"{limit} on pid {process.get('pid')}" for limit in not_set]
            unknown += [f"{limit} on pid {process.get('pid')}" for limit in not_known]
        missing = {limit.partition("=")[0] for limit in unset + unknown}
        unset = [limit for limit in unset if limit.partition("=")[0] not in counted]
        unknown = [limit for limit in unknown if limit.partition("=")[0] not in counted]
        if unset or unknown:
            return [], unset, unknown
        applied = {k: v for k, v in declared.items() if k not in missing}
        pids = ", ".join(str(p.get("pid")) for p in read)
        limits = (
            f"the payload's rlimits and cgroup caps, read by the host (/proc/{pids}/limits): "
            f"{_pairs(applied)} applied"
        )
        return [by_count, *([limits] if applied else [])], [], []

    def counted_held(self, ctx: CellContext, report: dict[str, Any]) -> dict[str, int]:
        """The declared limits the host's own count shows holding: limit -> the host's count.

        Only a limit whose effect the host counts (forks, fsize_mib), testable below its
        bound, where the host's count is within the declared value and equals the payload's,
        and the loop stopped on the limit's own errno near it (`_unexplained_stop`). Then the
        kernel refused the next step at the limit, whatever applied it. How far the other
        loops got is the payload's word and never qualifies.
        """
        declared = declared_limits(ctx.claims).claims()
        seen = self._witnessed(ctx)
        loops = {
            _LOOP_KEYS.get(str(a.get("what")), str(a.get("what"))): a
            for a in attempts_by_role(report, "escape")
        }
        return {
            key: seen[key]
            for key, value in declared.items()
            if key in seen
            and value < BOUNDS[key]
            and seen[key] <= value
            and int((loops.get(key) or {}).get("reached") or 0) == seen[key]
            and not _unexplained_stop(key, value, seen[key], loops.get(key) or {})
        }

    def _uncapped_but_counted(
        self, ctx: CellContext, declared: dict[str, int], counted: dict[str, int]
    ) -> list[str]:
        """A reason for each limit the host counted holding but read no rlimit or cap for."""
        read = [p for p in host_processes(ctx) if p.get("limits")]
        reasons = []
        for key, count in sorted(counted.items()):
            uncapped = [
                f"{limit} on pid {process.get('pid')}"
                for process in read
                for limit in unapplied_limits({key: declared[key]}, process)[0]
            ]
            if uncapped:
                reasons.append(
                    f"the host reads no rlimit or cgroup cap for {'; '.join(uncapped)}, but "
                    f"the limit held by the host's count ({key}={count} against the declared "
                    f"{declared[key]}): the sandbox applies it by other means"
                )
        return reasons

    @staticmethod
    def fork_dir(ctx: CellContext) -> str:
        """Workspace-relative dir where each forked child leaves a file (host witness)."""
        return f"forks-{ctx.nonce}"

    @staticmethod
    def fsize_file(ctx: CellContext) -> str:
        """Workspace-relative file the fsize loop grows (host witness)."""
        return f"fsize-{ctx.nonce}.bin"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """The bounds, the backend's declared limits, and where the witnesses go."""
        return {
            "bounds": dict(BOUNDS),
            "declared": declared_limits(ctx.claims).claims(),
            "fork_dir": self.fork_dir(ctx),
            "fsize_file": self.fsize_file(ctx),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host can write the workspace and sees what the payload left there."""
        nonce = new_control_nonce()
        return control_record(
            nonce, [host_writes_check("host writes the workspace", ctx.workspace, nonce)]
        )

    def _witnessed(self, ctx: CellContext) -> dict[str, int]:
        forks = ctx.workspace / self.fork_dir(ctx)
        grown = ctx.workspace / self.fsize_file(ctx)
        try:
            fork_count = sum(1 for p in forks.iterdir() if p.name.startswith("fork-"))
        except OSError:
            fork_count = 0
        try:
            size_mib = grown.stat().st_size // (1024 * 1024)
        except OSError:
            size_mib = 0
        return {"forks": fork_count, "fsize_mib": size_mib}

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A loop that went past its declared limit is an escape; the host counts two loops."""
        del witness
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        loops = {_LOOP_KEYS.get(str(a.get("what")), str(a.get("what"))): a for a in escapes}
        reached = {key: int(a.get("reached") or 0) for key, a in loops.items()}
        seen = self._witnessed(ctx)
        # The host's count wins where it has one: files a child made exist or they don't.
        for key, value in seen.items():
            if reached.get(key) != value:
                reached[f"{key}_payload"] = reached.get(key, 0)
                reached[key] = value
        reasons = [
            f"reached {_pairs(reached)} (bounds {_pairs(BOUNDS)}); host counted {_pairs(seen)}"
        ]
        disagree = any(k.endswith("_payload") for k in reached)
        if disagree:
            reasons.append("the payload's counts differ from what the host found")
        declared = declared_limits(ctx.claims).claims()
        escape: Escape
        if any(a.get("outcome") == "error" for a in escapes) or len(escapes) != len(BOUNDS):
            reasons.append(f"a loop could not run: {attempts_summary(escapes)}")
            escape = "undecided"
        elif self.expectation(ctx.claims) == "denied":
            escape = _held_to_declared(ctx.backend, declared, reached, loops, reasons)
            if escape == "refused" and disagree:
                escape = "disagree"
        else:
            at_bound = all(reached.get(k, 0) >= v for k, v in BOUNDS.items())
            escape = "escaped" if at_bound and not disagree else "disagree"
            if not at_bound:
                reasons.append("an unconfined loop stopped before its bound")
        counted = self.counted_held(ctx, report)
        corroborated, unapplied, unknown = self.host_limits(ctx, counted)
        reasons += self._uncapped_but_counted(ctx, declared, counted)
        if unknown:
            reasons.append(
                f"the host cannot tell whether {'; '.join(unknown)} is applied: the cell "
                "rests on the loops"
            )
        if unapplied and self.expectation(ctx.claims) == "denied":
            # The kernel's own record of the payload's limits: a declared limit it does not
            # carry was never applied, whatever the loops (or a rewritten report) say.
            escape = "escaped"
            reasons.insert(
                0,
                f"the resource limits claim ({_pairs(declared)}) is not applied: the host "
                f"sees {'; '.join(unapplied)} on the payload (its /proc/<pid>/limits and "
                "cgroup); apply them (prlimit, docker --ulimit/--pids-limit)",
            )
        assessment = conclude_with_controls(
            escape,
            observed,
            reasons,
            report,
            control,
            {
                "host_counted": seen,
                "declared": declared,
                "reached": reached,
                "host_limits": [
                    {
                        "pid": p.get("pid"),
                        "limits": p.get("limits"),
                        "cgroup": p.get("cgroup_limits"),
                    }
                    for p in host_processes(ctx)
                ],
            },
        )
        assessment.corroborated_by = corroborated
        return assessment
