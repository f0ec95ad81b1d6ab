"""fs_write_outside: a canary place in the payload home that moved during the cell fails it.

In the payload home only the payload user (or root) can move a directory, so a moved home
place is the swap of issue 23, never another program's housekeeping: unlike a /tmp place that
its owner removed (dropped from the cell), it fails the host control. The cell's user here is
nobody with a home under tmp_path, so the shared payload account's home is never touched.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from sandbox_attest.catalog.fs import FsWriteOutside
from sandbox_attest.catalog.spec import CellContext
from sandbox_attest.host.trust import PayloadUser
from tests.catalog.test_fs_write_outside import CONFINED, WorldLike

pytestmark = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="a cell of another uid needs root"
)

NOBODY = 65534


@pytest.fixture
def ctx(tmp_path: Path) -> CellContext:
    """A confined cell whose payload user is nobody, with a home of its own under tmp_path."""
    tmp_path.chmod(0o755)  # nobody must reach its home (and the canaries) below it
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    nonce = "n" + secrets.token_hex(8)
    cell_dir = tmp_path / "cells" / nonce
    (cell_dir / "workspace").mkdir(parents=True)
    (tmp_path / "world").mkdir()
    user = PayloadUser("nobody", NOBODY, NOBODY, frozenset(), home)
    return CellContext(
        probe="fs_write_outside",
        backend="unit",
        nonce=nonce,
        world=WorldLike(tmp_path / "world"),  # type: ignore[arg-type]  # only info.run_dir
        workspace=cell_dir / "workspace",
        cell_dir=cell_dir,
        claims=CONFINED,
        user=user,
    )


def test_a_home_place_re_pointed_during_the_cell_fails_the_control(
    ctx: CellContext, tmp_path: Path
) -> None:
    """~/.config re-pointed at a root dir after planting: a failed check names it; no drop."""
    spec = FsWriteOutside()
    spec.prepare(ctx)
    try:
        assert ctx.user is not None
        config = ctx.user.home / ".config"
        decoy = tmp_path / "decoy"
        decoy.mkdir()
        config.rename(config.with_name(".config-aside"))
        config.symlink_to(decoy)
        os.lchown(config, NOBODY, NOBODY)  # the payload user's own link
        control = spec.host_control(ctx)
        failed = {c["site"]: c["detail"] for c in control["checks"] if not c["ok"]}
        assert not control["ok"]
        assert "config" in failed
        assert "symlink" in failed["config"] or "another directory" in failed["config"]
        assert "config" not in control["dropped"]
        assert list(decoy.iterdir()) == []
    finally:
        spec.cleanup(ctx)
