"""Issue 28, the sandbox's own machinery, live: each hole FAILs its probe, the strong legs PASS.

Two deliberately broken wrappers under tests/data/newclasses/, each matrix/backends/
bwrap-generic.toml with one hole, go through one real `sandbox-attest run` beside the control
leg and the native bubblewrap and docker backends:

- fs_machinery_overwrite_hole.toml binds the sandbox's machinery (the harness's copy of a
  helper binary, its config and its allowlist) writable: `fs_machinery_overwrite` FAILs naming
  the copies the host saw change, and the fix;
- fs_leaked_dirfd_hole.toml starts bwrap holding a host directory (the probe's canary dir) as
  descriptor 7: `fs_leaked_dirfd` FAILs naming the descriptor, the canary read through it, and
  the fix.

Real bubblewrap, real docker, real uids; root only (the payload user exists only as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.host import disguise
from tests.integration.hole_runs import HoleRun, hole_run
from tests.integration.test_cli_run import CLI, keypair
from tests.reachable import reachable_tempdir

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install)"),
    pytest.mark.timeout(400),
]

REPO = Path(__file__).parent.parent.parent
DATA = Path(__file__).parent.parent / "data" / "newclasses"
PROBES = ("fs_machinery_overwrite", "fs_leaked_dirfd")
# Each wrapper (its [backend] name), its spec, and the one probe its hole must FAIL.
HOLES = {
    "hole-machinery": ("fs_machinery_overwrite_hole.toml", "fs_machinery_overwrite"),
    "hole-leaked-dirfd": ("fs_leaked_dirfd_hole.toml", "fs_leaked_dirfd"),
}
STRONG = ("bubblewrap", "docker")
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run() -> Iterator[HoleRun]:
    """The run, shared by the checks below."""
    legs = ("none", *STRONG)
    specs = [DATA / file for file, _ in HOLES.values()]
    with hole_run(
        "sa-machinery-",
        probes=PROBES,
        legs=legs,
        required=legs,
        specs=specs,
        run_timeout=RUN_TIMEOUT_S,
    ) as done:
        yield done


class TestControlLeg:
    @pytest.mark.parametrize("probe", PROBES)
    def test_sees_the_escape_unconfined(self, run: HoleRun, probe: str) -> None:
        """On the open leg each probe PASSes because it saw the escape: the FAILs are not noise."""
        cell = run.cell("none", probe)
        assert (cell["verdict"], cell["escape"]) == ("PASS", "escaped"), cell["reason"]


class TestStrongBackends:
    @pytest.mark.parametrize("backend", STRONG)
    @pytest.mark.parametrize("probe", PROBES)
    def test_pass(self, run: HoleRun, backend: str, probe: str) -> None:
        """The native bwrap and docker legs keep the machinery and host directories out: PASS."""
        cell = run.cell(backend, probe)
        if cell["verdict"] == "UNAVAILABLE":
            pytest.skip(f"{backend} cannot run here: {cell['reason']}")
        assert (cell["verdict"], cell["escape"]) == ("PASS", "refused"), cell["reason"]


class TestMachineryWritable:
    def test_fails_naming_the_copies_and_the_fix(self, run: HoleRun) -> None:
        """A writable helper, config and allowlist: FAIL naming each copy the host saw change."""
        cell = run.cell("hole-machinery", "fs_machinery_overwrite")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the host sees the sandbox's machinery written: " in cell["reason"]
        assert "fix: bind the sandbox's helper, its config, its allowlist" in cell["reason"]
        changed = {Path(p).name for p in cell["witness"]["changed"]}
        assert changed == {"helper", "config", "allowlist"}, cell["witness"]
        assert cell["witness"]["real_helpers_changed"] == [], cell["witness"]

    def test_the_other_probe_holds(self, run: HoleRun) -> None:
        """The writable machinery dir leaks no descriptor: fs_leaked_dirfd is not FAIL."""
        cell = run.cell("hole-machinery", "fs_leaked_dirfd")
        assert cell["verdict"] != "FAIL", cell["reason"]


class TestLeakedDirectoryDescriptor:
    def test_fails_naming_the_descriptor_and_the_fix(self, run: HoleRun) -> None:
        """A host directory held as fd 7 inside the sandbox: FAIL naming it and the fix."""
        cell = run.cell("hole-leaked-dirfd", "fs_leaked_dirfd")
        assert cell["verdict"] == "FAIL", cell["reason"]
        assert "the payload read the canary's token via " in cell["reason"]
        assert "fix: close every descriptor but 0-2 before starting the sandbox" in cell["reason"]
        leaked = cell["witness"]["leaked"]
        assert leaked, cell["witness"]
        assert all(entry.startswith("fd 7 of pid ") for entry in leaked), leaked
        assert all(entry.endswith("(the canary dir)") for entry in leaked), leaked

    def test_the_hole_holds_the_canary_dir_by_its_name(self) -> None:
        """The hole's wrapper opens the directory the probe plants: the names agree."""
        wrapper = (DATA / "fs_leaked_dirfd_hole.toml").read_text()
        assert f'/{disguise.DIRFD_CANARY_DIR}"' in wrapper

    def test_the_other_probe_holds(self, run: HoleRun) -> None:
        """The leaked descriptor writes no machinery: fs_machinery_overwrite is not FAIL."""
        cell = run.cell("hole-leaked-dirfd", "fs_machinery_overwrite")
        assert cell["verdict"] != "FAIL", cell["reason"]


class TestInheritedDescriptor:
    def test_native_backends_do_not_pass_the_harness_descriptors_on(self) -> None:
        """A harness started holding an inheritable fd on the host's / leaks it to no sandbox.

        bubblewrap keeps every descriptor it inherits, so the native backends must start it
        with nothing but what they mean to pass (CVE-2024-21626's class); the payload's walk
        reaching the host's / through any descriptor would FAIL the cell.
        """
        with reachable_tempdir("sa-inherit-") as root:
            matrix = root / "matrix.toml"
            matrix.write_text(
                '[[probe]]\nid = "fs_leaked_dirfd"\ntimeout = 30\n'
                + "".join(
                    f'[[backend]]\nname = "{b}"\nplatforms = ["linux"]\n' for b in ("none", *STRONG)
                )
            )
            policy = root / "policy.toml"
            policy.write_text(
                "".join(
                    f'[[require]]\nplatform = "linux"\nbackend = "{b}"\n'
                    'probes = ["fs_leaked_dirfd"]\n'
                    for b in ("none", *STRONG)
                )
            )
            private, _ = keypair(root)
            held = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.set_inheritable(held, True)  # noqa: FBT003  (positional-only in os)
                argv = [*CLI, "run", "--matrix", str(matrix), "--policy", str(policy)]
                argv += ["--key", str(private)]
                argv += ["--out", str(root / "report"), "-j", "2"]
                done = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    timeout=RUN_TIMEOUT_S,
                    check=False,
                    cwd=REPO,
                    pass_fds=(held,),
                )
            finally:
                os.close(held)
            inherited = HoleRun(root / "report", done.returncode, done.stdout, done.stderr)
            for backend in STRONG:
                cell = inherited.cell(backend, "fs_leaked_dirfd")
                if cell["verdict"] == "UNAVAILABLE":
                    continue
                assert (cell["verdict"], cell["escape"]) == ("PASS", "refused"), cell["reason"]
                assert cell["witness"]["reached"] == [], cell["witness"]


class TestGate:
    def test_no_hole_earns_a_pass_gate(self, run: HoleRun) -> None:
        """Exit 1 and gate FAILED: the holes' FAIL cells are not hidden by the PASSing legs."""
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
        gate = [ln for ln in run.stdout.splitlines() if ln.startswith("gate: ")]
        assert gate[-1] == "gate: FAILED", gate
