"""fs_link_escape, host side: symlinks, hardlinks and renames between workspace and host.

Two canaries outside the workspace: one beside it in the cell dir (the same filesystem, so a
hardlink is possible) and one in /tmp. A canary whose bytes, inode, links or directory
changed on the host, or whose hash the payload read back through a symlink, is the escape.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
    refusal_summary,
)
from sandbox_attest.catalog.canary import dir_canary_diff, dir_canary_state, planting, read_text
from sandbox_attest.catalog.controls import (
    control_record,
    host_check,
    host_writes_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.fs.canaries import (
    CANARY_NAME,
    canary_journal_key,
    payload_owner,
    remove_canary_dir,
)
from sandbox_attest.catalog.judging import conclude, judge_escape, private_namespace_reason
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    home_of,
)
from sandbox_attest.claims import Claims, claims_of, unclaimed
from sandbox_attest.host import disguise, journal, safefs
from sandbox_attest.verdict import Assessment, Expectation

LINK_OPS: Final = ("symlink-read", "symlink-write", "hardlink", "rename-in", "rename-out")


class FsLinkEscape(SpecBase):
    """Symlinks, hardlinks and renames between the workspace and host canaries."""

    id = "fs_link_escape"
    area = "fs"
    host_readings = ("canary files on the host",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Each link op in the workspace and at every planted canary."""
        canaries = sorted((task.get("targets") or {}).get("canaries") or {})
        workspace = attempts_of(("workspace", LINK_OPS))
        return AttemptTable(
            required=workspace | attempts_of(*((key, LINK_OPS) for key in canaries)),
            excuses=(("workspace:setup", workspace),),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied under a reads or a writes claim: a link must not widen the grant."""
        claims = claims_of(declared)
        return "denied" if (claims.reads, claims.writes) != ("open", "open") else "allowed"

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE under open reads and writes: the probe tests those claims alone."""
        return unclaimed(self.id, claims_of(declared))

    @staticmethod
    def judged(claims: Claims, op: str, path: Path, home: Path) -> bool:
        """Whether the claims forbid `op` at the canary at `path` (a read, or else a write).

        `symlink-read` is the read part, judged by the reads claim; every other op changes
        the canary or its directory, judged by the writes claim. On the control leg every
        op counts: it must show them all.
        """
        if claims.nothing:
            return True
        if op == "symlink-read":
            return claims.read_denied(path, home)
        return claims.write_denied(path, home)

    @staticmethod
    def canaries(ctx: CellContext) -> dict[str, Path]:
        """A canary beside the workspace (same filesystem: hardlinks possible) and in /tmp."""
        tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())  # noqa: S108
        return {
            "sibling": ctx.cell_dir / "link-outside" / CANARY_NAME,
            "tmp": tmp / f"{disguise.LINK_PREFIX}{ctx.nonce}" / CANARY_NAME,
        }

    @staticmethod
    def control_dir(ctx: CellContext) -> str:
        """The payload's control dir inside the workspace."""
        return f"link-control-{ctx.nonce}"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant each canary with a random token and record its state."""
        baseline: dict[str, Any] = {}
        # The /tmp one is journalled before it exists (host/journal.py); the sibling goes
        # with the scratch.
        journal.record(canary_journal_key(self.id, ctx), [self.canaries(ctx)["tmp"].parent])
        for key, path in self.canaries(ctx).items():
            # Through the place's descriptor: /tmp is everyone's (sandbox_attest/host/safefs.py).
            with planting(self.id, path), safefs.open_dir(path.parent.parent) as place:
                made = place.mkdir(path.parent.name, 0o755, payload_owner(ctx))
                text = f"{disguise.STEM} link {key} {secrets.token_hex(16)}\n"
                made.create_file(path.name, text, 0o644, payload_owner(ctx))
            baseline[key] = dir_canary_state(path)
        save_state(ctx, {"baseline": baseline})
        return {
            "canaries": {k: str(v) for k, v in self.canaries(ctx).items()},
            "control_dir": self.control_dir(ctx),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host can create and remove a file in every canary dir."""
        nonce = new_control_nonce()
        checks = [
            host_writes_check(f"host writes {key}", path.parent, nonce)
            for key, path in self.canaries(ctx).items()
        ]
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A changed canary (bytes, inode, links, dir) or its hash read back is an escape."""
        del witness
        baseline = load_state(ctx).get("baseline", {})
        claims, home = claims_of(ctx.claims), home_of(ctx)
        canaries = self.canaries(ctx)

        def counts(attempt: dict[str, Any]) -> bool:
            key, _, op = str(attempt.get("what")).partition(":")
            return key not in canaries or self.judged(claims, op, canaries[key], home)

        # The workspace's own ops are the control; a canary's op counts where a claim forbids it.
        escapes = [a for a in attempts_by_role(report, "escape") if counts(a)]
        changed: dict[str, str] = {}
        state: dict[str, Any] = {}
        broke: set[str] = set()
        for key, path in canaries.items():
            before = baseline.get(key, {})
            state[key] = dir_canary_state(path)
            phrase = dir_canary_diff(before, state[key])
            if phrase and self.judged(claims, "write", path, home):
                broke.add("writes")
            else:
                phrase = ""
            read_back = [
                a
                for a in escapes
                if a.get("what") == f"{key}:symlink-read"
                and a.get("outcome") == "succeeded"
                and a.get("sha256") == before.get("file", {}).get("sha256")
            ]
            if read_back:
                phrase = ", ".join(p for p in (phrase, "read through a symlink") if p)
                broke.add("reads")
            if phrase:
                changed[key] = phrase
        observed = observed_outcome(escapes)
        reasons = []
        if changed:
            named = [claims.phrase(c) for c in sorted(broke) if getattr(claims, c) != "open"]
            reasons.append(
                "".join(f"{n}; " for n in named)
                + "host sees the canary reached: "
                + "; ".join(f"{k}: {v}" for k, v in changed.items())
            )
        else:
            reasons.append("every canary's bytes, inode, links and dir unchanged")
            reasons.append(refusal_summary(escapes))
        if not claims.nothing:
            reasons.extend(
                f"the {part} part is not judged: the backend claims open {part}"
                for part in ("reads", "writes")
                if getattr(claims, part) == "open"
            )
        escape = judge_escape(
            observed, bool(changed), private_namespace_reason(report, "mnt"), reasons
        )
        inside = attempts_by_role(report, "control")
        workspace_checks = self._workspace_checks(ctx, inside)
        return conclude(
            escape,
            observed,
            reasons,
            inside_ok=all(c["ok"] for c in workspace_checks),
            inside_failed="workspace control failed: "
            + ", ".join(c["what"] for c in workspace_checks if not c["ok"]),
            host_control=control,
            host_failed="host control failed",
            witness={"canaries": state, "baseline": baseline, "changed": changed},
            controls={"inside": inside, "workspace": workspace_checks, "host": control},
        )

    def _workspace_checks(
        self, ctx: CellContext, inside: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        inner = ctx.workspace / self.control_dir(ctx) / "inner"
        stem = f"workspace-{ctx.nonce}"
        return [
            host_check(
                "payload link ops in the workspace",
                all_succeeded(inside, len(LINK_OPS)),
                attempts_summary(inside),
            ),
            host_check(
                "host sees the symlink", (inner / f"{stem}.symlink").is_symlink(), str(inner)
            ),
            host_check(
                "host sees the hardlink write",
                f"appended via hardlink {ctx.nonce}"
                in (read_text(inner / f"{stem}.hardlink") or ""),
                str(inner),
            ),
            host_check(
                "host sees the renamed canary",
                f"renamed over by {ctx.nonce}" in (read_text(inner / f"{stem}.stolen") or ""),
                str(inner),
            ),
        ]

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the /tmp canary dir (the sibling goes with cell_dir)."""
        tmp_dir = self.canaries(ctx)["tmp"].parent
        if ctx.nonce in tmp_dir.name:
            remove_canary_dir(tmp_dir)
        if not tmp_dir.exists():
            journal.forget(canary_journal_key(self.id, ctx))
