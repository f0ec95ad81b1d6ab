"""The runner checks the payload home's identity before and after every cell (issue 23)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_attest.host.trust import PayloadUser, home_identity
from sandbox_attest.run.runner import _home_moved, _unless_home_moved
from sandbox_attest.verdict import Decision, Verdict

pytestmark = pytest.mark.skipif(os.name != "posix", reason="directory descriptors are POSIX")


def user_at(home: Path) -> PayloadUser:
    """A payload user whose home is `home` (ids are this process's: nothing is chowned)."""
    return PayloadUser("someone", os.getuid(), os.getgid(), frozenset(), home)


def test_an_unchanged_home_is_not_named(tmp_path: Path) -> None:
    """The same directory before and after the cell: nothing to say."""
    user = user_at(tmp_path / "home")
    (tmp_path / "home").mkdir()
    before, why = home_identity(user)
    assert _home_moved(user, before, why) == ""


def test_a_home_replaced_during_the_cell_is_named(tmp_path: Path) -> None:
    """A home renamed away and made again names both inodes; a PASS becomes INCONCLUSIVE."""
    user = user_at(tmp_path / "home")
    (tmp_path / "home").mkdir()
    before, why = home_identity(user)
    (tmp_path / "home").rename(tmp_path / "moved")
    (tmp_path / "home").mkdir()
    moved = _home_moved(user, before, why)
    assert "the payload home changed during the cell" in moved
    decided = _unless_home_moved(Decision(Verdict.PASS, "all denied"), moved)
    assert decided.verdict == Verdict.INCONCLUSIVE
    assert decided.reason.startswith(moved)
    failed = Decision(Verdict.FAIL, "escape observed")
    assert _unless_home_moved(failed, moved) == failed


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="lchown needs root")
def test_a_home_swapped_for_a_symlink_is_named(tmp_path: Path) -> None:
    """A home that became a symlink cannot be opened safely, and the reason names the link."""
    user = user_at(tmp_path / "home")
    (tmp_path / "home").mkdir()
    before, why = home_identity(user)
    (tmp_path / "home").rename(tmp_path / "moved")
    (tmp_path / "home").symlink_to(tmp_path / "moved")
    # A link only root could change would be followed (safefs._trusted_link): this one is not
    # root's, as one the payload user planted would not be.
    os.lchown(tmp_path / "home", 65534, 65534)
    moved = _home_moved(user, before, why)
    assert "could not be opened safely" in moved
    assert "symlink" in moved
