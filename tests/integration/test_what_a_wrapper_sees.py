"""Nothing a command wrapper sees of its own start says it is under test (issue 23, part 4).

A wrapper that confines only when it detects the harness would earn every PASS. The wrapper
here (tests/data/lookout/wrapper.py) records what such a wrapper would look at: its argv,
its environment (names and values), its cwd, and the cmdline and comm of every ancestor it
can read. A real `sandbox-attest run` starts it, and none of that may carry a telltale word
(`sandbox_attest.payload.TELLTALE_WORDS`), the word `pytest` or a probe's id.

The exceptions, each with its reason:
- the interpreter's own path (`sys.prefix`): the user installed the harness there; a venv
  inside a checkout named `sandbox-attest` shows that name, and only the user can move it;
- ancestors above the harness process: this test's own pytest, or whatever shell or CI step
  started `sandbox-attest run` (its command line is the user's);
- the spec's own choices (the wrapper's path and `[env] set`), kept neutral here by this test.

What it does not cover (reports/README.md, "What a wrapper can still see"): files a wrapper
may read (the task's contents, the probes' code), the fixture world, /proc of other processes
than its ancestors, its cgroup's name.
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
from sandbox_attest.hostview import LAUNCHER
from sandbox_attest.payload import TELLTALE_WORDS

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux procfs"),
    pytest.mark.timeout(240),
]

REPO = Path(__file__).resolve().parents[2]
LOOKOUT = REPO / "tests" / "data" / "lookout"
PROBE = "env_inheritance"  # quick, and it needs nothing of the world but the workspace
RUN_TIMEOUT_S = 180
# Beyond the words that name the harness: the test runner it runs under, and every probe id
# (a wrapper that saw one would know the escape being tried).
LOUD = (*TELLTALE_WORDS, "pytest", *PROBES)


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
    root = Path(tempfile.mkdtemp())
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
            f'[[probe]]\nid = "{PROBE}"\ntimeout = 60\n'
            '[[backend]]\nname = "none"\nplatforms = ["linux"]\n'
        )
        policy = root / "p.toml"
        policy.write_text(
            f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = ["{PROBE}"]\n'
        )
        # The harness passes its own environment on, as an agent's would be: this test's
        # (PYTEST_CURRENT_TEST names this file) is not what a user's would hold.
        env = {k: os.environ[k] for k in ("PATH", "LANG", "HOME") if k in os.environ}
        proc = subprocess.Popen(
            [
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
