"""Cell groups: every process a wrapper starts is found, and the payload user cannot leave.

Real processes, real cgroups where the harness can make them (root with a cgroup2 mount),
and the subtree fallback forced where a test says so.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.host import cellgroup, cgroupfs, journal
from sandbox_attest.host.trust import payload_user
from sandbox_attest.run import sweep

if TYPE_CHECKING:
    from collections.abc import Iterator

HYBRID_MOUNTINFO = (
    "25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "41 25 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "42 25 0:39 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
)


def cgroup_possible() -> bool:
    """Whether this host lets the harness make the cgroups (root, cgroup2, kernel >= 5.16)."""
    return cellgroup.run_cgroup()[0] is not None


needs_cgroup = pytest.mark.skipif(
    not cgroup_possible(), reason="needs root, a cgroup2 mount and Linux >= 5.16"
)


def spawn(cell: cellgroup.CellGroup, argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
    """Start `argv` in `cell` as a backend does (through the thread's current group)."""
    previous = cellgroup.enter(cell)
    try:
        proc: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
            argv, stdout=subprocess.PIPE, text=True, **kwargs, **cellgroup.spawn_kwargs(argv)
        )
        cellgroup.started(proc.pid)
    finally:
        cellgroup.leave(previous)
    return proc


def wait_for(predicate: object, what: str) -> None:
    """Poll `predicate` (a callable) for at most 10 s; fail naming `what`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    pytest.fail(f"never happened: {what}")


class TestFindingTheHierarchy:
    def test_hybrid_layout_finds_the_unified_mount(self, tmp_path: Path) -> None:
        """On a hybrid host the v2 hierarchy is the cgroup2 mount, wherever it is mounted."""
        mounts = cgroupfs._mountinfo_v2(HYBRID_MOUNTINFO)
        assert mounts == [("/", Path("/sys/fs/cgroup/unified"))]

    def test_own_group_under_a_namespaced_root(self, tmp_path: Path) -> None:
        """A group below the mount's root is joined to the mount point; one outside is None."""
        (tmp_path / "run" / "x").mkdir(parents=True)
        mountinfo = f"41 25 0:38 /box {tmp_path} rw - cgroup2 cgroup2 rw\n"
        assert cgroupfs.own_v2_dir(mountinfo, "0::/box/run/x\n") == tmp_path / "run" / "x"
        assert cgroupfs.own_v2_dir(mountinfo, "0::/elsewhere\n") is None
        assert cgroupfs.own_v2_dir(mountinfo, "1:pids:/\n") is None


@needs_cgroup
class TestCgroup:
    def test_a_double_forked_setsid_child_stays_in_the_group(self) -> None:
        """A child that double-forks into a new session with a fresh environment is a member."""
        group = cellgroup.new_cell()
        assert group.mechanism == cellgroup.CGROUP, group.why
        try:
            proc = spawn(
                group,
                ["/bin/sh", "-c", "(setsid env -i /bin/sleep 30 >/dev/null 2>&1 &) ; echo started"],
            )
            proc.communicate(timeout=10)
            # Listed alone once the subshell and setsid have exec'd or exited.
            wait_for(
                lambda: (
                    [Path(f"/proc/{p}/cmdline").read_bytes()[:10] for p in group.pids()]
                    == [b"/bin/sleep"]
                ),
                "the orphan alone in the group",
            )
        finally:
            notes = group.close(kill=True)
        assert notes == []
        assert group.path is not None
        assert not group.path.exists()

    def test_the_payload_user_cannot_leave_its_group(self) -> None:
        """The payload user writing its pid into the run's parent group is refused: EACCES."""
        user = payload_user()
        if user is None:
            pytest.skip("no payload user to switch to on this host")
        group = cellgroup.new_cell()
        run, _ = cellgroup.run_cgroup()
        assert run is not None
        code = (
            "import os, sys\n"
            "try:\n"
            "    open(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n"
            "else:\n"
            "    print('moved')\n"
        )
        try:
            proc = spawn(
                group,
                [sys.executable, "-c", code, str(run / "cgroup.procs")],
                **user.popen_kwargs(),
            )
            out, _ = proc.communicate(timeout=30)
        finally:
            group.close(kill=True)
        assert out.split() == ["refused", "13"], out

    def test_a_dead_runs_cgroup_is_swept_from_its_journal(self) -> None:
        """A journal entry whose owner is gone names a run cgroup: its members die, it goes."""
        base = cgroupfs.own_v2_dir()
        assert base is not None
        path = base / f"{sweep.RUN_CGROUP_PREFIX}test-{os.getpid()}"
        (path / "cell-1").mkdir(parents=True)
        sleeper = subprocess.Popen(["sleep", "30"])
        (path / "cell-1" / "cgroup.procs").write_text(str(sleeper.pid))
        key = f"cgroup-test-{os.getpid()}"
        entry = journal.record(key, [], cgroup=str(path))
        # Owned by a process that is gone: pid 0 never matches a live start time.
        data = entry.read_text().replace(f'"pid": {os.getpid()}', '"pid": 999999999')
        entry.write_text(data)
        swept, _ = sweep.sweep_journal()
        assert sleeper.wait(timeout=10) == -9
        cgroups = [s for s in swept if s.what == "cgroup"]
        assert [(s.target, s.removed) for s in cgroups] == [(str(path), True)]
        assert "killed 1 process(es)" in cgroups[0].why
        assert not path.exists()
        assert not entry.exists()

    def test_a_path_that_is_no_run_cgroup_is_refused(self, tmp_path: Path) -> None:
        """A journal's cgroup that is not a run's group on cgroup2 is left alone, and said so."""
        done = sweep._remove_run_cgroup(tmp_path / f"{sweep.RUN_CGROUP_PREFIX}x", "test")
        assert not done.removed
        assert "not a run's cgroup" in done.why


@pytest.fixture
def subreaper() -> Iterator[None]:
    """This process as a child subreaper for one test, and not after it.

    Left set, every orphan of a later test would be reparented to pytest itself (the sweep's
    own tests tell an orphan by its parent no longer being a Python process).
    """
    assert cellgroup._become_subreaper() == ""
    try:
        yield
    finally:
        cellgroup._release_subreaper()


class TestSubtree:
    def test_the_harness_reaps_only_while_a_subtree_group_is_open(self) -> None:
        """Subreaper while a subtree group is open, an ordinary parent after the last closes."""
        get = ctypes.c_int(-1)
        libc = ctypes.CDLL(None, use_errno=True)
        pr_get_child_subreaper = 37
        first = cellgroup.CellGroup(cellgroup.SUBTREE, reaping=True)
        second = cellgroup.CellGroup(cellgroup.SUBTREE, reaping=True)
        assert cellgroup._become_subreaper() == ""
        assert cellgroup._become_subreaper() == ""
        first.close(kill=True)
        libc.prctl(pr_get_child_subreaper, ctypes.byref(get), 0, 0, 0)
        assert get.value == 1
        second.close(kill=True)
        libc.prctl(pr_get_child_subreaper, ctypes.byref(get), 0, 0, 0)
        assert get.value == 0

    @pytest.mark.usefixtures("subreaper")
    def test_members_are_the_wrapper_and_its_reparented_orphans(self) -> None:
        """Without a cgroup, a child seen once stays a member after it is reparented to us.

        (One that is orphaned before the harness ever saw it is not: the module's docstring
        names that weakness of the fallback.)
        """
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="forced by the test")
        # The wrapper waits for a line before it exits, so the orphan is seen with a parent.
        proc = spawn(
            group,
            ["/bin/sh", "-c", "setsid /bin/sleep 30 >/dev/null 2>&1 & echo started; read _"],
            stdin=subprocess.PIPE,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n"
        wait_for(lambda: len(group.pids()) == 2, "the wrapper and its child listed")
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()
        members = group.pids()
        try:
            assert len(members) == 1, members
            # Reparented to the harness (a subreaper), not to init.
            stat = Path(f"/proc/{members[0]}/stat").read_text()
            assert int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()
        finally:
            group.close(kill=True)
        wait_for(lambda: not Path(f"/proc/{members[0]}").exists(), "the orphan killed and reaped")


class TestWhoIsTheSandboxsOwn:
    """Above the launcher, only what cannot run Python is the sandbox's own process."""

    @pytest.mark.parametrize(
        ("argv", "own"),
        [
            (["/bin/sh", "-c", "sleep 30"], True),
            ([sys.executable, "-c", "import time; time.sleep(30)"], False),
            (["/lib64/ld-linux-x86-64.so.2", "/bin/sleep", "30"], False),
        ],
        ids=["shell", "python", "loader"],
    )
    def test_an_ancestor_is_own_only_when_it_cannot_run_python(
        self, argv: list[str], *, own: bool
    ) -> None:
        """A shell above the payload is the wrapper's; Python, or the loader, never is."""
        if not Path(argv[0]).exists():
            pytest.skip(f"{argv[0]} is not on this host")
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        proc = subprocess.Popen(argv)
        try:
            wait_for(lambda: Path(f"/proc/{proc.pid}/exe").exists(), "the process started")
            assert group.is_supervisor(proc.pid, {proc.pid}) is own
            # Not above the launcher and not pinned: judged whatever it runs.
            assert group.is_supervisor(proc.pid, set()) is False
        finally:
            proc.kill()
            proc.wait(timeout=10)

    def test_a_pinned_python_is_never_pinned(self) -> None:
        """Pinning the interpreter does nothing: the payload runs on it."""
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        group.pin_supervisor(sys.executable)
        group.pin_supervisor("sh", os.defpath)
        shell = Path("/bin/sh").resolve().stat()
        assert group.supervisors == {(shell.st_dev, shell.st_ino)}


# A Python supervisor script (sandlock's SDK supervises in its launcher's own process).
SUPERVISOR_CODE = "#!{python} -I\nimport sys, time\nprint('up', flush=True)\ntime.sleep(30)\n"


@pytest.fixture
def supervisor_script(tmp_path: Path) -> Path:
    """A Python script in a directory only root writes, its #! naming this interpreter."""
    if os.geteuid() != 0:
        pytest.skip("a pinned script must sit where only root (the harness) can change it")
    script = tmp_path / "launch.py"
    script.write_text(SUPERVISOR_CODE.format(python=sys.executable))
    script.chmod(0o755)
    return script


def run_in(cell: cellgroup.CellGroup, argv: list[str]) -> subprocess.Popen[str]:
    """`spawn` and wait for the script's "up" line (it is running its own code by then)."""
    proc = spawn(cell, argv)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "up\n"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill and reap `proc`, closing its pipe."""
    proc.kill()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


class TestAPinnedPythonSupervisor:
    """Only the harness's own spawn, running the pinned script unchanged, is exempt."""

    def test_the_spawned_process_running_the_pinned_script_is_own(
        self, supervisor_script: Path
    ) -> None:
        """Pinned by the spec ([detect] executables), spawned by the harness: the sandbox's."""
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        group.pin_supervisor(str(supervisor_script))
        proc = run_in(group, [sys.executable, "-I", str(supervisor_script)])
        try:
            assert group.is_supervisor(proc.pid) is True
            assert group.is_supervisor(proc.pid, {proc.pid}) is True
        finally:
            stop(proc)

    def test_an_unpinned_python_parent_is_still_judged(self, supervisor_script: Path) -> None:
        """The same spawn, its script not declared by the spec: judged, above the launcher too."""
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        proc = run_in(group, [sys.executable, "-I", str(supervisor_script)])
        try:
            assert group.is_supervisor(proc.pid, {proc.pid}) is False
        finally:
            stop(proc)

    def test_a_script_named_on_the_command_line_is_never_pinned(
        self, supervisor_script: Path
    ) -> None:
        """Command-line words pin executables, never scripts: `python3 probe.py` is the payload."""
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        argv = [sys.executable, "-I", str(supervisor_script)]
        proc = run_in(group, argv)
        try:
            assert group.supervisor_scripts == {}
            assert group.is_supervisor(proc.pid, {proc.pid}) is False
        finally:
            stop(proc)

    def test_a_process_the_harness_did_not_spawn_is_judged(self, supervisor_script: Path) -> None:
        """A decoy with the very same command line, forked by a member: not the harness's."""
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        group.pin_supervisor(str(supervisor_script))
        decoy = subprocess.Popen(
            [sys.executable, "-I", str(supervisor_script)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert decoy.stdout is not None
            assert decoy.stdout.readline() == "up\n"
            assert group.is_supervisor(decoy.pid, {decoy.pid}) is False
        finally:
            stop(decoy)

    @pytest.mark.parametrize(
        "options",
        [[], ["-c", "import time; print('up', flush=True); time.sleep(30)", "x"], ["-W", "x"]],
        ids=["not-isolated", "dash-c", "option-with-argument"],
    )
    def test_any_other_way_of_running_it_is_judged(
        self, supervisor_script: Path, options: list[str]
    ) -> None:
        """Without -I (PYTHONPATH, user site), `-c`, or an option taking a value: judged."""
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        group.pin_supervisor(str(supervisor_script))
        argv = [sys.executable, *options, str(supervisor_script)]
        if options[:1] == ["-W"]:
            argv = [sys.executable, "-I", "-W", "ignore", str(supervisor_script)]
        proc = run_in(group, argv)
        try:
            assert group.is_supervisor(proc.pid, {proc.pid}) is False
        finally:
            stop(proc)

    def test_a_changed_script_is_judged(self, supervisor_script: Path) -> None:
        """The digest pinned before the spawn must still be the file's."""
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        group.pin_supervisor(str(supervisor_script))
        proc = run_in(group, [sys.executable, "-I", str(supervisor_script)])
        try:
            with supervisor_script.open("a") as handle:
                handle.write("# changed\n")
            assert group.is_supervisor(proc.pid, {proc.pid}) is False
        finally:
            stop(proc)

    def test_a_script_the_payload_user_could_change_is_not_pinned(self, tmp_path: Path) -> None:
        """In a directory others may write (no sticky bit), or through a symlink: never pinned."""
        if os.geteuid() != 0:
            pytest.skip("needs root to own the directories")
        shared = tmp_path / "shared"
        shared.mkdir()
        script = shared / "launch.py"
        script.write_text(SUPERVISOR_CODE.format(python=sys.executable))
        script.chmod(0o755)
        shared.chmod(0o777)
        link = tmp_path / "link.py"
        link.symlink_to(script)
        group = cellgroup.CellGroup(cellgroup.SUBTREE, why="a test of the rule alone")
        group.pin_supervisor(str(script))
        group.pin_supervisor(str(link))
        assert group.supervisor_scripts == {}
