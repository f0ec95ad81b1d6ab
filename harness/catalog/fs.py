"""The write-outside probe, host side: canaries planted outside the workspace."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import sweep
from harness.trust import give
from harness.verdict import Assessment, Expectation

if TYPE_CHECKING:
    from harness.backends.base import DeclaredPolicy
from harness.catalog.base import (
    CellContext,
    WitnessRecordsLike,
    _all_succeeded,
    _attempts,
    _check,
    _conclude,
    _control,
    _control_nonce,
    _host_writes,
    _judge,
    _observed,
    _private_namespace,
    _Spec,
    _summary,
    home_of,
)
from harness.catalog.canary import dir_canary_diff, dir_canary_state, planting, read_text

CANARY_NAME = "canary.txt"
_BASELINE = "baseline.json"


class FsWriteOutside(_Spec):
    """Writes at host-planted canary dirs outside the workspace."""

    id = "fs_write_outside"
    area = "fs"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied when writes are confined to the workspace; seen on the open control leg."""
        return "denied" if policy.filesystem == "workspace" else "allowed"

    @staticmethod
    def canary_dirs(ctx: CellContext) -> dict[str, Path]:
        """The three canary dirs of a cell: sibling of the workspace, host temp, home."""
        tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())  # noqa: S108
        return {
            "sibling": ctx.cell_dir / "sibling",
            "tmp": tmp / f"sandbox-attest-canary-{ctx.nonce}",
            "home": home_of(ctx) / f".sandbox-attest-canary-{ctx.nonce}",
        }

    @staticmethod
    def control_name(ctx: CellContext) -> str:
        """The payload's control dir inside the workspace."""
        return f"fs-control-{ctx.nonce}"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant each canary dir with canary.txt and record its sha256 and mode."""
        baseline: dict[str, dict[str, Any]] = {}
        # Journalled before they exist: a killed run's canaries in /tmp and the home are
        # removed by the next run (harness/sweep.py); the sibling goes with the scratch.
        outside = [d for k, d in self.canary_dirs(ctx).items() if k != "sibling"]
        sweep.record(_journal_key(self.id, ctx), outside)
        for key, directory in self.canary_dirs(ctx).items():
            canary = directory / CANARY_NAME
            with planting(self.id, canary):
                directory.mkdir(mode=0o755, parents=False, exist_ok=False)
                canary.write_text(f"sandbox-attest canary {key} {ctx.nonce}\n")
                canary.chmod(0o644)
                # The payload user's own: unconfined it can write here, so a refusal inside a
                # sandbox is the sandbox's doing, not file permissions.
                give(directory, ctx.user, recursive=True)
            baseline[key] = dir_canary_state(canary)
        store = ctx.cell_dir / "canaries"
        store.mkdir(parents=True, exist_ok=True)
        (store / _BASELINE).write_text(_json_dumps(baseline))
        return {
            "dirs": {k: str(v) for k, v in self.canary_dirs(ctx).items()},
            "control_name": self.control_name(ctx),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host itself can write (and remove) a file in every canary dir."""
        nonce = _control_nonce()
        checks = [
            _host_writes(f"host writes {key}", directory, nonce)
            for key, directory in self.canary_dirs(ctx).items()
        ]
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A changed canary or a new file in a canary dir is an escape; workspace is checked."""
        del witness  # the filesystem is this probe's witness
        baseline = json.loads((ctx.cell_dir / "canaries" / _BASELINE).read_text())
        changed: dict[str, str] = {}
        state: dict[str, Any] = {}
        for key, directory in self.canary_dirs(ctx).items():
            now = dir_canary_state(directory / CANARY_NAME)
            state[key] = now
            diff = dir_canary_diff(baseline.get(key, {}), now)
            if diff:
                changed[key] = diff
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        reasons = []
        if changed:
            reasons.append(
                "host sees canary changes: " + "; ".join(f"{k}: {v}" for k, v in changed.items())
            )
        else:
            reasons.append("every canary's sha256 and mode unchanged, no nonce file on the host")
        landed = sorted(
            {str(a["what"]).split(":")[0] for a in escapes if a.get("outcome") == "succeeded"}
        )
        if landed:
            reasons.append(f"payload writes succeeded inside in {','.join(landed)}")
        refused = [a for a in escapes if a.get("outcome") == "refused"]
        if refused:
            errnos = sorted({str(a.get("errno")) for a in refused})
            reasons.append(f"{len(refused)} of {len(escapes)} writes refused ({','.join(errnos)})")
        escape = _judge(observed, bool(changed), _private_namespace(report, "mnt"), reasons)
        inside = _attempts(report, "control")
        workspace_checks = self._workspace_checks(ctx, inside)
        inside_ok = all(c["ok"] for c in workspace_checks)
        if inside_ok:
            reasons.append("the same writes in the workspace succeeded and are visible on the host")
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
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
        nonce = ctx.nonce
        directory = ctx.workspace / self.control_name(ctx)
        checks = [_check("payload workspace writes", _all_succeeded(inside, 5), _summary(inside))]
        created = directory / f"{nonce}.txt"
        checks.append(
            _check("host sees the created file", read_text(created) == f"{nonce}\n", str(created))
        )
        link = directory / f"{nonce}.link"
        checks.append(_check("host sees the symlink", link.is_symlink(), str(link)))
        canary = directory / CANARY_NAME
        checks.append(
            _check(
                "host sees the rename-over", read_text(canary) == f"renamed {nonce}\n", str(canary)
            )
        )
        return checks

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the /tmp and home canary dirs (the sibling goes with cell_dir)."""
        for key, directory in self.canary_dirs(ctx).items():
            if key != "sibling" and ctx.nonce in directory.name:
                shutil.rmtree(directory, ignore_errors=True)
        # Only once they are gone: a cleanup cut short leaves the entry for the next sweep.
        if not any(d.exists() for k, d in self.canary_dirs(ctx).items() if k != "sibling"):
            sweep.forget(_journal_key(self.id, ctx))


def _journal_key(probe: str, ctx: CellContext) -> str:
    """The journal entry of a cell's canaries outside the scratch (harness/sweep.py)."""
    return f"canary-{probe}-{ctx.nonce}"


def _json_dumps(data: object) -> str:
    return json.dumps(data, indent=1, sort_keys=True)
