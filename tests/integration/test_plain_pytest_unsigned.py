"""An unsigned report makes plain `pytest matrix/` exit non-zero, and its views say NOT SIGNED.

Signing fails late here for a real reason: the run's signer process dies after every cell
was judged and before the report is signed (SIGKILL from a plugin's `pytest_sessionfinish`,
as the OOM killer or a crash would end it). Everything else about the run is left as it is,
so the gate alone would let it exit 0; only the missing signature fails it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

from sandbox_attest.paths import matrix_dir
from sandbox_attest.report.views.model import NOT_SIGNED
from tests.integration.test_cli_run import small_matrix, small_policy

ROOT = Path(__file__).resolve().parent.parent.parent

# Loaded with `-p`: it runs after the harness's own sessionfinish, and before
# pytest_unconfigure, where the harness writes evidence.json and asks the signer to sign.
KILLER = """
import os
import signal

import pytest

from sandbox_attest.plugin import SIGNER_KEY


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    signer = session.config.stash[SIGNER_KEY]
    os.kill(signer.pid, signal.SIGKILL)
    print(f"killer: signer pid {signer.pid} killed; exit status so far {int(session.exitstatus)}")
"""


class TestSignerDiesLate:
    def test_unsigned_report_fails_plain_pytest(self, tmp_path: Path) -> None:
        """A run whose gate holds but whose signer died exits 1 with NOT SIGNED views."""
        (tmp_path / "plugins").mkdir()
        (tmp_path / "plugins" / "kill_signer.py").write_text(KILLER)
        matrix = small_matrix(tmp_path)
        out = tmp_path / "r"
        env = {k: v for k, v in os.environ.items() if k != "SANDBOX_ATTEST_SIGNING_KEY"}
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "plugins"), str(ROOT)])
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(matrix),
                f"--sandbox-attest={matrix}",
                f"--rootdir={tmp_path}",
                "-c",
                str(matrix_dir() / "pytest.ini"),
                f"--sandbox-attest-policy={small_policy(tmp_path)}",
                f"--sandbox-attest-report-dir={out}",
                "--sandbox-attest-backend=bubblewrap",
                "-p",
                "kill_signer",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**env, "XDG_CONFIG_HOME": str(tmp_path / "config")},
            cwd=ROOT,
        )
        log = proc.stdout[-4000:] + proc.stderr[-2000:]
        # The fault happened where it should: after the cells, before signing.
        killed = re.search(r"killer: signer pid \d+ killed; exit status so far (\d+)", proc.stdout)
        assert killed is not None, log
        assert killed[1] == "0", f"the run failed before signing, so it proves nothing: {log}"
        assert proc.returncode == 1, log
        assert "attestation NOT written" in proc.stdout, log
        assert "the attestation was not written" in proc.stdout, log
        assert not (out / "attestation.intoto.jsonl").exists()
        assert not (out / "signing.json").exists()
        # The evidence and every view are still there, and say they are not signed.
        evidence = json.loads((out / "evidence.json").read_text())
        assert evidence["cells"], "the cells were judged"
        assert NOT_SIGNED in (out / "report.html").read_text()
        summary = (out / "summary.md").read_text()
        # The gate held (the summary renders the gate the signer would have signed), so the
        # exit status 1 is the missing signature's alone.
        assert re.match(r"## sandbox-attest: (PASSED|WARNED) ", summary), summary[:300]
        assert f"**Signature:** {NOT_SIGNED}" in summary
        # Our own renderer wrote it (S314 is about hostile XML).
        root = ET.fromstring((out / "junit.xml").read_bytes())  # noqa: S314
        assert [s.get("name") for s in root.findall("testsuite")][-1] == "release-gate"
        assert any((out / "allure-results").glob("*-result.json"))
