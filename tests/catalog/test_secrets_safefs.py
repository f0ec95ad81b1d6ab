"""fs_read_secrets plants, checks and removes its canaries by descriptor and identity (issue 23)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.catalog import CellContext
from sandbox_attest.catalog.fs import FsReadSecrets
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import safefs
from sandbox_attest.run.runner import inside_route
from tests.catalog.test_host import CONFINED, StubWorld, stub_info

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="a link of another uid needs root to plant"
)

# The payload user's own uid, as its links and files would carry (nobody here).
PAYLOAD = (65534, 65534)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own ($HOME: the CellContexts here have no payload user)."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


@pytest.fixture
def make_ctx(tmp_path: Path) -> Iterator[Callable[[FsReadSecrets], CellContext]]:
    """CellContexts under tmp_path (as tests/catalog/test_host.py makes them), cleaned after."""
    made: list[tuple[FsReadSecrets, CellContext]] = []

    def make(spec: FsReadSecrets) -> CellContext:
        nonce = "n" + secrets.token_hex(8)
        cell_dir = tmp_path / nonce
        (cell_dir / "workspace").mkdir(parents=True)
        (tmp_path / "real.sock").touch()
        ctx = CellContext(
            probe=spec.id,
            backend="unit",
            nonce=nonce,
            world=StubWorld(stub_info(tmp_path / "real.sock")),
            workspace=cell_dir / "workspace",
            cell_dir=cell_dir,
            claims=CONFINED,
            route=inside_route(),
        )
        made.append((spec, ctx))
        return ctx

    yield make
    for spec, ctx in made:
        # What a test swapped in is named by cleanup (FixtureError); the test checked it.
        with contextlib.suppress(FixtureError):
            spec.cleanup(ctx)


def failed(control: dict[str, Any]) -> dict[str, str]:
    """The failed checks of a host control: what -> detail."""
    return {c["what"]: c["detail"] for c in control["checks"] if not c["ok"]}


def test_a_dir_re_pointed_after_planting_is_named_and_not_followed(
    make_ctx: Any, home: Path, tmp_path: Path
) -> None:
    """~/.ssh swapped for the payload's link after prepare: the check names it; decoy untouched."""
    spec = FsReadSecrets()
    ctx = make_ctx(spec)
    spec.prepare(ctx)
    assert spec.host_control(ctx)["ok"]
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (home / ".ssh").rename(home / ".ssh-aside")
    (home / ".ssh").symlink_to(decoy)
    os.lchown(home / ".ssh", *PAYLOAD)
    control = spec.host_control(ctx)
    assert not control["ok"]
    assert "symlink" in failed(control)["host reads ssh"]
    assert str(decoy) in failed(control)["host reads ssh"]
    with pytest.raises(FixtureError, match="left in place"):
        spec.cleanup(ctx)
    assert list(decoy.iterdir()) == []


def test_a_canary_swapped_in_its_dir_is_named_and_left(make_ctx: Any, home: Path) -> None:
    """A canary replaced by another file is not the harness's: named, and never removed."""
    spec = FsReadSecrets()
    ctx = make_ctx(spec)
    spec.prepare(ctx)
    canary = spec.secret_paths(ctx)["aws"]
    canary.rename(canary.with_name("aside"))  # kept, so its inode number is not reused
    canary.write_text("the payload's bytes")
    control = spec.host_control(ctx)
    assert "is another file now" in failed(control)["host reads aws"]
    with pytest.raises(FixtureError, match="not the file the harness made"):
        spec.cleanup(ctx)
    assert canary.read_text() == "the payload's bytes"
    del home


def test_a_dir_removed_by_a_concurrent_cleanup_is_made_again(
    make_ctx: Any, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~/.ssh removed (empty) between open and create, as another cell's cleanup may: retried."""
    spec = FsReadSecrets()
    ctx = make_ctx(spec)
    original = safefs.SafeDir.create_file
    removed: list[Path] = []

    def racing(self: safefs.SafeDir, name: str, *args: Any, **kwargs: Any) -> safefs.Identity:
        if self.path == home / ".ssh" and not removed:
            (home / ".ssh").rmdir()  # the other cell's cleanup, right now
            removed.append(self.path)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(safefs.SafeDir, "create_file", racing)
    spec.prepare(ctx)
    assert removed == [home / ".ssh"]
    assert spec.secret_paths(ctx)["ssh"].is_file()
    assert spec.host_control(ctx)["ok"]
