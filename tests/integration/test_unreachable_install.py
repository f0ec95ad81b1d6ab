"""A harness root installed where only root can enter still runs every payload (issue 24).

The reproduction: a venv made under a `mktemp -d` directory (0700, root's), holding a copy of
the package and its data as pipx's home under /root would. The payload user can neither start
that venv's Python nor read the probes inside it; before the fix every bubblewrap cell was
ERROR "Can't find source path ...: Permission denied" and every control cell "could not
execute ...". Now the run picks the system's Python, copies the payload files into its scratch,
says so in the evidence, and its gate holds.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_attest.host.trust import payload_user

REPO = Path(__file__).resolve().parents[2]
PROBES = ("net_denied_host", "fs_write_outside", "proc_privileges")
LEGS = ("none", "bubblewrap")

pytestmark = [
    pytest.mark.needs_bwrap,
    pytest.mark.skipif(payload_user() is None, reason="needs root (the payload user is another)"),
    pytest.mark.skipif(not Path("/usr/bin/python3").is_file(), reason="needs /usr/bin/python3"),
]


@pytest.fixture
def root_only_install() -> Iterator[Path]:
    """A venv under a 0700 `mktemp -d` dir whose sandbox_attest is a copy inside that dir.

    The copy (package, probes/, fixtures/, matrix/) sits in `src/`, put on the venv's path by a
    .pth file; the harness's own dependencies come from this suite's site-packages.
    """
    top = Path(tempfile.mkdtemp(prefix="h2-root-only-install-"))
    try:
        assert top.stat().st_mode & 0o777 == 0o700
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(top / "venv")], check=True)
        src = top / "src"
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in ("sandbox_attest", "probes", "fixtures", "matrix"):
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        (purelib,) = (top / "venv" / "lib").glob("python3*/site-packages")
        (purelib / "00-h2-copy.pth").write_text(
            "\n".join([str(src), *site.getsitepackages()]) + "\n"
        )
        yield top
    finally:
        shutil.rmtree(top)


def write_matrix(directory: Path) -> tuple[Path, Path]:
    """A matrix of a few probes on the control leg and bubblewrap, and a policy requiring all."""
    matrix = directory / "m.toml"
    policy = directory / "p.toml"
    probes = "".join(f'\n[[probe]]\nid = "{p}"\ntimeout = 60\n' for p in PROBES)
    matrix.write_text(
        f'[matrix]\ncontrol = "none"\n{probes}\n'
        '[[backend]]\nname = "none"\nplatforms = ["linux"]\n\n'
        '[[backend]]\nname = "bubblewrap"\nplatforms = ["linux"]\nreason = "Linux namespaces"\n'
    )
    required = ", ".join(f'"{p}"' for p in PROBES)
    policy.write_text(
        '[policy]\nname = "h2"\nversion = 2\n'
        + "".join(
            f'\n[[require]]\nplatform = "linux"\nbackend = "{b}"\nprobes = [{required}]\n'
            for b in LEGS
        )
    )
    return matrix, policy


def test_a_root_only_venv_runs_bubblewrap_cells(root_only_install: Path, tmp_path: Path) -> None:
    """From a venv the payload user cannot enter, every cell PASSes on the system's Python."""
    python = root_only_install / "venv" / "bin" / "python"
    # Nothing of this suite's own path may lead the venv to another copy of the package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(python), "-c", "import sandbox_attest; print(sandbox_attest.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=env,
    ).stdout.strip()
    assert where.startswith(str(root_only_install)), where  # not the checkout's package
    matrix, policy = write_matrix(tmp_path)
    done = subprocess.run(
        [
            *(str(python), "-m", "sandbox_attest.cli", "run", "--matrix", str(matrix)),
            *("--policy", str(policy), "--backend", "none", "--backend", "bubblewrap"),
            *("--out", "rep"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "gate: PASSED" in done.stdout
    evidence = json.loads((tmp_path / "rep" / "evidence.json").read_text())
    verdicts = {c["cell_id"]: c["verdict"] for c in evidence["cells"]}
    assert verdicts == {f"{b}-{p}": "PASS" for b in LEGS for p in PROBES}
    chosen = evidence["payload_interpreter"]
    assert chosen["path"] == "/usr/bin/python3"
    assert chosen["source"] == "system"
    assert chosen["harness_executable"] == str(python)
    assert chosen["rejected"][0].startswith(f"{python}: cannot be started: Permission denied")
    copied = evidence["payload_files"]
    assert copied["copied_to"].endswith("/lib")
    assert f"{root_only_install} is mode 700, owner root:root" in copied["because"]
    assert copied["unreadable"] > len(PROBES)  # every payload file, the shim and the dir
    for cell in evidence["cells"]:
        argv = cell["run"]["argv"]
        assert not any(str(root_only_install) in arg for arg in argv), argv
    for backend in evidence["backends"]:
        assert backend["identity"]["executables"]["{python}"]["path"] == "/usr/bin/python3"
