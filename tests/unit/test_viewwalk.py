"""The host's walk of a payload's view (sandbox_attest/host/viewwalk.py): bounds and identity.

Each test builds a small tree standing for a process's root and a fake procfs pointing at it
(`<proc>/<pid>/root`, `<proc>/<pid>/mountinfo`), then walks it as the host would: real
sockets, real symlinks, real device nodes where root can make them.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_attest.host.viewwalk import (
    Bounds,
    HostSocket,
    match_sockets,
    parse_mountinfo,
    walk_view,
)

PID = 4242


@pytest.fixture
def view() -> Iterator[tuple[Path, Path]]:
    """(the fake procfs, the view's root): short paths, so unix sockets bind there."""
    with tempfile.TemporaryDirectory(prefix="vw", dir="/tmp") as base:
        proc, root = Path(base) / "p", Path(base) / "r"
        (proc / str(PID)).mkdir(parents=True)
        root.mkdir()
        (proc / str(PID) / "root").symlink_to(root)
        mount(proc, [("/", "ext4")])
        yield proc, root


def mount(proc: Path, points: list[tuple[str, str]]) -> None:
    """Write the fake process's mountinfo: one line per (mount point, fstype)."""
    lines = [
        f"{i} 1 0:{i} / {point.replace(' ', chr(92) + '040')} rw - {fstype} src rw"
        for i, (point, fstype) in enumerate(points, start=20)
    ]
    (proc / str(PID) / "mountinfo").write_text("\n".join(lines) + "\n")


def listen(path: Path) -> socket.socket:
    """A listening unix socket at `path`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    return sock


def ident(path: Path) -> tuple[int, int]:
    """(st_dev, st_ino) of `path`, not followed."""
    st = path.lstat()
    return st.st_dev, st.st_ino


class TestFinds:
    def test_sockets_anywhere_with_their_identity(self, view: tuple[Path, Path]) -> None:
        """A socket is found at its inside path, deep or shallow, with its (dev, ino)."""
        proc, root = view
        (root / "run" / "a" / "b").mkdir(parents=True)
        with listen(root / "run" / "a" / "b" / "d.sock"), listen(root / "top.sock"):
            walk = walk_view(PID, proc=str(proc), host_root=str(root.parent / "nohost"))
            assert walk.seen
            assert walk.sockets == {
                "/run/a/b/d.sock": ident(root / "run" / "a" / "b" / "d.sock"),
                "/top.sock": ident(root / "top.sock"),
            }
            assert walk.not_covered == []

    @pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device node needs root")
    def test_device_nodes_with_their_numbers(self, view: tuple[Path, Path]) -> None:
        """A device node outside /dev is recorded with its kind and major:minor."""
        proc, root = view
        (root / "host" / "dev").mkdir(parents=True)
        os.mknod(root / "host" / "dev" / "autofs", 0o600 | 0o020000, os.makedev(10, 235))
        walk = walk_view(PID, proc=str(proc), host_root=str(root.parent / "nohost"))
        assert walk.devices == {"/host/dev/autofs": {"kind": "char", "rdev": "10:235"}}

    def test_a_symlink_is_never_followed(self, view: tuple[Path, Path]) -> None:
        """A symlink out of the view (to a host dir with a socket) is an entry, not a way."""
        proc, root = view
        outside = root.parent / "host"
        outside.mkdir()
        with listen(outside / "daemon.sock"):
            (root / "escape").symlink_to(outside)
            (root / "abs").symlink_to("/")
            walk = walk_view(PID, proc=str(proc), host_root=str(root.parent / "nohost"))
        assert walk.sockets == {}
        assert walk.dirs == 1

    def test_unreadable_root_is_not_seen(self, tmp_path: Path) -> None:
        """A pid whose root cannot be opened gives a walk that says so, and nothing else."""
        walk = walk_view(PID, proc=str(tmp_path))
        assert not walk.seen
        assert f"{tmp_path}/{PID}/root" in walk.why


class TestBounds:
    def test_pseudo_file_systems_are_skipped_where_mounted(self, view: tuple[Path, Path]) -> None:
        """A procfs mounted anywhere (here /host proc) is not entered, and the evidence says so."""
        proc, root = view
        (root / "host proc").mkdir()
        mount(proc, [("/", "ext4"), ("/host proc", "proc")])
        with listen(root / "host proc" / "x.sock"):
            walk = walk_view(PID, proc=str(proc), host_root=str(root.parent / "nohost"))
        assert walk.sockets == {}
        assert "procfs" in walk.skipped["/host proc"]

    def test_depth_bound_is_a_named_cut_off(self, view: tuple[Path, Path]) -> None:
        """Directories past the depth bound are not entered, and the cut-off names them."""
        proc, root = view
        deep = root / "a" / "b" / "c"
        deep.mkdir(parents=True)
        with listen(deep / "s.sock"), listen(root / "a" / "t.sock"):
            walk = walk_view(
                PID, proc=str(proc), host_root=str(root.parent / "n"), bounds=Bounds(depth=2)
            )
        assert list(walk.sockets) == ["/a/t.sock"]
        assert any("below depth 2" in c and "/a/b/c" in c for c in walk.not_covered)

    def test_entry_bound_is_a_named_cut_off(self, view: tuple[Path, Path]) -> None:
        """The walk stops at its entry bound and names the directories it did not list."""
        proc, root = view
        for i in range(5):
            (root / f"d{i}").mkdir()
        walk = walk_view(
            PID, proc=str(proc), host_root=str(root.parent / "n"), bounds=Bounds(entries=3)
        )
        assert walk.entries == 5  # the root's listing is finished, then nothing more
        assert any("stopped at 3 entries: 5 directories not listed" in c for c in walk.not_covered)

    def test_time_bound_is_a_named_cut_off(self, view: tuple[Path, Path]) -> None:
        """A walk out of time stops before its first directory and says so."""
        proc, root = view
        walk = walk_view(
            PID, proc=str(proc), host_root=str(root.parent / "n"), bounds=Bounds(seconds=-1)
        )
        assert walk.dirs == 0
        assert any("s bound: 1 directories not listed (/)" in c for c in walk.not_covered)

    def test_host_twin_is_pruned_unless_a_host_socket_lies_below(
        self, view: tuple[Path, Path]
    ) -> None:
        """A dir that is the host's own at its path is pruned, unless a known socket is below."""
        proc, root = view
        (root / "usr" / "lib").mkdir(parents=True)
        (root / "run").mkdir()
        with listen(root / "usr" / "lib" / "u.sock"), listen(root / "run" / "r.sock"):
            # The view's root is the host's root here: every directory is the host's twin.
            walk = walk_view(PID, proc=str(proc), host_root=str(root), known=["/run/r.sock"])
        assert "/usr" in walk.pruned
        assert list(walk.sockets) == ["/run/r.sock"]
        evidence = walk.as_evidence()
        assert "/usr" in evidence["pruned"]
        assert "the host's own directory" in evidence["pruned_why"]

    def test_pruning_can_be_turned_off(self, view: tuple[Path, Path]) -> None:
        """A caller after every node (the host's own too) walks the host's twins as well."""
        proc, root = view
        (root / "usr").mkdir()
        with listen(root / "usr" / "u.sock"):
            walk = walk_view(PID, proc=str(proc), host_root=str(root), prune=False)
        assert walk.pruned == {}
        assert list(walk.sockets) == ["/usr/u.sock"]

    def test_a_mount_below_stops_pruning(self, view: tuple[Path, Path]) -> None:
        """A twin dir with a mount of the view below it is walked: the mount may hold anything."""
        proc, root = view
        (root / "usr" / "m").mkdir(parents=True)
        mount(proc, [("/", "ext4"), ("/usr/m", "tmpfs")])
        with listen(root / "usr" / "x.sock"):
            walk = walk_view(PID, proc=str(proc), host_root=str(root))
        assert list(walk.sockets) == ["/usr/x.sock"]
        assert "/usr" not in walk.pruned

    def test_no_mount_table_no_pruning(self, view: tuple[Path, Path]) -> None:
        """Without the view's mount table nothing is pruned, /proc is skipped by path."""
        proc, root = view
        (proc / str(PID) / "mountinfo").unlink()
        (root / "usr").mkdir()
        (root / "proc").mkdir()
        with listen(root / "usr" / "x.sock"):
            walk = walk_view(PID, proc=str(proc), host_root=str(root))
        assert list(walk.sockets) == ["/usr/x.sock"]
        assert "/proc" in walk.skipped
        assert any("mount table was unreadable" in c for c in walk.not_covered)


class TestIdentity:
    def test_host_socket_is_matched_at_another_path(self, view: tuple[Path, Path]) -> None:
        """The host's socket bound elsewhere is matched by (dev, ino), not by its path."""
        proc, root = view
        (root / "run").mkdir()
        with listen(root / "run" / "host-docker.sock"), listen(root / "other.sock"):
            walk = walk_view(PID, proc=str(proc), host_root=str(root.parent / "n"))
            host = {
                ident(root / "run" / "host-docker.sock"): HostSocket(
                    "/var/run/docker.sock", "daemon"
                )
            }
            found = match_sockets(walk, host)
        assert [(f["inside"], f["host"], f["kind"]) for f in found] == [
            ("/run/host-docker.sock", "/var/run/docker.sock", "daemon")
        ]

    def test_same_name_other_inode_is_not_the_host_s(self, view: tuple[Path, Path]) -> None:
        """A socket at the host's path but of another inode (the sandbox's own) is no match."""
        proc, root = view
        with listen(root / "docker.sock"):
            walk = walk_view(PID, proc=str(proc), host_root=str(root.parent / "n"))
        host = {(1, 2): HostSocket("/docker.sock", "daemon")}
        assert match_sockets(walk, host) == []

    def test_mountinfo_escapes_are_undone(self) -> None:
        """Mount points with spaces (an octal escape) come back as the process sees them."""
        text = "36 35 98:0 / /mnt\\040x rw - tmpfs t rw\nbad line\n"
        assert parse_mountinfo(text) == [("/mnt x", "tmpfs")]
