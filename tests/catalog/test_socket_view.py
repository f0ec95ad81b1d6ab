"""The host's sockets found by identity in a payload's view, and the session it is given.

catalog/ipc/socket_view.py turns the walk's matches into what the payload is told and what
the verdict says; host/login_session.py makes the places a login session has. Real sockets,
real directories, real ownership (root only where a chown is the point).
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.catalog.ipc.socket_view import (
    daemon_reason,
    host_table,
    real_reached,
    walk_summary,
    write_hint,
)
from sandbox_attest.catalog.socket_witness import walk_socket_dirs
from sandbox_attest.host import login_session
from sandbox_attest.host.safefs import UnsafePathError
from sandbox_attest.host.trust import PayloadUser
from sandbox_attest.host.viewwalk import HostSocket

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def exposed(inside: str, host: str, kind: str, ino: int = 7) -> dict[str, Any]:
    """One match of the walk, as `match_sockets` gives it."""
    return {"inside": inside, "host": host, "kind": kind, "dev": 1, "ino": ino}


class TestHostTable:
    def test_witnesses_win_and_the_route_is_no_exposure(self, tmp_path: Path) -> None:
        """A socket both listed and witnessed is a witness; the egress route's is left out."""
        route = tmp_path / "r.sock"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(route))
            st = route.lstat()
            ident = (st.st_dev, st.st_ino)
            table = host_table(
                {"/run/w.sock": (1, 2)},
                {"/run/user/9/bus": (1, 3)},
                str(tmp_path / "no-daemon.sock"),
                {(1, 2): "/run/w.sock", (1, 4): "/run/dbus.sock", ident: str(route)},
                (str(route),),
            )
        assert table[(1, 2)] == HostSocket("/run/w.sock", "witness")
        assert table[(1, 3)] == HostSocket("/run/user/9/bus", "session")
        assert table[(1, 4)] == HostSocket("/run/dbus.sock", "host")
        assert ident not in table


class TestReached:
    def test_real_daemon_counts_only_where_the_walk_found_it(self) -> None:
        """A `view:` connect counts for a real daemon found there by identity, nowhere else."""
        view = {
            "exposed": [
                exposed("/run/host-docker.sock", "/var/run/docker.sock", "docker"),
                exposed("/run/w.sock", "/run/w.sock", "witness"),
            ]
        }
        attempts: list[dict[str, Any]] = [
            {"what": "view:/run/host-docker.sock", "outcome": "succeeded", "dev": 1, "ino": 7},
            {"what": "view:/run/w.sock", "outcome": "succeeded"},  # a witness: its log decides
            {"what": "view:/elsewhere.sock", "outcome": "succeeded"},  # not the host's
            {"what": "path:/run/host-docker.sock", "outcome": "succeeded"},
        ]
        found = real_reached(view, attempts)
        assert [f["inside"] for f in found] == ["/run/host-docker.sock"]

    def test_disagreeing_identity_is_not_counted(self) -> None:
        """A payload that reports another inode at that path is not credited with the host's."""
        view = {"exposed": [exposed("/x.sock", "/run/docker.sock", "docker")]}
        attempt = {"what": "view:/x.sock", "outcome": "succeeded", "dev": 1, "ino": 8}
        assert real_reached(view, [attempt]) == []

    def test_daemon_reason_names_the_inside_path_and_the_fix(self) -> None:
        """The fake daemon's socket found elsewhere is named where it sat, with the fix."""
        view = {"exposed": [exposed("/run/host-docker.sock", "/w/daemon.sock", "daemon")]}
        reason = daemon_reason(view, "/w/daemon.sock")
        assert reason is not None
        assert "/w/daemon.sock is in the payload's view at /run/host-docker.sock" in reason
        assert "do not bind host sockets" in reason
        assert daemon_reason({"exposed": []}, "/w/daemon.sock") is None


class TestWalkSummary:
    def test_cut_offs_are_said(self) -> None:
        """The verdict's phrase names the walk's cut-offs, so a reader sees where it stopped."""
        view = {
            "walk": {"seen": True, "sockets": {"/a": [1, 2]}, "ms": 3.0, "not_covered": ["x"]},
            "exposed": [],
        }
        assert walk_summary(view) == (
            "host walk of the view: 1 sockets, 0 of them the host's (3.0 ms); not covered: x"
        )

    def test_no_walk_is_said(self) -> None:
        """A view the host could not walk is said, never taken for an empty one."""
        view = {"walk": {"seen": False, "why": "cannot open /proc/1/root: EACCES"}}
        assert walk_summary(view) == (
            "the host did not walk the payload's view: cannot open /proc/1/root: EACCES"
        )


class TestHint:
    def test_hint_says_how_to_try_each(self, tmp_path: Path) -> None:
        """The payload's list: witnesses and session sockets get the nonce, real ones a touch."""
        ok, why = write_hint(
            tmp_path,
            ".kiln-map-n1",
            [
                exposed("/a", "/run/w", "witness"),
                exposed("/b", "/run/user/9/bus", "session"),
                exposed("/c", "/w/d.sock", "daemon"),
                exposed("/d", "/run/dbus.sock", "host"),
            ],
        )
        assert (ok, why) == (True, "")
        paths = json.loads((tmp_path / ".kiln-map-n1").read_text())["paths"]
        assert paths == [["/a", "witness"], ["/b", "witness"], ["/c", "daemon"], ["/d", "touch"]]

    def test_a_planted_name_is_not_overwritten(self, tmp_path: Path) -> None:
        """Something already at the hint's name (the payload's) is refused, not followed."""
        (tmp_path / ".kiln-map-n1").symlink_to("/etc/passwd")
        ok, why = write_hint(tmp_path, ".kiln-map-n1", [])
        assert not ok
        assert "could not write .kiln-map-n1" in why


@needs_root
class TestLoginSession:
    @pytest.fixture
    def places(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
        """A private /run and /tmp for the session (root's, like the real ones)."""
        run, tmp = tmp_path / "run", tmp_path / "tmp"
        run.mkdir()
        tmp.mkdir(mode=0o1777)
        monkeypatch.setattr(login_session, "RUN", run)
        monkeypatch.setattr(login_session, "TMP", tmp)
        monkeypatch.setenv("SANDBOX_ATTEST_STATE_DIR", str(tmp_path / "state"))
        return run, tmp

    def user(self) -> PayloadUser:
        """An ordinary uid that is not root's."""
        return PayloadUser("nobody", 65534, 65534, frozenset(), Path("/nonexistent"))

    def test_made_as_a_login_makes_them_and_removed_after(self, places: tuple[Path, Path]) -> None:
        """The runtime dir and the ssh-agent dir are 0700 and the user's; close removes them."""
        run, _ = places
        session = login_session.open_session(self.user())
        runtime = run / "user" / "65534"
        assert session.env()["XDG_RUNTIME_DIR"] == str(runtime)
        for place in (runtime, runtime / "gnupg", runtime / "podman", session.ssh_sock.parent):
            st = place.lstat()
            assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, 65534), place
        assert set(session.sites()) >= {runtime / "bus", session.ssh_sock}
        removed = session.close()
        assert not runtime.exists()
        assert not session.ssh_sock.parent.exists()
        assert str(session.ssh_sock.parent) in removed

    def test_an_open_session_is_in_an_agents_environment(self, places: tuple[Path, Path]) -> None:
        """While open, its variables are what a command wrapper is started with; after, not."""
        del places
        assert login_session.current_env() == {}
        session = login_session.open_session(self.user())
        try:
            assert login_session.current_env() == session.env()
            assert set(session.env()) == {"XDG_RUNTIME_DIR", "SSH_AUTH_SOCK"}
        finally:
            session.close()
        assert login_session.current_env() == {}

    def test_an_open_session_s_dirs_are_no_witness_site(self, places: tuple[Path, Path]) -> None:
        """A walk for socket dirs that excludes `session_dirs()` skips the open session's.

        Its ssh-agent dir holds a socket once the session's witness is in it; a cell's own
        witness planted there kept `close` from removing the dir (left in /tmp after a run).
        """
        _, tmp = places
        session = login_session.open_session(self.user())
        try:
            agent = socket.socket(socket.AF_UNIX)
            agent.bind(str(session.ssh_sock))  # the session's witness, as acquire plants it
            dirs = login_session.session_dirs()
            assert session.ssh_sock.parent in dirs
            found = walk_socket_dirs(str(tmp), 1, exclude=tuple(str(d) for d in dirs))
            assert str(session.ssh_sock.parent) not in found
            assert str(session.ssh_sock.parent) in walk_socket_dirs(str(tmp), 1)
            agent.close()
            session.ssh_sock.unlink()
        finally:
            session.close()
        assert login_session.session_dirs() == []

    def test_another_user_s_runtime_dir_is_refused(self, places: tuple[Path, Path]) -> None:
        """A runtime dir already there with another owner is not used, and is left alone."""
        run, _ = places
        (run / "user" / "65534").mkdir(parents=True, mode=0o700)
        with pytest.raises(UnsafePathError, match="not a session directory"):
            login_session.open_session(self.user())
        assert (run / "user" / "65534").is_dir()

    def test_a_symlinked_runtime_dir_is_not_followed(self, places: tuple[Path, Path]) -> None:
        """A runtime dir that is a symlink (to /etc) is refused, never entered."""
        run, _ = places
        (run / "user").mkdir()
        (run / "user" / "65534").symlink_to("/etc")
        with pytest.raises(UnsafePathError):
            login_session.open_session(self.user())

    def test_one_run_holds_a_session_at_a_time(self, places: tuple[Path, Path]) -> None:
        """While one run holds the user's session another is refused (the names are fixed)."""
        del places
        first = login_session.open_session(self.user())
        try:
            with pytest.raises(login_session.SessionBusyError, match="another run holds"):
                login_session.open_session(self.user(), wait=0)
        finally:
            first.close()
        login_session.open_session(self.user(), wait=0).close()

    def test_a_stale_socket_at_a_daemon_s_name_is_cleared(self, places: tuple[Path, Path]) -> None:
        """A socket left at bus (a killed run's, or the user's own) is gone once a run holds it."""
        run, _ = places
        runtime = run / "user" / "65534"
        runtime.mkdir(parents=True, mode=0o700)
        os.chown(runtime, 65534, 65534)
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(str(runtime / "bus"))
        session = login_session.open_session(self.user())
        try:
            assert not (runtime / "bus").exists()
        finally:
            session.close()
        assert runtime.is_dir()  # the user's own runtime dir was there before: it stays
