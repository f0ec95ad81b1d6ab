"""The shim hands its command exactly the descriptors it inherited, and none of its own.

A sandbox that leaks descriptors (bwrap keeps what it inherits) must leak them to the payload
with the shim in between as without it: env_inheritance judges what the payload holds, and a
shim that closed the leak would hide it (issue 26).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.egress.egress_helpers import SHIM
from tests.py38 import python38

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from pathlib import Path

# The child reports its descriptor table: number -> what /proc/self/fd says it is.
_CHILD = (
    "import json, os\n"
    "fds = {}\n"
    "for name in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        fds[name] = os.readlink('/proc/self/fd/' + name)\n"
    "    except OSError:\n"
    "        pass\n"
    "print(json.dumps(fds))\n"
)


def _run_shim(python: str, tmp_path: Path, held: Iterable[int]) -> dict[str, str]:
    """Start the shim holding the descriptors `held`; the child's descriptor table."""
    result = subprocess.run(
        [
            *(python, str(SHIM), "--unix", str(tmp_path / "none.sock"), "--port", "0"),
            *("--log", str(tmp_path / "shim.log"), "--", python, "-c", _CHILD),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        pass_fds=tuple(held),
    )
    assert result.returncode == 0, result.stderr
    table: dict[str, str] = json.loads(result.stdout)
    return table


@pytest.fixture
def inherited(tmp_path: Path) -> Iterator[dict[int, str]]:
    """Descriptors on a directory and a file, as a leaky launcher would hand them on."""
    (tmp_path / "leak").mkdir()
    (tmp_path / "leak" / "secret").write_text("x\n")
    fds = {
        os.open(tmp_path / "leak", os.O_RDONLY | os.O_DIRECTORY): str(tmp_path / "leak"),
        os.open(tmp_path / "leak" / "secret", os.O_RDONLY): str(tmp_path / "leak" / "secret"),
    }
    yield fds
    for fd in fds:
        os.close(fd)


class TestShimPassesInheritedFds:
    def test_the_child_sees_exactly_the_inherited_fds(
        self, tmp_path: Path, inherited: dict[int, str]
    ) -> None:
        """The payload holds the inherited fds at their numbers, and nothing else above 2."""
        table = _run_shim(sys.executable, tmp_path, inherited)
        above = {int(n): t for n, t in table.items() if int(n) > 2}
        # The child's own listing descriptor is closed by the time readlink runs (or shows
        # /proc/<pid>/fd itself): everything else must be exactly what the shim inherited.
        above = {n: t for n, t in above.items() if not t.startswith("/proc/")}
        assert above == inherited

    def test_the_listener_never_reaches_the_child(self, tmp_path: Path) -> None:
        """With nothing inherited the child holds only 0-2: no socket of the shim's own."""
        table = _run_shim(sys.executable, tmp_path, ())
        above = {n: t for n, t in table.items() if int(n) > 2 and not t.startswith("/proc/")}
        assert above == {}
        assert not any(t.startswith("socket:") for n, t in table.items() if int(n) > 2)

    def test_the_same_on_python_38(self, tmp_path: Path, inherited: dict[int, str]) -> None:
        """The pass-through works on the oldest interpreter the shim promises."""
        table = _run_shim(python38(), tmp_path, inherited)
        above = {int(n): t for n, t in table.items() if int(n) > 2 and not t.startswith("/proc/")}
        assert above == inherited
