"""A finished run measures its trust domains and signs accordingly (issue 23).

The session is built for real (its backends asked whether they run here, its signer a real
process with a real key) but its cells are recorded by hand with the host readings a run
records, so the signing decision is checked without running a sandbox.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest.keys import ENV_VAR, private_key_pem
from sandbox_attest.host import separation
from sandbox_attest.paths import matrix_dir
from sandbox_attest.report.evidence import cell_entry
from sandbox_attest.run import session as session_module
from sandbox_attest.run.matrix import load_matrix
from sandbox_attest.run.session import RunSession

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="a separated run needs a root harness on Linux (it switches to the payload user)",
)


def finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uid: int | None
) -> tuple[RunSession, list[str]]:
    """A finished run of bubblewrap with --key, every cell read as `uid` (None: the payload's).

    Returns:
        The session and the lines its finish printed.
    """
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    key = tmp_path / "release.pem"
    key.write_bytes(private_key_pem(Ed25519PrivateKey.generate()))
    key.chmod(0o600)
    run = RunSession(
        matrix=load_matrix(matrix_dir() / "matrix.toml"),
        backend_names=["bubblewrap"],
        report_dir=tmp_path / "report",
        policy_path=matrix_dir() / "policy.toml",
        required_backends=set(),
        key_path=key,
    )
    assert run.user is not None
    ids = " ".join([str(run.user.uid if uid is None else uid)] * 4)
    for cell in run.cells():
        entry = cell_entry(
            cell_id=cell.cell_id,
            backend=cell.backend,
            probe=cell.probe.id,
            platform=run.platform,
            verdict="NOT_APPLICABLE" if cell.not_applicable else "PASS",
            reason=cell.not_applicable or "recorded by the test",
            required=run.is_required(cell),
        )
        if not cell.not_applicable:
            entry["host_view"] = {"seen": True, "pid": 7, "status": {"Uid": ids, "Gid": ids}}
        run.writer.add_cell(entry)
    return run, run.finish(complete=True)


def signing(run: RunSession) -> dict[str, Any]:
    """signing.json of the run's report."""
    data: dict[str, Any] = json.loads((run.report_dir / "signing.json").read_text())
    return data


class TestFinish:
    def test_a_separated_run_signs_with_the_key_given(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Payloads read as the payload user: separated, signed with --key, nothing refused."""
        run, _ = finished(tmp_path, monkeypatch, None)
        evidence = json.loads((run.report_dir / "evidence.json").read_text())
        assert evidence["trust_domains"]["separated"] is True, evidence["trust_domains"]
        assert evidence["trust_domains"]["backends"]["bubblewrap"]["status"] == "separated"
        assert signing(run)["trust"] == "provided"
        assert (run.release_key_refused, run.release_key_insisted) == ("", False)

    def test_a_root_reading_refuses_the_insisted_key(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Payloads read as root: shared, signed with the per-machine key, --key insisted."""
        run, lines = finished(tmp_path, monkeypatch, 0)
        evidence = json.loads((run.report_dir / "evidence.json").read_text())
        assert evidence["trust_domains"]["backends"]["bubblewrap"]["status"] == "shared"
        assert signing(run)["trust"] == "untrusted-local"
        assert run.release_key_insisted is True
        assert "(--key) was NOT used" in run.release_key_refused
        assert run.release_key_refused in lines
        # The views were rendered after the swap: they name the key that signed.
        assert signing(run)["keyid"] in (run.report_dir / "summary.md").read_text()

    def test_a_measurement_that_fails_is_not_separated_and_still_signs(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fault while measuring costs the release key, never the report."""
        measure = separation.trust_domains

        def broken(*args: Any) -> dict[str, Any]:
            if len(args) == 1:  # the start-time fact: "not measured yet"
                return measure(*args)
            raise RuntimeError("reading went wrong")

        monkeypatch.setattr(session_module, "trust_domains", broken)
        run, _ = finished(tmp_path, monkeypatch, None)
        evidence = json.loads((run.report_dir / "evidence.json").read_text())
        assert evidence["trust_domains"]["separated"] is False
        assert "RuntimeError: reading went wrong" in evidence["trust_domains"]["reason"]
        assert signing(run)["trust"] == "untrusted-local"
        assert (run.report_dir / "attestation.intoto.jsonl").is_file()
