"""Issue 26, row 2 and item 2, live: the host's sockets found by identity wherever they sit.

Two wrappers under tests/data/identity/, each matrix/backends/bwrap-generic.toml with one
mistake, go through one real `sandbox-attest run` beside the control leg and the strong legs:

- sock_daemon_elsewhere.toml binds the host's docker-style daemon socket (the world's fake
  daemon) at `/run/host-docker.sock`. The host has nothing at that path, so looking the path
  up on the host passed it; the host's walk of the payload's view (host/viewwalk.py) finds the
  daemon's socket there by (st_dev, st_ino), tells the payload, and the daemon's own log of the
  nonce is the escape: FAIL naming the inside path and the fix.
- sock_session.toml binds the payload user's login session (`/run/user/<uid>`) and passes
  XDG_RUNTIME_DIR: the session's witness sockets (the D-Bus session bus, gpg-agent, rootless
  docker and podman) hear the payload: FAIL naming the session socket and the fix.
- sock_run_elsewhere.toml shows the host's /run read-only at `/host/run`, where the payload's
  own walk never looks: the host's walk finds the cell's /run witness there, the payload is
  told, and the witness hears it: FAIL naming the witness, the inside path and the fix.

The control leg proves every session socket is reachable unconfined; none, bubblewrap and
bwrap-generic stay PASS in the same run, and the gate is FAILED. Real bubblewrap, real
sockets, the real payload user (root only).

On a real sandbox, in the lab: sock_srt_session.toml is matrix/backends/srt.toml with its own
documented switch `allowAllUnixSockets` on and the runtime dir readable: FAIL naming the
session's sockets, while srt as shipped in matrix/backends/ stays PASS in the same run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.world.lab import lab_supported
from tests.integration.hole_runs import LIVE_HOLE_MARKS, REPO, HoleRun, hole_run
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [*LIVE_HOLE_MARKS, pytest.mark.timeout(500)]

DATA = Path(__file__).parent.parent / "data" / "identity"
PROBE = "ipc_unix_socket_escape"
STRONG = ("none", "bubblewrap", "bwrap-generic")
DAEMON_HOLE = "hole-sock-daemon-elsewhere"
SESSION_HOLE = "hole-sock-session"
RUN_HOLE = "hole-sock-run-elsewhere"


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """One real run: the probe on the strong legs and both hole wrappers, every leg required."""
    with hole_run(
        "sa-idsock-",
        probes=[PROBE],
        legs=STRONG,
        required=[*STRONG[1:], DAEMON_HOLE, SESSION_HOLE, RUN_HOLE],
        specs=[
            DATA / "sock_daemon_elsewhere.toml",
            DATA / "sock_session.toml",
            DATA / "sock_run_elsewhere.toml",
        ],
        run_timeout=450,
    ) as done:
        yield done


def view_of(cell: dict[str, Any]) -> dict[str, Any]:
    """The host's walk of the payload's view, as the cell's evidence holds it."""
    view: dict[str, Any] = cell["witness"]["view"]
    return view


class TestStrongLegs:
    @pytest.mark.parametrize("backend", STRONG)
    def test_strong_legs_stay_pass_with_their_view_walked(self, run: HoleRun, backend: str) -> None:
        """None, bubblewrap and bwrap-generic PASS, each with the host's walk of its view."""
        cell = run.cell(backend, PROBE)
        assert cell["verdict"] == "PASS", cell["reason"]
        walk = view_of(cell)["walk"]
        assert walk["seen"], walk
        assert "host walk of the view:" in cell["reason"]

    def test_confined_legs_expose_no_host_socket(self, run: HoleRun) -> None:
        """Bubblewrap and bwrap-generic show the payload none of the host's sockets."""
        for backend in STRONG[1:]:
            assert view_of(run.cell(backend, PROBE))["exposed"] == [], backend

    def test_control_leg_reaches_every_session_socket(self, run: HoleRun) -> None:
        """Unconfined, the payload reaches each session socket, and the host control held."""
        cell = run.cell("none", PROBE)
        session = cell["witness"]["session_sockets"]
        assert session["planted"], session
        heard = {h["witness"] for h in session["heard"]}
        assert heard == set(session["planted"])
        assert {"XDG_RUNTIME_DIR", "SSH_AUTH_SOCK"} <= set(session["env"])
        checks = {c["what"]: c["ok"] for c in cell["control"]["host"]["checks"]}
        assert checks["the login session's sockets hear the payload user"] is True


class TestHoles:
    def test_daemon_at_another_path_fails_naming_it(self, run: HoleRun) -> None:
        """The daemon socket bound at /run/host-docker.sock FAILs, named there, with the fix."""
        cell = run.cell(DAEMON_HOLE, PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "is in the payload's view at /run/host-docker.sock" in cell["reason"]
        assert "do not bind host sockets" in cell["reason"]
        kinds = {(e["inside"], e["kind"]) for e in view_of(cell)["exposed"]}
        assert ("/run/host-docker.sock", "daemon") in kinds
        assert cell["witness"]["daemon"], "the daemon's own log must hold the payload's request"

    def test_exposed_session_fails_naming_the_socket(self, run: HoleRun) -> None:
        """The bound runtime dir FAILs naming its D-Bus session bus socket and the fix."""
        cell = run.cell(SESSION_HOLE, PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        runtime = cell["witness"]["session_sockets"]["env"]["XDG_RUNTIME_DIR"]
        assert f"D-Bus session bus {runtime}/bus" in cell["reason"]
        assert "do not bind $XDG_RUNTIME_DIR" in cell["reason"]

    def test_witness_at_another_path_fails_naming_where(self, run: HoleRun) -> None:
        """The host's /run at /host/run FAILs naming its witness where the payload saw it."""
        cell = run.cell(RUN_HOLE, PROBE)
        assert cell["verdict"] == "FAIL", cell["reason"]
        name = f".kiln-ipc-{cell['nonce']}.sock"
        assert (
            f"witness socket /run/{name} heard the payload at /host/run/{name} inside"
            in (cell["reason"])
        )
        assert "do not bind host sockets" in cell["reason"]

    def test_gate_fails_on_every_hole(self, run: HoleRun) -> None:
        """The run's gate is FAILED, naming every hole cell."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        assert "gate: FAILED" in run.stdout
        for backend in (DAEMON_HOLE, SESSION_HOLE, RUN_HOLE):
            assert f"required cell {backend}-{PROBE} is FAIL" in run.stdout

    def test_session_is_gone_after_the_run(self, run: HoleRun) -> None:
        """The harness removed every session witness it planted, and its ssh-agent directory.

        Read from the evidence, not from the paths: the names are fixed, and another run on
        this host may hold the session (and its own sockets there) by the time this looks.
        """
        cells = [run.cell(b, PROBE) for b in (*STRONG, DAEMON_HOLE, SESSION_HOLE, RUN_HOLE)]
        sessions = [c["witness"]["session_sockets"] for c in cells]
        planted = {p for s in sessions for p in s["planted"]}
        removed = {p for s in sessions for p in s.get("removed", [])}
        assert planted
        assert planted <= removed
        for session in sessions:
            assert not Path(session["env"]["SSH_AUTH_SOCK"]).parent.exists()


@pytest.fixture(scope="module")
def srt_cells() -> Iterator[dict[str, dict[str, Any]]]:
    """The sandbox srt as shipped and with allowAllUnixSockets, one lab run; cells by backend."""
    supported, why_not = lab_supported()
    if not supported:
        pytest.skip(f"srt runs in the lab world, which needs root and namespaces: {why_not}")
    check = subprocess.run(
        [str(REPO / "scripts" / "real-sandboxes.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        pytest.skip(f"srt missing: run scripts/real-sandboxes.sh ({check.stderr.strip()})")
    with reachable_tempdir("sa-idsrt-") as root:
        matrix, policy = root / "matrix.toml", root / "policy.toml"
        matrix.write_text(
            f'[[probe]]\nid = "{PROBE}"\ntimeout = 60\n'
            + "".join(
                f'[[backend]]\nname = "{b}"\nplatforms = ["linux"]\n' for b in ("none", "srt")
            )
        )
        policy.write_text(
            f'[[require]]\nplatform = "linux"\nbackend = "srt"\nprobes = ["{PROBE}"]\n'
        )
        argv = [sys.executable, "-m", "sandbox_attest.cli", "run", "--matrix", str(matrix)]
        argv += ["--policy", str(policy), "--backend", "none", "--backend", "srt"]
        argv += ["--backend-spec", str(DATA / "sock_srt_session.toml"), "--world", "lab"]
        argv += ["-j", "2", "--out", str(root / "report")]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=400, check=False, cwd=REPO
        )
        evidence = root / "report" / "evidence.json"
        assert evidence.is_file(), f"no evidence: {done.stdout[-3000:]} {done.stderr[-2000:]}"
        yield {c["backend"]: c for c in json.loads(evidence.read_text())["cells"]}


class TestRealSandbox:
    def test_srt_as_shipped_passes(self, srt_cells: dict[str, dict[str, Any]]) -> None:
        """The shipped srt spec shows the payload none of the host's sockets."""
        cell = srt_cells["srt"]
        assert cell["verdict"] == "PASS", cell["reason"]
        assert view_of(cell)["exposed"] == []

    def test_srt_all_unix_sockets_fails_naming_the_session(
        self, srt_cells: dict[str, dict[str, Any]]
    ) -> None:
        """With allowAllUnixSockets and the runtime dir readable, srt FAILs naming the session."""
        cell = srt_cells["hole-srt-session"]
        assert cell["verdict"] == "FAIL", cell["reason"]
        runtime = cell["witness"]["session_sockets"]["env"]["XDG_RUNTIME_DIR"]
        assert f"D-Bus session bus {runtime}/bus" in cell["reason"]
        assert "the sandbox exposes the agent's login session" in cell["reason"]
