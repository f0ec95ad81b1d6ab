"""The plugin as a library: what a sandbox vendor's own test suite sees with the package installed.

Every test here runs pytest in a subprocess from a temporary directory that holds nothing of
this project (no conftest.py, no pytest.ini of ours, another rootdir), exactly as a vendor's
checkout would: the plugin comes from the installed distribution's `pytest11` entry point
(the venv has the package installed editable), not from `-p` or a path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.test_cli_run import small_matrix, small_policy

ROOT = Path(__file__).resolve().parents[2]
HOLE_SPEC = ROOT / "tests" / "data" / "specs" / "hole_generic_shared_net.toml"
FIXTURES = ("attest_world", "attest_backend", "attest_cell", "egress_proxy", "make_egress_proxy")

VENDOR_TEST = '''
"""A vendor's tests of their sandbox, written against sandbox-attest's fixtures."""

import socket
import time


def test_world_is_running(attest_world):
    """The world answers: its allowed origin serves /ok over plain HTTP on loopback."""
    host = attest_world.info.hosts["allowed"]
    assert host.name.endswith(".test")
    assert attest_world.info.ca_bundle


def test_bubblewrap_holds(attest_backend, attest_cell):
    """bubblewrap keeps the payload from a denied host, and the control leg saw it escape."""
    bwrap = attest_backend("bubblewrap")
    assert bwrap.ok, bwrap.reason
    cell = attest_cell("net_denied_host", bwrap)
    assert cell.cell_id == "bubblewrap-net_denied_host"
    assert cell.verdict == "PASS", cell.reason
    assert cell.control["verdict"] == "PASS"
    assert cell.evidence["probe"] == "net_denied_host"


def test_a_hole_is_found(attest_cell):
    """A wrapper sharing the host's network is a FAIL for direct egress, not a pass."""
    cell = attest_cell("net_direct_egress", HOLE_SPEC)
    assert cell.cell_id == "generic-shared-net-net_direct_egress"
    assert cell.verdict == "FAIL", cell.reason


def test_own_proxy_admits_only_its_rules(attest_world, make_egress_proxy):
    """A proxy with one rule: CONNECT to that host is 200, to the denied host 403."""
    allowed = attest_world.info.hosts["allowed"]
    denied = attest_world.info.hosts["denied"]
    proxy = make_egress_proxy([f"{allowed.name}:{allowed.https_port}"])

    def connect(name, port):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            user = __import__("urllib.parse").parse.urlsplit(proxy.url).username
            auth = __import__("base64").b64encode(f"{user}:{proxy.secret}".encode())
            sock.sendall(
                f"CONNECT {name}:{port} HTTP/1.1\\r\\nHost: {name}:{port}\\r\\n"
                f"Proxy-Authorization: Basic {auth.decode()}\\r\\n\\r\\n".encode()
            )
            return sock.recv(200).split(b" ")[1]

    assert connect(allowed.name, allowed.https_port) == b"200"
    assert connect(denied.name, denied.https_port) == b"403"
    # A tunnel's decision line is written when the tunnel closes: wait for both lines.
    deadline = time.monotonic() + 10
    while len(proxy.decisions()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(d["status"] for d in proxy.decisions()) == [200, 403]


def test_world_proxy_is_the_cells_proxy(attest_world, egress_proxy):
    """egress_proxy is the world's own proxy process."""
    assert egress_proxy is attest_world.proxy
    assert egress_proxy.socket is not None
'''


# A project's plugin that reverses the collected tests: the unit test (collected first) then
# runs last, and the cells would run backwards, bubblewrap before its control leg.
REVERSE_ITEMS = """
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    items.reverse()
"""


def vendor_pytest(
    project: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run pytest in `project` as a vendor would: its own rootdir, this venv's pytest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # The project's own plugins directory (if any), as a project would put it on its path.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(project / "plugins"), os.environ.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


@pytest.fixture
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty project directory outside this checkout, traversable by the payload user."""
    # The payload user runs the cells: it must reach the directory the world's files are in,
    # which the suite's tmp_path_factory sees to (tests/conftest.py).
    return tmp_path_factory.mktemp("vendor")


class TestVendorFixtures:
    def test_fixtures_are_listed(self, project: Path) -> None:
        """`pytest --fixtures` in a foreign project lists every fixture the README documents."""
        proc = vendor_pytest(project, "--fixtures")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        for name in FIXTURES:
            assert f"\n{name} " in proc.stdout, f"{name} missing from pytest --fixtures"

    @pytest.mark.needs_bwrap
    def test_vendor_suite_passes(self, project: Path) -> None:
        """A conftest-less vendor test file using all five fixtures passes, a hole FAILs there."""
        body = VENDOR_TEST.replace("HOLE_SPEC", repr(str(HOLE_SPEC)))
        (project / "test_my_sandbox.py").write_text(textwrap.dedent(body))
        proc = vendor_pytest(project, "-v")
        log = proc.stdout[-4000:] + proc.stderr[-2000:]
        assert proc.returncode == 0, log
        assert "5 passed" in proc.stdout, log
        assert "PytestAssertRewriteWarning" not in proc.stdout + proc.stderr

    @pytest.mark.needs_bwrap
    def test_readme_example_passes(self, project: Path) -> None:
        """The README's example test file passes as written, with a real spec beside it."""
        readme = (ROOT / "README.md").read_text()
        section = readme.split("## In your own test suite", 1)[1]
        example = section.split("```python\n", 1)[1].split("```", 1)[0]
        shutil.copy(
            ROOT / "matrix" / "backends" / "bwrap-generic.toml", project / "sandbox-spec.toml"
        )
        (project / "test_my_sandbox.py").write_text(example)
        proc = vendor_pytest(project, "-v")
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert "2 passed" in proc.stdout


class TestWaitsToBeAsked:
    def test_unrelated_matrix_toml_is_left_alone(self, project: Path) -> None:
        """A project's own matrix.toml with a [build] table is not collected; its tests pass."""
        (project / "matrix.toml").write_text('[build]\ntargets = ["x86_64", "aarch64"]\n')
        (project / "test_build.py").write_text(
            'import tomllib\n\n\ndef test_targets():\n    """The build matrix has two targets."""\n'
            '    with open("matrix.toml", "rb") as f:\n'
            '        assert len(tomllib.load(f)["build"]["targets"]) == 2\n'
        )
        proc = vendor_pytest(project, "-v")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "test_build.py::test_targets PASSED" in proc.stdout
        assert "1 passed" in proc.stdout
        assert "matrix.toml::" not in proc.stdout
        assert "sandbox-attest" not in proc.stdout.split("collected")[1]

    def test_old_unprefixed_options_are_gone(self, project: Path) -> None:
        """The plugin adds only --sandbox-attest options: --backend-spec is not ours."""
        proc = vendor_pytest(project, "--help")
        assert proc.returncode == 0, proc.stderr
        ours = [
            line.split()[0]
            for line in proc.stdout.split("sandbox-attest:\n", 1)[1].split("\n\n")[0].splitlines()
            if line.startswith("  --")
        ]
        assert ours, proc.stdout
        assert all(opt.startswith("--sandbox-attest") for opt in ours), ours
        assert "--backend-spec" not in proc.stdout
        assert "--require-backend" not in proc.stdout.replace("--sandbox-attest-require", "")

    @pytest.mark.needs_bwrap
    def test_bare_flag_runs_the_package_matrix_alone(self, project: Path) -> None:
        """`pytest --sandbox-attest` runs the package's matrix only, ids `matrix.toml::<cell>`.

        `-k` keeps two cells, so the evidence is incomplete and the gate fails, as it must;
        the project's own test is not collected at all without test paths on the line.
        """
        (project / "test_unit.py").write_text('def test_unit():\n    """Never run."""\n')
        out = project / "report"
        proc = vendor_pytest(
            project,
            "-v",
            "--sandbox-attest",
            "--sandbox-attest-backend=bubblewrap",
            f"--sandbox-attest-report-dir={out}",
            "-k",
            "net_denied_host",
        )
        log = proc.stdout[-4000:] + proc.stderr[-2000:]
        assert "\nmatrix.toml::none-net_denied_host PASS" in proc.stdout, log
        assert "\nmatrix.toml::bubblewrap-net_denied_host PASS" in proc.stdout, log
        assert "site-packages" not in proc.stdout.split("collected", 1)[1].split("=====")[0]
        assert "test_unit" not in proc.stdout, log
        assert "cells: the evidence is incomplete" in proc.stdout, log
        assert proc.returncode == 1, log

    @pytest.mark.needs_bwrap
    def test_ini_option_collects_the_matrix_beside_the_projects_tests(self, project: Path) -> None:
        """`sandbox_attest_matrix` in a project's pytest.ini: bare `pytest` runs both, ids clean."""
        attest = project / "attest"
        attest.mkdir(mode=0o755)
        small_matrix(attest, name="matrix.toml", probe="fs_write_outside")
        policy = small_policy(attest)
        (project / "pytest.ini").write_text(
            "[pytest]\ntestpaths = tests\nsandbox_attest_matrix = attest/matrix.toml\n"
        )
        (project / "tests").mkdir()
        (project / "tests" / "test_unit.py").write_text(
            'def test_unit():\n    """Arithmetic holds."""\n    assert 2 * 2 == 4\n'
        )
        # A plugin of the project's that reorders tests, as pytest-randomly does: the cells
        # must still run control leg first, or the sandbox's PASS proves nothing.
        plugins = project / "plugins"
        plugins.mkdir()
        (plugins / "reverse_items.py").write_text(REVERSE_ITEMS)
        out = project / "report"
        proc = vendor_pytest(
            project,
            "-v",
            "-p",
            "reverse_items",
            "--sandbox-attest-backend=bubblewrap",
            f"--sandbox-attest-policy={policy}",
            f"--sandbox-attest-report-dir={out}",
        )
        log = proc.stdout[-4000:] + proc.stderr[-2000:]
        assert "tests/test_unit.py::test_unit PASSED" in proc.stdout, log
        assert "attest/matrix.toml::bubblewrap-fs_write_outside PASS" in proc.stdout, log
        assert "attest/matrix.toml::none-fs_write_outside PASS" in proc.stdout, log
        none_at = proc.stdout.index("attest/matrix.toml::none-fs_write_outside")
        bwrap_at = proc.stdout.index("attest/matrix.toml::bubblewrap-fs_write_outside")
        assert none_at < bwrap_at, log
        # The reversal did happen: the unit test, collected first, ran last.
        assert proc.stdout.index("tests/test_unit.py::test_unit") > bwrap_at, log
        assert (out / "attestation.intoto.jsonl").is_file(), log
        assert proc.returncode == 0, log
