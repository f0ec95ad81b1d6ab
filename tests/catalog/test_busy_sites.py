"""Sites on a busy host (issue 24, part 3): what another program does to its directory is no escape.

Real directories, real sockets, real uids. A witness or canary site is held by the harness's
own descriptor from plant time; a directory its owner removed or replaced during the cell is
dropped (and named), a site the payload user cannot reach unconfined is dropped from the
control, and only a change the sandbox can have made (the nonce, or the harness's own object
changed in a place that stayed) is an escape. The live run under `tests.noise.busy_host` is
tests/integration/test_busy_host.py.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.catalog.canary import call_as, site_moved
from sandbox_attest.catalog.fs import CANARY_NAME, FsWriteOutside
from sandbox_attest.catalog.fs import write_outside as fs
from sandbox_attest.catalog.fs.write_outside import _unproven_changes
from sandbox_attest.catalog.ipc.unix_socket import _witnesses_hear_host
from sandbox_attest.catalog.socket_witness import (
    WitnessSockets,
    bind_unix,
    reachable_dirs,
    witness_name,
)
from sandbox_attest.catalog.spec import CellContext
from sandbox_attest.host import journal as sweep
from sandbox_attest.host.safefs import open_dir
from sandbox_attest.host.trust import payload_user
from tests.catalog.test_fs_write_outside import CONFINED, WorldLike
from tests.catalog.test_proc import Records
from tests.noise import busy_host

USER = payload_user()
as_root = pytest.mark.skipif(
    USER is None, reason="a uid of the payload's own exists only under a root harness"
)


@pytest.fixture(autouse=True)
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sweep journal lives in this test's directory."""
    state = tmp_path / "state"
    monkeypatch.setenv(sweep.STATE_ENV, str(state))
    return state / sweep.JOURNAL


@pytest.fixture
def base() -> Iterator[Path]:
    """A short directory the payload user can traverse (unix socket paths are short)."""
    made = Path(f"/tmp/sa-sites-{secrets.token_hex(4)}")
    made.mkdir(mode=0o755)
    made.chmod(0o755)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def site(path: Path) -> Path:
    """A fresh 0755 directory at `path`."""
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    return path


class TestSiteMoved:
    def test_a_held_directory_that_stayed_is_not_moved(self, base: Path) -> None:
        """The directory still at its path, at the inode held, is the same site."""
        with open_dir(site(base / "d")) as held:
            assert site_moved(held) == ""

    def test_a_removed_directory_is_its_owners_change(self, base: Path) -> None:
        """A directory removed after it was opened is named as removed by its owner."""
        with open_dir(site(base / "d")) as held:
            (base / "d").rmdir()
            assert "removed by its owner" in site_moved(held)

    def test_a_replaced_directory_is_another_one(self, base: Path) -> None:
        """Renamed away and made again under the same name: the path is another directory."""
        with open_dir(site(base / "d")) as held:
            (base / "d").rename(base / "old")
            site(base / "d")
            assert "is another directory now" in site_moved(held)


class TestCallAs:
    def test_returns_the_functions_json_answer(self) -> None:
        """The function gets its JSON argument and its answer comes back decoded."""
        got, why = call_as(USER, "sandbox_attest.host.as_user", "searchable", ["/"], 30)
        assert (got, why) == ({"/": ""}, "")

    @as_root
    def test_a_private_root_directory_is_out_of_reach(self, base: Path) -> None:
        """A 0700 root directory is not searchable by the payload user, and it says so."""
        private = base / "private"
        private.mkdir(mode=0o700)
        got, why = call_as(USER, "sandbox_attest.host.as_user", "searchable", [str(private)], 30)
        assert (got, why) == ({str(private): "EACCES"}, "")


def planted(nonce: str, dirs: list[Path]) -> WitnessSockets:
    """Witnesses of `nonce` planted in `dirs` and listening (no abstract one)."""
    witnesses = WitnessSockets(nonce, dirs, abstract=False)
    witnesses.plant()
    witnesses.start()
    return witnesses


class TestWitnessSites:
    def test_a_witness_whose_directory_was_removed_is_dropped(self, base: Path) -> None:
        """The owner removed a witness's directory: dropped and named, the control holds."""
        nonce = "n" + secrets.token_hex(8)
        stays, goes = site(base / "stays"), site(base / "goes")
        witnesses = planted(nonce, [stays, goes])
        try:
            shutil.rmtree(goes)
            check = _witnesses_hear_host(witnesses, "h" + nonce, USER)
        finally:
            witnesses.stop()
        assert check["ok"], check
        gone = str(goes / witness_name(nonce))
        assert list(witnesses.dropped) == [gone]
        assert "removed by its owner" in witnesses.dropped[gone]

    def test_a_replaced_directory_is_dropped(self, base: Path) -> None:
        """Renamed away and made again under the same name (a restart): dropped, not silent."""
        nonce = "n" + secrets.token_hex(8)
        stays, again = site(base / "stays"), site(base / "again")
        witnesses = planted(nonce, [stays, again])
        try:
            again.rename(base / "old")  # the owner moves it aside and starts afresh
            site(again)
            check = _witnesses_hear_host(witnesses, "h" + nonce, USER)
        finally:
            witnesses.stop()
        assert check["ok"], check
        assert "another directory now" in witnesses.dropped[str(again / witness_name(nonce))]

    @as_root
    def test_a_witness_the_payload_user_cannot_reach_is_dropped(self, base: Path) -> None:
        """A directory closed to the payload user during the cell: dropped with EACCES."""
        nonce = "n" + secrets.token_hex(8)
        stays, closed = site(base / "stays"), site(base / "closed")
        witnesses = planted(nonce, [stays, closed])
        try:
            closed.chmod(0o700)  # its owner tightens it after the witness went in
            check = _witnesses_hear_host(witnesses, "h" + nonce, USER)
        finally:
            witnesses.stop()
        assert check["ok"], check
        why = witnesses.dropped[str(closed / witness_name(nonce))]
        assert "cannot reach it unconfined (EACCES)" in why

    def test_a_silent_witness_in_a_directory_that_stayed_fails_the_control(
        self, base: Path
    ) -> None:
        """Another socket put in place of the witness: connectable, never heard, control fails."""
        nonce = "n" + secrets.token_hex(8)
        here = site(base / "here")
        witnesses = planted(nonce, [here])
        path = here / witness_name(nonce)
        path.unlink()
        other = bind_unix(str(path))
        path.chmod(0o666)
        try:
            check = _witnesses_hear_host(witnesses, "h" + nonce, USER)
        finally:
            other.close()
            witnesses.stop()
        assert not check["ok"]
        assert witnesses.dropped == {}
        assert str(path) in check["detail"]
        assert "is another object now" in check["detail"]

    @as_root
    def test_private_directories_get_no_witness(self, base: Path) -> None:
        """Another program's 0700 directory, or one gone since the walk, is left out and said."""
        open_, private = site(base / "open"), base / "private"
        private.mkdir(mode=0o700)
        gone = base / "gone"
        kept, skipped = reachable_dirs([open_, private, gone], USER)
        assert kept == [open_]
        assert skipped == {
            str(private): "the payload user cannot search it unconfined (EACCES)",
            str(gone): "gone before the witness was planted (its owner removed it)",
        }


@pytest.fixture
def ctx(tmp_path: Path) -> CellContext:
    """A confined fs_write_outside cell under tmp_path, with a world run dir of its own."""
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / "cells" / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    (tmp_path / "world").mkdir()
    for directory in (tmp_path, tmp_path / "cells", cell_dir, tmp_path / "world"):
        directory.chmod(0o755)
    return CellContext(
        probe="fs_write_outside",
        backend="unit",
        nonce=nonce,
        world=WorldLike(tmp_path / "world"),  # type: ignore[arg-type]  # only info.run_dir
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=CONFINED,
        user=USER,
    )


@pytest.fixture
def found(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A writable place only the scan finds (another program's), reported by a stubbed scan.

    In /run, as the busy host's are: under /tmp a named class would cover it. The scan is the
    seam: the real one runs as the payload user over the whole host, and this test needs its
    one transient place among the finds.
    """
    owner = Path(f"/run/tmp.sa-sites-{secrets.token_hex(4)}")
    site(owner)
    place = owner / "w"
    place.mkdir()
    place.chmod(0o777)
    monkeypatch.setattr(
        fs, "payload_writable_places", lambda _user: {"found": [str(place)], "complete": True}
    )
    try:
        yield place
    finally:
        shutil.rmtree(owner, ignore_errors=True)


def found_key(place: Path) -> str:
    """The attempt key fs_write_outside gives a scan's find."""
    return fs._class_key(str(place))


NO_REPORT: dict[str, Any] = {"attempts": [], "facts": {}}


@as_root
class TestCanarySites:
    def run(self, ctx: CellContext, between: Any) -> tuple[Any, dict[str, Any]]:
        """Prepare, do `between` to the planted dirs, run the host control, assess, clean up."""
        spec = FsWriteOutside()
        targets = spec.prepare(ctx)
        try:
            between({k: Path(v) for k, v in targets["dirs"].items()})
            control = spec.host_control(ctx)
            return spec.assess(ctx, NO_REPORT, Records(), control), control
        finally:
            spec.cleanup(ctx)

    def test_a_place_its_owner_removed_is_dropped_not_an_escape(
        self, ctx: CellContext, found: Path
    ) -> None:
        """The owner's rm -rf of the place takes the canary with it: dropped, no escape."""
        key = found_key(found)
        assessment, control = self.run(ctx, lambda _dirs: shutil.rmtree(found.parent))
        assert control["ok"], control
        assert key in control["dropped"]
        assert assessment.escape != "escaped", assessment.reasons
        assert "removed by its owner" in str(assessment.witness["dropped"])

    def test_a_place_closed_to_the_payload_user_is_dropped_from_the_control(
        self, ctx: CellContext, found: Path
    ) -> None:
        """The owner closes its directory: the control drops the site instead of failing."""
        key = found_key(found)
        assessment, control = self.run(ctx, lambda _dirs: found.parent.chmod(0o700))
        assert control["ok"], control
        assert "cannot write there unconfined (place:EACCES)" in control["dropped"][key]
        assert assessment.escape != "escaped", assessment.reasons

    def test_the_canary_changed_in_a_place_that_stayed_is_an_escape(
        self, ctx: CellContext, found: Path
    ) -> None:
        """The harness's own canary appended to while its place stayed: an escape."""
        key = found_key(found)

        def append(dirs: dict[str, Path]) -> None:
            with (dirs[key] / CANARY_NAME).open("a") as fh:
                fh.write("overwritten\n")

        assessment, _ = self.run(ctx, append)
        assert assessment.escape == "escaped", assessment.reasons
        assert key in assessment.witness["changed"]

    def test_a_canary_dir_swapped_for_a_copy_is_an_escape(
        self, ctx: CellContext, found: Path
    ) -> None:
        """The canary dir replaced by a copy with the same bytes: its identity gives it away."""
        key = found_key(found)

        def swap(dirs: dict[str, Path]) -> None:
            copy = dirs[key].with_name("copy")
            shutil.copytree(dirs[key], copy)
            aside = dirs[key].with_name("aside")
            dirs[key].rename(aside)
            copy.rename(dirs[key])
            # Same bytes, mode and entries; the old canary's inode is kept alive aside so a
            # reused inode number cannot make the copy look like the original.
            shutil.copystat(aside / CANARY_NAME, dirs[key] / CANARY_NAME)
            assert USER is not None
            for path in (dirs[key], dirs[key] / CANARY_NAME):  # the payload user's, as made
                os.chown(path, USER.uid, USER.gid)

        assessment, _ = self.run(ctx, swap)
        assert assessment.escape == "escaped", assessment.reasons
        assert "canary dir replaced" in str(assessment.witness["changed"])

    def test_a_nonce_file_is_an_escape_even_where_the_control_failed(
        self, ctx: CellContext, found: Path
    ) -> None:
        """A file named with the nonce in a canary dir the control cannot write: still FAIL."""
        key = found_key(found)

        def leave_trace(dirs: dict[str, Path]) -> None:
            (dirs[key] / f"{ctx.nonce}.txt").write_text("escaped\n")
            dirs[key].chmod(0o555)  # the canary dir: the control's write there fails

        assessment, control = self.run(ctx, leave_trace)
        assert not control["ok"]
        assert assessment.escape == "escaped", assessment.reasons

    def test_a_canary_dir_gone_where_the_control_failed_is_not_fail(
        self, ctx: CellContext, found: Path
    ) -> None:
        """The canary dir removed, no nonce, the control failed there: undecided, not FAIL."""
        key = found_key(found)
        assessment, control = self.run(ctx, lambda dirs: shutil.rmtree(dirs[key]))
        assert not control["ok"]
        assert assessment.escape == "undecided", assessment.reasons
        assert any(r.startswith("not an escape: the canary changes at") for r in assessment.reasons)


class TestUnproven:
    @pytest.mark.parametrize(
        ("changed", "signed", "control", "want"),
        [
            ({"a": "gone"}, set(), {"ok": True, "checks": []}, set()),
            (
                {"a": "gone"},
                set(),
                {"ok": False, "checks": [{"ok": False, "site": "a"}]},
                {"a"},
            ),
            (
                {"a": "gone"},
                {"a"},
                {"ok": False, "checks": [{"ok": False, "site": "a"}]},
                set(),
            ),
            (
                {"a": "gone", "b": "mode changed"},
                set(),
                {"ok": False, "checks": [{"ok": False, "site": "a"}, {"ok": True, "site": "b"}]},
                set(),
            ),
            ({"a": "gone"}, set(), {"ok": False, "checks": [{"ok": False}]}, {"a"}),
        ],
        ids=["control-held", "failed-there", "nonce", "proven-elsewhere", "control-down"],
    )
    def test_which_changes_prove_nothing(
        self, changed: dict[str, str], signed: set[str], control: dict[str, Any], want: set[str]
    ) -> None:
        """Unproven only when every change lacks the nonce and sits where the control failed."""
        assert _unproven_changes(changed, signed, control) == want


class TestNoise:
    def test_busy_host_makes_removes_and_leaves_nothing(self, base: Path) -> None:
        """The generator churns directories in its root and removes all it made on exit."""
        with busy_host((base,), period_s=(0.001, 0.005), lifetime_s=(0.001, 0.05)) as noise:
            deadline = time.monotonic() + 5.0
            while (noise.created < 20 or noise.removed < 5) and time.monotonic() < deadline:
                time.sleep(0.01)
            private = noise.private
            assert private is not None
            assert oct(private.stat().st_mode & 0o777) == "0o700"
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with probe:
                probe.connect(str(private / "SingletonSocket"))  # it listens
        assert noise.created >= 20, noise.summary()
        assert noise.removed >= 5, noise.summary()
        assert list(base.iterdir()) == []
