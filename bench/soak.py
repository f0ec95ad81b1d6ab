"""Soak: the full matrix N times and `pytest tests/` M times on a clean clone, then compare.

Run by hand (not part of `./run test`): `.venv/bin/python bench/soak.py [--matrix-runs 10]
[--test-runs 3]`. It clones the repository's committed HEAD into a temporary directory (so
uncommitted edits and an earlier run's files play no part), runs from that clone with this
repository's `.venv` (PYTHONPATH names the clone, so its `harness` is the one imported), and
reports three figures, each with its target:

1. verdict changes between matrix runs, per cell (target 0): a gate that is red one run in
   three gets overridden by hand;
2. test failures over the `pytest tests/` runs (target 0);
3. what the runs left on the host: descriptors, processes, mounts, containers and /tmp
   entries of the harness, before against after (target equal).

The JSON report goes to `--json` (default `reports/soak-<UTC time>.json`), a short table to
stdout; the exit status is 0 only when every target is met.

What the leftover snapshot counts, and why only that: the machine is shared, so a global
count (every process, every mount) moves with other people's work. The soak therefore makes
what its runs leave attributable: as root every run starts inside a pids cgroup of the soak's
own (a process left there is the run's, whoever its parent is now), and every run gets a
private TMPDIR (the world's scratch, the proxy's config). It counts the processes in that
cgroup (else, without root, those whose command line, working directory or environment names
the clone) and their open descriptors plus this process's own; mounts naming the clone, the
private TMPDIR or sandbox-attest; containers labelled `sandbox-attest.run` and the per-run
image tags; entries of the private TMPDIR, `/tmp` entries and journal entries with the
harness's names. The last three can still show someone else's concurrent run; the report
lists every entry, so a reader can tell whose it was.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

ROOT = Path(__file__).resolve().parent.parent
# Names the harness gives what it makes in /tmp (sandbox_attest.run.sweep.TMP_NAMES and the proxy's
# config file, the world of `sandbox-attest serve`, the test suite's temp root), and a run's
# scratch and availability-check dirs (sandbox_attest.payload.SCRATCH_PREFIX: `agent-`); the
# canaries and witness sockets are `kiln-*` / `.kiln-*` (sandbox_attest.host.disguise), the
# `sandbox-attest-*` names are those before it.
TMP_PREFIXES = (
    "kiln-",
    ".kiln-",
    "sandbox-attest-",
    "agent-",
    "proxy-config-",
    "sa-world-",
    "attest-tests-",
)
DOCKER_TIMEOUT_S = 20
RUN_TIMEOUT_S = 3600.0


# ---------------------------------------------------------------------------------------------
# What the runs leave: a snapshot, and the comparison of two.


@dataclass(frozen=True)
class Snapshot:
    """What of the harness is on the host at one moment (see the module docstring).

    Attributes:
        descriptors: open descriptors per owner ("soak": this process; "processes": the
            harness processes below, summed).
        processes: `"<pid> <command line>"` of every harness process.
        mounts: mount points that name sandbox-attest or the clone.
        containers: docker containers and images of the harness (or one entry saying why
            docker could not be asked); narrowed to the soak's runs by `only_runs`.
        tmp_entries: harness-named entries of /tmp and of the journal.
    """

    descriptors: dict[str, int] = field(default_factory=dict)
    processes: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    containers: tuple[str, ...] = ()
    tmp_entries: tuple[str, ...] = ()


@dataclass(frozen=True)
class Difference:
    """One category of a snapshot, before against after."""

    before: Any
    after: Any
    added: list[str]
    removed: list[str]
    equal: bool


def compare(before: Snapshot, after: Snapshot) -> dict[str, Difference]:
    """Each category of two snapshots side by side; `equal` (nothing added) is the target.

    Sets are compared as sets. Something gone after the runs is listed as `removed` but is
    not a leftover: the first run's sweep removes what earlier killed runs left, and a
    process of before may simply have ended. Descriptor counts are compared per owner; more
    after than before is a leak, fewer is not.
    """
    result: dict[str, Difference] = {}
    for name in ("processes", "mounts", "containers", "tmp_entries"):
        old, new = set(getattr(before, name)), set(getattr(after, name))
        result[name] = Difference(
            before=len(old),
            after=len(new),
            added=sorted(new - old),
            removed=sorted(old - new),
            equal=new <= old,
        )
    owners = sorted(set(before.descriptors) | set(after.descriptors))
    changed = [
        f"{o}: {before.descriptors.get(o, 0)} -> {after.descriptors.get(o, 0)}"
        for o in owners
        if after.descriptors.get(o, 0) > before.descriptors.get(o, 0)
    ]
    result["descriptors"] = Difference(
        before=dict(before.descriptors),
        after=dict(after.descriptors),
        added=changed,
        removed=[],
        equal=not changed,
    )
    return result


def verdict_changes(runs: Sequence[dict[str, str]]) -> dict[str, list[str]]:
    """Cells whose verdict was not the same in every run: cell id -> its verdict per run.

    A cell missing from a run counts as a change ("MISSING" in its place): a run that lost a
    cell is as unstable as one that changed it.
    """
    cells = sorted({cell for run in runs for cell in run})
    changes = {}
    for cell in cells:
        seen = [run.get(cell, "MISSING") for run in runs]
        if len(set(seen)) > 1:
            changes[cell] = seen
    return changes


def junit_failures(xml: bytes) -> dict[str, Any]:
    """Counts and failed test ids from a pytest `--junitxml` file's bytes."""
    root = ET.fromstring(xml)  # noqa: S314  (our own pytest's output, not untrusted XML)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {
        key: sum(int(s.get(key, "0")) for s in suites)
        for key in ("tests", "failures", "errors", "skipped")
    }
    failed = [
        f"{case.get('classname', '')}::{case.get('name', '')}"
        for suite in suites
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    # Skips are listed with their reasons: a test that silently stops running (a guard that
    # trips on the wrong thing) is a lost check, and a count alone does not show which.
    skipped = {
        f"{case.get('classname', '')}::{case.get('name', '')}": skip.get("message") or ""
        for suite in suites
        for case in suite.iter("testcase")
        if (skip := case.find("skipped")) is not None
    }
    return {**counts, "failed": failed, "skipped_tests": skipped}


def docker_run_ids(argv: Sequence[object]) -> set[str]:
    """The docker backend's run ids in a cell's recorded argv (`--label sandbox-attest.run=`)."""
    prefix = "sandbox-attest.run="
    return {str(a).removeprefix(prefix) for a in argv if str(a).startswith(prefix)}


def only_runs(snap: Snapshot, ids: set[str]) -> Snapshot:
    """The snapshot with its containers narrowed to those of the soak's runs (by run id).

    The engine is shared: other people's runs make and remove containers and image tags
    meanwhile. The soak's own carry its runs' docker run ids in their names and tags.
    """
    # "docker: ..." says why the engine could not be asked: kept, a changed answer shows.
    mine = tuple(c for c in snap.containers if c.startswith("docker:") or any(i in c for i in ids))
    return dataclasses.replace(snap, containers=mine)


def test_failure_count(test_runs: list[dict[str, Any]]) -> int:
    """Failed and errored tests over all runs; a run that died without a count counts as one.

    pytest exits 1 for failures, 0 for none and 5 for no tests; anything else (an internal
    error, a crash before the JUnit file) is a failure the counts cannot show.
    """
    return sum(
        int(run["failures"])
        + int(run["errors"])
        + int(run["exit_code"] not in (0, 1, 5) or (run["exit_code"] == 1 and not run["failed"]))
        for run in test_runs
    )


def targets(
    changes: dict[str, list[str]], test_runs: list[dict[str, Any]], left: dict[str, Difference]
) -> dict[str, bool]:
    """Whether each target is met: 0 verdict changes, 0 test failures, nothing left behind."""
    return {
        "verdict_changes": not changes,
        "test_failures": test_failure_count(test_runs) == 0,
        "leftovers": all(d.equal for d in left.values()),
    }


# ---------------------------------------------------------------------------------------------
# Taking a snapshot.


def _cmdline(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def _uid(pid: str) -> int | None:
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None


def _fd_count(pid: str | int) -> int:
    try:
        return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return 0


def _payload_uid() -> int | None:
    try:
        import pwd  # noqa: PLC0415  (POSIX only)

        return pwd.getpwnam(os.environ.get("SANDBOX_ATTEST_PAYLOAD_USER", "sandbox-attest")).pw_uid
    except (ImportError, KeyError):
        return None


def _ancestors() -> set[str]:
    """This process and its ancestors: never counted as the harness's."""
    pids = set()
    pid = str(os.getpid())
    while pid not in ("0", ""):
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = stat.rsplit(")", 1)[1].split()[1]
    return pids


def _names(pid: str, clone: Path) -> bool:
    """Whether a process's argv, working directory or environment names the clone."""
    if str(clone) in _cmdline(pid):
        return True
    try:
        if str(Path(f"/proc/{pid}/cwd").readlink()).startswith(str(clone)):
            return True
        return str(clone).encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def harness_processes(clone: Path, cgroup: Path | None) -> list[str]:
    """Pids of the runs' processes: those in the soak's cgroup, else those naming the clone."""
    mine = _ancestors()
    if cgroup is not None:
        try:
            pids = (cgroup / "cgroup.procs").read_text().split()
        except OSError:
            pids = []
        return [p for p in pids if p not in mine]
    if not Path("/proc/self/stat").exists():
        return []
    return [
        entry.name
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and entry.name not in mine and _names(entry.name, clone)
    ]


def make_cgroup(tag: str) -> Path | None:
    """A pids cgroup for the runs (v1 hierarchy or v2 root), or None without root or cgroups."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists():
            group = root / f"sandbox-attest-soak-{tag}"
            try:
                group.mkdir(exist_ok=True)
            except OSError:
                continue
            if (group / "cgroup.procs").exists():
                return group
    return None


def remove_cgroup(group: Path | None) -> None:
    """Remove the runs' cgroup once it is empty (a leftover is reported, never killed)."""
    if group is not None:
        with contextlib.suppress(OSError):
            group.rmdir()


def _docker(*args: str) -> list[str] | str:
    """Lines of a docker CLI query, or why docker could not be asked."""
    if shutil.which("docker") is None:
        return "docker: no CLI"
    try:
        done = subprocess.run(
            ["docker", *args],
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "docker: no answer"
    if done.returncode != 0:
        return "docker: engine not answering"
    return [line for line in done.stdout.splitlines() if line]


def containers() -> tuple[str, ...]:
    """The harness's containers (by label) and per-run image tags; or why not known."""
    listed = _docker("ps", "-a", "--filter", "label=sandbox-attest.run", "--format", "{{.Names}}")
    if isinstance(listed, str):
        return (listed,)
    images = _docker(
        "images", "--filter", "reference=sandbox-attest/*", "--format", "{{.Repository}}:{{.Tag}}"
    )
    tags = [f"image {i}" for i in images] if isinstance(images, list) else [images]
    return tuple(sorted([f"container {c}" for c in listed] + tags))


def tmp_entries(private: Path) -> tuple[str, ...]:
    """The runs' private TMPDIR, and harness-named /tmp and journal entries of no live run.

    A concurrent run (someone else's, or this soak's own in progress) journals what it makes
    under a live owner: those entries, and the paths they claim, are that run's and are left
    out. What remains after the soak's runs ended is something a finished run left.
    """
    found = [str(p) for p in private.iterdir()] if private.is_dir() else []
    try:
        from sandbox_attest.host import journal as sweep  # noqa: PLC0415  (the same journal the clone's runs use)

        live = sweep.live_entries()
    except Exception as exc:  # a snapshot says what it could not read
        return (*sorted(found), f"journal unreadable: {exc}")
    claimed = {str(p) for data in live for p in [*data.get("paths", []), *data.get("dirs", [])]}
    tmp = Path(tempfile.gettempdir())
    found += [
        str(p) for p in tmp.iterdir() if p.name.startswith(TMP_PREFIXES) and str(p) not in claimed
    ]
    found += [str(entry) for entry in sweep.dead_entries()]
    return tuple(sorted(found))


def mounts(*names: Path) -> tuple[str, ...]:
    """Mount points naming the harness or one of `names` (the clone, the private TMPDIR)."""
    if shutil.which("findmnt") is None:
        return ("findmnt: missing",)
    done = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False
    )
    return tuple(
        sorted(
            m
            for m in done.stdout.splitlines()
            if "sandbox-attest" in m or any(str(n) in m for n in names)
        )
    )


@dataclass(frozen=True)
class Where:
    """Where the soak's runs live: the clone, their private TMPDIR, their cgroup (or None)."""

    clone: Path
    tmp: Path
    cgroup: Path | None


def snapshot(where: Where) -> Snapshot:
    """What of the runs is on the host now."""
    pids = harness_processes(where.clone, where.cgroup)
    return Snapshot(
        descriptors={"soak": _fd_count("self"), "processes": sum(_fd_count(p) for p in pids)},
        processes=tuple(sorted(f"{p} {_cmdline(p)[:200]}" for p in pids)),
        mounts=mounts(where.clone, where.tmp),
        containers=containers(),
        tmp_entries=tmp_entries(where.tmp),
    )


# ---------------------------------------------------------------------------------------------
# The runs.


def clone_repo(source: Path, into: Path) -> str:
    """`git clone` the committed HEAD of `source`; its commit id."""
    subprocess.run(["git", "clone", "--quiet", str(source), str(into)], check=True)
    done = subprocess.run(
        ["git", "-C", str(into), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def clone_env(where: Where, *, private_tmp: bool) -> dict[str, str]:
    """This environment with the clone first on the import path (the venv's .pth names ours).

    With `private_tmp`, TMPDIR is the runs' own, so what a matrix run leaves in its temp dir
    is known to be its. `pytest tests/` keeps the system one: its tests bind unix sockets
    under tmp_path, and a longer prefix could push a path past the ~100-byte limit.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where.clone), env.get("PYTHONPATH")]))
    if private_tmp:
        env["TMPDIR"] = str(where.tmp)
    env.pop("SANDBOX_ATTEST_TEST_FAULTS", None)  # never a fault hook in a soak
    return env


def _run(argv: list[str], where: Where, *, private_tmp: bool) -> subprocess.CompletedProcess[str]:
    """Run `argv` from the clone, inside the runs' cgroup when there is one."""
    procs = where.cgroup / "cgroup.procs" if where.cgroup is not None else None

    def enter() -> None:
        # In the child before exec: it and everything it starts belong to the cgroup.
        if procs is not None:
            procs.write_text(str(os.getpid()))

    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        cwd=where.clone,
        env=clone_env(where, private_tmp=private_tmp),
        preexec_fn=enter if procs is not None else None,
    )


def run_matrix(where: Where, out: Path, python: str, jobs: int) -> dict[str, Any]:
    """One `sandbox-attest run` of the full matrix from the clone; its gate and verdicts."""
    start = time.monotonic()
    done = _run(
        [python, "-m", "sandbox_attest.cli", "run", "--out", str(out), "--json", "-j", str(jobs)],
        where,
        private_tmp=True,
    )
    cells: dict[str, str] = {}
    reasons: dict[str, str] = {}
    docker_ids: set[str] = set()
    evidence = out / "evidence.json"
    if evidence.is_file():
        for cell in json.loads(evidence.read_text())["cells"]:
            cells[str(cell["cell_id"])] = str(cell["verdict"])
            reasons[str(cell["cell_id"])] = str(cell.get("reason", ""))[:300]
            docker_ids.update(docker_run_ids(cell.get("run", {}).get("argv") or []))
    try:
        gate = str(json.loads(done.stdout).get("gate"))
    except ValueError:
        gate = "unknown (no JSON on stdout)"
    return {
        "exit_code": done.returncode,
        "gate": gate,
        "duration_s": round(time.monotonic() - start, 1),
        "cells": cells,
        "reasons": reasons,
        "docker_run_ids": sorted(docker_ids),
        "stderr_tail": done.stderr[-2000:] if not cells else "",
    }


def run_tests(where: Where, junit: Path, python: str) -> dict[str, Any]:
    """One `pytest tests/` from the clone; counts and failed test ids from its JUnit XML."""
    start = time.monotonic()
    done = _run(
        [python, "-m", "pytest", "tests/", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        where,
        private_tmp=False,
    )
    found: dict[str, Any] = {
        "tests": 0,
        "failures": 0,
        "errors": 0,
        "skipped": 0,
        "failed": [],
        "skipped_tests": {},
    }
    if junit.is_file():
        found = junit_failures(junit.read_bytes())
    return {
        "exit_code": done.returncode,
        "duration_s": round(time.monotonic() - start, 1),
        **found,
        "tail": done.stdout[-1500:] if done.returncode not in (0, 5) else "",
    }


def table(report: dict[str, Any]) -> list[str]:
    """The report's short table for a person."""
    met = report["targets_met"]

    def mark(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    changes = len(report["verdict_changes"])
    lines = [
        (
            f"soak of {report['commit'][:12]}: {len(report['matrix_runs'])} matrix runs, "
            f"{len(report['test_runs'])} test runs"
        ),
        f"  verdict changes between runs  {changes:>4}  (target 0)  {mark(met['verdict_changes'])}",
        (
            f"  test failures                 {report['test_failures']:>4}  (target 0)  "
            f"{mark(met['test_failures'])}"
        ),
    ]
    for name, diff in report["leftovers"].items():
        lines.append(
            f"  {name:<13} before {json.dumps(diff['before']):<28} after "
            f"{json.dumps(diff['after']):<28} {'equal' if diff['equal'] else 'DIFFERENT'}"
        )
    for cell, seen in report["verdict_changes"].items():
        lines.append(f"  changed: {cell}: {' -> '.join(seen)}")
    for name, diff in report["leftovers"].items():
        lines.extend(f"  left ({name}): {entry}" for entry in diff["added"])
    for index, run in enumerate(report["matrix_runs"], 1):
        lines.append(
            f"  matrix run {index}: exit {run['exit_code']}, gate {run['gate']}, "
            f"{len(run['cells'])} cells, {run['duration_s']} s"
        )
    for index, run in enumerate(report["test_runs"], 1):
        lines.append(
            f"  test run {index}: exit {run['exit_code']}, {run['tests']} tests, "
            f"{run['failures']} failures, {run['errors']} errors, {run['skipped']} skipped, "
            f"{run['duration_s']} s"
        )
    reasons: dict[str, int] = {}
    for run in report["test_runs"]:
        for reason in (run.get("skipped_tests") or {}).values():
            reasons[reason] = reasons.get(reason, 0) + 1
    lines.extend(f"  skipped {n}x: {reason[:150]}" for reason, n in sorted(reasons.items()))
    return lines


def soak(matrix_runs: int, test_runs: int, jobs: int, keep: bool) -> dict[str, Any]:
    """Clone, snapshot, run everything, snapshot again; the whole report."""
    python = str(ROOT / ".venv" / "bin" / "python")
    if not Path(python).exists():
        python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    # The payload user must traverse to the clone's probes and the runs' scratch.
    work.chmod(0o755)
    where = Where(clone=work / "clone", tmp=work / "tmp", cgroup=make_cgroup(work.name))
    where.tmp.mkdir(mode=0o755)
    where.tmp.chmod(0o755)  # whatever the umask: scratch dirs below must be reachable
    try:
        commit = clone_repo(ROOT, where.clone)
        before = snapshot(where)
        runs = [
            run_matrix(where, work / "reports" / f"run-{i}", python, jobs)
            for i in range(1, matrix_runs + 1)
        ]
        tests = [run_tests(where, work / f"junit-{i}.xml", python) for i in range(1, test_runs + 1)]
        # Give dying children a moment to be reaped before counting what is left.
        time.sleep(2.0)
        after = snapshot(where)
    finally:
        remove_cgroup(where.cgroup)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    changes = verdict_changes([r["cells"] for r in runs])
    ids = {i for r in runs for i in r["docker_run_ids"]}
    left = compare(only_runs(before, ids), only_runs(after, ids))
    return {
        "commit": commit,
        "clone": str(where.clone),
        "cgroup": str(where.cgroup) if where.cgroup is not None else None,
        "kept": keep,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "matrix_runs": runs,
        "test_runs": tests,
        "verdict_changes": changes,
        "test_failures": test_failure_count(tests),
        "leftovers": {name: asdict(diff) for name, diff in left.items()},
        "targets_met": targets(changes, tests, left),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the soak; 0 only when every target is met."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--matrix-runs", type=int, default=10, help="full matrix runs (10)")
    parser.add_argument("--test-runs", type=int, default=3, help="`pytest tests/` runs (3)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="cells at once per run (1)")
    parser.add_argument("--json", type=Path, help="report path (reports/soak-<UTC>.json)")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its reports")
    args = parser.parse_args(argv)
    report = soak(args.matrix_runs, args.test_runs, args.jobs, args.keep)
    path = args.json or ROOT / "reports" / f"soak-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    for line in table(report):
        print(line)
    print(f"report: {path}")
    return 0 if all(report["targets_met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
