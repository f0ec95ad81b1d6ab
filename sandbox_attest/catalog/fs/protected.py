"""fs_protected_in_workspace, host side: files in the workspace that run code outside later.

The workspace is writable by design, but some paths in it make code run outside the sandbox
later: git runs hooks and obeys its config, shells source rc files. The host reads each for
the cell's nonce after the payload ran; a protected-paths claim says which must not change.
"""

from __future__ import annotations

import os
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
    refusal_summary,
)
from sandbox_attest.catalog.canary import read_text
from sandbox_attest.catalog.controls import control_record, host_writes_check, new_control_nonce
from sandbox_attest.catalog.judging import conclude, judge_escape
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
)
from sandbox_attest.claims import claims_of, unclaimed
from sandbox_attest.host import disguise
from sandbox_attest.verdict import Assessment, Expectation

# Paths inside the workspace that make code run outside the sandbox later (git runs hooks and
# obeys config; shells source rc files). Keys are what the payload reports.
PROTECTED_PATHS: Final = {
    "git-hook": ".git/hooks/pre-commit",
    "git-config": ".git/config",
    "bashrc": ".bashrc",
}


class FsProtectedInWorkspace(SpecBase):
    """Writes `.git/hooks/*`, `.git/config` and `.bashrc` inside the writable workspace."""

    id = "fs_protected_in_workspace"
    area = "fs"
    host_readings = ("protected files read on the host",)

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The workspace-file control and one write per protected path."""
        paths = (task.get("targets") or {}).get("paths") or {}
        return AttemptTable(required=attempts_of("workspace-file", *sorted(paths)))

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied under a protected-paths claim; else allowed (reported as exposure).

        A backend that claims no protected path is NOT_APPLICABLE (`not_claimed`); where the
        runner does not ask, and on the control leg, the write landing is the exposure.
        """
        return "denied" if claims_of(declared).protected else "allowed"

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE without protected paths: this probe tests that claim alone."""
        return unclaimed(self.id, claims_of(declared))

    @staticmethod
    def control_name(ctx: CellContext) -> str:
        """The ordinary sibling file the payload writes as its control."""
        return f"notes-{ctx.nonce}.txt"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Lay out a git checkout and a home-like rc file in the workspace."""
        git = ctx.workspace / ".git"
        (git / "hooks").mkdir(parents=True)
        (git / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = false\n")
        (ctx.workspace / ".bashrc").write_text(f"# {disguise.STEM}\n")
        return {"paths": dict(PROTECTED_PATHS), "control": self.control_name(ctx)}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host can write in each protected folder (so a refusal there is the sandbox's)."""
        nonce = new_control_nonce()
        checks = [
            host_writes_check(f"host writes beside {key}", (ctx.workspace / rel).parent, nonce)
            for key, rel in PROTECTED_PATHS.items()
        ]
        return control_record(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The host reads each protected file for the nonce; a hook must also be executable."""
        del witness
        nonce = ctx.nonce
        planted: dict[str, bool] = {}
        for key, rel in PROTECTED_PATHS.items():
            path = ctx.workspace / rel
            text = read_text(path) or ""
            ok = nonce in text
            if key == "git-hook":
                ok = ok and os.access(path, os.X_OK)
            planted[key] = ok
        claims = claims_of(ctx.claims)
        # With a claim, only the paths it protects are judged; the others are exposure.
        judged_keys = {
            k for k, rel in PROTECTED_PATHS.items() if not claims.protected or claims.protects(rel)
        }
        seen = sorted(k for k, ok in planted.items() if ok and k in judged_keys)
        exposed = sorted(k for k, ok in planted.items() if ok and k not in judged_keys)
        escapes = [a for a in attempts_by_role(report, "escape") if a.get("what") in judged_keys]
        observed = observed_outcome(escapes)
        reasons = []
        if seen and claims.protected:
            wrote = ", ".join(f"{k} ({PROTECTED_PATHS[k]})" for k in seen)
            reasons.append(f"{claims.phrase('protected')}; the payload wrote {wrote}")
        elif seen:
            reasons.append(
                f"exposure: the payload planted {', '.join(seen)} in the workspace, which run "
                "outside the sandbox later; no protected-path claim is declared"
            )
        else:
            reasons.append("no protected file carries the nonce on the host")
            reasons.append(refusal_summary(escapes))
        if exposed:
            reasons.append(
                f"exposure, not claimed protected: the payload planted {', '.join(exposed)}"
            )
        # The workspace is the same directory on both sides, so a success the host cannot
        # see is a contradiction, never containment.
        escape = judge_escape(observed, bool(seen), None, reasons)
        if not judged_keys:
            escape = "undecided"
            reasons.insert(
                0,
                f"{claims.phrase('protected')}, none of which this probe writes "
                f"({', '.join(PROTECTED_PATHS.values())})",
            )
        inside = attempts_by_role(report, "control")
        sibling = read_text(ctx.workspace / self.control_name(ctx)) or ""
        inside_ok = all_succeeded(inside, 1) and nonce in sibling
        return conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"sibling-file control failed: {attempts_summary(inside)}",
            host_control=control,
            host_failed="host control failed",
            witness={"planted": planted},
            controls={"inside": inside, "sibling_has_nonce": nonce in sibling, "host": control},
        )
