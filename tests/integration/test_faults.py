"""Faults on a real `sandbox-attest run`: each ends in ERROR cells, a gate line, nothing left.

Each test starts a run of a small matrix, waits until a cell of the sandbox leg is in flight
(the control leg is judged by then), breaks one fixture from outside, and reads what the run
made of it: the cells from then on are never PASS and name the fixture, the run still writes
and signs its report and exits 1 with a FAILED gate, and none of its processes, scratch,
mounts or journal entries is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_attest.host import journal
from sandbox_attest.host.jsonlines import read_complete_lines
from sandbox_attest.payload import SCRATCH_PREFIX
from sandbox_attest.run import sweep
from sandbox_attest.world.faults import FAULTS_ENV
from tests.integration.test_cli_run import CLI, keypair, run_cli
from tests.integration.test_signals import anchor_in_flight, descendants, still_alive

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "faults"
# A run of the small matrix takes ~20 s here; a fault that hangs a cell adds its timeouts.
RUN_TIMEOUT_S = 240
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="the sandbox leg is bubblewrap"),
]

# proc_visibility first: its anchor process marks the cell in flight from outside.
PROBES = ("proc_visibility", "net_denied_host", "dns_resolution")


def matrix(directory: Path, backend: str = "bubblewrap") -> Path:
    """The control leg and `backend`, three probes each, 30 s per cell."""
    path = directory / "faults.toml"
    path.write_text(
        "".join(f'[[probe]]\nid = "{probe}"\ntimeout = 30\n' for probe in PROBES)
        + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        + f'[[backend]]\nname = "{backend}"\nplatforms = ["linux"]\nreason = "faults"\n'
    )
    return path


def policy(directory: Path, backend: str = "bubblewrap") -> Path:
    """A policy requiring every probe of the control leg and of `backend`."""
    path = directory / "policy.toml"
    probes = ", ".join(f'"{p}"' for p in PROBES)
    path.write_text(
        "".join(
            f'[[require]]\nplatform = "linux"\nbackend = "{b}"\nprobes = [{probes}]\n'
            for b in ("none", backend)
        )
    )
    return path


def mounts() -> set[str]:
    """Every mount point this process's mount namespace sees (findmnt's list)."""
    done = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True
    )
    return set(done.stdout.splitlines())


def ours_in_tmp() -> set[str]:
    """The /tmp entries a run names as its own (its scratch, `sandbox-attest-*`, proxy config)."""
    tmp = Path("/tmp")
    return {
        p.name
        for p in tmp.iterdir()
        if p.name.startswith((SCRATCH_PREFIX, "sandbox-attest-", "proxy-config-"))
    }


class FaultRun:
    """A `sandbox-attest run` of the fault matrix, broken once while a sandbox cell runs."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        out: Path | None = None,
        backend: str = "bubblewrap",
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        """Start the run with a fresh key; read its run id from its first line."""
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.private, self.public = keypair(tmp_path)
        self.out = out if out is not None else tmp_path / "r"
        self.mounts_before = mounts()
        self.tmp_before = ours_in_tmp()
        self.proc = subprocess.Popen(
            [
                *CLI,
                "run",
                "--matrix",
                str(matrix(tmp_path, backend)),
                "--policy",
                str(policy(tmp_path, backend)),
                "--out",
                str(self.out),
                "--key",
                str(self.private),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert "run " in first, first + self.proc.communicate()[1][-3000:]
        self.run_id = first.split("run ", 1)[1].split(",", 1)[0]
        self.processes: dict[int, str] = {}
        self.scratch: Path | None = None

    def journal_lines(self) -> int:
        """How many cells evidence.jsonl holds so far."""
        journal = self.out / "evidence.jsonl"
        return len(journal.read_bytes().splitlines()) if journal.exists() else 0

    def wait_for_sandbox_cell(self, judged: int = len(PROBES)) -> None:
        """Block until `judged` cells (the control leg) are journalled and an anchor runs."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (self.journal_lines() >= judged and anchor_in_flight(self.proc.pid)):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the sandbox leg's first cell never started"
            time.sleep(0.02)
        entry = journal.journal_dir() / f"run-{self.run_id}.json"
        self.scratch = Path(json.loads(entry.read_text())["paths"][0])
        self.processes = descendants(self.proc.pid)

    def finish(self) -> str:
        """Wait for the run to end by itself; its whole output."""
        out, err = self.proc.communicate(timeout=RUN_TIMEOUT_S)
        return out + err

    def cells(self) -> dict[str, dict[str, object]]:
        """The judged cells of evidence.json, by cell id."""
        evidence = json.loads((self.out / "evidence.json").read_text())
        return {str(c["cell_id"]): c for c in evidence["cells"]}

    def assert_nothing_left(self) -> None:
        """No process, scratch, journal entry, mount or /tmp entry of the run is left."""
        deadline = time.monotonic() + 10
        while still_alive(self.processes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert still_alive(self.processes) == []
        assert self.scratch is not None
        assert not self.scratch.exists()
        assert not (journal.journal_dir() / f"run-{self.run_id}.json").exists()
        # Mounts of others (a docker engine's overlays) may come and go meanwhile: only a
        # mount that names this run, its scratch or the harness counts as left behind.
        new = mounts() - self.mounts_before
        assert not [m for m in new if "sandbox-attest" in m or str(self.scratch) in m], new
        # Another run on this machine may make its own; this run's scratch must be gone.
        assert self.scratch.name not in ours_in_tmp()

    def assert_failed_closed(self, output: str, fixture: str) -> None:
        """The sandbox leg is ERROR naming `fixture`; the run is signed, FAILED, exit 1."""
        assert self.proc.returncode == 1, output[-4000:]
        gate = [line for line in output.splitlines() if line.startswith("gate:")]
        assert "gate: FAILED" in gate, output[-4000:]
        cells = self.cells()
        sandbox = {cid: c for cid, c in cells.items() if not cid.startswith("none-")}
        assert set(sandbox) == {f"bubblewrap-{p}" for p in PROBES}
        for cid, cell in sandbox.items():
            assert cell["verdict"] == "ERROR", (cid, cell["verdict"], cell["reason"])
            assert fixture in str(cell["reason"]), (cid, cell["reason"])
            assert "rerun" in str(cell["reason"]), (cid, cell["reason"])
        # The payload of a cell after the fault never ran: nothing could witness it.
        later = [c for cid, c in sandbox.items() if cid != "bubblewrap-proc_visibility"]
        assert all(str(c["reason"]).startswith("not run: ") for c in later), later
        assert any(fixture in line for line in gate), gate
        assert (self.out / "attestation.intoto.jsonl").is_file()
        verify = run_cli("verify", str(self.out), "--trusted-key", str(self.public), "--partial")
        assert verify.returncode != 0  # a FAILED gate never verifies as a release


@pytest.fixture
def fault_dir(tmp_path: Path) -> Path:
    """A trigger directory only this (root) process can write, as the hook requires."""
    directory = tmp_path / "faults"
    directory.mkdir(mode=0o700)
    return directory


def trigger(directory: Path, name: str) -> None:
    """Create the trigger file and wait until the world has injected the fault."""
    (directory / name).touch()
    deadline = time.monotonic() + 10
    while not (directory / f"{name}.done").exists():
        assert time.monotonic() < deadline, f"the world never injected {name}"
        time.sleep(0.02)


def proxy_pid(harness: int) -> int:
    """The egress proxy among the harness's descendants."""
    for pid in descendants(harness):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if sweep.is_harness_child(argv) and argv[1] == b"-m":
                return pid
    pytest.fail("the run has no egress proxy")


class TestDeadFixtures:
    """A fixture that dies mid-run turns every cell from then on into ERROR naming it."""

    def test_killed_proxy(self, tmp_path: Path) -> None:
        """A proxy SIGKILLed during a sandbox cell makes it and every later cell ERROR."""
        run = FaultRun(tmp_path)
        run.wait_for_sandbox_cell()
        os.kill(proxy_pid(run.proc.pid), signal.SIGKILL)
        output = run.finish()
        run.assert_failed_closed(output, "the egress proxy")
        reason = str(run.cells()["bubblewrap-proc_visibility"]["reason"])
        assert "killed by SIGKILL, exit -9" in reason
        run.assert_nothing_left()

    def test_stopped_dns(self, tmp_path: Path, fault_dir: Path) -> None:
        """A DNS fixture stopped during a sandbox cell makes it and every later cell ERROR."""
        run = FaultRun(tmp_path, env={FAULTS_ENV: str(fault_dir)})
        run.wait_for_sandbox_cell()
        trigger(fault_dir, "dns-stop")
        output = run.finish()
        run.assert_failed_closed(output, "the DNS fixture")
        assert "it was stopped" in str(run.cells()["bubblewrap-proc_visibility"]["reason"])
        run.assert_nothing_left()

    @pytest.mark.parametrize(
        ("fault", "said"),
        [
            ("origins-stop-answering", "accepted but did not answer"),
            ("origins-stop-accepting", "stopped accepting"),
        ],
        ids=["accepts-never-answers", "stops-accepting"],
    )
    def test_silent_origin(self, tmp_path: Path, fault_dir: Path, fault: str, said: str) -> None:
        """An origin that stops answering or accepting makes the cells ERROR, saying which."""
        run = FaultRun(tmp_path, env={FAULTS_ENV: str(fault_dir)})
        run.wait_for_sandbox_cell()
        trigger(fault_dir, fault)
        output = run.finish()
        run.assert_failed_closed(output, "the origin ")
        assert said in str(run.cells()["bubblewrap-proc_visibility"]["reason"])
        run.assert_nothing_left()

    def test_hook_refuses_a_directory_others_can_write(self, tmp_path: Path) -> None:
        """A trigger directory others could write injects nothing: the world refuses to start."""
        directory = tmp_path / "open"
        directory.mkdir()
        directory.chmod(0o777)
        (directory / "dns-stop").touch()
        # run_cli passes no environment of its own; the hook reads it from the harness's.
        proc = subprocess.run(
            [
                *CLI,
                "run",
                "--matrix",
                str(matrix(tmp_path)),
                "--policy",
                str(policy(tmp_path)),
                "--backend",
                "none",
                "--out",
                str(tmp_path / "r"),
            ],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
            cwd=REPO,
            env={**os.environ, FAULTS_ENV: str(directory)},
        )
        assert (directory / "dns-stop").exists()  # never acted on
        cells = json.loads((tmp_path / "r" / "evidence.json").read_text())["cells"]
        assert cells
        for cell in cells:
            assert cell["verdict"] == "ERROR"
            assert f"{FAULTS_ENV}={directory} must be a directory of uid" in cell["reason"]
        assert proc.returncode == 1


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (root only), unmounted whatever happens."""
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        check=True,
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a size-limited tmpfs needs root")
@pytest.mark.parametrize(
    ("size", "unwritten"),
    [("64k", "evidence.json"), ("12k", "evidence.jsonl")],
    ids=["full-at-the-end", "full-mid-run"],
)
def test_full_report_disk_names_the_directory_and_keeps_the_journal(
    tmp_path: Path, size: str, unwritten: str
) -> None:
    """A full report disk ends in a gate line naming it and the fix, exit 1, journal kept."""
    # 64k holds the journal of all six cells but not evidence.json; 12k fills up after two.
    with small_tmpfs(tmp_path / "small", size) as small:
        out = small / "r"
        run = FaultRun(tmp_path / "run", out=out)
        run.wait_for_sandbox_cell(judged=0)  # to know the run's processes and scratch
        output = run.finish()
        assert run.proc.returncode == 1, output[-4000:]
        gate = [line for line in output.splitlines() if line.startswith("gate:")]
        assert "gate: FAILED" in gate, output[-4000:]
        full = [line for line in gate if "its filesystem is full (ENOSPC" in line]
        assert full, gate
        assert any(f"cannot write {unwritten} in the report directory" in g for g in full), gate
        assert str(out) in full[0]
        assert "--out on a filesystem with room" in full[0]
        assert "Traceback" not in output
        # What reached the disk before it filled is still there, whole lines only.
        kept = read_complete_lines(out / "evidence.jsonl")
        assert kept, "no cell reached the journal before the disk filled"
        order = [f"{b}-{p}" for b in ("none", "bubblewrap") for p in PROBES]
        assert [c["cell_id"] for c in kept] == order[: len(kept)]
        assert not list(out.glob("*.tmp"))  # no half-written temp file is left
        run.assert_nothing_left()


# Tasks (threads count): far below this machine's pid_max, far above the wrapper's limit of 64
# payload-user tasks plus the harness's own threads.
FORK_CAP = 2048


def cmdline(pid: int) -> str:
    """A process's command line, for a message ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return ""


def pids_cgroup_root() -> Path | None:
    """Where a pids cgroup can be made: the v1 pids hierarchy, or the v2 unified root."""
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists():
        return v1
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "pids" in controllers.read_text().split():
        return v2
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="the cgroup cap on the whole run needs root")
def test_fork_bomb_is_stopped_by_the_sandbox_limit(tmp_path: Path) -> None:
    """A payload that fork-bombs under a process-limited wrapper is ERROR, and nothing is left."""
    # The wrapper (tests/data/faults/forkbomb.toml) gives its payload a process limit; the run
    # as a whole is capped again in a pids cgroup of its own, by RLIMIT_CPU and by a hard
    # timeout, so the test cannot threaten the machine even if the wrapper's limit failed.
    root = pids_cgroup_root()
    if root is None:
        pytest.skip("needs a pids cgroup (v1 /sys/fs/cgroup/pids or v2) to cap the run")
    cgroup = root / f"sandbox-attest-faults-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "pids.max").write_text(str(FORK_CAP))
        procs = cgroup / "cgroup.procs"

        def enter() -> None:
            # In the child before exec: the harness and all it starts are inside the cap.
            procs.write_text(str(os.getpid()))
            resource.setrlimit(resource.RLIMIT_CPU, (300, 300))

        private, _ = keypair(tmp_path)
        out = tmp_path / "r"
        proc = subprocess.run(
            [
                *CLI,
                "run",
                "--matrix",
                str(matrix(tmp_path, "forkbomb")),
                "--policy",
                str(policy(tmp_path, "forkbomb")),
                "--backend-spec",
                str(DATA / "forkbomb.toml"),
                "--backend",
                "none",
                "--backend",
                "forkbomb",
                "--out",
                str(out),
                "--key",
                str(private),
            ],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
            cwd=REPO,
            preexec_fn=enter,
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1, output[-4000:]
        assert "gate: FAILED" in output
        evidence = json.loads((out / "evidence.json").read_text())
        bombed = [c for c in evidence["cells"] if c["backend"] == "forkbomb"]
        assert len(bombed) == len(PROBES)
        for cell in bombed:
            assert cell["verdict"] in ("ERROR", "INCONCLUSIVE"), (cell["cell_id"], cell["reason"])
            # The wrapper's limit stopped the bomb (EAGAIN), not the hard stop or our cap.
            assert "forkbomb: stopped by EAGAIN" in cell["run"]["stderr"], cell["run"]
        peak = cgroup / "pids.peak"
        if peak.exists():
            assert int(peak.read_text()) < FORK_CAP
        # Nothing of the run is left: every process it started, bomb children included. The
        # kernel reaps killed orphans asynchronously, so give it a few seconds to finish.
        deadline = time.monotonic() + 10
        while (cgroup / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = {pid: cmdline(int(pid)) for pid in (cgroup / "cgroup.procs").read_text().split()}
        assert left == {}
    finally:
        with contextlib.suppress(OSError):
            for pid in (cgroup / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while cgroup.exists() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
            time.sleep(0.1)


class PrivateEngine:
    """A dockerd of the test's own, run as scripts/docker-engine.sh runs one, restartable.

    Same flags as the script (no bridge, no iptables, no masquerade), but its own socket,
    data root and exec root: restarting it cannot disturb an engine someone else is using.
    """

    def __init__(self, tag: str) -> None:
        """Paths only; `start` starts it."""
        self.exec_root = Path("/run") / f"sa-faults-{tag}"
        self.data_root = Path("/var/lib") / f"sa-faults-{tag}"
        self.sock = self.exec_root / "docker.sock"
        self.log = self.exec_root / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """The DOCKER_HOST that names it."""
        return f"unix://{self.sock}"

    def start(self) -> None:
        """Start dockerd and wait (60 s at most) until `docker version` answers."""
        self.exec_root.mkdir(mode=0o700, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    "dockerd",
                    "--bridge=none",
                    "--iptables=false",
                    "--ip-masq=false",
                    "--ip6tables=false",
                    f"--data-root={self.data_root}",
                    f"--exec-root={self.exec_root / 'exec'}",
                    f"--pidfile={self.exec_root / 'dockerd.pid'}",
                    f"--host={self.host}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not self.answers():
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)

    def answers(self) -> bool:
        """Whether the engine answers `docker version` now."""
        done = subprocess.run(
            ["docker", "--host", self.host, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            check=False,
            timeout=10,
        )
        return done.returncode == 0

    def stop(self) -> None:
        """SIGTERM, as the script's stop does; SIGKILL after 30 s."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Stop the engine (every container dies with it) and start it again."""
        self.stop()
        self.start()

    def remove(self) -> None:
        """Stop it and remove its roots, unmounting whatever it left mounted there."""
        self.stop()
        for root in (self.exec_root, self.data_root):
            for target in sorted((m for m in mounts() if m.startswith(str(root))), reverse=True):
                subprocess.run(["umount", "-l", target], check=False)
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def private_engine() -> Iterator[PrivateEngine]:
    """A running dockerd of this test's own; removed with everything it made afterwards."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.skip("restarting a docker engine needs root and dockerd (scripts/docker-engine.sh)")
    pytest.importorskip("docker", reason="the docker backend needs the docker SDK")
    engine = PrivateEngine(str(os.getpid()))
    try:
        engine.start()
        yield engine
    finally:
        engine.remove()


def test_docker_engine_restarted_mid_cell(tmp_path: Path, private_engine: PrivateEngine) -> None:
    """Restarting dockerd under a running container makes that cell ERROR naming the engine."""
    # The container is paused first (from outside, through the engine) so the restart lands
    # while it runs, not after. The cells after it run on the engine that came back, and the
    # run removes every container and the image tag it made.
    import docker  # noqa: PLC0415  (optional extra, skipped above when missing)

    client = docker.DockerClient(base_url=private_engine.host, timeout=30)
    run = FaultRun(tmp_path, backend="docker", env={"DOCKER_HOST": private_engine.host})
    first = f"docker-{PROBES[0]}"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    paused = None
    while paused is None:
        assert run.proc.poll() is None, run.proc.communicate()
        assert time.monotonic() < deadline, "the docker leg's first container never ran"
        for container in client.containers.list(filters={"label": f"sandbox-attest.cell={first}"}):
            with contextlib.suppress(docker.errors.APIError):  # it may have exited already
                container.pause()
                paused = container
        time.sleep(0.01)
    run_label = str(paused.labels["sandbox-attest.run"])
    client.close()
    private_engine.restart()
    output = run.finish()
    cells = run.cells()
    hit = cells[first]
    assert hit["verdict"] == "ERROR", hit
    assert "the Docker engine went away while" in str(hit["reason"])
    assert "rerun once `docker version` answers" in str(hit["reason"])
    for probe in PROBES[1:]:  # judged on the engine that came back, whatever their verdict
        assert "Docker engine" not in str(cells[f"docker-{probe}"]["reason"])
    assert run.proc.returncode == 1, output[-4000:]  # the required docker cell is ERROR
    assert "gate: FAILED" in output
    client = docker.DockerClient(base_url=private_engine.host, timeout=30)
    try:
        label = {"label": f"sandbox-attest.run={run_label}"}
        assert client.containers.list(all=True, filters=label) == []
        assert (
            client.images.list(filters={"reference": f"sandbox-attest/hostroot:{run_label}"}) == []
        )
    finally:
        client.close()


def test_next_run_untags_the_images_of_gone_runs(
    private_engine: PrivateEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gone run's per-run image tag is removed by the sweep; a live or fresh one stays."""
    import docker  # noqa: PLC0415  (optional extra, skipped by the fixture when missing)

    from sandbox_attest.backends.docker.stale import sweep_stale_images  # noqa: PLC0415

    monkeypatch.setenv("DOCKER_HOST", private_engine.host)
    empty = tmp_path / "empty.tar"
    subprocess.run(["tar", "-cf", str(empty), "-T", "/dev/null"], check=True)
    old = time.strftime("%Y%m%dt%H%M%S", time.localtime(time.time() - 8 * 3600)) + "-aaaaaa"
    fresh = time.strftime("%Y%m%dt%H%M%S") + "-bbbbbb"
    dead, live = fresh.replace("bbbbbb", "cccccc"), fresh.replace("bbbbbb", "dddddd")
    for tag in (old, fresh, dead, live):
        subprocess.run(
            ["docker", "--host", private_engine.host, "import", str(empty),
             f"sandbox-attest/hostroot:{tag}"],
            check=True, capture_output=True,
        )  # fmt: skip
    swept = sweep_stale_images({dead}, {live}, 6 * 3600.0)
    assert sorted((ref.rsplit(":", 1)[1], ok) for ref, _, ok in swept) == sorted(
        [(old, True), (dead, True)]
    )
    client = docker.DockerClient(base_url=private_engine.host, timeout=30)
    try:
        tags = {t for image in client.images.list() for t in image.tags}
    finally:
        client.close()
    assert tags == {f"sandbox-attest/hostroot:{t}" for t in (fresh, live)}


def test_next_run_removes_the_containers_of_gone_runs(
    private_engine: PrivateEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gone run's container is removed in one listing; a live run's and a fresh one stay."""
    import docker  # noqa: PLC0415  (optional extra, skipped by the fixture when missing)

    from sandbox_attest.backends.docker.image import RUN_LABEL  # noqa: PLC0415
    from sandbox_attest.backends.docker.stale import sweep_stale_containers  # noqa: PLC0415

    monkeypatch.setenv("DOCKER_HOST", private_engine.host)
    empty = tmp_path / "empty.tar"
    subprocess.run(["tar", "-cf", str(empty), "-T", "/dev/null"], check=True)
    image = "sandbox-attest/sweep-test:empty"
    host = ["docker", "--host", private_engine.host]
    subprocess.run([*host, "import", str(empty), image], check=True, capture_output=True)
    runs = {"dead": "20261201t000000-dead00", "live": "20261201t000000-live00"}
    runs["fresh"] = time.strftime("%Y%m%dt%H%M%S") + "-fresh0"
    for kind, run in runs.items():
        subprocess.run(
            [*host, "create", "--name", f"sweep-{kind}", "--label", f"{RUN_LABEL}={run}",
             image, "/never-started"],
            check=True, capture_output=True,
        )  # fmt: skip
    swept = sweep_stale_containers({runs["dead"]}, {runs["live"]}, 6 * 3600.0)
    assert [(name, ok) for name, _, ok in swept] == [("sweep-dead", True)]
    client = docker.DockerClient(base_url=private_engine.host, timeout=30)
    try:
        left = {c.name for c in client.containers.list(all=True)}
    finally:
        client.close()
    assert {"sweep-live", "sweep-fresh"} <= left
    assert "sweep-dead" not in left
