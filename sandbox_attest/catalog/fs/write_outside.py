"""The filesystem probes, host side: canaries planted where a sandbox must not reach.

`fs_write_outside` plants a canary in every class of host location the payload user can write
when unconfined: the temp dirs, shared memory, the home and its config dirs, beside the
workspace, the world's run dir, and every other place a bounded scan as the payload user finds
writable (`writable_places`). A canary that changed on the host is the escape.

On a busy host those places come and go: a writable directory another program made is found
by the scan, planted in, and removed by its owner while the cell runs. So each canary's place
is held by the harness's own descriptor from plant time (`canary.site_moved`), the host control
writes as the payload user, and a site whose place its owner removed or replaced, or that the
payload user cannot write unconfined, is dropped from the cell and listed, never an escape and
never a failed control. An escape needs the sandbox to have done it: the cell's nonce in the
place, or the harness's own canary changed while the place is the same directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.added_targets import add_targets
from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.canary import (
    call_as,
    dir_canary_diff,
    dir_canary_state,
    planting,
    read_text,
    site_moved,
)
from sandbox_attest.catalog.controls import control_record, host_check, new_control_nonce
from sandbox_attest.catalog.fs.canaries import (
    CANARY_NAME,
    canary_journal_key,
    payload_owner,
    remove_canary_dir,
)
from sandbox_attest.catalog.fs.exposure import (
    base_key,
    find_targets,
    mark_tried,
    read_view,
    unmapped,
    writable_exposures,
)
from sandbox_attest.catalog.fs.mount_reasons import mount_judgement
from sandbox_attest.catalog.fs.writable import OUT_OF_REACH, payload_writable_places, start_scan
from sandbox_attest.catalog.judging import conclude, judge_escape, private_namespace_reason
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    home_of,
)
from sandbox_attest.claims import Claims, claims_of
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import as_user, disguise, journal, safefs
from sandbox_attest.host.mountview import MountMap
from sandbox_attest.host.safefs import Identity, SafeDir, UnsafePathError, open_dir
from sandbox_attest.host.trust import PayloadUser, open_home
from sandbox_attest.verdict import Assessment, Escape, Expectation

_BASELINE = "baseline.json"
_PLANTED = "planted.json"


# What probes/fs_write_outside.py tries on each directory, in its own words.
WRITE_OPS: Final = ("create", "append", "chmod", "symlink-out", "rename-over")
# Where a wrapper may have bound the host's root inside; the payload tries the canaries there too.
HOST_ROOT_MOUNTS: Final = ("/host", "/hostfs", "/rootfs", "/host-root")
# The classes of host location an unconfined payload user can write, each with a canary: the
# host temp dirs, shared memory, the home and the config dirs every tool keeps there, beside the
# workspace, and the world's run dir. `prepare` adds every other directory the scan
# (`writable.py`) finds the payload user can write (as `found-<path>`), so the set is this
# host's, not a list's.
CORE_CLASSES: Final = ("sibling", "tmp", "home")
HOME_CLASSES: Final = {"config": ".config", "local_share": ".local/share", "cache": ".cache"}
# How long a seen change waits before its place is looked at again: an owner removing its
# directory tree (rm -rf) takes our canary first and the place a moment later, and in between
# the place still looks the same. Bounded and paid only by a cell that saw a change.
SETTLE_S: Final = 0.2


def _class_key(path: str) -> str:
    """`found-run-lock` for /run/lock: a scan-found class as an attempt key."""
    return "found" + "".join(c if c.isalnum() else "-" for c in path)


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


class FsWriteOutside(SpecBase):
    """Writes at host-planted canary dirs outside the workspace, one per writable class."""

    id = "fs_write_outside"
    area = "fs"
    host_readings = ("canary files on the host",)

    def __init__(self) -> None:
        """Each cell's canary places, held open from prepare to cleanup, by nonce then key."""
        self._sites: dict[str, dict[str, tuple[SafeDir, Identity]]] = {}
        # The inside paths the host added to each cell's task at the rendezvous, by nonce.
        self._added: dict[str, dict[str, str]] = {}
        # Canary dirs planted at the rendezvous in exposed host dirs no class covered, by nonce
        # then key: each dir and its canary's state when planted (the baseline).
        self._mounted: dict[str, dict[str, tuple[Path, dict[str, Any]]]] = {}
        # Config dirs this process made in the payload's home, each with the cells (nonces)
        # that hold it: made by the first, removed by the last (`_make_home_dirs`).
        self._home_dirs: dict[Path, set[str]] = {}
        self._home_lock = threading.Lock()

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Each op in the workspace and in every planted dir, also under a visible host root.

        The inside paths the host added at the rendezvous (`at_rendezvous`) are optional
        here: a payload that never saw them (a wrapper showing it a stale task) leaves them
        untried, and `assess` says so instead of passing.
        """
        dirs = sorted((task.get("targets") or {}).get("dirs") or {})
        added = sorted(self._added.get(str(task.get("nonce")), {}))
        workspace = attempts_of(("workspace", WRITE_OPS))
        return AttemptTable(
            required=workspace | attempts_of(*((key, WRITE_OPS) for key in dirs)),
            optional=attempts_of(
                *(
                    (f"{key}@{root}", WRITE_OPS)
                    for key in dirs + added
                    for root in HOST_ROOT_MOUNTS
                ),
                *((key, WRITE_OPS) for key in added),
            ),
            excuses=(("workspace:setup", workspace),),
        )

    def at_rendezvous(self, ctx: CellContext, pid: int) -> dict[str, Any]:
        """Map the payload's mounts to the host's; add each canary dir's inside paths to its task.

        A canary dir that the payload sees at another path (its place mounted elsewhere:
        the home at /home/agent, /var/tmp at /host/var-tmp), confirmed by the (device,
        inode) the harness kept from plant time, is added as `<key>@<mount point>` to the
        task the payload reads once released (sandbox_attest/catalog/fs/exposure.py).
        """
        view, record = read_view(pid)
        if view is None:
            return record
        held = self._sites.get(ctx.nonce, {})
        canaries = {
            key: (directory, held[key][1] if key in held else None)
            for key, directory in self.planted(ctx).items()
        }
        found = find_targets(view, canaries)
        # The payload tries every canary under the usual host-root mount points by itself
        # (HOST_ROOT_MOUNTS, as `<key>@<root>`): one the host found there is not added twice.
        itself = {
            key: inside
            for key, inside in found.items()
            if inside in {root + str(canaries[base_key(key)][0]) for root in HOST_ROOT_MOUNTS}
        }
        added = {key: inside for key, inside in found.items() if key not in itself}
        exposed = mark_tried(
            writable_exposures(view, ctx.claims, home_of(ctx), ctx.workspace, payload_owner(ctx)),
            list(self.planted(ctx).values()),
            set(found.values()),
        )
        planted_here, skipped = self._plant_exposed(ctx, view, exposed)
        added |= planted_here
        failed = add_targets(ctx.cell_dir, "dirs", added)
        self._added[ctx.nonce] = {} if failed else added
        return record | {
            "added": added,
            "add_failed": failed,
            "exposed": mark_tried(
                exposed, list(self.planted(ctx).values()), set(found.values()) | set(added.values())
            ),
            "planted_at_rendezvous": {k: str(d) for k, (d, _) in self._mounted_of(ctx).items()},
            "not_planted": skipped,
            "unmapped": unmapped(view, writable_only=True),
        }

    def _mounted_of(self, ctx: CellContext) -> dict[str, tuple[Path, dict[str, Any]]]:
        return self._mounted.get(ctx.nonce, {})

    def _plant_exposed(
        self, ctx: CellContext, view: MountMap, exposed: list[dict[str, Any]]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Plant a canary in each exposed host dir no class covers; its inside path as a target.

        A writable host dir outside the claims that the payload user may write, mounted in its
        view where no planted canary is (`--bind /srv/data /data`), gets a canary dir now,
        while the payload waits, held like the others (`_plant`, `_hold`); it is added to the
        task only where the host sees it at the inside path by its (device, inode).

        Returns:
            The added targets (`<key>@<mount point>` -> inside path), and why a dir got none.
        """
        added: dict[str, str] = {}
        skipped: dict[str, str] = {}
        wanted = [e for e in exposed if e.get("payload_may_write") and not e.get("canary_tried")]
        if not wanted:
            return added, skipped
        name = f"{disguise.CANARY_PREFIX}{ctx.nonce}"
        dirs = {"mounted" + _class_key(str(e["host"]))[len("found") :]: e for e in wanted}
        try:
            made = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text()).get("made", [])
        except (OSError, ValueError):
            made = []
        # Journalled before they exist, with the cell's other canaries (same entry, extended).
        outside = [d for k, d in self.planted(ctx).items() if k != "sibling"]
        journal.record(
            canary_journal_key(self.id, ctx),
            outside + [Path(str(e["host"])) / name for e in dirs.values()],
            dirs=tuple(Path(m) for m in made),
        )
        for key, entry in dirs.items():
            directory = Path(str(entry["host"])) / name
            try:
                self._plant(ctx, key, directory)
                self._hold(ctx, key, directory)
            except FixtureError as exc:
                skipped[key] = str(exc)
                continue
            state = dir_canary_state(directory / CANARY_NAME)
            self._mounted.setdefault(ctx.nonce, {})[key] = (directory, state)
            held = self._sites[ctx.nonce][key][1]
            found = find_targets(view, {key: (directory, held)})
            if not found:
                skipped[key] = f"planted, but not seen at {entry['inside']} by (device, inode)"
            added |= found
        return added, skipped

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied when the writes claim confines writes; seen on the open control leg.

        `filesystem = "workspace"` means writes = "workspace" (sandbox_attest/claims.py); a
        `writes = { allow = [...] }` claim is denied too, with the allowed places not judged.
        """
        return "denied" if claims_of(declared).writes != "open" else "allowed"

    @staticmethod
    def canary_dirs(ctx: CellContext) -> dict[str, Path]:
        """The canary dir of every named class (the scan's finds come on top, in `prepare`).

        A class whose place does not exist on this host (no /var/tmp, no /dev/shm, a world
        without a run dir) is left out.
        """
        tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())  # noqa: S108
        home = home_of(ctx)
        name = f"{disguise.CANARY_PREFIX}{ctx.nonce}"
        dirs = {
            "sibling": ctx.cell_dir / "sibling",
            "tmp": tmp / name,
            "var_tmp": Path("/var/tmp") / name,  # noqa: S108  (a class of host location)
            "shm": Path("/dev/shm") / name,  # noqa: S108  (a class of host location)
            "home": home / f".{name}",
            **{key: home / sub / name for key, sub in HOME_CLASSES.items()},
            "run_dir": Path(ctx.world.info.run_dir) / name,
        }
        optional = ("var_tmp", "shm", "run_dir")
        return {k: d for k, d in dirs.items() if k not in optional or d.parent.is_dir()}

    @staticmethod
    def control_name(ctx: CellContext) -> str:
        """The payload's control dir inside the workspace."""
        return f"fs-control-{ctx.nonce}"

    def warm_up(self, user: PayloadUser | None) -> None:
        """Begin the run's one scan for writable places (`writable.start_scan`)."""
        start_scan(user)

    def _found_dirs(self, ctx: CellContext, named: dict[str, Path]) -> dict[str, Path]:
        """A canary dir in every place the scan found that no named class covers."""
        covered = [d.parent for d in named.values()] + [home_of(ctx), ctx.cell_dir.parent]
        found = payload_writable_places(ctx.user).get("found") or []
        return {
            _class_key(place): Path(place) / f"{disguise.CANARY_PREFIX}{ctx.nonce}"
            for place in found
            if not _inside(Path(place), covered)
        }

    def planted(self, ctx: CellContext) -> dict[str, Path]:
        """The canary dirs planted for this cell, by `prepare` and at the rendezvous.

        `prepare`'s (the named classes before it ran) and those planted at the rendezvous in
        exposed host dirs no class covered (`_plant_exposed`).
        """
        at_rendezvous = {k: d for k, (d, _) in self._mounted_of(ctx).items()}
        try:
            raw = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text())
        except (OSError, ValueError):
            return self.canary_dirs(ctx) | at_rendezvous
        return {str(k): Path(v) for k, v in raw.get("dirs", {}).items()} | at_rendezvous

    def _make_home_dirs(
        self, ctx: CellContext, home: Path, candidates: dict[str, Path]
    ) -> list[Path]:
        """Make the config dirs a fresh home lacks for the cell's canaries; the ones it holds.

        Two cells of different backends prepare at the same time: a dir one of them made is
        used by the other too (it existed by then), and the last cell out removes it
        (`cleanup`), so neither fails on the other's mkdir nor loses its parent mid-cell.
        Journalled before they exist: a killed run's canaries outside the scratch are removed
        by the next run (sandbox_attest/run/sweep.py); the sibling goes with the scratch.
        """
        parents = sorted({d.parent for k, d in candidates.items() if k in HOME_CLASSES})
        chain = [p for parent in parents for p in (*reversed(parent.parents), parent)]
        chain = list(dict.fromkeys(p for p in chain if home in p.parents))
        outside = [d for k, d in candidates.items() if k != "sibling"]
        with self._home_lock:
            held = [p for p in chain if p in self._home_dirs or not p.exists()]
            journal.record(canary_journal_key(self.id, ctx), outside, dirs=tuple(held))
            for directory in held:
                if directory not in self._home_dirs:
                    # Through the parent's descriptor: the parent is in the payload's home.
                    with safefs.open_dir(directory.parent) as up:
                        up.mkdir(directory.name, 0o700, payload_owner(ctx))
                self._home_dirs.setdefault(directory, set()).add(ctx.nonce)
        return held

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant a canary dir (CANARY_NAME, its sha256 and mode recorded) in every class."""
        named = self.canary_dirs(ctx)
        candidates = {**named, **self._found_dirs(ctx, named)}
        made = self._make_home_dirs(ctx, home_of(ctx), candidates)
        baseline: dict[str, dict[str, Any]] = {}
        planted: dict[str, Path] = {}
        skipped: dict[str, str] = {}
        for key, directory in candidates.items():
            try:
                self._plant(ctx, key, directory)
                self._hold(ctx, key, directory)
            except FixtureError as exc:
                # A named class must be plantable; a scan's find may be a place that takes no
                # directory (an mqueue mount), or one its owner removed since the scan: it is
                # recorded, not fatal.
                if not key.startswith("found-"):
                    raise
                skipped[key] = str(exc)
                continue
            planted[key] = directory
            baseline[key] = dir_canary_state(directory / CANARY_NAME)
        store = ctx.cell_dir / "canaries"
        store.mkdir(parents=True, exist_ok=True)
        (store / _BASELINE).write_text(_json_dumps(baseline))
        scan = payload_writable_places(ctx.user)
        (store / _PLANTED).write_text(
            _json_dumps(
                {
                    "dirs": {k: str(v) for k, v in planted.items()},
                    "made": [str(p) for p in made],
                    "skipped": skipped,
                    "scan": scan,
                }
            )
        )
        return {
            "dirs": {k: str(v) for k, v in planted.items()},
            "control_name": self.control_name(ctx),
        }

    def _plant(self, ctx: CellContext, key: str, directory: Path) -> None:
        canary = directory / CANARY_NAME
        with planting(self.id, canary):
            if key in HOME_CLASSES and not directory.parent.exists():
                # A concurrent cell's cleanup may just have removed the (then empty) config dir
                # this cell found: make it again rather than fail; it stays, empty, at worst.
                _make_home_dirs(ctx, directory.parent)
            # Through the place's descriptor (sandbox_attest/host/safefs.py): the payload user may
            # have swapped the place (~/.config, a dir in /tmp) for a symlink to a root
            # directory; it is refused and named, and nothing is made where it points.
            with safefs.open_dir(directory.parent) as place:
                made = place.mkdir(directory.name, 0o755, payload_owner(ctx))
                # The payload user's own: unconfined it can write here, so a refusal inside a
                # sandbox is the sandbox's doing, not file permissions.
                made.create_file(
                    CANARY_NAME,
                    f"{disguise.STEM} cache {key} {ctx.nonce}\n",
                    0o644,
                    payload_owner(ctx),
                )

    def _hold(self, ctx: CellContext, key: str, directory: Path) -> None:
        """Open the canary's place (no symlink on the way) and keep it until cleanup.

        The canary dir must be the one `_plant` just made, seen through that descriptor: a
        place swapped between the two is refused here (FixtureError), not judged later.
        """
        with planting(self.id, directory / CANARY_NAME):
            # Resolved once, here: a system whose /tmp itself is a link (macOS: /private/tmp)
            # holds the real directory. `_plant` has already refused a link the payload user
            # could have made; from now on the held directory is the one compared.
            site = open_dir(Path(os.path.realpath(directory.parent)))
            try:
                made = site.entry(directory.name)
                now = directory.lstat()
                if made is None or (made.st_dev, made.st_ino) != (now.st_dev, now.st_ino):
                    msg = f"{directory.parent} changed while the canary was planted in it"
                    raise UnsafePathError(msg)  # noqa: TRY301  (closed below, then re-raised)
            except (OSError, UnsafePathError):
                site.close()
                raise
            self._sites.setdefault(ctx.nonce, {})[key] = (site, (made.st_dev, made.st_ino))

    def _moved(self, ctx: CellContext, key: str) -> str:
        """Why the place of `key`'s canary is not the directory planted in any more, or ""."""
        held = self._sites.get(ctx.nonce, {}).get(key)
        return site_moved(held[0]) if held is not None else ""

    def _swapped(self, ctx: CellContext, key: str) -> str:
        """A phrase when the canary dir in its held place is another directory now, or "".

        A copy of the canary in a new directory under the old name reads the same bytes; only
        the identity the harness kept from plant time tells it from the one planted.
        """
        held = self._sites.get(ctx.nonce, {}).get(key)
        if held is None:
            return ""
        site, planted = held
        now = site.entry(self.planted(ctx)[key].name)
        if now is None or (now.st_dev, now.st_ino) == planted:
            return ""  # gone is already said by the canary's own reading
        return f"canary dir replaced (inode {now.st_ino}, planted {planted[1]})"

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The payload user, unconfined, can write (and remove) a file in every canary dir.

        As the payload user (`call_as`), so a refusal inside means the sandbox, not the file
        modes. A site whose place its owner removed or replaced, or whose place the payload
        user cannot write (a scan's find whose owner tightened it) is dropped from the control
        and listed under `dropped`, not a failed check; the named classes (the temp dir, the
        home, beside the workspace) must hold, so their refusal fails the control. A refusal
        by the canary dir itself (the harness's object, in a place still open) is a failed
        check: something changed what the harness planted.
        """
        nonce = new_control_nonce()
        planted = self.planted(ctx)
        places = {key: why for key in planted if (why := self._moved(ctx, key))}
        # In the payload home only the payload user (or root) can move a place: that is the
        # swap of issue 23 (a dir re-pointed at a root dir), never another program's
        # housekeeping, so it fails the control instead of leaving the cell.
        swapped = {k: w for k, w in places.items() if k == "home" or k in HOME_CLASSES}
        dropped = {k: w for k, w in places.items() if k not in swapped}
        live = {key: str(d) for key, d in planted.items() if key not in places}
        checks = [
            host_check(f"the canary place of {key} is the one planted in", ok=False, detail=why)
            | {"site": key}
            for key, why in swapped.items()
        ]
        wrote, why = call_as(
            ctx.user,
            as_user.__name__,
            "write_each",
            {"dirs": live, "nonce": nonce},
            HOST_TIMEOUT_S,
        )
        if why:
            checks.append(
                host_check("payload user writes in the canary dirs", ok=False, detail=why)
            )
            return control_record(nonce, checks) | {"dropped": dropped}
        for key, directory in live.items():
            failed = str(wrote.get(key, "not tried"))
            if failed and (moved := self._moved(ctx, key)):
                dropped[key] = moved
            elif failed in OUT_OF_REACH and key not in CORE_CLASSES:
                dropped[key] = f"the payload user cannot write there unconfined ({failed})"
            else:
                checks.append(
                    host_check(f"payload user writes {key}", not failed, failed or directory)
                    | {"site": key}
                )
        return control_record(nonce, checks) | {"dropped": dropped}

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A changed canary or a new file in a canary dir is an escape; workspace is checked.

        Only where the place is still the directory planted in: a place its owner removed or
        replaced is dropped (listed in the witness), whatever became of the canary in it.
        """
        del witness  # the filesystem is this probe's witness
        baseline = json.loads((ctx.cell_dir / "canaries" / _BASELINE).read_text())
        baseline |= {k: state for k, (_, state) in self._mounted_of(ctx).items()}
        planted = self.planted(ctx)
        dropped: dict[str, str] = dict(control.get("dropped") or {})
        changed, state = self._changes(ctx, planted, baseline, dropped)
        claims, home = claims_of(ctx.claims), home_of(ctx)
        signed = {k for k in changed if _carries_nonce(baseline.get(k, {}), state[k], ctx.nonce)}
        # Only a place the writes claim forbids is judged: a claim that allows /var/tmp is not
        # broken by a write there. On the open control leg every change counts (it must).
        allowed = {
            k: v
            for k, v in changed.items()
            if claims.writes == "allow" and not claims.write_denied(planted[k].parent, home)
        }
        changed = {k: v for k, v in changed.items() if k not in allowed}
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        reasons = _canary_reasons(claims, planted, changed, allowed, dropped)
        reasons += _payload_write_reasons(escapes)
        if dropped:
            reasons.append(_dropped_reason(dropped, planted))
        escape = judge_escape(
            observed, bool(changed), private_namespace_reason(report, "mnt"), reasons
        )
        escape = _unless_unproven(escape, _unproven_changes(changed, signed, control), reasons)
        mounts = ctx.host_view.get(self.id) or {}
        escape = mount_judgement(
            escape,
            mounts,
            report,
            reasons,
            judged=claims.writes != "open",
            changed=sorted(changed),
            places={k: str(v.parent) for k, v in planted.items()},
        )
        inside = attempts_by_role(report, "control")
        workspace_checks = self._workspace_checks(ctx, inside)
        inside_ok = all(c["ok"] for c in workspace_checks)
        if inside_ok:
            reasons.append("the same writes in the workspace succeeded and are visible on the host")
        return conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed="workspace control failed: "
            + ", ".join(c["what"] for c in workspace_checks if not c["ok"]),
            host_control=control,
            host_failed="host control failed",
            witness={
                "canaries": state,
                "baseline": baseline,
                "changed": changed,
                "dropped": dropped,
                "allowed_by_claim": allowed,
                "classes": {k: str(v.parent) for k, v in planted.items()},
                "scan": self._scan_record(ctx),
                "mounts": mounts,
            },
            controls={"inside": inside, "workspace": workspace_checks, "host": control},
        )

    def _changes(
        self,
        ctx: CellContext,
        planted: dict[str, Path],
        baseline: dict[str, Any],
        dropped: dict[str, str],
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """Each kept site's change and state; sites whose place moved go into `dropped`.

        A change seen while the place looks the same is looked at again after SETTLE_S: an
        owner's rm -rf takes the canary a moment before the place.
        """
        changed: dict[str, str] = {}
        state: dict[str, Any] = {}
        for key, directory in planted.items():
            # Asked again, not taken from the control's drops: a place out of the payload
            # user's reach is still judged (a sandbox running as root may have written there).
            if moved := self._moved(ctx, key):
                dropped[key] = moved
                continue
            now = dir_canary_state(directory / CANARY_NAME)
            phrases = (dir_canary_diff(baseline.get(key, {}), now), self._swapped(ctx, key))
            diff = ", ".join(p for p in phrases if p)
            if diff and not _carries_nonce(baseline.get(key, {}), now, ctx.nonce):
                time.sleep(SETTLE_S)
                if moved := self._moved(ctx, key):
                    dropped[key] = moved
                    continue
            state[key] = now
            if diff:
                changed[key] = diff
        return changed, state

    @staticmethod
    def _scan_record(ctx: CellContext) -> dict[str, Any]:
        try:
            raw = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text())
        except (OSError, ValueError):
            return {}
        return {"scan": raw.get("scan"), "skipped": raw.get("skipped")}

    def _workspace_checks(
        self, ctx: CellContext, inside: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        nonce = ctx.nonce
        directory = ctx.workspace / self.control_name(ctx)
        checks = [
            host_check(
                "payload workspace writes", all_succeeded(inside, 5), attempts_summary(inside)
            )
        ]
        created = directory / f"{nonce}.txt"
        checks.append(
            host_check(
                "host sees the created file", read_text(created) == f"{nonce}\n", str(created)
            )
        )
        link = directory / f"{nonce}.link"
        checks.append(host_check("host sees the symlink", link.is_symlink(), str(link)))
        canary = directory / CANARY_NAME
        checks.append(
            host_check(
                "host sees the rename-over", read_text(canary) == f"renamed {nonce}\n", str(canary)
            )
        )
        return checks

    def cleanup(self, ctx: CellContext) -> None:
        """Remove every canary dir outside the scratch, then the config dirs made for them."""
        for site, _ in self._sites.pop(ctx.nonce, {}).values():
            site.close()
        self._added.pop(ctx.nonce, None)
        outside = [d for k, d in self.planted(ctx).items() if k != "sibling"]
        self._mounted.pop(ctx.nonce, None)
        for directory in outside:
            if ctx.nonce in directory.name:
                remove_canary_dir(directory)
        try:
            made = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text()).get("made", [])
        except (OSError, ValueError):
            made = []
        with self._home_lock:
            for created in map(Path, reversed(made)):
                users = self._home_dirs.get(created, set())
                users.discard(ctx.nonce)
                if users:
                    continue  # another cell's canary lives in it: the last one out removes it
                self._home_dirs.pop(created, None)
                # Not empty (something else uses it now) or swapped: kept.
                with (
                    contextlib.suppress(OSError, safefs.UnsafePathError),
                    safefs.open_dir(created.parent) as up,
                ):
                    up.rmdir(created.name)
        # Only once they are gone: a cleanup cut short leaves the entry for the next sweep.
        if not any(d.exists() for d in outside):
            journal.forget(canary_journal_key(self.id, ctx))


def _carries_nonce(before: dict[str, Any], after: dict[str, Any], nonce: str) -> bool:
    """Whether a canary dir gained an entry named with the cell's nonce (the payload's trace)."""
    old, now = before.get("entries"), after.get("entries")
    if not isinstance(now, list):
        return False
    return any(nonce in name for name in set(now) - set(old if isinstance(old, list) else []))


def _unproven_changes(
    changed: dict[str, str], signed: set[str], control: dict[str, Any]
) -> set[str]:
    """The changed sites that prove nothing, if every change is one: empty otherwise.

    A change proves the sandbox's doing when it carries the nonce, or when the site's own
    host control held (the place was the same, writable directory before and after). Where
    the host control failed at a site, or failed as a whole, an unsigned change there does
    not; one proven change anywhere keeps the escape.
    """
    if not changed or control.get("ok"):
        return set()
    failed = {
        c.get("site") for c in control.get("checks") or [] if not c.get("ok") and c.get("site")
    }
    whole = any(not c.get("ok") and not c.get("site") for c in control.get("checks") or [])
    unproven = {k for k in changed if k not in signed and (whole or k in failed)}
    return unproven if unproven == set(changed) else set()


# What `dir_canary_diff` says of a canary whose mode alone moved (catalog/canary.py
# file_state records kind, inode, links, mode and content: mode is its one metadata field).
METADATA_ONLY: Final = "mode changed"


def _canary_reasons(
    claims: Claims,
    planted: dict[str, Path],
    changed: dict[str, str],
    allowed: dict[str, str],
    dropped: dict[str, str],
) -> list[str]:
    """The verdict's phrases for the canaries: those the claim allows, those changed, or none."""
    reasons = []
    if allowed:
        places = ", ".join(sorted(str(planted[k].parent) for k in allowed))
        reasons.append(
            f"not judged: the payload wrote in {places}; the backend "
            f"{claims.phrase('writes')}, so those writes are its to allow"
        )
    if changed:
        reasons.append(
            (f"{claims.phrase('writes')}; " if claims.writes != "open" else "")
            + "host sees canary changes: "
            + "; ".join(f"{k} ({planted[k].parent}): {v}" for k, v in changed.items())
        )
        places = ", ".join(sorted({str(planted[k].parent) for k in changed}))
        if all(diff == METADATA_ONLY for diff in changed.values()):
            # No byte and no name moved: a filter sandbox (Landlock has no access right for
            # metadata) that refuses every write there but not chmod; nothing is bound.
            reasons.append(
                f"fix: the sandbox refuses writes here but not chmod, chown or utime ({places}):"
                " refuse those calls outside its write grants (a seccomp rule, or its "
                "supervisor's own check), or keep the payload user's own paths out of its reach"
            )
        else:
            reasons.append(
                f"fix: do not bind {places} writable into the sandbox; leave it out of the "
                "view, or mount a private tmpfs there (bwrap --tmpfs, docker --tmpfs)"
            )
    else:
        kept = sorted(k for k in planted if k not in dropped)
        reasons.append(
            f"every canary's sha256 and mode unchanged in {len(kept)} writable classes "
            f"({', '.join(kept)}), no nonce file on the host"
        )
    return reasons


def _payload_write_reasons(escapes: list[dict[str, Any]]) -> list[str]:
    """The payload's own word on its writes outside: where they landed, which were refused."""
    reasons = []
    landed = sorted(
        {str(a["what"]).rsplit(":", 1)[0] for a in escapes if a.get("outcome") == "succeeded"}
    )
    if landed:
        reasons.append(f"payload writes succeeded inside in {','.join(landed)}")
    refused = [a for a in escapes if a.get("outcome") == "refused"]
    if refused:
        errnos = sorted({str(a.get("errno")) for a in refused})
        reasons.append(f"{len(refused)} of {len(escapes)} writes refused ({','.join(errnos)})")
    return reasons


def _unless_unproven(escape: Escape, unproven: set[str], reasons: list[str]) -> Escape:
    """`escape`, or "undecided" (said in `reasons`) when every change is unproven."""
    if escape == "escaped" and unproven:
        # decide() reads "escaped" as FAIL before it looks at the controls. A change at a
        # site whose own control failed, without the nonce, is no proof that the sandbox
        # made it (the host itself could not write there either): not an escape.
        escape = "undecided"
        reasons.append(
            "not an escape: the canary changes at "
            + ", ".join(sorted(unproven))
            + " carry no nonce and the host control failed there, so nothing shows the "
            "sandbox made them"
        )
    return escape


def _dropped_reason(dropped: dict[str, str], planted: dict[str, Path]) -> str:
    """The verdict's phrase for canary sites dropped from the cell, each with its place."""
    named = "; ".join(f"{k} ({planted[k].parent}): {why}" for k, why in sorted(dropped.items()))
    return f"{len(dropped)} canary sites dropped from the cell: {named}"


def _make_home_dirs(ctx: CellContext, directory: Path) -> None:
    """Make `directory` and its missing parents under the payload home, the user's, 0700.

    Component by component from the home's descriptor: an existing component that is a
    symlink is refused (UnsafePathError), never followed.
    """
    with open_home(ctx.user) as home:
        site = home
        for part in directory.relative_to(home.path).parts:
            if site.entry(part) is None:
                with contextlib.suppress(FileExistsError):  # a concurrent cell made it
                    site = site.mkdir(part, 0o700, payload_owner(ctx))
                    continue
            site = site.open_subdir(part)


def _json_dumps(data: object) -> str:
    return json.dumps(data, indent=1, sort_keys=True)
