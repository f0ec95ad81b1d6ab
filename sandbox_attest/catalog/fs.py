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

import collections
import contextlib
import errno
import functools
import hashlib
import json
import os
import secrets
import stat
import tempfile
import time
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
from sandbox_attest.catalog.canary import (
    call_as,
    dir_canary_diff,
    dir_canary_state,
    planting,
    read_text,
    site_moved,
)
from sandbox_attest.catalog.controls import (
    control_record,
    host_check,
    host_writes_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.judging import conclude, judge_escape, private_namespace_reason
from sandbox_attest.catalog.spec import (
    HOST_TIMEOUT_S,
    AttemptTable,
    CellContext,
    PolicyLike,
    SpecBase,
    WitnessRecordsLike,
    home_of,
    host_processes,
)
from sandbox_attest.claims import Claims, claims_of, unclaimed
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise, safefs
from sandbox_attest.host.safefs import Identity, SafeDir, UnsafePathError, open_dir
from sandbox_attest.host.trust import PayloadUser, measure_as, open_home
from sandbox_attest.run import sweep
from sandbox_attest.verdict import Assessment, Expectation

CANARY_NAME = disguise.CANARY_FILE
_BASELINE = "baseline.json"
_PLANTED = "planted.json"
# How often a canary is planted again when a concurrent cell removed its (empty) dir meanwhile.
_PLANT_TRIES: Final = 3


# What probes/fs_write_outside.py tries on each directory, in its own words.
WRITE_OPS: Final = ("create", "append", "chmod", "symlink-out", "rename-over")
# Where a wrapper may have bound the host's root inside; the payload tries the canaries there too.
HOST_ROOT_MOUNTS: Final = ("/host", "/hostfs", "/rootfs", "/host-root")
# The classes of host location an unconfined payload user can write, each with a canary: the
# host temp dirs, shared memory, the home and the config dirs every tool keeps there, beside the
# workspace, and the world's run dir. `prepare` adds every other directory the scan below finds
# the payload user can write (as `found-<path>`), so the set is this host's, not a list's.
CORE_CLASSES: Final = ("sibling", "tmp", "home")
HOME_CLASSES: Final = {"config": ".config", "local_share": ".local/share", "cache": ".cache"}
# The scan: breadth first from /, as the payload user, for the topmost directories it may
# write (a writable directory's subtree is the same class). Bounded in time and size, and run
# once per harness process: which places are writable does not change between cells.
SCAN_BUDGET_S: Final = 10.0
SCAN_MAX_DIRS: Final = 200_000
SCAN_PRUNE: Final = ("/proc", "/sys")
# How long a seen change waits before its place is looked at again: an owner removing its
# directory tree (rm -rf) takes our canary first and the place a moment later, and in between
# the place still looks the same. Bounded and paid only by a cell that saw a change.
SETTLE_S: Final = 0.2
# A place the payload user's own permissions close to it: out of its reach unconfined.
_OUT_OF_REACH: Final = frozenset({"place:EACCES", "place:EPERM", "place:EROFS"})


def write_each(request: dict[str, Any]) -> dict[str, str]:
    """Run as the payload user: create, read back and remove a nonce file in each directory.

    `request` is `{"dirs": {key: path}, "nonce": str}`. Never follows a symlink at the name.

    Returns:
        {key: ""} where it worked, else {key: the errno name (or what went wrong)}.
    """
    nonce = str(request["nonce"])
    name = f"host-control-{nonce}.txt"
    result: dict[str, str] = {}
    for key, directory in dict(request["dirs"]).items():
        path = Path(directory) / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(nonce)
            same = path.read_text() == nonce
            path.unlink()
            result[key] = "" if same else "read back other bytes"
        except OSError as exc:
            failed = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            # Whose refusal: the place's (its owner closed it to this user: "place:EACCES")
            # or the canary dir's, which is the harness's planted object in a place still open.
            place = Path(directory).parent
            result[key] = failed if os.access(place, os.W_OK | os.X_OK) else f"place:{failed}"
    return result


def writable_places(
    root: str = "/", budget_s: float = SCAN_BUDGET_S, max_dirs: int = SCAN_MAX_DIRS
) -> dict[str, Any]:
    """The topmost directories under `root` that THIS process may create entries in.

    `os.access` with the real uid, so run it as the payload user (`payload_writable_places`).
    Symlinks are not followed; /proc and /sys are not walked.

    Returns:
        `{"found": [...], "complete": bool, "visited": n, "elapsed_s": s}`; `complete` is
        False when the budget ran out first (the found list is then a lower bound).
    """
    start = time.monotonic()
    found: list[str] = []
    queue: collections.deque[str] = collections.deque([root])
    visited = 0
    while queue and time.monotonic() - start < budget_s and visited < max_dirs:
        directory = queue.popleft()
        visited += 1
        if directory in SCAN_PRUNE:
            continue
        if os.access(directory, os.W_OK | os.X_OK):
            found.append(directory)
            continue
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        queue.append(entry.path)
    return {
        "found": sorted(found),
        "complete": not queue,
        "visited": visited,
        "elapsed_s": round(time.monotonic() - start, 2),
    }


@functools.cache
def _scan_as(user: PayloadUser | None) -> dict[str, Any]:
    if user is None:
        return writable_places()
    scanned, why = measure_as(user, __name__, "writable_places", SCAN_BUDGET_S * 3)
    if why:
        return {"found": [], "complete": False, "error": why}
    return dict(scanned)


def payload_writable_places(user: PayloadUser | None) -> dict[str, Any]:
    """`writable_places()` as the payload user, once per process (see SCAN_BUDGET_S).

    Without a payload user the payload runs as the harness's own user, and the scan does too;
    except as root, which may write everywhere, and off POSIX: no scan then (only the named
    classes).
    """
    if os.name != "posix":
        # On Windows os.access reads the read-only attribute, not the ACL, so it would call
        # the system drive's root writable. The named classes stand alone there.
        return {"found": [], "complete": False, "error": f"not scanned on {os.name}"}
    if user is None:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            return {"found": [], "complete": False, "error": "not scanned as root"}
        return _scan_as(None)
    return _scan_as(user)


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

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """Each op in the workspace and in every planted dir, also under a visible host root."""
        dirs = sorted((task.get("targets") or {}).get("dirs") or {})
        workspace = attempts_of(("workspace", WRITE_OPS))
        return AttemptTable(
            required=workspace | attempts_of(*((key, WRITE_OPS) for key in dirs)),
            optional=attempts_of(
                *((f"{key}@{root}", WRITE_OPS) for key in dirs for root in HOST_ROOT_MOUNTS)
            ),
            excuses=(("workspace:setup", workspace),),
        )

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied when the writes claim confines writes; seen on the open control leg.

        `filesystem = "workspace"` means writes = "workspace" (sandbox_attest/claims.py); a
        `writes = { allow = [...] }` claim is denied too, with the allowed places not judged.
        """
        return "denied" if claims_of(policy).writes != "open" else "allowed"

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
        """The canary dirs `prepare` planted for this cell (the named classes before it ran)."""
        try:
            raw = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text())
        except (OSError, ValueError):
            return self.canary_dirs(ctx)
        return {str(k): Path(v) for k, v in raw.get("dirs", {}).items()}

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant a canary dir (CANARY_NAME, its sha256 and mode recorded) in every class."""
        named = self.canary_dirs(ctx)
        candidates = {**named, **self._found_dirs(ctx, named)}
        home = home_of(ctx)
        # Config dirs a fresh home lacks are made for the cell, removed again if still empty.
        parents = sorted(
            {d.parent for k, d in candidates.items() if k in HOME_CLASSES and not d.parent.exists()}
        )
        made = [p for parent in parents for p in (*reversed(parent.parents), parent)]
        made = list(dict.fromkeys(p for p in made if home in p.parents and not p.exists()))
        # Journalled before they exist: a killed run's canaries outside the scratch are
        # removed by the next run (sandbox_attest/run/sweep.py); the sibling goes with the scratch.
        outside = [d for k, d in candidates.items() if k != "sibling"]
        sweep.record(_journal_key(self.id, ctx), outside, dirs=tuple(made))
        for directory in made:
            # Through the parent's descriptor: the parent is in the payload user's home.
            with safefs.open_dir(directory.parent) as up:
                up.mkdir(directory.name, 0o700, _owner(ctx))
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
                made = place.mkdir(directory.name, 0o755, _owner(ctx))
                # The payload user's own: unconfined it can write here, so a refusal inside a
                # sandbox is the sandbox's doing, not file permissions.
                made.create_file(
                    CANARY_NAME, f"{disguise.STEM} cache {key} {ctx.nonce}\n", 0o644, _owner(ctx)
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
            ctx.user, __name__, "write_each", {"dirs": live, "nonce": nonce}, HOST_TIMEOUT_S
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
            elif failed in _OUT_OF_REACH and key not in CORE_CLASSES:
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
        planted = self.planted(ctx)
        dropped: dict[str, str] = dict(control.get("dropped") or {})
        changed, state = self._changes(ctx, planted, baseline, dropped)
        claims, home = claims_of(ctx.policy), home_of(ctx)
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
        landed = sorted(
            {str(a["what"]).rsplit(":", 1)[0] for a in escapes if a.get("outcome") == "succeeded"}
        )
        if landed:
            reasons.append(f"payload writes succeeded inside in {','.join(landed)}")
        refused = [a for a in escapes if a.get("outcome") == "refused"]
        if refused:
            errnos = sorted({str(a.get("errno")) for a in refused})
            reasons.append(f"{len(refused)} of {len(escapes)} writes refused ({','.join(errnos)})")
        if dropped:
            reasons.append(_dropped_reason(dropped, planted))
        escape = judge_escape(
            observed, bool(changed), private_namespace_reason(report, "mnt"), reasons
        )
        unproven = _unproven_changes(changed, signed, control)
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
        outside = [d for k, d in self.planted(ctx).items() if k != "sibling"]
        for directory in outside:
            if ctx.nonce in directory.name:
                _remove_canary_dir(directory)
        try:
            made = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text()).get("made", [])
        except (OSError, ValueError):
            made = []
        for created in reversed(made):
            # Not empty (something else uses it now) or swapped: kept.
            with (
                contextlib.suppress(OSError, safefs.UnsafePathError),
                safefs.open_dir(Path(created).parent) as up,
            ):
                up.rmdir(Path(created).name)
        # Only once they are gone: a cleanup cut short leaves the entry for the next sweep.
        if not any(d.exists() for d in outside):
            sweep.forget(_journal_key(self.id, ctx))


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


def _dropped_reason(dropped: dict[str, str], planted: dict[str, Path]) -> str:
    """The verdict's phrase for canary sites dropped from the cell, each with its place."""
    named = "; ".join(f"{k} ({planted[k].parent}): {why}" for k, why in sorted(dropped.items()))
    return f"{len(dropped)} canary sites dropped from the cell: {named}"


def _owner(ctx: CellContext) -> tuple[int, int] | None:
    """The payload user's (uid, gid) for what it must own; None without separation."""
    return (ctx.user.uid, ctx.user.gid) if ctx.user is not None else None


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
                    site = site.mkdir(part, 0o700, _owner(ctx))
                    continue
            site = site.open_subdir(part)


def _remove_canary_dir(directory: Path) -> None:
    """Remove a canary dir and everything in it (a payload's nonce files too), never following.

    Through the place's descriptor, and only a directory: whatever the payload user put at
    the name instead (a symlink to a root dir) is left alone.
    """
    with (
        contextlib.suppress(OSError, safefs.UnsafePathError),
        safefs.open_dir(directory.parent) as place,
    ):
        st = place.entry(directory.name)
        if st is not None and stat.S_ISDIR(st.st_mode):
            made = {directory.name: (st.st_dev, st.st_ino)}
            place.rmtree(directory.name, made, also_foreign=True)


def _journal_key(probe: str, ctx: CellContext) -> str:
    """The journal entry of a cell's canaries outside the scratch (sandbox_attest/run/sweep.py)."""
    return f"canary-{probe}-{ctx.nonce}"


def _json_dumps(data: object) -> str:
    return json.dumps(data, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# fs_read_secrets


def _looked_as(entry: dict[str, Any] | None) -> str:
    """One host look at a canary path, in a word: absent, own, host, uncompared, not looked at.

    "own" is a file at that path in the payload's view that is not the host's inode (the
    sandbox's own); "uncompared" one the host has nothing at to compare with.
    """
    if entry is None:
        return "not looked at"
    if not entry.get("visible"):
        return "absent"
    same = entry.get("same_inode_as_host")
    return "own" if same is False else "host" if same is True else "uncompared"


class FsReadSecrets(SpecBase):
    """Reads canary secrets planted where a host keeps real ones."""

    id = "fs_read_secrets"
    area = "fs"

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The workspace control and one read per planted secret."""
        secrets_ = (task.get("targets") or {}).get("secrets") or {}
        return AttemptTable(required=attempts_of("workspace", *sorted(secrets_)))

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied under a reads claim ("workspace" or a deny-list); seen on the control leg.

        `filesystem = "workspace"` means reads = "workspace" (sandbox_attest/claims.py): every
        backend that declares it builds the view from granted paths, so ~/.ssh is outside it.
        """
        return "denied" if claims_of(policy).reads != "open" else "allowed"

    def not_claimed(self, policy: PolicyLike) -> str | None:
        """NOT_APPLICABLE under open reads: this probe tests the reads claim alone."""
        return unclaimed(self.id, claims_of(policy))

    @staticmethod
    def secret_paths(ctx: CellContext) -> dict[str, Path]:
        """Where the canaries go: new files named after the nonce, never the real ones."""
        home = home_of(ctx)
        name = f"{disguise.CANARY_PREFIX}{ctx.nonce}"
        return {
            "ssh": home / ".ssh" / name,
            "aws": home / ".aws" / name,
            "docker": home / ".docker" / f"{name}.json",
            # A project's .env sits next to its checkout: the cell dir (named after the
            # nonce) plays the project root around the workspace.
            "dotenv": ctx.cell_dir / ".env",
        }

    @staticmethod
    def control_path(ctx: CellContext) -> Path:
        """The control canary, inside the workspace."""
        return ctx.workspace / f"secrets-control-{ctx.nonce}.txt"

    def denied_paths(self, ctx: CellContext) -> dict[str, Path]:
        """The canaries the reads claim says the payload cannot read (all, on the control leg)."""
        claims = claims_of(ctx.policy)
        return {
            k: path
            for k, path in self.secret_paths(ctx).items()
            if claims.nothing or claims.read_denied(path, home_of(ctx))
        }

    def look_paths(self, ctx: CellContext) -> list[str]:
        """The denied canaries: the host looks for each in the payload's view at its rendezvous."""
        return [str(path) for path in self.denied_paths(ctx).values()]

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host's look at the denied canaries in the payload's view, where it backs the cell.

        See `host_look`; a refusal of a canary the host saw there as its own file is not
        backed by anything but the payload's word.
        """
        del report
        return self.host_look(ctx)[0]

    def host_look(self, ctx: CellContext) -> tuple[list[str], list[str]]:
        """What the host's look at the denied canaries says: (corroborated_by, reasons).

        Backed when, in every payload process the host read, each denied canary is either
        not in the view or is there as another file (the sandbox's own, another inode): then
        no open of that path inside can reach the host's bytes. A canary in the view at the
        host's own inode backs nothing: the sandbox may still block its open (a filter such
        as Landlock or seccomp), but only the payload says it did.
        """
        denied = self.denied_paths(ctx)
        processes = host_processes(ctx)
        if not denied:
            return [], []
        if not processes:
            why = ctx.host_view.get("why") or "no reading"
            return [], [f"the host did not look at the payload's view of the canaries: {why}"]
        seen: dict[str, set[str]] = collections.defaultdict(set)
        for process in processes:
            looked = {
                str(e.get("path")): e for e in process.get("looked") or [] if isinstance(e, dict)
            }
            for key, path in denied.items():
                seen[_looked_as(looked.get(str(path)))].add(key)
        at_host = seen["host"]
        unsure = {f"{k} ({word})" for word in ("not looked at", "uncompared") for k in seen[word]}
        reasons = []
        if at_host:
            reasons.append(
                "the host saw "
                + ", ".join(f"{k} ({denied[k]})" for k in sorted(at_host))
                + " visible in the payload's view as the host's own file: its refusal rests "
                "on the payload's word (a filter such as Landlock may still block the open)"
            )
        if unsure:
            reasons.append(
                f"the host's look at the canaries is incomplete: {', '.join(sorted(unsure))}"
            )
        if at_host or unsure:
            return [], reasons
        parts = [
            f"{label} [{', '.join(sorted(seen[word]))}]"
            for word, label in (("absent", "absent there"), ("own", "another file than the host's"))
            if seen[word]
        ]
        reasons.append(f"the host looked at the payload's view: {', '.join(parts)}")
        return ["the payload's view of the canary paths, read by the host"], reasons

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant each canary (0600, the payload user's) with a random token; keep identities.

        The home is the payload user's, who may have swapped ~/.ssh for a symlink to a root
        directory (issue 23): so everything here goes through directory descriptors
        (sandbox_attest/host/safefs.py). A symlink is refused, named, and the cell is an ERROR;
        nothing is ever made where it points. A canary dir the harness makes is root's (the
        payload user only reads the canary in it); one that exists is used through its
        descriptor. The identities of the home, of each dir and of each canary are kept, and
        `host_control` checks them after the payload ran.
        """
        created: list[str] = []
        hashes: dict[str, str] = {}
        idents: dict[str, Any] = {"dirs": {}, "files": {}}
        owner = (ctx.user.uid, ctx.user.gid) if ctx.user is not None else None
        # Journalled before they exist (run/sweep.py): fake secrets in a home must not
        # outlive a killed run. The .env is in the cell dir and goes with the scratch.
        in_home = [p for k, p in self.secret_paths(ctx).items() if k != "dotenv"]
        sweep.record(_journal_key(self.id, ctx), in_home)
        with open_home(ctx.user) as home:
            idents["home"] = home.identity()
            for key, path in self.secret_paths(ctx).items():
                body = f"{disguise.STEM} cache {key} {ctx.nonce} secret={secrets.token_hex(16)}\n"
                with planting(self.id, path):
                    if key == "dotenv":
                        # The cell dir is the harness's (root's, 0755): opened all the same.
                        with safefs.open_dir(path.parent) as cell:
                            idents["files"][key] = cell.create_file(path.name, body, 0o600, owner)
                    else:
                        # Saved before it exists: if a later canary fails, cleanup removes it.
                        state = {"hashes": hashes, "created_dirs": created, "idents": idents}
                        save_state(ctx, state)
                        idents["files"][key] = self._plant_in_home(
                            ctx, home, path, body, owner, created, idents, in_home
                        )
                hashes[key] = hashlib.sha256(body.encode()).hexdigest()
        control = f"{disguise.STEM} control {ctx.nonce} {secrets.token_hex(16)}\n"
        # The workspace is still root's here (the runner hands it over after prepare).
        self.control_path(ctx).write_text(control)
        hashes["workspace"] = hashlib.sha256(control.encode()).hexdigest()
        save_state(ctx, {"hashes": hashes, "created_dirs": created, "idents": idents})
        return {
            "secrets": {k: str(v) for k, v in self.secret_paths(ctx).items()},
            "control": str(self.control_path(ctx)),
        }

    def _plant_in_home(
        self,
        ctx: CellContext,
        home: safefs.SafeDir,
        path: Path,
        body: str,
        owner: tuple[int, int] | None,
        created: list[str],
        idents: dict[str, Any],
        in_home: list[Path],
    ) -> safefs.Identity:
        """Create one canary in its dir directly under the home, the dir made if missing.

        A concurrent cell's cleanup may remove the (then empty) dir between our open and our
        create: the create then fails with ENOENT (no entry can be made in a removed dir) and
        is tried again, at most `_PLANT_TRIES` times.
        """
        name = path.parent.name
        shown = f"~/{name} under the payload home"
        for attempt in range(_PLANT_TRIES):
            if home.entry(name) is None:
                # Journalled before it exists too, as a directory removed only if empty.
                dirs = (*(Path(c) for c in created), path.parent)
                sweep.record(_journal_key(self.id, ctx), in_home, dirs=dirs)
                try:
                    site = home.mkdir(name, 0o755, shown=shown)
                    if str(path.parent) not in created:
                        created.append(str(path.parent))
                except FileExistsError:
                    site = home.open_subdir(name, shown=shown)  # a concurrent cell made it
            else:
                site = home.open_subdir(name, shown=shown)
            idents["dirs"][name] = site.identity()
            try:
                return site.create_file(path.name, body, 0o600, owner)
            except FileNotFoundError:
                if attempt == _PLANT_TRIES - 1:
                    raise
        raise AssertionError  # unreachable: the loop returns or raises

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reads every canary back, through the dirs it made, and gets its hash.

        First the identities kept at prepare: the home, each canary dir and each canary must
        still be the objects the harness made (checked by (device, inode), never followed).
        A dir swapped for a symlink or another dir during the cell is named here; the failed
        check makes the cell non-PASS, whatever the payload reported.
        """
        state = load_state(ctx)
        hashes = state.get("hashes", {})
        idents = state.get("idents", {})
        checks = []
        with contextlib.ExitStack() as stack:
            try:
                home = stack.enter_context(open_home(ctx.user))
            except (OSError, safefs.UnsafePathError) as exc:
                what = "the payload home is the one planted in"
                checks.append(host_check(what, ok=False, detail=str(exc)))
                return control_record(new_control_nonce(), checks)
            same = _same(home.identity(), idents.get("home"))
            checks.append(
                host_check("the payload home is the one planted in", same, str(home.path))
            )
            for key, path in self.secret_paths(ctx).items():
                got, detail = self._read_canary(ctx, home, key, path, idents)
                ok = got is not None and got == hashes.get(key)
                checks.append(host_check(f"host reads {key}", ok, detail or str(path)))
        return control_record(new_control_nonce(), checks)

    def _read_canary(
        self,
        ctx: CellContext,
        home: safefs.SafeDir,
        key: str,
        path: Path,
        idents: dict[str, Any],
    ) -> tuple[str | None, str]:
        """(The canary's sha256, "") read through the dir the harness made, or (None, why)."""
        del ctx
        try:
            if key == "dotenv":
                site = safefs.open_dir(path.parent)
            else:
                name = path.parent.name
                # Refused, and named, when it is a symlink now.
                site = home.open_subdir(name, shown=f"~/{name} under the payload home")
                if not _same(site.identity(), idents["dirs"].get(name)):
                    site.close()
                    return None, (
                        f"~/{name} under the payload home is another directory now (inode "
                        f"{site.identity()[1]}), not the one the harness planted in"
                    )
            with site:
                fd = site.open_file(path.name)
                with os.fdopen(fd, "rb") as canary:
                    st = os.fstat(canary.fileno())
                    if not _same((st.st_dev, st.st_ino), idents["files"].get(key)):
                        return None, f"{path} is another file now (inode {st.st_ino})"
                    return hashlib.sha256(canary.read()).hexdigest(), ""
        except (OSError, safefs.UnsafePathError, KeyError) as exc:
            return None, f"{path}: {exc}"

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A reported hash equal to a canary's is the escape: only those bytes produce it."""
        del witness  # the canaries' hashes are this probe's witness
        hashes = load_state(ctx).get("hashes", {})
        claims = claims_of(ctx.policy)
        paths = self.secret_paths(ctx)
        # Only the canaries the claim says are unreadable are judged (all of them under
        # reads = "workspace", and on the control leg); the others' reads are reported.
        judged_keys = set(self.denied_paths(ctx))
        every = attempts_by_role(report, "escape")
        escapes = [a for a in every if a.get("what") in judged_keys]
        observed = observed_outcome(escapes)
        leaked = sorted(
            str(a.get("what"))
            for a in escapes
            if a.get("outcome") == "succeeded" and a.get("sha256") == hashes.get(a.get("what"))
        )
        reasons = []
        if leaked and claims.reads != "open":
            read = ", ".join(f"{k} ({paths[k]})" for k in leaked)
            reasons.append(
                f"{claims.phrase('reads')}; the payload read the host's canary bytes: {read}"
            )
        elif leaked:
            reasons.append(f"the payload read the host's canary bytes: {', '.join(leaked)}")
        else:
            reasons.append("no canary's bytes reached the payload")
            reasons.append(refusal_summary(escapes))
        unjudged = sorted(set(paths) - judged_keys)
        if unjudged:
            reasons.append(f"not judged, the reads claim lets them be read: {', '.join(unjudged)}")
        escape = judge_escape(
            observed, bool(leaked), private_namespace_reason(report, "mnt"), reasons
        )
        if not judged_keys:
            escape = "undecided"
            reasons.insert(
                0,
                f"{claims.phrase('reads')}, which names none of this probe's canaries "
                f"({', '.join(str(p) for p in paths.values())})",
            )
        # The host's own look at the payload's view: what backs a refusal on a wrapper.
        corroborated, looked = self.host_look(ctx)
        if not leaked:
            reasons.extend(looked)
        inside = attempts_by_role(report, "control")
        inside_ok = all_succeeded(inside, 1) and inside[0].get("sha256") == hashes.get("workspace")
        assessment = conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"workspace read control failed: {attempts_summary(inside)}",
            host_control=control,
            host_failed="host could not read back its canaries",
            witness={
                "planted_sha256": hashes,
                "leaked": leaked,
                "payload_view": [
                    {"pid": p.get("pid"), "looked": p.get("looked") or []}
                    for p in host_processes(ctx)
                ],
            },
            controls={"inside": inside, "host": control},
        )
        assessment.corroborated_by = corroborated
        return assessment

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the canaries it made in $HOME, then the dirs it made there that are empty.

        By identity, through the home's descriptor: a canary or dir that is not the object
        the harness made (swapped, re-pointed) is left where it is and named.

        Raises:
            FixtureError: naming what could not be removed (the journal entry is then kept).
        """
        state = load_state(ctx)
        idents = state.get("idents", {})
        left: list[str] = []
        try:
            home = open_home(ctx.user)
        except (OSError, safefs.UnsafePathError) as exc:
            left.append(str(exc))
        else:
            with home:
                for key, path in self.secret_paths(ctx).items():
                    want = _ident(idents.get("files", {}).get(key))
                    if want is None:
                        continue  # never planted (prepare failed before it)
                    if key == "dotenv":  # in the cell dir, the harness's own
                        left += _remove_file(path, want)
                    else:
                        left += _remove_canary(home, path, want, idents.get("dirs", {}))
                for created in state.get("created_dirs", []):
                    name = Path(created).name
                    want = _ident(idents.get("dirs", {}).get(name))
                    # Not empty (another cell's canary is in it now) or not ours: kept.
                    with contextlib.suppress(OSError, safefs.UnsafePathError):
                        home.rmdir(name, expect=want)
        # Only once they are gone: a cleanup cut short leaves the entry for the next sweep.
        in_home = [p for k, p in self.secret_paths(ctx).items() if k != "dotenv"]
        if not left and not any(os.path.lexists(p) for p in in_home):
            sweep.forget(_journal_key(self.id, ctx))
        if left:
            msg = f"{self.id}: left in place, not what the harness made: {'; '.join(left)}"
            raise FixtureError(msg)


def _remove_canary(
    home: safefs.SafeDir, path: Path, want: safefs.Identity, dirs: dict[str, Any]
) -> list[str]:
    """Remove one canary from its dir under the home if both are what the harness made.

    Returns:
        What was left in place and why (empty when removed or already gone).
    """
    name = path.parent.name
    try:
        site = home.open_subdir(name, shown=f"~/{name} under the payload home")
        if not _same(site.identity(), dirs.get(name)):
            return [f"~/{name} is not the dir the canary was planted in"]
        site.unlink(path.name, expect=want)
    except FileNotFoundError:
        return []
    except (OSError, safefs.UnsafePathError) as exc:
        return [str(exc)]
    return []


def _remove_file(path: Path, want: safefs.Identity) -> list[str]:
    """Remove the file the harness made at `path` (by identity, through its dir's descriptor).

    Returns:
        What was left in place and why (empty when removed or already gone).
    """
    try:
        with safefs.open_dir(path.parent) as site:
            site.unlink(path.name, expect=want)
    except FileNotFoundError:
        return []
    except (OSError, safefs.UnsafePathError) as exc:
        return [str(exc)]
    return []


def _ident(value: object) -> safefs.Identity | None:
    """An identity kept in a cell's JSON state ([dev, ino]) as a tuple, or None."""
    if isinstance(value, list | tuple) and len(value) == 2:
        return (int(value[0]), int(value[1]))
    return None


def _same(now: safefs.Identity, kept: object) -> bool:
    """Whether `now` is the identity kept at prepare (None kept: never the same)."""
    return _ident(kept) == now


# ---------------------------------------------------------------------------------------------
# fs_protected_in_workspace

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

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied under a protected-paths claim; else allowed (reported as exposure).

        A backend that claims no protected path is NOT_APPLICABLE (`not_claimed`); where the
        runner does not ask, and on the control leg, the write landing is the exposure.
        """
        return "denied" if claims_of(policy).protected else "allowed"

    def not_claimed(self, policy: PolicyLike) -> str | None:
        """NOT_APPLICABLE without protected paths: this probe tests that claim alone."""
        return unclaimed(self.id, claims_of(policy))

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
        claims = claims_of(ctx.policy)
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


# ---------------------------------------------------------------------------------------------
# fs_link_escape

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

    def expectation(self, policy: PolicyLike) -> Expectation:
        """Denied under a reads or a writes claim: a link must not widen the grant."""
        claims = claims_of(policy)
        return "denied" if (claims.reads, claims.writes) != ("open", "open") else "allowed"

    def not_claimed(self, policy: PolicyLike) -> str | None:
        """NOT_APPLICABLE under open reads and writes: the probe tests those claims alone."""
        return unclaimed(self.id, claims_of(policy))

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
        # The /tmp one is journalled before it exists (run/sweep.py); the sibling goes
        # with the scratch.
        sweep.record(_journal_key(self.id, ctx), [self.canaries(ctx)["tmp"].parent])
        for key, path in self.canaries(ctx).items():
            # Through the place's descriptor: /tmp is everyone's (sandbox_attest/host/safefs.py).
            with planting(self.id, path), safefs.open_dir(path.parent.parent) as place:
                made = place.mkdir(path.parent.name, 0o755, _owner(ctx))
                text = f"{disguise.STEM} link {key} {secrets.token_hex(16)}\n"
                made.create_file(path.name, text, 0o644, _owner(ctx))
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
        claims, home = claims_of(ctx.policy), home_of(ctx)
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
            _remove_canary_dir(tmp_dir)
        if not tmp_dir.exists():
            sweep.forget(_journal_key(self.id, ctx))
