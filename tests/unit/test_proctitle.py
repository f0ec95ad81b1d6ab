"""The harness's processes show neutral titles in /proc (host/proctitle.py, issue 23)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_attest.payload import TELLTALE_WORDS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process titles are set through Linux procfs"
)

# A child that sets a title (from its environment: not in the argv it replaces), reports what
# set_title saw, and waits for stdin to close, so this test reads its /proc entries meanwhile.
CHILD = """
import json, os, sys
from sandbox_attest.host import proctitle
done = proctitle.set_title(json.loads(os.environ["TITLE"]))
print(json.dumps({"comm": done.comm, "cmdline": done.cmdline, "notes": done.notes}), flush=True)
sys.stdin.read()
"""


def titled_child(title: list[str], *extra: str) -> tuple[dict[str, object], bytes, str]:
    """Start a child that sets `title`; its own report, and its cmdline and comm as read here."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *extra],
        env={**os.environ, "TITLE": json.dumps(title)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        said = json.loads(proc.stdout.readline())
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
    finally:
        proc.communicate(timeout=30)
    return said, cmdline, comm


def test_another_process_reads_only_the_neutral_title() -> None:
    """Another process reads the title as cmdline and comm, and none of the old argv."""
    telling_argv = "--out=/srv/sandbox-attest/reports/run-1"
    said, cmdline, comm = titled_child(["python3", "app.py"], telling_argv)
    words = [w for w in cmdline.split(b"\0") if w]
    assert words == [b"python3", b"app.py"]
    assert comm == "python3"
    assert said["cmdline"] == ["python3", "app.py"]
    text = (cmdline.decode() + comm).lower()
    assert [w for w in TELLTALE_WORDS if w in text] == []


def test_a_title_longer_than_the_command_line_is_cut_and_said() -> None:
    """The kernel keeps the argument area's size: a longer title is cut, with a note."""
    said, cmdline, _ = titled_child(["python3", "x" * 4096])
    shown = [w for w in cmdline.split(b"\0") if w]
    assert shown[0] == b"python3"
    assert 0 < len(shown[1]) < 4096
    assert any("cut" in note for note in said["notes"])  # type: ignore[attr-defined]


def test_a_word_with_a_nul_is_refused() -> None:
    """A NUL would split one word into two in /proc; such a title is a caller's error."""
    from sandbox_attest.host.proctitle import set_title  # noqa: PLC0415

    with pytest.raises(ValueError, match="without NUL"):
        set_title(["py\0thon"])


# The plugin's step before a matrix session, run in a child (it retitles its own process):
# a stand-in config that names a payload user, then what the child now shows and holds.
PLUGIN_CHILD = """
import json, os, sys
from pathlib import Path
from sandbox_attest import plugin
from sandbox_attest.host.trust import USER_ENV

class Config:
    def getoption(self, name):
        return "someone" if name == plugin.OPT_PAYLOAD_USER else None

plugin._hide_the_harness(Config())
words = [w.decode() for w in Path("/proc/self/cmdline").read_bytes().split(b"\\0") if w]
print(json.dumps({"user": os.environ.get(USER_ENV), "cmdline": words}))
"""


def test_a_pytest_matrix_run_hides_the_harness_too() -> None:
    """With `pytest --sandbox-attest`, the payload user option is set and the title is neutral."""
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX_ATTEST_PAYLOAD_USER"}
    done = subprocess.run(
        [sys.executable, "-c", PLUGIN_CHILD, "--sandbox-attest-report-dir=/srv/x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    said = json.loads(done.stdout)
    assert said["user"] == "someone"
    assert said["cmdline"][1:] == ["app.py"]
