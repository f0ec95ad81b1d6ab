"""bench/soak.py's comparisons: verdict changes, test failures, leftovers before and after."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SOAK = Path(__file__).parent.parent.parent / "bench" / "soak.py"


def _load() -> ModuleType:
    # bench/ is scripts, not a package: load the file itself, as `python bench/soak.py` does.
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolves the module's annotations through sys.modules.
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


soak = _load()


class TestVerdictChanges:
    def test_same_verdicts_every_run_are_no_change(self) -> None:
        """Cells with one verdict in every run are not reported."""
        runs = [{"none-a": "PASS", "bwrap-a": "FAIL"}, {"none-a": "PASS", "bwrap-a": "FAIL"}]
        assert soak.verdict_changes(runs) == {}

    def test_a_changed_verdict_is_listed_with_every_run(self) -> None:
        """A cell that went PASS then INCONCLUSIVE is listed with both, in run order."""
        runs = [{"c": "PASS", "d": "PASS"}, {"c": "INCONCLUSIVE", "d": "PASS"}, {"c": "PASS"}]
        assert soak.verdict_changes(runs) == {
            "c": ["PASS", "INCONCLUSIVE", "PASS"],
            "d": ["PASS", "PASS", "MISSING"],
        }

    def test_one_run_has_nothing_to_compare(self) -> None:
        """A single run cannot change: no changes."""
        assert soak.verdict_changes([{"c": "ERROR"}]) == {}


class TestCompare:
    def snap(self, **kwargs: object) -> object:
        """A snapshot with one proxy process, one mount, one container and one /tmp entry."""
        base: dict[str, object] = {
            "descriptors": {"soak": 5, "processes": 10},
            "processes": ("1 python -m sandbox_attest.world.egress.proxy cfg",),
            "mounts": ("/tmp/sandbox-attest-x",),
            "containers": ("container sa-1",),
            "tmp_entries": ("/tmp/sandbox-attest-abc",),
        }
        return soak.Snapshot(**{**base, **kwargs})

    def test_identical_snapshots_are_equal_everywhere(self) -> None:
        """Nothing differs: every category is equal, with nothing added or removed."""
        result = soak.compare(self.snap(), self.snap())
        assert set(result) == {"descriptors", "processes", "mounts", "containers", "tmp_entries"}
        assert all(d.equal and not d.added and not d.removed for d in result.values())

    def test_a_left_process_and_tmp_entry_are_named(self) -> None:
        """What appeared after the runs is listed as added, and the category is not equal."""
        after = self.snap(
            processes=("1 python -m sandbox_attest.world.egress.proxy cfg", "7 python -c anchor"),
            tmp_entries=("/tmp/sandbox-attest-abc", "/tmp/sandbox-attest-def"),
        )
        result = soak.compare(self.snap(), after)
        assert result["processes"].added == ["7 python -c anchor"]
        assert result["processes"].equal is False
        assert result["tmp_entries"].added == ["/tmp/sandbox-attest-def"]
        assert result["mounts"].equal is True

    def test_something_gone_is_listed_but_not_a_leftover(self) -> None:
        """A container gone after the runs is listed as removed; the category stays equal."""
        result = soak.compare(self.snap(), self.snap(containers=()))
        assert result["containers"].removed == ["container sa-1"]
        assert result["containers"].equal is True

    def test_descriptor_counts_are_compared_per_owner(self) -> None:
        """A descriptor more in this process shows as 'soak: 5 -> 6'."""
        after = self.snap(descriptors={"soak": 6, "processes": 10})
        result = soak.compare(self.snap(), after)
        assert result["descriptors"].added == ["soak: 5 -> 6"]
        assert result["descriptors"].equal is False
        fewer = soak.compare(self.snap(), self.snap(descriptors={"soak": 4, "processes": 10}))
        assert fewer["descriptors"].equal is True  # a descriptor closed is no leak


@pytest.fixture(scope="module")
def junit(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real JUnit XML from pytest: one pass, one failure, one error, one skip."""
    directory = tmp_path_factory.mktemp("junit")
    (directory / "test_sample.py").write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken():\n    raise RuntimeError('fixture')\n"
        "def test_ok():\n    assert True\n"
        "def test_bad():\n    assert 1 == 2\n"
        "def test_err(broken):\n    pass\n"
        "def test_skip():\n    pytest.skip('no')\n"
    )
    xml = directory / "junit.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(directory / "test_sample.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            f"--junitxml={xml}",
            f"--rootdir={directory}",
            "-c",
            "/dev/null",
        ],
        capture_output=True,
        check=False,
        cwd=directory,
    )
    return xml.read_bytes()


class TestTestFailures:
    def test_counts_and_ids_come_from_pytest_junit(self, junit: bytes) -> None:
        """Real pytest JUnit XML gives 4 tests, 1 failure, 1 error, 1 skip, and both ids."""
        found = soak.junit_failures(junit)
        assert (found["tests"], found["failures"], found["errors"], found["skipped"]) == (
            4,
            1,
            1,
            1,
        )
        assert sorted(name.rsplit("::", 1)[1] for name in found["failed"]) == [
            "test_bad",
            "test_err",
        ]
        # The skip is named with its reason, so a test that stops running shows which.
        [(skipped, reason)] = found["skipped_tests"].items()
        assert skipped.endswith("::test_skip")
        assert reason == "no"

    def test_a_crashed_run_counts_as_a_failure(self) -> None:
        """A run that exited 2 with no counts is one failure; exit 5 (no tests) is none."""
        crashed = {"exit_code": 2, "failures": 0, "errors": 0, "failed": []}
        empty = {"exit_code": 5, "failures": 0, "errors": 0, "failed": []}
        assert soak.test_failure_count([crashed]) == 1
        assert soak.test_failure_count([empty]) == 0

    def test_failures_sum_over_runs(self) -> None:
        """Two failures in one run and an error in another are three."""
        one = {"exit_code": 1, "failures": 2, "errors": 0, "failed": ["a", "b"]}
        two = {"exit_code": 1, "failures": 0, "errors": 1, "failed": ["c"]}
        assert soak.test_failure_count([one, two]) == 3


class TestTargets:
    def test_met_only_with_no_change_no_failure_nothing_left(self) -> None:
        """Each target is met on its own terms; a leftover misses only the leftovers target."""
        same = soak.compare(soak.Snapshot(), soak.Snapshot())
        ok_run = {"exit_code": 0, "failures": 0, "errors": 0, "failed": []}
        assert soak.targets({}, [ok_run], same) == {
            "verdict_changes": True,
            "test_failures": True,
            "leftovers": True,
        }
        left = soak.compare(soak.Snapshot(), soak.Snapshot(tmp_entries=("/tmp/sandbox-attest-x",)))
        assert soak.targets({"c": ["PASS", "FAIL"]}, [], left) == {
            "verdict_changes": False,
            "test_failures": True,
            "leftovers": False,
        }


def test_a_real_snapshot_reads_this_host(tmp_path: Path) -> None:
    """A snapshot of this host counts this process's descriptors and its private TMPDIR."""
    (tmp_path / "sandbox-attest-left").mkdir()
    where = soak.Where(clone=tmp_path / "clone", tmp=tmp_path, cgroup=None)
    taken = soak.snapshot(where)
    assert str(tmp_path / "sandbox-attest-left") in taken.tmp_entries
    assert taken.descriptors["soak"] > 0
    assert all(isinstance(entry, str) for entry in taken.tmp_entries)
    assert taken.containers  # names, or the reason docker could not be asked


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making a cgroup needs root"
)
def test_a_process_left_in_the_runs_cgroup_is_counted() -> None:
    """A process started in the soak's cgroup is one of the runs', whoever its parent is."""
    group = soak.make_cgroup(f"unit-{os.getpid()}")
    if group is None:
        pytest.skip("no pids cgroup hierarchy here")
    procs = group / "cgroup.procs"
    child = subprocess.Popen(
        ["sleep", "30"],
        preexec_fn=lambda: procs.write_text(str(os.getpid())),  # noqa: PLW1509  (one write)
    )
    try:
        where = soak.Where(clone=Path("/nonexistent-clone"), tmp=Path("/nonexistent"), cgroup=group)
        assert soak.harness_processes(where.clone, group) == [str(child.pid)]
    finally:
        child.kill()
        child.wait()
        deadline = time.monotonic() + 5
        while (procs.read_text().split() if procs.exists() else []) and time.monotonic() < deadline:
            time.sleep(0.05)
        soak.remove_cgroup(group)
    assert not group.exists()


def test_only_journal_entries_of_gone_runs_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live run's journal entry and the scratch it claims are its; a dead owner's is left."""
    from sandbox_attest.host import journal as sweep  # noqa: PLC0415  (after the state dir is set)

    monkeypatch.setenv(sweep.STATE_ENV, str(tmp_path / "state"))
    live = sweep.record("run-live", [tmp_path / "scratch"], run_id="live")
    dead = sweep.journal_dir() / "run-dead.json"
    entry = json.loads(live.read_text())
    entry["owner"]["pid"] = 2**22 + 1  # above any pid_max default: no such process
    dead.write_text(json.dumps(entry))
    assert sweep.dead_entries() == [dead]
    taken = soak.tmp_entries(tmp_path / "private")
    assert str(dead) in taken
    assert str(live) not in taken


def test_containers_are_narrowed_to_the_soaks_runs() -> None:
    """Another run's image tag is ignored; one carrying a soak run's docker id is kept."""
    argv = ["docker", "run", "--label", "sandbox-attest.run=20261201t1-abc", "img"]
    ids = soak.docker_run_ids(argv)
    assert ids == {"20261201t1-abc"}
    snap = soak.Snapshot(
        containers=(
            "image sandbox-attest/hostroot:20261201t1-abc",
            "image sandbox-attest/hostroot:20261201t0-zzz",
            "docker: engine not answering",
        )
    )
    assert soak.only_runs(snap, ids).containers == (
        "image sandbox-attest/hostroot:20261201t1-abc",
        "docker: engine not answering",
    )
