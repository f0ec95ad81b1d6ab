"""Suite-wide fixtures: temporary directories the payload user can reach.

As root the harness runs every sandboxed command as its payload user (host/trust.py), the
way a real run does. pytest makes its temporary directories 0700 for the user running the
suite, so a wrapper script, a workspace or a world under `tmp_path` would be out of that
user's reach, and tests would measure file modes instead of sandboxes. A real run's scratch
directory is traversable (0755) for the same reason; these fixtures give tests the same.

The suite's temporary directories live under a root of its own, not pytest's shared
`pytest-of-<user>`: every pytest that starts as the same user (a nested `pytest matrix/` in a
test, an xdist sibling, a developer's second run) tightens `pytest-of-<user>` back to 0700, and
for that moment the payload user cannot reach anything under it. A host baseline that started
then could not read its task (the soak's one docker `proc_privileges` INCONCLUSIVE).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

# Where this suite's runs keep their temporary directories (one subdirectory per run).
TEMP_ROOT_PREFIX = "attest-tests-"
# A run directory older than this belongs to no live run (the suite takes minutes); a failed
# run's directory is kept that long for a person to look at.
STALE_RUN_S = 24 * 3600.0
# The base temp directory this process chose (absent where it was given or inherited).
_CHOSEN_BASETEMP = pytest.StashKey[Path]()


def _reachable(path: Path, top: Path) -> None:
    """Make `path` and its ancestors up to `top` 0755, and `top`'s parent traversable."""
    current = path
    while current != top and top in current.parents:
        current.chmod(0o755)
        current = current.parent
    top.chmod(0o755)
    # The suite's root, this run's directory (and xdist's popen-gwN): traversable only, up
    # to the system temp dir; other runs' directories stay unlisted.
    system_tmp = Path(tempfile.gettempdir())
    for ancestor in top.parents:
        if ancestor == system_tmp or system_tmp not in ancestor.parents:
            break
        ancestor.chmod(ancestor.stat().st_mode | 0o711)


def _own_temp_root() -> Path:
    """`<tmp>/attest-tests-<uid>`: made 0711 by this user, refused if anyone else owns it."""
    root = Path(tempfile.gettempdir()) / f"{TEMP_ROOT_PREFIX}{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o711)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise pytest.UsageError(
            f"{root} is not a directory of uid {os.geteuid()} (a link, or someone else's); "
            "remove it, or pass --basetemp=DIR"
        )
    root.chmod(0o711)  # others traverse to what the tests give them; nobody lists runs
    return root


def _prune_stale_runs(root: Path) -> None:
    """Remove run directories that no live run can own (older than STALE_RUN_S)."""
    cutoff = time.time() - STALE_RUN_S
    for entry in root.iterdir():
        with contextlib.suppress(OSError):
            if entry.lstat().st_mtime < cutoff:
                shutil.rmtree(entry)


def _new_run_dir() -> Path:
    """A fresh `run*` directory under the suite's root."""
    for _ in range(2):
        root = _own_temp_root()
        _prune_stale_runs(root)
        with contextlib.suppress(FileNotFoundError):
            # (a run that just passed may remove the then empty root between the two steps)
            return Path(tempfile.mkdtemp(prefix="run", dir=root))
    return Path(tempfile.mkdtemp(prefix="run", dir=_own_temp_root()))


@pytest.hookimpl(tryfirst=True)  # before pytest's own tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    """Give this run a base temp directory of its own unless one was given (or inherited).

    xdist workers inherit theirs from the controller (`<base>/popen-gwN`), so only the
    process that chose it sets it, and removes it at the end when the run passed.
    """
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    base = _new_run_dir()
    config.option.basetemp = str(base)
    config.stash[_CHOSEN_BASETEMP] = base


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing run leaves nothing; a failing one keeps its directory and says where."""
    base = session.config.stash.get(_CHOSEN_BASETEMP, None)
    if base is None:
        return
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(base, ignore_errors=True)
        with contextlib.suppress(OSError):  # another run may be using the root: then it stays
            base.parent.rmdir()
    else:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"temporary directories of this run kept in {base}")


class _PayloadReachableFactory:
    """`tmp_path_factory` whose directories the payload user can traverse."""

    def __init__(self, inner: pytest.TempPathFactory) -> None:
        self._inner = inner

    def getbasetemp(self) -> Path:
        base = self._inner.getbasetemp()
        _reachable(base, base)
        return base

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        # (the signature pytest's own tmp_path fixture calls it with)
        path = self._inner.mktemp(basename, numbered=numbered)
        _reachable(path, self.getbasetemp())
        return path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture(scope="session")
def tmp_path_factory(tmp_path_factory: pytest.TempPathFactory) -> pytest.TempPathFactory:
    """Pytest's factory, with every directory it makes reachable by the payload user."""
    return _PayloadReachableFactory(tmp_path_factory)  # type: ignore[return-value]  # a proxy
