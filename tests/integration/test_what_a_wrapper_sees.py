"""Nothing a command wrapper sees of its start or its cell says it is under test (issue 23).

A wrapper that confines only when it detects the harness would earn every PASS. The wrapper
here (tests/data/lookout/wrapper.py) records what such a wrapper would look at: its argv,
its environment (names and values), its cwd, and the cmdline and comm of every ancestor it
can read; and while its payload runs, what the payload user can list: the workspace, /tmp
and /run, the payload home, abstract sockets, the command lines of processes carrying the
cell's nonce, /proc/self/cgroup, and the `Server:` headers of the fixture origins and the
fake daemon. A real `sandbox-attest run` starts it on cells whose probes plant what the host
plants (canaries, witness sockets, an anchor process), and none of that may carry a telltale
word (`sandbox_attest.payload.TELLTALE_WORDS`), `witness`, the word `pytest` or a probe's id.
The run goes through scripts/fresh-state.sh where it can (root, util-linux's unshare): /tmp
then starts empty and the harness's leftovers are hidden, so every name judged is this run's.

The exceptions, each with its reason:
- the interpreter's own path (`sys.prefix`): the user installed the harness there; a venv
  inside a checkout named `sandbox-attest` shows that name, and only the user can move it;
- ancestors above the harness process: this test's own pytest, or whatever shell or CI step
  started `sandbox-attest run` (its command line is the user's);
- the spec's own choices (the wrapper's path and `[env] set`), kept neutral here by this test.

- the cgroup levels above the harness's own group: the user's (systemd's slice, a CI's).

What it does not cover (reports/README.md, "What a wrapper can still see"): what a wrapper
may read in files (the task's contents, the probes' code), the payload's output, the fixture
zone `.test` and its host names, the lab's mounts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.host import disguise
from sandbox_attest.payload import TELLTALE_WORDS
from sandbox_attest.run.hostview import LAUNCHER

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux procfs"),
    pytest.mark.timeout(420),
]

REPO = Path(__file__).resolve().parents[2]
LOOKOUT = REPO / "tests" / "data" / "lookout"
# env_inheritance is quick and needs nothing but the workspace; each other one makes the host
# plant what a wrapper could list during its cell: an anchor process (proc_visibility), witness
# sockets in /tmp, /run and the abstract namespace beside the fake daemon
# (ipc_unix_socket_escape), canary dirs in /tmp (fs_write_outside), canaries in the payload
# home (fs_read_secrets).
CELL_PROBES = (
    "env_inheritance",
    "proc_visibility",
    "ipc_unix_socket_escape",
    "fs_write_outside",
    "fs_read_secrets",
)
RUN_TIMEOUT_S = 330
FRESH_STATE = REPO / "scripts" / "fresh-state.sh"
# Only where a fresh /tmp and /run can be made is every name there this run's own.
FRESH = os.geteuid() == 0 and shutil.which("unshare") is not None
# Beyond the words that name the harness: the test runner it runs under, and every probe id
# (a wrapper that saw one would know the escape being tried), and what a socket is there for.
LOUD = (*TELLTALE_WORDS, "witness", "pytest", *PROBES)
Seen = tuple[list[dict[str, Any]], int, str]


def telltales(text: str) -> list[str]:
    """The loud words in `text` once the interpreter's own prefix is taken out."""
    for prefix in {sys.prefix, sys.base_prefix, str(Path(sys.executable).parent)}:
        text = text.replace(prefix, "<python>")
    return [word for word in LOUD if word in text.lower()]


@pytest.fixture(scope="module")
def seen() -> Iterator[tuple[list[dict[str, Any]], int, str]]:
    """One run with the lookout wrapper: its records, the harness pid, and the run's output."""
    # A directory named as any program's temp dir would be: the wrapper's own path and its
    # SEEN_DIR must not be what trips the check (the suite's temp root is `attest-tests-*`).
    # Under fresh-state.sh /tmp is the namespace's own, so the directory is made in /var/tmp.
    root = Path(tempfile.mkdtemp(dir="/var/tmp" if FRESH else None))
    try:
        root.chmod(0o755)
        drop = root / "seen"
        drop.mkdir()
        drop.chmod(0o777)  # the payload user writes its records here
        wrapper = root / "wrap.py"
        shutil.copyfile(LOOKOUT / "wrapper.py", wrapper)
        wrapper.chmod(0o755)
        spec = root / "wrap.toml"
        text = (LOOKOUT / "spec.toml.in").read_text()
        spec.write_text(text.replace("@WRAPPER@", str(wrapper)).replace("@SEEN_DIR@", str(drop)))
        matrix = root / "m.toml"
        matrix.write_text(
            "".join(f'[[probe]]\nid = "{probe}"\ntimeout = 60\n' for probe in CELL_PROBES)
            + '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        )
        policy = root / "p.toml"
        required = ", ".join(f'"{probe}"' for probe in CELL_PROBES)
        policy.write_text(
            f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{required}]\n'
        )
        # The harness passes its own environment on, as an agent's would be: this test's
        # (PYTEST_CURRENT_TEST names this file) is not what a user's would hold.
        env = {k: os.environ[k] for k in ("PATH", "LANG", "HOME") if k in os.environ}
        proc = subprocess.Popen(
            [
                *([str(FRESH_STATE)] if FRESH else []),
                *(sys.executable, "-m", "sandbox_attest.cli", "run", "--world", "loopback"),
                *("--matrix", str(matrix), "--policy", str(policy), "--backend-spec", str(spec)),
                *("--out", str(root / "out")),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=root,
            env=env,
        )
        try:
            output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        records = [json.loads(p.read_text()) for p in sorted(drop.glob("seen-*.json"))]
        yield records, proc.pid, output
    finally:
        shutil.rmtree(root, ignore_errors=True)


def starts(seen: tuple[list[dict[str, Any]], int, str]) -> list[dict[str, Any]]:
    """Every start of the wrapper (the availability check's too); fails if none ran a payload."""
    records, _, output = seen
    cells = [r for r in records if any(a.endswith(f"/{LAUNCHER}") for a in r["argv"])]
    assert cells, f"the wrapper never ran a payload: {len(records)} records; run said {output}"
    return records


def test_the_wrapper_argv_and_cwd_are_neutral(seen: tuple[list[dict[str, Any]], int, str]) -> None:
    """The payload's command line and the wrapper's cwd name no harness, test or probe."""
    for record in starts(seen):
        shown = " ".join([*record["argv"], record["cwd"]])
        assert telltales(shown) == [], shown


def test_the_wrapper_environment_is_neutral(seen: tuple[list[dict[str, Any]], int, str]) -> None:
    """No variable name or value the wrapper gets carries a telltale word."""
    for record in starts(seen):
        loud = {k: v for k, v in record["environ"].items() if telltales(f"{k}={v}")}
        assert loud == {}


def test_the_harness_and_the_ancestors_below_it_are_neutral(
    seen: tuple[list[dict[str, Any]], int, str],
) -> None:
    """Every ancestor up to the harness process shows a neutral cmdline and comm."""
    _, harness_pid, _ = seen
    for record in starts(seen):
        chain = record["ancestors"]
        pids = [a["pid"] for a in chain]
        assert harness_pid in pids, f"the harness {harness_pid} is not an ancestor: {pids}"
        for ancestor in chain[: pids.index(harness_pid) + 1]:
            assert ancestor["unread"] == "", ancestor
            shown = " ".join([*ancestor["cmdline"], ancestor["comm"]])
            assert telltales(shown) == [], ancestor


def test_the_harness_children_show_neutral_titles(
    seen: tuple[list[dict[str, Any]], int, str],
) -> None:
    """The harness's other children (its egress proxy and signer) show neutral titles too."""
    _, harness_pid, _ = seen
    siblings = [
        s for r in starts(seen) if r["ancestors"][0]["pid"] == harness_pid for s in r["siblings"]
    ]
    titles = [s["cmdline"] for s in siblings]
    # The signer runs from before the first wrapper starts, the proxy from the first cell on
    # (the availability check comes before the world): each was seen at least once.
    assert any(t[1:3] == ["-m", "relay"] for t in titles), titles
    assert any(t[1:2] == ["worker.py"] for t in titles), titles
    for sibling in siblings:
        shown = " ".join([*sibling["cmdline"], sibling["comm"]])
        assert telltales(shown) == [], sibling


def cells(seen: Seen) -> list[dict[str, Any]]:
    """The records of starts that ran a payload (those carry the cell's nonce and task)."""
    found = [r for r in starts(seen) if r.get("nonce")]
    assert found, "no start of the wrapper ran a payload with a task"
    return found


def basenames(paths: list[str]) -> set[str]:
    """The last component of every path."""
    return {Path(p).name for p in paths}


def needs_fresh_state() -> None:
    """Skip where /tmp and /run hold other programs' names too (no root or no unshare)."""
    if not FRESH:
        pytest.skip("a fresh /tmp and /run needs root and util-linux's unshare")


def test_the_workspace_shows_only_neutral_names(seen: Seen) -> None:
    """The workspace, listed all through each cell, rendezvous files included, names nothing."""
    listed = [p for record in cells(seen) for p in record["listed"]["workspace"]]
    assert telltales(" ".join(sorted(basenames(listed)))) == [], sorted(basenames(listed))
    # The listing ran while the host looked: the launcher's rendezvous file was seen.
    ready = [n for n in basenames(listed) if n.startswith(disguise.READY_PREFIX)]
    assert ready, f"no rendezvous file seen in any cell's workspace: {sorted(basenames(listed))}"


def test_tmp_and_run_and_the_home_show_only_neutral_names(seen: Seen) -> None:
    """Every name the payload user can list in /tmp, /run and its home during a cell is neutral."""
    needs_fresh_state()
    for place in ("tmp", "run", "home"):
        names = {n for record in cells(seen) for n in basenames(record["listed"][place])}
        assert telltales(" ".join(sorted(names))) == [], (place, sorted(names))
    tmp = {n for record in cells(seen) for n in basenames(record["listed"]["tmp"])}
    home = {n for record in cells(seen) for n in basenames(record["listed"]["home"])}
    # The host's plantings were there to be seen: a canary dir and a witness socket in /tmp
    # (/run gets witnesses only in directories that hold a socket, which a host may lack),
    # canaries in the home.
    assert any(n.startswith(disguise.CANARY_PREFIX) for n in tmp), sorted(tmp)
    assert any(n.startswith(disguise.WITNESS_PREFIX) for n in tmp), sorted(tmp)
    assert any(n.startswith(disguise.CANARY_PREFIX) for n in home), sorted(home)


def test_abstract_sockets_of_the_cell_are_neutral(seen: Seen) -> None:
    """The abstract sockets of this run (its witnesses, the fake daemon) name nothing."""
    ours = []
    for record in cells(seen):
        daemon = f"@{disguise.DAEMON_ABSTRACT_PREFIX}"
        ours += [
            name
            for name in record["listed"]["abstract"]
            if record["nonce"] in name or name.startswith(daemon)
        ]
    assert ours, "no abstract socket of this run was seen"
    assert telltales(" ".join(ours)) == [], ours


def test_processes_carrying_the_nonce_are_neutral(seen: Seen) -> None:
    """Every process command line that carries a cell's nonce (the host's anchor) is neutral."""
    shown = [c for record in cells(seen) for c in record["listed"]["processes"]]
    assert any(disguise.ANCHOR_MARKER in c for c in shown), shown
    for cmdline in shown:
        assert telltales(cmdline) == [], cmdline


def test_the_cgroup_below_the_harness_is_neutral(seen: Seen) -> None:
    """/proc/self/cgroup names nothing below the harness's own group (the run's and the cell's)."""
    for record in cells(seen):
        above = {}
        for line in record["harness_cgroup"]:
            hierarchy, _, path = line.rpartition(":")
            above[hierarchy] = path
        for line in record["listed"]["cgroup"]:
            hierarchy, _, path = line.rpartition(":")
            # The levels above the harness's own group are the user's (systemd's, a CI's).
            own = above.get(hierarchy, "")
            below = path.removeprefix(own)
            assert telltales(below) == [], line


def test_server_headers_are_neutral(seen: Seen) -> None:
    """The `Server:` headers of every fixture origin and of the fake daemon name nothing."""
    headers = {k: v for record in cells(seen) for k, v in record["servers"].items()}
    assert any(k.startswith("origin:") for k in headers), headers
    assert any(k.startswith("daemon:") for k in headers), headers
    for where, server in headers.items():
        assert not server.startswith("error"), (where, server)
        assert server, f"{where} sent no Server header"
        assert telltales(server) == [], (where, server)
