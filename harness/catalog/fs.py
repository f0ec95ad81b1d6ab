"""The write-outside probe, host side: canaries planted outside the workspace."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.verdict import Assessment, Expectation

if TYPE_CHECKING:
    from harness.backends.base import DeclaredPolicy
from harness.catalog.base import (
    CellContext,
    WitnessRecordsLike,
    _attempts,
    _check,
    _control,
    _control_nonce,
    _host_writes,
    _judge,
    _observed,
    _private_namespace,
    _Spec,
    _summary,
)
from harness.catalog.canary import planting

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
            "home": Path.home() / f".sandbox-attest-canary-{ctx.nonce}",
        }

    @staticmethod
    def control_name(ctx: CellContext) -> str:
        """The payload's control dir inside the workspace."""
        return f"fs-control-{ctx.nonce}"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant each canary dir with canary.txt and record its sha256 and mode."""
        baseline: dict[str, dict[str, Any]] = {}
        for key, directory in self.canary_dirs(ctx).items():
            canary = directory / CANARY_NAME
            with planting(self.id, canary):
                directory.mkdir(mode=0o755, parents=False, exist_ok=False)
                canary.write_text(f"sandbox-attest canary {key} {ctx.nonce}\n")
                canary.chmod(0o644)
            baseline[key] = _canary_state(directory)
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
            now = _canary_state(directory)
            state[key] = now
            diff = _state_diff(baseline.get(key, {}), now)
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
        if not inside_ok:
            failed = [c["what"] for c in workspace_checks if not c["ok"]]
            reasons.append(f"workspace control failed: {', '.join(failed)}")
        else:
            reasons.append("the same writes in the workspace succeeded and are visible on the host")
        if not control.get("ok"):
            reasons.append("host control failed")
        return Assessment(
            escape=escape,
            controls_ok=inside_ok and bool(control.get("ok")),
            reasons=reasons,
            observed=observed,
            witness={"canaries": state, "baseline": baseline, "changed": changed},
            control={"inside": inside, "workspace": workspace_checks, "host": control},
        )

    def _workspace_checks(
        self, ctx: CellContext, inside: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        nonce = ctx.nonce
        directory = ctx.workspace / self.control_name(ctx)
        checks = [
            _check(
                "payload workspace writes",
                len(inside) == 5 and all(a.get("outcome") == "succeeded" for a in inside),
                _summary(inside),
            )
        ]
        created = directory / f"{nonce}.txt"
        checks.append(
            _check("host sees the created file", _read(created) == f"{nonce}\n", str(created))
        )
        link = directory / f"{nonce}.link"
        checks.append(_check("host sees the symlink", link.is_symlink(), str(link)))
        canary = directory / CANARY_NAME
        checks.append(
            _check("host sees the rename-over", _read(canary) == f"renamed {nonce}\n", str(canary))
        )
        return checks

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the /tmp and home canary dirs (the sibling goes with cell_dir)."""
        for key, directory in self.canary_dirs(ctx).items():
            if key != "sibling" and ctx.nonce in directory.name:
                shutil.rmtree(directory, ignore_errors=True)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _json_dumps(data: object) -> str:
    return json.dumps(data, indent=1, sort_keys=True)


def _canary_state(directory: Path) -> dict[str, Any]:
    """What the host sees of a canary dir: entries, and canary.txt's sha256 and mode."""
    try:
        entries = sorted(p.name for p in directory.iterdir())
    except OSError as exc:
        return {"error": repr(exc)}
    canary = directory / CANARY_NAME
    try:
        info = canary.lstat()
        digest = (
            hashlib.sha256(canary.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
        )
        mode = oct(stat.S_IMODE(info.st_mode))
        inode = info.st_ino
    except OSError:
        digest, mode, inode = None, None, None
    return {"entries": entries, "sha256": digest, "mode": mode, "inode": inode}


def _state_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A short phrase naming what changed between two canary states, or "" (details: witness)."""
    changes = [key for key in ("sha256", "mode", "inode") if before.get(key) != after.get(key)]
    phrase = [f"{','.join(changes)} changed"] if changes else []
    old, now = set(before.get("entries", [])), set(after.get("entries", []))
    if now - old:
        phrase.append(f"new {','.join(sorted(now - old))}")
    if old - now:
        phrase.append(f"gone {','.join(sorted(old - now))}")
    if "error" in after:
        phrase.append(f"dir unreadable: {after['error']}")
    return ", ".join(phrase)
