"""fs_write_outside covers the class: every place the payload user can write gets a canary.

Real directories, real uids: the scan runs as the payload user over a tree made here and over
this host, and `prepare` / `cleanup` plant and remove real canaries (journalled first). The
live holes (a wrapper binding /var/tmp writable) are in tests/integration/test_host_classes.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog.fs import CANARY_NAME, FsWriteOutside
from sandbox_attest.catalog.fs.writable import payload_writable_places, writable_places
from sandbox_attest.catalog.fs.write_outside import _PLANTED, HOME_CLASSES, _class_key
from sandbox_attest.catalog.spec import CellContext
from sandbox_attest.host import journal as sweep
from sandbox_attest.host import mountview
from sandbox_attest.host.trust import PayloadUser, payload_user
from sandbox_attest.payload import INPUT_DIR, STAGED_TASK
from sandbox_attest.verdict import Assessment
from tests.catalog.test_proc import Records
from tests.unit.test_hostview import needs_bwrap, sandboxed, wait_for

CONFINED = DeclaredClaims(network="proxy", filesystem="workspace", ipc="isolated")
SPEC = FsWriteOutside()
USER = payload_user()
as_root = pytest.mark.skipif(
    USER is None, reason="the scan as another user needs the root harness's payload user"
)


class WorldInfoLike:
    """The one field of WorldInfo this spec reads: the world's run dir."""

    def __init__(self, run_dir: Path) -> None:
        """A world whose run dir is `run_dir`."""
        self.run_dir = str(run_dir)


class WorldLike:
    """A world that carries only its run dir (fs_write_outside reads no fixture log)."""

    def __init__(self, run_dir: Path) -> None:
        """A world whose run dir is `run_dir`."""
        self.info = WorldInfoLike(run_dir)


def scan_as(user: PayloadUser, root: Path) -> dict[str, Any]:
    """`writable_places(root)` in a child running as `user`."""
    code = (
        "import json, sys; from sandbox_attest.catalog.fs.writable import writable_places; "
        "print(json.dumps(writable_places(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd="/",
        **user.popen_kwargs(),
    )
    return dict(json.loads(done.stdout))


@pytest.fixture
def ctx(tmp_path: Path) -> CellContext:
    """A confined cell under tmp_path, with a world run dir of its own."""
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / "cells" / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    (tmp_path / "world").mkdir()
    return CellContext(
        probe=SPEC.id,
        backend="unit",
        nonce=nonce,
        world=WorldLike(tmp_path / "world"),  # type: ignore[arg-type]  # only info.run_dir
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=CONFINED,
        user=USER,
    )


class TestScan:
    def test_class_key_spells_the_place(self) -> None:
        """A scan's find becomes an attempt key of letters, digits and dashes."""
        assert _class_key("/run/lock") == "found-run-lock"

    @as_root
    def test_finds_the_topmost_writable_dirs_only(self, tmp_path: Path) -> None:
        """In a tree, the scan names each writable dir once, and not what lies below it."""
        assert USER is not None
        tmp_path.chmod(0o755)
        (tmp_path / "closed" / "mine" / "deeper").mkdir(parents=True)
        (tmp_path / "open" / "below").mkdir(parents=True)
        os.chown(tmp_path / "closed" / "mine", USER.uid, USER.gid)
        (tmp_path / "open").chmod(0o1777)
        found = scan_as(USER, tmp_path)
        assert found["complete"]
        assert found["found"] == [str(tmp_path / "closed" / "mine"), str(tmp_path / "open")]

    @as_root
    def test_host_scan_finds_the_temp_dirs(self) -> None:
        """On this host the payload user may write /tmp and /var/tmp, and the scan says so."""
        found = payload_writable_places(USER)
        assert {"/tmp", "/var/tmp"} <= set(found["found"]), found

    def test_root_writes_everywhere(self) -> None:
        """As the harness's root, / itself is writable: why the scan runs as the payload user."""
        if os.geteuid() != 0:
            pytest.skip("the harness is not root here")
        assert writable_places("/")["found"] == ["/"]


@as_root
class TestPlanting:
    def test_every_class_is_planted_then_removed(self, ctx: CellContext) -> None:
        """Each named class and each scan find gets a canary; cleanup removes them all."""
        targets = SPEC.prepare(ctx)
        planted = {k: Path(v) for k, v in targets["dirs"].items()}
        try:
            named = {"sibling", "tmp", "var_tmp", "shm", "home", "run_dir", *HOME_CLASSES}
            assert named <= set(planted), sorted(planted)
            found = {k for k in planted if k.startswith("found-")}
            record = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text())
            assert all(Path(p).parent.is_dir() for p in planted.values())
            assert all((p / CANARY_NAME).is_file() for p in planted.values())
            assert SPEC.host_control(ctx)["ok"]
            journal = sweep.journal_dir() / f"canary-{SPEC.id}-{ctx.nonce}.json"
            entry = json.loads(journal.read_text())
            assert {str(planted[k]) for k in planted if k != "sibling"} <= set(entry["paths"])
        finally:
            SPEC.cleanup(ctx)
        assert not [p for k, p in planted.items() if k != "sibling" and p.exists()]
        assert not journal.exists()
        # Whatever the scan found beyond the named classes was planted too, or skipped with
        # its reason: on a busy host a found directory can vanish between the scan and the
        # planting (its owner removed it), and prepare lists it under "skipped".
        skipped = {k for k in record["skipped"] if k.startswith("found-")}
        assert found | skipped == {_class_key(p) for p in found_places(ctx)}
        assert not found & skipped


def found_places(ctx: CellContext) -> list[str]:
    """The scan's finds that no named class covers, as prepare picks them."""
    covered = [d.parent for d in SPEC.canary_dirs(ctx).values()]
    home = USER.home if USER is not None else Path.home()
    covered += [home, ctx.cell_dir.parent]
    return [
        place
        for place in payload_writable_places(USER)["found"]
        if not any(Path(place) == c or c in Path(place).parents for c in covered)
    ]


def write_into_var_tmp(ctx: CellContext) -> Assessment:
    """Plant the canaries, append to /var/tmp's as a leaky payload would, assess, clean up."""
    targets = SPEC.prepare(ctx)
    try:
        with (Path(targets["dirs"]["var_tmp"]) / CANARY_NAME).open("a") as fh:
            fh.write(f"appended {ctx.nonce}\n")
        report: dict[str, Any] = {"attempts": [], "facts": {}}
        return SPEC.assess(ctx, report, Records(), {"ok": True})
    finally:
        SPEC.cleanup(ctx)


def chmod_in_var_tmp(ctx: CellContext) -> Assessment:
    """Plant the canaries, chmod /var/tmp's (no byte, no name) as sandlock lets through."""
    targets = SPEC.prepare(ctx)
    try:
        (Path(targets["dirs"]["var_tmp"]) / CANARY_NAME).chmod(0o666)
        report: dict[str, Any] = {"attempts": [], "facts": {}}
        return SPEC.assess(ctx, report, Records(), {"ok": True})
    finally:
        SPEC.cleanup(ctx)


@as_root
class TestWritesClaim:
    def test_a_metadata_only_change_names_a_fix_for_metadata(self, ctx: CellContext) -> None:
        """Only a mode changed: the fix is about chmod/chown/utime, not about a writable bind."""
        assessment = chmod_in_var_tmp(ctx)
        assert assessment.escape == "escaped"
        said = " ".join(assessment.reasons)
        assert "var_tmp (/var/tmp): mode changed" in said
        assert "do not bind" not in said
        assert "refuses writes here but not chmod, chown or utime" in said

    def test_a_content_change_keeps_the_bind_fix(self, ctx: CellContext) -> None:
        """Bytes written: the fix is still to keep the place out of the sandbox's writes."""
        said = " ".join(write_into_var_tmp(ctx).reasons)
        assert "fix: do not bind /var/tmp writable into the sandbox" in said

    def test_a_write_the_claim_forbids_is_an_escape_named_by_the_claim(
        self, ctx: CellContext
    ) -> None:
        """Writes = "workspace": the /var/tmp canary changed on the host, so the claim broke."""
        assessment = write_into_var_tmp(ctx)
        assert assessment.escape == "escaped"
        assert assessment.reasons[0].startswith(
            'claims writes limited to the workspace (implied by filesystem = "workspace"); '
            "host sees canary changes: var_tmp"
        )
        assert assessment.witness["allowed_by_claim"] == {}

    def test_a_write_the_claim_allows_is_not_judged(self, ctx: CellContext) -> None:
        """Writes = { allow = ["/var/tmp"] }: the same write is reported, not held against it."""
        declared = DeclaredClaims(
            network="proxy",
            filesystem="workspace",
            ipc="isolated",
            writes="allow",
            write_allow=("/var/tmp",),
        )
        assessment = write_into_var_tmp(dataclasses.replace(ctx, claims=declared))
        assert assessment.escape != "escaped"
        allowed = assessment.witness["allowed_by_claim"]
        assert isinstance(allowed, dict)
        assert set(allowed) == {"var_tmp"}
        assert assessment.witness["changed"] == {}
        assert any(
            r.startswith(
                "not judged: the payload wrote in /var/tmp; the backend claims writes "
                "limited to the workspace and /var/tmp"
            )
            for r in assessment.reasons
        )


def stage_task(ctx: CellContext, targets: dict[str, Any]) -> Path:
    """The task the payload would read (cell_dir/input/config.json), as the runner stages it."""
    inputs = ctx.cell_dir / INPUT_DIR
    inputs.mkdir()
    task = inputs / STAGED_TASK
    task.write_text(json.dumps({"nonce": ctx.nonce, "targets": targets}))
    return task


def rendezvous_in(ctx: CellContext, extra: list[str]) -> dict[str, Any]:
    """The spec's rendezvous reading of a bwrap payload with `extra` mounts, once pivoted."""
    with sandboxed(extra) as pid:
        wait_for(
            lambda: mountview.read_text(f"/proc/{pid}/mountinfo") or "/newroot",
            lambda text: "/newroot" not in text,
        )
        reading = SPEC.at_rendezvous(ctx, pid)
    ctx.host_view[SPEC.id] = reading
    return reading


@as_root
@needs_bwrap
class TestMountedElsewhere:
    """A canary's place mounted at another path in the view (an empty dir of the cell's)."""

    def test_the_canary_is_added_at_its_inside_path(self, ctx: CellContext) -> None:
        """/var/tmp bound at <cell>/vt: its canary is added there, and untried is no PASS."""
        task = stage_task(ctx, SPEC.prepare(ctx))
        inside = ctx.cell_dir / "vt"
        inside.mkdir()
        try:
            reading = rendezvous_in(ctx, ["--bind", "/var/tmp", str(inside)])
            key = f"var_tmp@{inside}"
            name = SPEC.planted(ctx)["var_tmp"].name
            assert reading["added"][key] == str(inside / name), reading
            # Anything else added is a payload-writable dir this machine already has mounted
            # under /var/tmp (CI's fresh-state binds the host's entries back as mounts), which
            # the bind brings along: planted at the rendezvous, as the next test shows.
            others = {k: v for k, v in reading["added"].items() if k != key}
            planted = reading.get("planted_at_rendezvous") or {}
            assert all(k.split("@")[0] in planted for k in others), reading
            assert all(str(planted[k.split("@")[0]]).startswith("/var/tmp/") for k in others)
            assert json.loads(task.read_text())["targets"]["dirs"][key] == str(inside / name)
            table = SPEC.attempt_table({"nonce": ctx.nonce, "targets": {"dirs": {}}})
            assert f"{key}:create" in table.optional
            exposed = {e["inside"]: e for e in reading["exposed"]}
            assert exposed[str(inside)]["canary_tried"], exposed
            report: dict[str, Any] = {"attempts": [], "facts": {}}
            assessment = SPEC.assess(ctx, report, Records(), {"ok": True})
            assert assessment.escape == "undecided", assessment.reasons
            assert any("no attempt at the inside paths" in r for r in assessment.reasons)
        finally:
            SPEC.cleanup(ctx)

    def test_a_host_dir_no_class_covers_gets_a_canary_then_loses_it(self, ctx: CellContext) -> None:
        """A payload-writable dir under /var/tmp bound at <cell>/data: planted there, removed."""
        assert USER is not None
        stage_task(ctx, SPEC.prepare(ctx))
        shared = Path(tempfile.mkdtemp(dir="/var/tmp"))
        os.chown(shared, USER.uid, USER.gid)
        inside = ctx.cell_dir / "data"
        inside.mkdir()
        try:
            reading = rendezvous_in(ctx, ["--bind", str(shared), str(inside)])
            key = "mounted" + _class_key(str(shared))[len("found") :]
            assert set(reading["planted_at_rendezvous"]) == {key}, reading
            planted = Path(reading["planted_at_rendezvous"][key])
            assert (planted / CANARY_NAME).is_file()
            assert reading["added"] == {f"{key}@{inside}": str(inside / planted.name)}
            # The payload writes there: the host sees the change on its own canary.
            (planted / f"{ctx.nonce}.txt").write_text("x")
            assessment = SPEC.assess(ctx, {"attempts": [], "facts": {}}, Records(), {"ok": True})
            assert assessment.escape == "escaped", assessment.reasons
            assert any(f"at {inside} (writable)" in r for r in assessment.reasons)
        finally:
            SPEC.cleanup(ctx)
            leftovers = list(shared.iterdir())
            shutil.rmtree(shared)
        assert leftovers == []


@as_root
class TestTwoCellsAtOnce:
    """Two cells of different backends plant in a fresh home at the same time (CI: `-j 2`).

    The second found `.cache` made by the first between its check and its mkdir, and failed
    with FileExistsError (an ERROR cell); the first's cleanup could also remove a config dir
    the second's canary still needed. A dir one cell made is held by every cell that uses it,
    and the last one out removes it.
    """

    def test_the_second_uses_the_firsts_dirs_and_the_last_out_removes_them(
        self, ctx: CellContext, tmp_path: Path
    ) -> None:
        """Both prepare; the made dirs outlive the first cleanup and not the second."""
        other = dataclasses.replace(
            ctx, nonce="n" + secrets.token_hex(8), cell_dir=tmp_path / "cells" / "other"
        )
        (other.cell_dir / "workspace").mkdir(parents=True)
        other = dataclasses.replace(other, workspace=other.cell_dir / "workspace")
        first = SPEC.prepare(ctx)
        try:
            made = json.loads((ctx.cell_dir / "canaries" / _PLANTED).read_text())["made"]
            if not made:
                pytest.skip("the payload's home already has every config dir: nothing is made")
            second = SPEC.prepare(other)
            try:
                held = json.loads((other.cell_dir / "canaries" / _PLANTED).read_text())["made"]
                assert set(made) <= set(held)
                assert set(first["dirs"]) == set(second["dirs"])
            finally:
                SPEC.cleanup(ctx)
                assert all(Path(m).is_dir() for m in made), "removed under the other cell"
        finally:
            SPEC.cleanup(other)
        assert not any(Path(m).exists() for m in made)
