"""trust.give and the payload home: root follows no path the payload user can change (issue 23)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox_attest.errors import ConfigError
from sandbox_attest.host.safefs import UnsafePathError
from sandbox_attest.host.trust import PayloadUser, _ensure_home, give, home_identity, open_home

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another uid needs root"
)

# nobody/nogroup: an unprivileged owner that exists on every Linux host, and is not root.
NOBODY = 65534


def someone(home: Path) -> PayloadUser:
    """A payload user whose home is `home` (the account itself is nobody's ids)."""
    return PayloadUser("nobody", NOBODY, NOBODY, frozenset(), home)


def owners(root: Path) -> dict[str, int]:
    """Relative path -> owner uid of every entry under `root`, links not followed."""
    return {str(p.relative_to(root)): p.lstat().st_uid for p in sorted(root.rglob("*"))}


def test_give_hands_over_the_tree_but_not_a_link_target(tmp_path: Path) -> None:
    """A recursive give chowns the harness's files, never a symlink's target outside the tree."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "root-file").write_text("root's")
    tree = tmp_path / "workspace"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "file").write_text("x")
    (tree / "sub" / "escape").symlink_to(outside)
    give(tree, someone(tmp_path), recursive=True)
    assert tree.stat().st_uid == NOBODY
    assert (tree / "sub").stat().st_uid == NOBODY
    assert (tree / "sub" / "file").stat().st_uid == NOBODY
    assert owners(outside) == {"root-file": 0}
    assert outside.stat().st_uid == 0


def test_give_refuses_a_symlink_anywhere_on_the_path(tmp_path: Path) -> None:
    """A parent swapped for a symlink to a root dir makes give refuse, naming the link."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "canary").write_text("root's")
    (tmp_path / "home").symlink_to(decoy)
    os.lchown(tmp_path / "home", NOBODY, NOBODY)  # the payload user's link, as it would plant it
    with pytest.raises(UnsafePathError, match="symlink"):
        give(tmp_path / "home" / "canary", someone(tmp_path))
    assert (decoy / "canary").stat().st_uid == 0


def test_give_skips_what_the_harness_does_not_own(tmp_path: Path) -> None:
    """A file of a third uid inside the tree stays that uid's: give hands over root's alone."""
    tree = tmp_path / "workspace"
    tree.mkdir()
    (tree / "theirs").write_text("x")
    os.chown(tree / "theirs", 1, 1)  # daemon: some other account's file, planted in the tree
    give(tree, someone(tmp_path), recursive=True)
    assert (tree / "theirs").stat().st_uid == 1


def test_ensure_home_refuses_a_parent_others_may_write(tmp_path: Path) -> None:
    """A home under a directory others may write could itself be swapped: refused, named."""
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o1777)
    with pytest.raises(ConfigError, match="writable by nobody else"):
        _ensure_home(someone(parent / "home"))


def test_ensure_home_refuses_a_home_that_is_a_symlink(tmp_path: Path) -> None:
    """A home swapped for a symlink is refused and named, and its target is not chowned."""
    parent = tmp_path / "base"
    parent.mkdir(mode=0o755)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (parent / "home").symlink_to(decoy)
    with pytest.raises(UnsafePathError, match="symlink"):
        _ensure_home(someone(parent / "home"))
    assert decoy.stat().st_uid == 0


def test_ensure_home_makes_the_home_the_users_0700(tmp_path: Path) -> None:
    """A missing home is made under a root 0755 parent, the user's, 0700, whatever the umask."""
    parent = tmp_path / "base"
    parent.mkdir()
    parent.chmod(0o755)
    old = os.umask(0o022)
    try:
        _ensure_home(someone(parent / "home"))
    finally:
        os.umask(old)
    info = (parent / "home").lstat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (NOBODY, 0o700)
    identity, why = home_identity(someone(parent / "home"))
    assert (identity, why) == ((info.st_dev, info.st_ino), "")
    with open_home(someone(parent / "home")) as home:
        assert home.still_same() == ""
