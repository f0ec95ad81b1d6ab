"""Availability tells a sandbox with its own kernel by behaviour (issue 27, item 2).

The test command writes a file into the workspace and waits for the host's answer, while the
host looks for its process. A wrapper that runs it where the host sees no such process, yet
lets its file land (gVisor, a microVM; here a shell that feeds the one-liner to `python -` so
its command line is not the one-liner's), gets a note naming `kernel = "own"`; a spec that
claims an own kernel while the host reads its test command as a host process is UNAVAILABLE,
naming the fix. Real wrappers, run as the payload user.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandbox_attest.backends.base import Availability
from sandbox_attest.backends.command.backend import CommandBackend

HIDDEN = """
[backend]
name = "hidden-kernel"
[detect]
executables = ["sh"]
[run]
egress = "harness-tcp"
# {payload} is `python -c CODE READY GO`: fed to `python -` instead, the process the host
# finds runs the same code under another command line, as a guest kernel's would be unseen.
argv = ["sh", "-c", 'py="$1"; code="$3"; shift 3; printf "%s" "$code" | "$py" - "$@"', "sh",
        "{payload}"]
[claims]
network = "open"
filesystem = "open"
ipc = "open"
"""

PLAIN = """
[backend]
name = "plain-kernel"
[detect]
executables = ["env"]
[run]
egress = "harness-tcp"
argv = ["env", "{payload}"]
[claims]
network = "open"
filesystem = "open"
ipc = "open"
kernel = "own"
"""


def availability(tmp_path: Path, body: str) -> Availability:
    """The availability of a spec with this body."""
    path = tmp_path / "spec.toml"
    path.write_text(body)
    return CommandBackend.from_path(path).availability()


class TestKernelShape:
    def test_unseen_process_with_a_landed_file_suggests_the_claim(self, tmp_path: Path) -> None:
        """No host process ran the test command, its file landed: the note names kernel own."""
        avail = availability(tmp_path, HIDDEN)
        assert avail.ok, avail.reason
        assert avail.identity is not None
        facts = avail.identity.profile["test_command"]
        assert facts["host_process"] == "not seen; its workspace file landed"
        assert 'claim kernel = "own"' in avail.reason

    def test_claimed_and_unseen_says_nothing_more(self, tmp_path: Path) -> None:
        """Claimed, and the behaviour agrees: no note about the kernel."""
        avail = availability(tmp_path, HIDDEN + 'kernel = "own"\n')
        assert avail.ok, avail.reason
        assert "kernel = " not in avail.reason

    def test_a_false_claim_is_unavailable(self, tmp_path: Path) -> None:
        """Claimed while the host reads the test command as its own process: UNAVAILABLE."""
        avail = availability(tmp_path, PLAIN)
        assert not avail.ok
        assert 'claims kernel = "own", but the host reads its test command' in avail.reason
        assert "drop kernel from [claims]" in avail.reason

    def test_a_plain_wrapper_is_seen(self, tmp_path: Path) -> None:
        """A wrapper that runs the payload on the host's kernel: seen, no note."""
        avail = availability(tmp_path, PLAIN.replace('kernel = "own"\n', ""))
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.profile["test_command"]["host_process"] == "seen"


@pytest.mark.skipif(
    shutil.which("runsc") is None, reason="runsc missing: scripts/real-sandboxes.sh"
)
def test_gvisor_is_told_by_behaviour(tmp_path: Path) -> None:
    """The shipped gVisor spec without its kernel claim gets the note; with it, none."""
    spec = Path(__file__).resolve().parents[2] / "matrix" / "backends" / "gvisor.toml"
    body = spec.read_text().replace('kernel = "own"', "")
    avail = availability(tmp_path, body)
    assert avail.ok, avail.reason
    assert 'claim kernel = "own"' in avail.reason
