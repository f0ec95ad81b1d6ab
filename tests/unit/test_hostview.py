"""The host's view of a payload: found by its launcher command line, read from /proc.

Live: real processes, a real network namespace with a default route (made here, lo only,
so nothing can leave it), real /proc, real bubblewrap views (a tmpfs over a host folder, a
file of the sandbox's own, an absolute link inside), real rlimits (prlimit) and the real
launcher at a real rendezvous.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.paths import probes_dir
from sandbox_attest.payload import LAUNCHER_SOURCE
from sandbox_attest.run import hostview
from sandbox_attest.run.hostview import (
    LAUNCHER,
    Rendezvous,
    find_payloads,
    read_cgroup_limits,
    read_limits,
    read_process,
)
from sandbox_attest.run.pathview import MAX_LOOK, look_at

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a new netns needs root")


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    """A stand-in `_launch.py` that only sleeps (named as the real one)."""
    script = tmp_path / LAUNCHER
    script.write_text("import time; time.sleep(30)\n")
    return script


def _exe(pid: int) -> str:
    """What `pid` runs, or "" while it cannot be read."""
    try:
        return str(Path(f"/proc/{pid}/exe").readlink())
    except OSError:
        return ""


def _cmdline(pid: int) -> bytes:
    """`pid`'s NUL-separated argv, or b"" while it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@contextlib.contextmanager
def started(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """Start `argv`, yield it once its cmdline is visible, kill its whole group afterwards."""
    proc = subprocess.Popen(argv, start_new_session=True)  # a wrapper's child goes with it
    try:
        # Until the exec the child is this interpreter with this cmdline. Counting argv's
        # words in its cmdline instead missed a program that execs on (unshare -> sh has
        # fewer words), and waited out the whole 10 s whenever the check came after that exec.
        ours = str(Path("/proc/self/exe").readlink())
        words = [os.fsencode(a) for a in argv]

        def exec_done(seen: tuple[str, bytes]) -> bool:
            exe, cmdline = seen
            return exe not in {ours, ""} or cmdline.split(b"\0")[: len(words)] == words

        wait_for(lambda: (_exe(proc.pid), _cmdline(proc.pid)), exec_done)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class TestFind:
    def test_the_launcher_is_found_and_its_wrapper_is_not(
        self, tmp_path: Path, launcher: Path
    ) -> None:
        """`python _launch.py PROBE TASK` is the payload; a wrapper naming it later is not."""
        task = tmp_path / "task.json"
        payload = [sys.executable, str(launcher), "probe.py", str(task)]
        wrapper = ["sh", "-c", "sleep 30", "--", *payload]
        with started(payload) as proc, started(wrapper) as other:
            found = find_payloads(task)
            assert proc.pid in found
            assert other.pid not in found

    def test_another_cells_task_is_not_found(self, tmp_path: Path, launcher: Path) -> None:
        """Only this cell's task file matches."""
        with started([sys.executable, str(launcher), "probe.py", str(tmp_path / "a.json")]):
            assert find_payloads(tmp_path / "b.json") == []


@needs_root
class TestRead:
    def test_a_default_route_in_its_own_namespace_is_seen(self) -> None:
        """A process in a new netns with a default route: not shared, route and lo listed."""
        argv = [
            "unshare",
            "--net",
            "sh",
            "-c",
            "ip link set lo up && ip route add default dev lo && sleep 30",
        ]
        with started(argv) as proc:
            # Until unshare has made the new namespace and sh has added the route, the
            # process is still in ours: wait for both.
            deadline = time.monotonic() + 10
            view = read_process(proc.pid)
            while time.monotonic() < deadline and (
                "net" in view["shared_with_harness"] or not view["default_routes"]
            ):
                time.sleep(0.05)
                view = read_process(proc.pid)
            assert view["default_routes"][0]["dev"] == "lo"
            assert "net" not in view["shared_with_harness"]
            assert view["interfaces"] == ["lo"]

    def test_an_unconfined_child_shares_every_namespace_and_its_creds_are_read(self) -> None:
        """A plain child shares the harness's namespaces; its status fields are read."""
        with started(["sleep", "30"]) as proc:
            view = read_process(proc.pid)
            assert "net" in view["shared_with_harness"]
            assert "mnt" in view["shared_with_harness"]
            assert view["status"]["Uid"].split()[0] == str(os.getuid())
            assert "NoNewPrivs" in view["status"]
            assert "PATH" in view["env_names"]


# Sleeps until the test kills it (sandboxed() does on exit). It slept a fixed 30 s: a deadline
# the test does not need, and in the soak's busy-host run /proc/<pid> of a sleeper vanished
# mid-test once; this removes the only timed part (the cause is not proven beyond that).
SLEEPER = "import time; time.sleep(3600)"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def wait_for(read: Callable[[], Any], ok: Callable[[Any], bool]) -> Any:
    """Call `read` until `ok` holds for its result (10 s at most); the last result."""
    deadline = time.monotonic() + 10
    result = read()
    while not ok(result) and time.monotonic() < deadline:
        time.sleep(0.02)
        result = read()
    return result


@contextlib.contextmanager
def sandboxed(extra: list[str], code: str = SLEEPER) -> Iterator[int]:
    """Run `python -c code` under bubblewrap (the host's / read-only, plus `extra`); its pid.

    The pid comes from bwrap's --info-fd and is yielded once that process runs the
    interpreter, so its mounts are all in place.
    """
    read_end, write_end = os.pipe()
    argv = [
        "bwrap",
        "--die-with-parent",  # the sleeper goes when bwrap is killed, as a test leaves nothing
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *extra,
        "--info-fd",
        str(write_end),
        "--",
        sys.executable,
        "-c",
        code,
    ]
    proc = subprocess.Popen(argv, pass_fds=(write_end,))
    os.close(write_end)
    try:
        with os.fdopen(read_end) as info:
            # bwrap writes its info as indented JSON and may keep the fd open: read up to
            # the line that names the child.
            line = wait_for(info.readline, lambda ln: "child-pid" in ln or not ln)
        pid = int(line.split(":")[1].strip().rstrip(","))
        # The interpreter's own argv: bwrap's pid carries the same code in its argv until it
        # execs, and a slow fork let the tests read bwrap's half-built root as the payload's.
        interpreter = [sys.executable.encode(), b"-c", code.encode()]
        wait_for(
            lambda: Path(f"/proc/{pid}/cmdline").read_bytes(),
            lambda c: c.split(b"\0")[:3] == interpreter,
        )
        yield pid
    finally:
        proc.kill()
        proc.wait()


@needs_root
@needs_bwrap
class TestLook:
    def test_a_host_file_under_the_sandboxs_tmpfs_is_not_visible(self, tmp_path: Path) -> None:
        """A host file under a folder the sandbox covers with a tmpfs is absent from its view."""
        secret = tmp_path / "hidden" / "secret"
        secret.parent.mkdir()
        secret.write_text("host")
        with sandboxed(["--tmpfs", str(secret.parent)]) as pid:
            entry = look_at(pid, str(secret))
        assert entry == {
            "path": str(secret),
            "visible": False,
            "same_inode_as_host": None,
            "errno": "ENOENT",
        }

    def test_a_shared_host_file_is_visible_at_the_hosts_inode(self, tmp_path: Path) -> None:
        """A host file the sandbox's read-only bind of / carries is the host's own inode."""
        secret = tmp_path / "secret"
        secret.write_text("host")
        with sandboxed([]) as pid:
            entry = look_at(pid, str(secret))
        assert entry["visible"] is True
        assert entry["same_inode_as_host"] is True

    def test_the_sandboxs_own_file_at_that_path_is_another_inode(self, tmp_path: Path) -> None:
        """A file the sandbox made at the host file's path is visible, but not the host's inode."""
        secret = tmp_path / "own" / "secret"
        secret.parent.mkdir()
        secret.write_text("host")
        code = f"open({str(secret)!r}, 'w').write('own'); {SLEEPER}"
        with sandboxed(["--tmpfs", str(secret.parent)], code) as pid:
            entry = wait_for(lambda: look_at(pid, str(secret)), lambda e: e["visible"])
        assert entry["visible"] is True
        assert entry["same_inode_as_host"] is False

    def test_an_absolute_link_resolves_in_the_payloads_root(self, tmp_path: Path) -> None:
        """A link inside to an absolute path is followed in the payload's root, not the host's.

        Handed to the kernel whole, the same path resolves the link in the host's root and
        finds the host's file: the walk must not.
        """
        area = tmp_path / "area"
        (area / "real").mkdir(parents=True)
        (area / "real" / "secret").write_text("host")
        binds = [
            "--tmpfs",
            str(area),
            "--dir",
            str(area / "real"),
            "--symlink",
            str(area / "real"),
            str(area / "link"),
        ]
        looked = str(area / "link" / "secret")
        with sandboxed(binds) as pid:
            entry = look_at(pid, looked)
            naive = os.lstat(f"/proc/{pid}/root{looked}")
        assert entry["visible"] is False
        assert entry["errno"] == "ENOENT"
        assert entry["links"] == [f"link -> {area / 'real'}"]
        assert naive.st_ino == (area / "real" / "secret").lstat().st_ino

    def test_dot_dot_stops_at_the_payloads_root(self, tmp_path: Path) -> None:
        """`..` above the payload's root stays there: the tmpfs-covered file is still absent."""
        secret = tmp_path / "hidden" / "secret"
        secret.parent.mkdir()
        secret.write_text("host")
        with sandboxed(["--tmpfs", str(secret.parent)]) as pid:
            entry = look_at(pid, f"/../../..{secret}")
        assert entry["visible"] is False
        assert entry["errno"] == "ENOENT"

    def test_a_gone_process_is_no_view_and_no_exception(self) -> None:
        """A pid with no process behind it is not visible, and says why."""
        entry = look_at(2**22 + 1, "/etc")
        assert entry["visible"] is False
        assert entry["errno"] == "ENOENT"
        assert "cannot open /proc/" in entry["why"]

    def test_at_most_max_look_paths_are_looked_at(self) -> None:
        """A spec that asks for more than MAX_LOOK paths gets MAX_LOOK readings and a note."""
        with started(["sleep", "30"]) as proc:
            view = read_process(proc.pid, [f"/nonexistent-{i}" for i in range(MAX_LOOK + 6)])
        assert len(view["looked"]) == MAX_LOOK
        assert view["looked_cut"] == f"{MAX_LOOK + 6} paths asked, only the first 64 looked at"


@needs_root
class TestLimits:
    def test_prlimit_values_are_read_from_the_host(self) -> None:
        """The host reads the file-size and open-file rlimits prlimit set on a process."""
        argv = ["prlimit", "--fsize=1048576", "--nofile=64", sys.executable, "-c", SLEEPER]
        # Not `started`: prlimit execs the interpreter, whose cmdline is shorter than argv.
        proc = subprocess.Popen(argv)
        try:
            limits = wait_for(
                lambda: read_limits(proc.pid),
                lambda lim: lim.get("Max open files", {}).get("soft") == 64,
            )
        finally:
            proc.kill()
            proc.wait()
        assert limits["Max file size"] == {"soft": 1048576, "hard": 1048576}
        assert limits["Max open files"] == {"soft": 64, "hard": 64}
        assert "Max processes" in limits

    def test_an_unlimited_rlimit_reads_as_none(self) -> None:
        """RLIMIT_AS left alone shows as unlimited, read as None."""
        with started(["sleep", "30"]) as proc:
            view = read_process(proc.pid)
        assert view["limits"]["Max address space"] == {"soft": None, "hard": None}


@contextlib.contextmanager
def pids_cgroup(tmp_name: str, cap: int) -> Iterator[Path]:
    """A child cgroup of the host's pids controller (v1 or v2) capped at `cap`, removed after."""
    v1 = Path("/sys/fs/cgroup/pids")
    base = v1 if v1.is_dir() else Path("/sys/fs/cgroup")
    group = base / tmp_name
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(cap))
    except OSError as exc:
        pytest.skip(f"cannot make a pids cgroup here ({exc.strerror}); run as root with cgroups")
    try:
        yield group
    finally:
        group.rmdir()


@needs_root
class TestCgroup:
    def test_a_pids_cap_on_the_payloads_group_is_read(self) -> None:
        """A process moved into a group with pids.max 50 reads as capped at 50."""
        with (
            pids_cgroup(f"sa-test-{os.getpid()}", 50) as group,
            started(["sleep", "30"]) as proc,
        ):
            (group / "cgroup.procs").write_text(str(proc.pid))
            try:
                caps = read_cgroup_limits(proc.pid)
            finally:
                # Out again before the group is removed (a group with members cannot be).
                (group.parent / "cgroup.procs").write_text(str(proc.pid))
        assert caps["pids.max"] == 50

    def test_a_cap_on_a_parent_group_binds_the_child(self) -> None:
        """A process in an uncapped child of a group with pids.max 40 reads as capped at 40."""
        with (
            pids_cgroup(f"sa-test-parent-{os.getpid()}", 40) as parent,
            started(["sleep", "30"]) as proc,
        ):
            child = parent / "child"
            child.mkdir()
            try:
                (child / "cgroup.procs").write_text(str(proc.pid))
                try:
                    caps = read_cgroup_limits(proc.pid)
                finally:
                    (parent.parent / "cgroup.procs").write_text(str(proc.pid))
            finally:
                child.rmdir()
        assert caps["pids.max"] == 40


class TestRendezvous:
    def test_the_real_launcher_waits_while_the_host_looks_and_runs_hooks(
        self, tmp_path: Path
    ) -> None:
        """At the real launcher's rendezvous the host reads the paths and hooks, then lets go."""
        workspace = tmp_path / "ws"
        workspace.mkdir()
        probe = tmp_path / "probe.py"
        probe.write_text("print('probe ran')\n")
        task = tmp_path / "task.json"
        rendezvous_s = 60  # the launcher's own deadline: it waits this long unless let go
        task.write_text(
            json.dumps({"workspace": str(workspace), "nonce": "n1", "rendezvous_s": rendezvous_s})
        )
        looked = tmp_path / "looked"
        looked.write_text("x")
        launcher_source, staged = probes_dir() / LAUNCHER_SOURCE, tmp_path / LAUNCHER

        def broken(pid: int) -> dict[str, Any]:
            msg = f"no reading of {pid}"
            raise RuntimeError(msg)

        watch = Rendezvous(
            workspace,
            task,
            "n1",
            look=[str(looked)],
            hooks={"mine": lambda pid: {"pid": pid}, "broken": broken},
        )
        watch.start()
        start = time.monotonic()
        done = subprocess.run(
            # Staged as the runner stages it: the repository's launcher under the found name.
            [sys.executable, shutil.copyfile(launcher_source, staged), str(probe), str(task)],
            capture_output=True,
            text=True,
            timeout=2 * rendezvous_s,
            check=True,
        )
        elapsed = time.monotonic() - start
        view = watch.finish()
        assert done.stdout == "probe ran\n"
        # Not a speed budget: a launcher the host never let go runs only at its deadline.
        assert elapsed < rendezvous_s, "the launcher waited for its deadline: never let go"
        assert view["seen"], view
        assert view["looked"] == [
            {"path": str(looked), "visible": True, "same_inode_as_host": True, "errno": None}
        ]
        assert view["mine"] == {"pid": view["pid"]}
        assert view["broken"] == {
            "seen": False,
            "why": f"RuntimeError: no reading of {view['pid']}",
        }
        assert "Max open files" in view["limits"]


class TestCgroupChainAboveTheHarness:
    """From the harness's own group up, limits are read once per process.

    A host may nest its own processes deep (this VM's agent: 300 levels of `runtime/` in the
    v1 memory hierarchy by mid-session); walking them at every rendezvous held each payload
    50 ms. The groups below the harness's (the cell's, the sandbox's) are read every time.
    """

    def test_only_the_cells_part_is_read_again(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The cap is the smallest of both parts; the part above the harness is read once."""
        base = tmp_path / "pids"
        ours = base / "host" / "harness"
        cell = ours / "cell"
        cell.mkdir(parents=True)
        for where, value in ((base, "max"), (base / "host", "64"), (ours, "max"), (cell, "20")):
            (where / "pids.max").write_text(value)
        monkeypatch.setattr(hostview, "_own_group", lambda _base: ours)
        hostview._tightest_from.cache_clear()
        reads: list[Path] = []
        real = hostview._read

        def counted(path: Path) -> str:
            reads.append(path)
            return real(path)

        monkeypatch.setattr(hostview, "_read", counted)
        group = "/host/harness/cell"
        assert hostview._tightest(base, group, "pids.max") == 20
        assert hostview._tightest(base, group, "pids.max") == 20
        (cell / "pids.max").write_text("100")
        assert hostview._tightest(base, group, "pids.max") == 64
        assert reads.count(cell / "pids.max") == 3
        assert reads.count(base / "host" / "pids.max") == 1
        hostview._tightest_from.cache_clear()

    def test_a_group_shared_with_the_harness_is_named_not_spelled_out(self) -> None:
        """A plain child is in the harness's groups: each non-root one reads as such.

        A host may nest its processes hundreds of levels deep (3 KB a path here), and every
        process of every cell would carry the path; the caps are read all the same.
        """
        ours = {c: p for c, p in hostview._cgroup_paths(os.getpid()).items() if p != "/"}
        with started(["sleep", "30"]) as proc:
            caps = read_cgroup_limits(proc.pid)
        for controller, path in ours.items():
            assert caps["cgroup"][controller] == hostview.HARNESS_OWN_GROUP, path
        assert "pids.max" in caps
        assert "memory.max" in caps
