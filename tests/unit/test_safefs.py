"""safefs: the harness's root operations under payload-reachable paths never follow a link."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path

import pytest

from sandbox_attest.catalog.canary import read_text, sha256
from sandbox_attest.host import safefs
from sandbox_attest.host.safefs import UnsafePathError, chown_tree, open_dir

pytestmark = pytest.mark.skipif(os.name != "posix", reason="directory descriptors are POSIX")

# An owner that is neither root nor this process's uid, for the ownership checks.
OTHER = (65534, 65534)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture(params=["openat2", "per-component"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with openat2 (where the kernel has it) and with the per-component walk."""
    if request.param == "openat2":
        if not safefs.openat2_supported():
            pytest.skip("this kernel or machine has no openat2")
        monkeypatch.setitem(safefs._openat2_state, "ok", value=True)
    else:
        monkeypatch.setitem(safefs._openat2_state, "ok", value=False)
    return str(request.param)


def planted_link(link: Path, target: Path) -> None:
    """A symlink as the payload user would plant it: owned by that user.

    A root-owned link in a dir only root writes is trusted and followed (as /var/run -> /run).
    """
    link.symlink_to(target)
    os.lchown(link, *OTHER)


def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A real a/b/c chain and a decoy directory standing for /etc/cron.hourly."""
    real = tmp_path / "a" / "b" / "c"
    real.mkdir(parents=True)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    return real, decoy


@needs_root
@pytest.mark.parametrize("component", ["a", "b", "c"])
def test_a_symlink_at_any_component_is_refused_and_named(
    tmp_path: Path, resolver: str, component: str
) -> None:
    """open_dir refuses a path with a symlink at any component and names the link's target."""
    del resolver
    real, decoy = tree(tmp_path)
    swapped = {"a": tmp_path / "a", "b": tmp_path / "a" / "b", "c": real}[component]
    swapped.rename(swapped.with_name(swapped.name + ".moved"))
    planted_link(swapped, decoy)
    (decoy / "b" / "c").mkdir(parents=True)  # so a followed link would succeed
    with pytest.raises(UnsafePathError) as caught:
        open_dir(real, shown="~/.ssh").close()
    assert "symlink" in str(caught.value)
    assert f"to {decoy}" in str(caught.value)


def test_a_plain_directory_opens_and_keeps_its_identity(tmp_path: Path, resolver: str) -> None:
    """An ordinary directory opens, and its identity is the directory's (dev, ino)."""
    del resolver
    real, _ = tree(tmp_path)
    with open_dir(real) as safe:
        st = real.stat()
        assert safe.identity() == (st.st_dev, st.st_ino)
        assert safe.still_same() == ""


@needs_root
def test_a_swap_between_open_and_use_is_not_followed(tmp_path: Path, resolver: str) -> None:
    """A dir swapped for a link after open: the file lands in the opened dir, never the decoy."""
    del resolver
    real, decoy = tree(tmp_path)
    with open_dir(real, shown="~/.ssh") as safe:
        moved = real.with_name("c.moved")
        real.rename(moved)
        planted_link(real, decoy)
        safe.create_file("canary", "secret\n", 0o600)
        assert list(decoy.iterdir()) == []
        assert (moved / "canary").read_text() == "secret\n"
        changed = safe.still_same()
    assert "symlink" in changed
    assert str(decoy) in changed


def test_create_file_refuses_a_planted_symlink(tmp_path: Path) -> None:
    """A symlink already at the name makes create_file fail; nothing is written through it."""
    real, decoy = tree(tmp_path)
    (real / "canary").symlink_to(decoy / "target")
    with open_dir(real) as safe, pytest.raises(FileExistsError):
        safe.create_file("canary", "x", 0o600)
    assert not (decoy / "target").exists()


@needs_root
def test_mkdir_and_create_file_set_mode_and_owner_on_what_they_made(tmp_path: Path) -> None:
    """Mode and owner are set on the harness's own new objects, whatever the umask."""
    real, _ = tree(tmp_path)
    old = os.umask(0o077)
    try:
        with open_dir(real) as safe:
            sub = safe.mkdir("sub", 0o755)
            ident = sub.create_file("f", b"data", 0o640, OTHER)
    finally:
        os.umask(old)
    st = (real / "sub").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o755, 0)
    st = (real / "sub" / "f").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, *OTHER)
    assert ident == (st.st_dev, st.st_ino)


def test_chmod_refuses_a_symlink_and_changes_a_socket(tmp_path: Path) -> None:
    """SafeDir.chmod never follows a link at the name, and reaches a socket inode through O_PATH."""
    real, decoy = tree(tmp_path)
    target = decoy / "file"
    target.write_text("x")
    target.chmod(0o600)
    (real / "link").symlink_to(target)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(real / "s.sock"))
        with open_dir(real) as safe:
            with pytest.raises(UnsafePathError, match="symlink"):
                safe.chmod("link", 0o666)
            safe.chmod("s.sock", 0o666)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE((real / "s.sock").lstat().st_mode) == 0o666


def test_unlink_refuses_a_replaced_file(tmp_path: Path) -> None:
    """A file the harness made, replaced by another, is named and left in place."""
    real, _ = tree(tmp_path)
    with open_dir(real) as safe:
        safe.create_file("canary", "ours")
        # Renamed aside, not unlinked: a freed inode number may be reused for the new file.
        (real / "canary").rename(real / "aside")
        (real / "canary").write_text("theirs")
        with pytest.raises(UnsafePathError, match="not the file the harness made"):
            safe.unlink("canary")
    assert (real / "canary").read_text() == "theirs"


def test_rmtree_removes_what_it_made_and_names_the_rest(tmp_path: Path) -> None:
    """SafeDir.rmtree removes its own objects, names a foreign file and link, follows neither."""
    real, decoy = tree(tmp_path)
    (decoy / "keep").write_text("decoy's own")
    with open_dir(real) as safe:
        made = safe.mkdir("canaries")
        made.create_file("canary", "ours")
        (real / "canaries" / "planted").write_text("foreign")
        (real / "canaries" / "link").symlink_to(decoy)
        foreign = safe.rmtree("canaries")
    assert sorted(p.name for p in (real / "canaries").iterdir()) == ["link", "planted"]
    assert any("symlink" in f and str(decoy) in f for f in foreign)
    assert any("planted" in f for f in foreign)
    assert (decoy / "keep").read_text() == "decoy's own"


def test_rmtree_also_foreign_removes_without_following(tmp_path: Path) -> None:
    """With also_foreign, foreign entries go too, and a link's target is untouched."""
    real, decoy = tree(tmp_path)
    (decoy / "keep").write_text("decoy's own")
    with open_dir(real) as safe:
        safe.mkdir("canaries").create_file("canary", "ours")
        (real / "canaries" / "link").symlink_to(decoy)
        foreign = safe.rmtree("canaries", also_foreign=True)
    assert not (real / "canaries").exists()
    assert len(foreign) == 1
    assert (decoy / "keep").read_text() == "decoy's own"


def test_rmtree_refuses_a_swapped_top(tmp_path: Path) -> None:
    """A made dir swapped for a link to the decoy is named and the decoy's content stays."""
    real, decoy = tree(tmp_path)
    (decoy / "keep").write_text("decoy's own")
    with open_dir(real) as safe:
        safe.mkdir("canaries").create_file("canary", "ours")
        (real / "canaries").rename(real / "moved")
        (real / "canaries").symlink_to(decoy)
        foreign = safe.rmtree("canaries")
    assert foreign
    assert "symlink" in foreign[0]
    assert (decoy / "keep").read_text() == "decoy's own"


@needs_root
def test_chown_tree_follows_no_link_and_skips_hard_links(tmp_path: Path) -> None:
    """chown_tree changes the tree's own objects, not a link's target nor a hard-linked file."""
    real, decoy = tree(tmp_path)
    outside = decoy / "outside"
    outside.write_text("root's")
    (real / "f").write_text("ours")
    (real / "sub").mkdir()
    (real / "sub" / "link").symlink_to(decoy)
    os.link(outside, real / "hard")
    with open_dir(real) as safe:
        chown_tree(safe, OTHER)
    assert (real / "f").stat().st_uid == OTHER[0]
    assert (real / "sub").stat().st_uid == OTHER[0]
    assert decoy.stat().st_uid == 0
    assert outside.stat().st_uid == 0


def test_open_file_refuses_a_fifo(tmp_path: Path) -> None:
    """A FIFO left at a canary's name is refused at once instead of hanging the harness."""
    real, _ = tree(tmp_path)
    os.mkfifo(real / "canary")
    with open_dir(real) as safe, pytest.raises(UnsafePathError, match="fifo"):
        safe.read_bytes("canary")


@needs_root
def test_a_link_only_root_can_change_is_followed(tmp_path: Path, resolver: str) -> None:
    """A root link in a dir only root writes (as /var/run -> /run) is followed, also via ".."."""
    del resolver
    real, _ = tree(tmp_path)
    system = tmp_path / "system"
    system.mkdir(mode=0o755)
    (system / "run").symlink_to("../a/b")  # relative, with "..": resolved from system/
    with open_dir(system / "run" / "c") as safe:
        assert safe.identity() == (real.stat().st_dev, real.stat().st_ino)


@needs_root
def test_a_root_link_in_a_dir_others_may_write_is_refused(tmp_path: Path) -> None:
    """A root-owned link in a dir others may write (not sticky) could be replaced: refused."""
    real, _ = tree(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "run").symlink_to(real)
    with pytest.raises(UnsafePathError, match="symlink"):
        open_dir(shared / "run").close()


def test_canary_reads_refuse_a_fifo_and_a_final_symlink(tmp_path: Path) -> None:
    """The host's canary reads return None for a planted FIFO or link instead of hanging."""
    real, decoy = tree(tmp_path)
    (decoy / "secret").write_text("not the canary")
    os.mkfifo(real / "fifo")
    (real / "link").symlink_to(decoy / "secret")
    (real / "canary").write_text("ours\n")
    assert (sha256(real / "fifo"), read_text(real / "fifo")) == (None, None)
    assert (sha256(real / "link"), read_text(real / "link")) == (None, None)
    assert read_text(real / "canary") == "ours\n"
    assert sha256(real / "canary") == hashlib.sha256(b"ours\n").hexdigest()
