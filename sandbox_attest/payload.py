"""What the harness hands every payload: its files, the interpreter it runs on, the only env.

Both the runner (which builds each `ProbeRequest`) and the backends that must grant the
interpreter's paths (command wrappers) or check the declared environment (`env_inheritance`)
read them here. This module imports nothing of ours, so every layer can.

The payload's files are staged per cell under names any program could have (`stage_payload`):
a wrapper sees the payload's command line, its working directory and the paths it is asked to
grant, and a wrapper that confines only when it sees it is under test must find nothing there
that says so (issue 23). The names below are that command line's whole vocabulary.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "INPUT_DIR",
    "LAUNCHER_SOURCE",
    "SCRATCH_PREFIX",
    "STAGED_LAUNCHER",
    "STAGED_PROGRAM",
    "STAGED_SHIM",
    "STAGED_TASK",
    "TELLTALE_WORDS",
    "StagedPayload",
    "interpreter_paths",
    "payload_env",
    "stage_payload",
    "stage_shim",
    "staged_shim_path",
]

# The launcher as the repository keeps it (probes/_launch.py: the underscore keeps it out of
# the probe catalogue), and the names every payload file gets where the wrapper sees them. The
# staged launcher's name is what the host finds the payload by (sandbox_attest/run/hostview.py
# LAUNCHER must equal it; tests/unit/test_payload_staging.py checks that).
LAUNCHER_SOURCE: Final = "_launch.py"
STAGED_LAUNCHER: Final = "main.py"
STAGED_PROGRAM: Final = "job.py"
STAGED_TASK: Final = "config.json"
# The egress shim (sandbox_attest/world/egress/shim.py), staged beside them for command wrappers.
STAGED_SHIM: Final = "bridge.py"
# The cell dir's subdirectory they are staged in (read-only for the payload).
INPUT_DIR: Final = "input"
# The prefix of a run's scratch directory (under the temp dir), which holds every workspace:
# the payload's cwd and HOME, so a wrapper sees it. Fixed, so a test can count leftovers.
SCRATCH_PREFIX: Final = "agent-"
# Words that say "this is a test of you" to a wrapper reading its argv, environment, cwd or
# ancestors. None of the names the harness chooses for what a wrapper sees may contain one.
TELLTALE_WORDS: Final = ("sandbox-attest", "sandbox_attest", "attest", "probe", "harness", "canary")


def interpreter_paths() -> list[Path]:
    """The interpreter by its lexical and its resolved location, deduplicated.

    A venv's `bin/python` is a symlink into the base installation: the sandbox needs the venv
    (lexical path, pyvenv.cfg, site-packages with pip) and the base prefix it resolves into.
    Paths under /usr are left out because every backend binds /usr already.
    """
    exe = Path(sys.executable)
    candidates = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        exe.parent,
        exe.resolve().parent,
        Path(sys.base_prefix).resolve(),
    }
    kept = sorted(p for p in candidates if not p.is_relative_to("/usr"))
    return [p for p in kept if not any(p != q and p.is_relative_to(q) for q in kept)]


def payload_env(proxy_url: str | None, home: Path) -> dict[str, str]:
    """The only environment a payload sees: a minimal PATH/HOME/LANG and the proxy."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # the probe dir is read-only inside the sandbox
        "PYTHONUNBUFFERED": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if proxy_url:
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[key] = proxy_url
    return env


@dataclass(frozen=True)
class StagedPayload:
    """The payload's files for one cell, under neutral names in one read-only directory.

    The payload runs as `PYTHON launcher program task`: the shape the host finds it by
    (sandbox_attest.run.hostview.find_payloads).
    """

    directory: Path
    launcher: Path
    program: Path
    task: Path


def stage_payload(
    directory: Path, launcher: Path, program: Path, task: dict[str, Any]
) -> StagedPayload:
    """Copy the launcher and the probe into `directory` under neutral names; write the task.

    A copy, not the repository's file: the repository path (`.../probes/net_direct_egress.py`)
    names both the harness and the escape being tried. Each file is 0644 in a 0755 directory
    that the harness owns, so the payload user reads them and changes none.

    Args:
        directory: the cell's input directory, made by the caller (0755, the harness's).
        launcher: the repository's launcher (`probes/_launch.py`).
        program: the probe's payload script.
        task: the task JSON the probe reads.
    """
    staged = StagedPayload(
        directory=directory,
        launcher=directory / STAGED_LAUNCHER,
        program=directory / STAGED_PROGRAM,
        task=directory / STAGED_TASK,
    )
    shutil.copyfile(launcher, staged.launcher)
    shutil.copyfile(program, staged.program)
    staged.task.write_text(json.dumps(task, indent=1), encoding="utf-8")
    # Explicit modes, never the umask's: the payload user must read what is staged here.
    for path in (staged.launcher, staged.program, staged.task):
        path.chmod(0o644)
    return staged


def staged_shim_path(cell_dir: Path) -> Path:
    """Where a cell's staged shim is (`stage_shim` into the cell's `INPUT_DIR`)."""
    return cell_dir / INPUT_DIR / STAGED_SHIM


def stage_shim(cell_dir: Path, shim: Path) -> Path:
    """Copy the egress shim into the cell's input directory as `STAGED_SHIM` (0644).

    A command wrapper runs it by this path, in the payload's argv; the installed one's path
    (`.../sandbox_attest/world/egress/shim.py`) would name the harness. Staged before the probe
    prepares the cell, so a probe that watches the shim watches the copy really run.
    """
    target = staged_shim_path(cell_dir)
    shutil.copyfile(shim, target)
    target.chmod(0o644)
    return target
