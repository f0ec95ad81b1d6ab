"""Witness sockets and the class reading of ipc_unix_socket_escape, over real sockets.

The walk runs over real directory trees holding real sockets; the witnesses are real
listening AF_UNIX sockets that real clients connect to; the assessor reads hand-made reports
against those real witnesses and the host's real stat of real sockets. The sweep journal is
pointed at the test's own directory, never the harness's.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.catalog.controls import save_state
from sandbox_attest.catalog.ipc.unix_socket import IpcUnixSocketEscape
from sandbox_attest.catalog.socket_witness import (
    WitnessSockets,
    abstract_names,
    abstract_witness,
    bind_unix,
    remove_nonce_files,
    walk_socket_dirs,
    witness_name,
)
from sandbox_attest.host.journal import JOURNAL, STATE_ENV
from sandbox_attest.run import sweep
from sandbox_attest.verdict import Verdict, decide
from tests.catalog.test_proc import CONFINED, OK_CONTROL, OPEN, Records, att, make_ctx


@pytest.fixture(autouse=True)
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sweep journal lives in this test's directory."""
    state = tmp_path / "state"
    monkeypatch.setenv(STATE_ENV, str(state))
    return state / JOURNAL


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    """Sockets a test binds, closed at the end."""
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def plant_socket(path: Path, held: list[socket.socket]) -> Path:
    """A real listening socket at `path` (parents made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    held.append(bind_unix(str(path)))
    return path


def send_line(address: str, line: str) -> None:
    """Connect to a unix socket and send one line, as the payload does to a witness."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        if address.startswith("\0"):
            sock.connect(address)
        else:  # through the directory's fd: pytest's tmp paths outgrow sun_path
            dir_fd = os.open(Path(address).parent, os.O_RDONLY)
            try:
                sock.connect(f"/proc/self/fd/{dir_fd}/{Path(address).name}")
            finally:
                os.close(dir_fd)
        sock.sendall(line.encode())


def wait_heard(witnesses: WitnessSockets, nonce: str, count: int, phase: str = "cell") -> None:
    """Poll until `count` witnesses heard `nonce` in `phase` (the listener is a thread)."""
    deadline = time.monotonic() + 3.0
    while len(witnesses.heard(nonce, phase)) < count and time.monotonic() < deadline:
        time.sleep(0.01)


class TestWalk:
    def test_finds_socket_dirs_to_the_depth(self, tmp_path: Path, listening: list[Any]) -> None:
        """The walk lists each directory holding a socket, down to its depth and no deeper."""
        plant_socket(tmp_path / "a" / "s.sock", listening)
        plant_socket(tmp_path / "a" / "b" / "c" / "t.sock", listening)
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "plain.txt").write_text("not a socket")
        assert walk_socket_dirs(str(tmp_path), 1) == [str(tmp_path / "a")]
        assert walk_socket_dirs(str(tmp_path), 3) == [
            str(tmp_path / "a"),
            str(tmp_path / "a" / "b" / "c"),
        ]

    def test_never_follows_links_or_enters_excluded(
        self, tmp_path: Path, listening: list[Any]
    ) -> None:
        """A symlinked directory is not followed and an excluded tree is not entered."""
        plant_socket(tmp_path / "real" / "s.sock", listening)
        (tmp_path / "link").symlink_to(tmp_path / "real")
        assert walk_socket_dirs(str(tmp_path), 2) == [str(tmp_path / "real")]
        assert walk_socket_dirs(str(tmp_path), 2, exclude=(str(tmp_path / "real"),)) == []

    def test_own_witnesses_do_not_make_a_socket_dir(self, tmp_path: Path) -> None:
        """A directory whose only socket is a witness is not a place the host keeps sockets."""
        witnesses = WitnessSockets("n" + secrets.token_hex(8), [tmp_path], abstract=False)
        witnesses.plant()
        try:
            assert walk_socket_dirs(str(tmp_path), 1) == []
        finally:
            witnesses.stop()

    def test_abstract_names_lists_listeners_only(self) -> None:
        """A listening abstract socket is listed; one bound without listen() is not."""
        listening_name = f"sa-test-listen-{secrets.token_hex(6)}"
        bound_name = f"sa-test-bound-{secrets.token_hex(6)}"
        with (
            bind_unix("\0" + listening_name),
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound,
        ):
            bound.bind("\0" + bound_name)
            names = abstract_names()
        assert listening_name in names
        assert bound_name not in names


class TestWitnessSockets:
    def test_journals_hears_and_removes(self, tmp_path: Path, journal: Path) -> None:
        """Planted witnesses are journalled, hear the nonce and the control apart, then go."""
        nonce = "n" + secrets.token_hex(8)
        dirs = [tmp_path / "one", tmp_path / "two"]
        for d in dirs:
            d.mkdir()
        witnesses = WitnessSockets(nonce, dirs, abstract=True)
        witnesses.plant()
        paths = [str(d / witness_name(nonce)) for d in dirs]
        entry = journal / f"socket-witness-{nonce}.json"
        assert entry.exists()
        assert sorted(witnesses.planted) == sorted([*paths, "@" + abstract_witness(nonce)])
        assert all((Path(p).stat().st_mode & 0o777) == 0o666 for p in paths)
        witnesses.start()
        send_line(paths[0], f"SANDBOX-ATTEST-WITNESS {nonce}\n")
        send_line("\0" + abstract_witness(nonce), f"SANDBOX-ATTEST-WITNESS {nonce}\n")
        wait_heard(witnesses, nonce, 2)
        witnesses.enter_control()
        send_line(paths[1], "SANDBOX-ATTEST-WITNESS hcontrol\n")
        wait_heard(witnesses, "hcontrol", 1, phase="host-control")
        heard = {e["witness"] for e in witnesses.heard(nonce)}
        assert heard == {paths[0], "@" + abstract_witness(nonce)}
        assert [e["witness"] for e in witnesses.heard("hcontrol", "host-control")] == [paths[1]]
        assert witnesses.heard(nonce)[0]["peer"]["pid"] == os.getpid()
        assert sorted(witnesses.stop()) == sorted(paths)
        assert not any(Path(p).exists() for p in paths)
        assert not entry.exists()

    def test_a_killed_runs_witnesses_are_swept_by_the_next(self, tmp_path: Path) -> None:
        """Witnesses a process planted and never removed (it died) go in the next sweep."""
        nonce = "n" + secrets.token_hex(8)
        plant = (
            "import sys; from pathlib import Path; "
            "from sandbox_attest.catalog.socket_witness import WitnessSockets; "
            "WitnessSockets(sys.argv[1], [Path(sys.argv[2])], abstract=False).plant()"
        )
        # A real process that plants and exits without its cleanup, as a killed run does.
        subprocess.run([sys.executable, "-c", plant, nonce, str(tmp_path)], check=True)
        left = tmp_path / witness_name(nonce)
        assert left.exists()
        swept, _ = sweep.sweep_journal()
        assert str(left) in [s.target for s in swept if s.removed]
        assert not left.exists()

    def test_old_unjournalled_leftovers_in_the_run_dir_are_swept(self, tmp_path: Path) -> None:
        """Rogue sockets, shims and witnesses of gone runs no journal claims go after 6 h."""
        run_dir, tmp = tmp_path / "run-sandbox-attest", tmp_path / "tmp"
        run_dir.mkdir()
        tmp.mkdir()
        nonce = "n" + secrets.token_hex(8)
        leftovers = [run_dir / f"rogue-{nonce}.sock", run_dir / f"shim-{nonce}.py"]
        leftovers.append(tmp / witness_name(nonce))
        kept = [run_dir / "proxy.sock", run_dir / "rogue-notanonce.sock"]
        for path in (*leftovers, *kept):
            path.write_text("")
        # Fresh: a live run's, perhaps; never touched.
        assert sweep.sweep_unjournalled(tmp, [], {os.getuid()}, run_dirs=(run_dir,)) == []
        swept = sweep.sweep_unjournalled(
            tmp, [], {os.getuid()}, now=time.time() + sweep.STALE_AGE_S + 60, run_dirs=(run_dir,)
        )
        assert sorted(s.target for s in swept) == sorted(map(str, leftovers))
        assert all(p.exists() for p in kept)

    def test_a_refusing_directory_is_skipped_and_said(self, tmp_path: Path) -> None:
        """A directory that cannot take a witness is listed under skipped with its error."""
        missing = tmp_path / "gone"
        witnesses = WitnessSockets("n" + secrets.token_hex(8), [missing], abstract=False)
        witnesses.plant()
        assert witnesses.planted == {}
        assert list(witnesses.skipped) == [str(missing / witness_name(witnesses.nonce))]
        assert "No such file" in next(iter(witnesses.skipped.values()))
        witnesses.stop()

    def test_remove_nonce_files_takes_only_the_cells(self, tmp_path: Path) -> None:
        """Files carrying the nonce go; other files and any directory stay."""
        nonce = "n" + secrets.token_hex(8)
        (tmp_path / f"rogue-{nonce}.sock").write_text("")
        (tmp_path / f"shim-{nonce}.py").write_text("")
        (tmp_path / "rogue-nother.sock").write_text("")
        (tmp_path / f"dir-{nonce}").mkdir()
        removed = remove_nonce_files([tmp_path, tmp_path / "absent"], nonce)
        assert sorted(removed) == sorted(
            [str(tmp_path / f"rogue-{nonce}.sock"), str(tmp_path / f"shim-{nonce}.py")]
        )
        assert sorted(p.name for p in tmp_path.iterdir()) == ["dir-" + nonce, "rogue-nother.sock"]


def class_report(*extra: dict[str, Any]) -> dict[str, Any]:
    """A confined-looking report: the fixed attempts refused, plus the class attempts given."""
    return {
        "attempts": [
            att("socketpair", "succeeded", "control"),
            att("daemon-unix", "refused", errno="ENOENT"),
            att("daemon-abstract", "refused", errno="ECONNREFUSED"),
            *extra,
        ],
        "facts": {"netns": "net:[1]", "mntns": "mnt:[1]"},
    }


class TestClassReading:
    def test_a_witness_that_heard_is_fail_whatever_the_payload_says(self, tmp_path: Path) -> None:
        """The payload reports refusals, but a witness heard its nonce: FAIL naming dir and fix."""
        ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
        spec = PROBES[ctx.probe]
        assert isinstance(spec, IpcUnixSocketEscape)
        site = tmp_path / "run-like"
        site.mkdir()
        witnesses = WitnessSockets(ctx.nonce, [site], abstract=False)
        witnesses.plant()
        witnesses.start()
        spec._witnesses[ctx.nonce] = witnesses
        path = str(site / witness_name(ctx.nonce))
        send_line(path, f"SANDBOX-ATTEST-WITNESS {ctx.nonce}\n")
        wait_heard(witnesses, ctx.nonce, 1)
        assessment = spec.assess(ctx, class_report(), Records(), OK_CONTROL)
        decision = decide("denied", assessment)
        assert decision.verdict is Verdict.FAIL
        assert f"witness socket {path} heard the payload" in decision.reason
        assert f"do not bind {site} (or a parent of it) into the sandbox" in decision.reason
        assert assessment.witness["witness_sockets"]["removed"] == [path]  # type: ignore[index]
        assert not Path(path).exists()

    def test_a_host_socket_at_its_inode_is_fail(self, tmp_path: Path, listening: list[Any]) -> None:
        """A real daemon socket the payload reached, at the host's own inode, is FAIL named."""
        ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
        daemon = plant_socket(tmp_path / "daemons" / "real.sock", listening)
        info = daemon.stat()
        reached = att(f"path:{daemon}", "succeeded", dev=info.st_dev, ino=info.st_ino)
        spec = PROBES[ctx.probe]
        decision = decide("denied", spec.assess(ctx, class_report(reached), Records(), OK_CONTROL))
        assert decision.verdict is Verdict.FAIL
        assert f"the payload connected to the host's {daemon}" in decision.reason
        assert f"the sandbox exposes the host's {daemon.parent}" in decision.reason

    def test_a_socket_at_another_inode_is_the_sandboxs_own(
        self, tmp_path: Path, listening: list[Any]
    ) -> None:
        """The same path at another inode (the sandbox's own /run) stays inside: PASS."""
        ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
        daemon = plant_socket(tmp_path / "daemons" / "real.sock", listening)
        info = daemon.stat()
        private = att(f"path:{daemon}", "succeeded", dev=info.st_dev, ino=info.st_ino + 1)
        spec = PROBES[ctx.probe]
        decision = decide("denied", spec.assess(ctx, class_report(private), Records(), OK_CONTROL))
        assert decision.verdict is Verdict.PASS, decision.reason

    def test_open_leg_needs_a_witness_not_a_real_daemon(
        self, tmp_path: Path, listening: list[Any]
    ) -> None:
        """On the control leg a real daemon's answer cannot stand in for a silent witness."""
        ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", OPEN, "none")
        daemon = plant_socket(tmp_path / "daemons" / "real.sock", listening)
        info = daemon.stat()
        reached = att(f"path:{daemon}", "succeeded", dev=info.st_dev, ino=info.st_ino)
        report = class_report(reached)
        spec = PROBES[ctx.probe]
        decision = decide("allowed", spec.assess(ctx, report, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.INCONCLUSIVE

    def test_a_filter_refusing_af_unix_outright_holds_the_claim(self, tmp_path: Path) -> None:
        """The socketpair and every escape got EPERM at socket(), no witness heard: PASS."""
        ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
        spec = PROBES[ctx.probe]
        assert isinstance(spec, IpcUnixSocketEscape)
        site = tmp_path / "run-like"
        site.mkdir()
        witnesses = WitnessSockets(ctx.nonce, [site], abstract=False)
        witnesses.plant()
        witnesses.start()
        spec._witnesses[ctx.nonce] = witnesses
        save_state(ctx, {"planted": sorted(witnesses.planted), "not_planted": []})  # as prepare
        ctx.host_view.update({"seen": True, "pid": os.getpid()})  # the host saw it run
        report = {
            "attempts": [
                att("socketpair", "error", "control", errno="EPERM"),
                att("daemon-unix", "refused", errno="EPERM"),
                att("daemon-abstract", "refused", errno="EPERM"),
            ],
            "facts": {"netns": "net:[1]", "mntns": "mnt:[1]"},
        }
        decision = decide("denied", PROBES[ctx.probe].assess(ctx, report, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "refuses AF_UNIX sockets outright" in decision.reason

    def test_without_witnesses_an_all_eperm_report_proves_nothing(self, tmp_path: Path) -> None:
        """The same all-EPERM report with no witness planted stays INCONCLUSIVE."""
        ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
        report = {
            "attempts": [
                att("socketpair", "error", "control", errno="EPERM"),
                att("daemon-unix", "refused", errno="EPERM"),
                att("daemon-abstract", "refused", errno="EPERM"),
            ],
            "facts": {"netns": "net:[1]", "mntns": "mnt:[1]"},
        }
        decision = decide("denied", PROBES[ctx.probe].assess(ctx, report, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason

    def test_a_refused_socketpair_beside_an_open_escape_stays_undecided(
        self, tmp_path: Path
    ) -> None:
        """A refused socketpair beside a connect with another errno is no filter: INCONCLUSIVE."""
        ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
        report = {
            "attempts": [
                att("socketpair", "error", "control", errno="EPERM"),
                att("daemon-unix", "refused", errno="ENOENT"),
                att("daemon-abstract", "refused", errno="EPERM"),
            ],
            "facts": {"netns": "net:[1]", "mntns": "mnt:[1]"},
        }
        decision = decide("denied", PROBES[ctx.probe].assess(ctx, report, Records(), OK_CONTROL))
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason

    def test_class_attempts_are_discovered_names(self) -> None:
        """The report may list any path: or abstract: attempt; any other new name is a mismatch."""
        table = PROBES["ipc_unix_socket_escape"].attempt_table({"targets": {"abstract": "a"}})
        base = [att("socketpair", "succeeded", "control"), att("daemon-unix", "refused")]
        base.append(att("daemon-abstract", "refused"))
        found = [att("path:/run/dbus/system_bus_socket", "refused"), att("abstract:x", "refused")]
        assert table.mismatch(base + found) is None
        assert table.mismatch([*base, att("all", "refused")]) is not None
