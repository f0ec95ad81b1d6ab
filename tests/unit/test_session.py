"""The run's gate: what is required, what is missing, and what a run attests at all.

The session is built for real (its backends asked whether they run here) but its cells are
recorded by hand, so each gate rule is checked without running a sandbox.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest import ATTESTATION_NAME
from sandbox_attest.attest.keys import ENV_VAR, private_key_pem
from sandbox_attest.attest.subjects import ALL_SUBJECTS, JUNIT
from sandbox_attest.errors import ConfigError
from sandbox_attest.host.lifetime import RunInterrupted, RunSignals, catch_run_signals
from sandbox_attest.paths import matrix_dir
from sandbox_attest.report.evidence import cell_entry
from sandbox_attest.report.policy import load_policy
from sandbox_attest.run.matrix import Cell, Matrix, ProbeRow, load_matrix
from sandbox_attest.run.requirements import check_names
from sandbox_attest.run.session import RunSession

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the gate rules use Linux legs")

POLICY = matrix_dir() / "policy.toml"


def shipped() -> Matrix:
    """The shipped matrix."""
    return load_matrix(matrix_dir() / "matrix.toml")


def session(tmp_path: Path, backends: list[str], named: set[str]) -> RunSession:
    """A run over `backends` (control first) with `named` named by the user."""
    return RunSession(
        matrix=shipped(),
        backend_names=backends,
        report_dir=tmp_path / "report",
        policy_path=POLICY,
        required_backends=set(),
        named_backends=named,
    )


def record(run: RunSession, cell: Cell, verdict: str) -> None:
    """Record `cell` as the runner would, with `verdict` (NOT_APPLICABLE if it is)."""
    entry = cell_entry(
        cell_id=cell.cell_id,
        backend=cell.backend,
        probe=cell.probe.id,
        platform=run.platform,
        verdict="NOT_APPLICABLE" if cell.not_applicable else verdict,
        reason=cell.not_applicable or "recorded by the test",
        required=run.is_required(cell),
    )
    run.writer.add_cell(entry)


class TestControlOnly:
    def test_named_backend_that_cannot_run_here_fails_the_gate(self, tmp_path: Path) -> None:
        """--backend seatbelt on Linux: every seatbelt cell NOT_APPLICABLE, only `none` ran."""
        run = session(tmp_path, ["seatbelt"], {"seatbelt"})
        for cell in run.cells():
            record(run, cell, "PASS")
        failures = run.gate_failures()
        assert "backend seatbelt runs on darwin only; run it on a macOS runner" in failures
        assert any("the control leg alone attests nothing" in f for f in failures)

    def test_control_leg_alone_fails(self, tmp_path: Path) -> None:
        """Every control cell PASSing attests nothing about any sandbox."""
        run = session(tmp_path, ["none"], set())
        for cell in run.cells():
            record(run, cell, "PASS")
        assert any("the control leg alone attests nothing" in f for f in run.gate_failures())


class TestNamedBackendNotApplicable:
    def test_a_cell_found_not_applicable_is_not_required_by_naming(self, tmp_path: Path) -> None:
        """Naming firejail requires its cells that apply; one NOT_APPLICABLE by claim does not."""
        run = session(tmp_path, ["firejail"], {"firejail"})
        cell = next(c for c in run.cells() if c.cell_id == "firejail-fs_protected_in_workspace")
        assert run.is_required(cell)  # before it runs: it may apply
        assert run.is_required(cell, "PASS")
        assert not run.is_required(cell, "NOT_APPLICABLE")

    def test_the_policy_still_requires_what_it_names(self, tmp_path: Path) -> None:
        """A policy-required cell stays required even when it comes out NOT_APPLICABLE."""
        run = session(tmp_path, ["bubblewrap"], set())
        cell = next(c for c in run.cells() if c.cell_id == "bubblewrap-net_denied_host")
        assert ("bubblewrap", "net_denied_host") in run.required
        assert run.is_required(cell, "NOT_APPLICABLE")


class TestClaims:
    def test_a_leg_that_claims_less_than_required_fails_the_run_gate(self, tmp_path: Path) -> None:
        """Bubblewrap held to a seccomp cut it does not claim: the run's gate says so, as verify."""
        text = POLICY.read_text()
        assert 'network_cut = "namespace"' in text
        policy = tmp_path / "policy.toml"
        policy.write_text(text.replace('network_cut = "namespace"', 'network_cut = "seccomp"'))
        run = RunSession(
            matrix=shipped(),
            backend_names=["bubblewrap"],
            report_dir=tmp_path / "report",
            policy_path=policy,
            required_backends=set(),
            named_backends={"bubblewrap"},
        )
        for cell in run.cells():
            record(run, cell, "PASS")
        claims = [f for f in run.gate_failures() if "requires claims network_cut" in f]
        expected = (
            "leg linux/bubblewrap requires claims network_cut = 'seccomp', but bubblewrap "
            "claims network_cut = 'namespace': a backend cannot pass by claiming less; declare "
            "the claim in its [claims] (and hold it) or change the requirement"
        )
        assert claims == [expected]

    def test_the_shipped_policy_finds_no_claim_missing(self, tmp_path: Path) -> None:
        """Bubblewrap makes every claim the shipped policy asks of its leg."""
        run = session(tmp_path, ["bubblewrap"], {"bubblewrap"})
        for cell in run.cells():
            record(run, cell, "PASS")
        assert not [f for f in run.gate_failures() if "requires claims" in f]


class TestMissing:
    def test_named_backend_cell_never_recorded_is_missing(self, tmp_path: Path) -> None:
        """A named backend's cell that left no evidence fails the gate (not just policy cells)."""
        run = session(tmp_path, ["firejail"], {"firejail"})
        dropped = "firejail-fs_write_outside"
        for cell in run.cells():
            if cell.cell_id != dropped:
                record(run, cell, "PASS")
        assert run.missing_required() == [dropped]
        assert f"missing required cell {dropped}" in run.gate_failures()

    def test_deselected_cells_fail_the_gate(self, tmp_path: Path) -> None:
        """A -k filter is not a way to drop a cell: the gate names the deselected cells."""
        run = session(tmp_path, ["firejail"], {"firejail"})
        for cell in run.cells():
            record(run, cell, "PASS")
        run.deselected = ["firejail-fs_read_secrets"]
        assert any("1 cells were deselected" in f for f in run.gate_failures())

    def test_aborted_cell_is_recorded_as_error_once(self, tmp_path: Path) -> None:
        """A cell cut short by pytest-timeout still leaves one ERROR entry."""
        run = session(tmp_path, ["firejail"], {"firejail"})
        cell = next(c for c in run.cells() if c.backend == "firejail")
        run.record_aborted(cell, pytest.fail.Exception("Timeout >60.0s"))
        run.record_aborted(cell, KeyboardInterrupt())
        entries = [c for c in run.writer.cells if c["cell_id"] == cell.cell_id]
        assert len(entries) == 1
        assert entries[0]["verdict"] == "ERROR"
        assert "Timeout >60.0s" in entries[0]["reason"]
        assert entries[0]["required"] is True


class TestSignalTurnedIntoAnError:
    """The CI failure of stop 23: SIGINT midway, yet evidence.json said complete.

    A signal's KeyboardInterrupt that code on the way replaces (a cleanup failing as the
    signal cut it) reaches the runner as an ordinary exception: it judged the cell ERROR
    and the run went on to the end, calling itself complete.
    """

    @pytest.fixture
    def handlers(self) -> Iterator[RunSignals]:
        """The process's run handlers, installed as a run installs them, then put back."""
        handlers = catch_run_signals()
        try:
            yield handlers
        finally:
            handlers.restore()
            handlers.caught = None  # the next run's install would; no test may inherit it

    def test_the_recorded_signal_ends_the_run(
        self, tmp_path: Path, handlers: RunSignals, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The cell judged ERROR under the signal is not journaled: the signal ends the run."""
        run = session(tmp_path, ["firejail"], {"firejail"})
        cell = next(c for c in run.cells() if c.backend == "firejail")

        def judged_while_cut(judged: Cell) -> dict[str, Any]:
            try:
                try:
                    signal.raise_signal(signal.SIGINT)
                finally:
                    raise OSError("cleanup failed as the signal cut it")
            except Exception as exc:  # as CellRunner.run_cell does: an ERROR cell
                return dict(
                    cell_entry(
                        cell_id=judged.cell_id,
                        backend=judged.backend,
                        probe=judged.probe.id,
                        platform=run.platform,
                        verdict="ERROR",
                        reason=f"harness error while running the cell: {exc}",
                    )
                )

        monkeypatch.setattr(run.pool, "result", judged_while_cut)
        with pytest.raises(RunInterrupted) as cut:
            run.run_cell(cell)
        assert cut.value is handlers.caught
        assert cut.value.signame == "SIGINT"
        # The item records the cell as cut short (MatrixItem.runtest), not as judged.
        assert run.writer.cells == []
        run.record_aborted(cell, cut.value)
        assert run.writer.cells[0]["reason"] == "cut short by SIGINT before it was judged"


class TestWarnings:
    def test_unrequired_unavailable_backend_is_a_warning(self, tmp_path: Path) -> None:
        """A default-included backend that is UNAVAILABLE is said, once, among the warnings."""
        run = session(tmp_path, ["firejail"], set())
        for cell in run.cells():
            verdict = "UNAVAILABLE" if cell.backend == "firejail" else "PASS"
            record(run, cell, verdict)
        warnings = run.gate_warnings()
        assert len([w for w in warnings if "backend firejail is UNAVAILABLE" in w]) == 1

    def test_control_leg_hint_names_the_policy_not_backend(self, tmp_path: Path) -> None:
        """Naming --backend none never requires it; the hint points at the policy instead."""
        run = session(tmp_path, ["firejail"], set())
        for cell in run.cells():
            record(run, cell, "FAIL" if cell.cell_id == "none-lifecycle_orphans" else "PASS")
        (warning,) = [w for w in run.gate_warnings() if w.startswith("none-lifecycle_orphans")]
        assert "--backend none" not in warning
        assert "[[require]]" in warning


class TestSigning:
    def test_attestation_is_signed_with_the_runs_policy(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The signer process signs with the policy bytes the run was judged by, over every subject.

        Stricter than the old check (that `sign_report` got the run's Policy object): the
        signed statement's policy digest is the run's, and it covers all five subjects.
        """
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        monkeypatch.delenv(ENV_VAR, raising=False)
        run = passing_run(tmp_path)
        (run.report_dir / JUNIT).write_text("<testsuites/>")
        lines = run.finish(complete=True)
        assert f"attestation: {run.report_dir / ATTESTATION_NAME}" in lines, lines
        assert run.artifact_errors == []
        # One test-result statement per backend (none, firejail), then the evidence one.
        *results, evidence = statements(run.report_dir)
        assert len(results) == 2
        for stmt in results:
            config = stmt["predicate"]["configuration"]
            policy = next(c for c in config if c["name"] == "policy")
            assert policy["digest"]["sha256"] == run.policy.sha256
            reports = [c for c in config if c.get("annotations", {}).get("role") == "report file"]
            assert [c["name"] for c in reports] == list(ALL_SUBJECTS)
        assert [s["name"] for s in evidence["subject"]] == list(ALL_SUBJECTS)
        assert stat.S_IMODE(run.report_dir.stat().st_mode) == 0o700

    def test_key_variable_leaves_the_environment_when_the_signer_starts(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """use_signer takes $SANDBOX_ATTEST_SIGNING_KEY out of os.environ before any cell."""
        key = tmp_path / "k.pem"
        key.write_bytes(private_key_pem(Ed25519PrivateKey.generate()))
        key.chmod(0o600)
        monkeypatch.setenv(ENV_VAR, str(key))
        run = session(tmp_path, ["none"], set())
        signer = run.use_signer()
        try:
            assert ENV_VAR not in os.environ
            assert signer.source == f"env:{ENV_VAR}"
        finally:
            signer.close()

    def test_a_report_that_cannot_be_signed_fails_the_run_and_says_not_signed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A signer that died signs nothing: the run fails, and the views say NOT SIGNED.

        (junit.xml is rendered from the evidence now, so its absence no longer stops signing;
        the signer process is killed for real instead.)
        """
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        monkeypatch.delenv(ENV_VAR, raising=False)
        run = passing_run(tmp_path)
        signer = run.use_signer()
        os.kill(signer.pid, signal.SIGKILL)
        lines = run.finish(complete=True)
        assert any("signer" in e for e in run.artifact_errors), run.artifact_errors
        assert not (run.report_dir / ATTESTATION_NAME).exists()
        assert "NOT SIGNED" in (run.report_dir / "summary.md").read_text()
        assert any(line.startswith("attestation NOT written") for line in lines)


def passing_run(tmp_path: Path) -> RunSession:
    """A run over none and firejail (named) whose every cell is recorded as PASS."""
    run = session(tmp_path, ["firejail"], {"firejail"})
    for cell in run.cells():
        record(run, cell, "PASS")
    return run


def statements(report_dir: Path) -> list[dict[str, Any]]:
    """The statements of a report's attestation, in order (signatures not checked here)."""
    lines = (report_dir / ATTESTATION_NAME).read_text().splitlines()
    return [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in lines]


class TestCheckNames:
    def test_policy_backend_typo_is_an_error(self, tmp_path: Path) -> None:
        """A policy requiring `dockr` names the typo and the policy file."""
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY.read_text().replace('backend = "docker"', 'backend = "dockr"', 1))
        with pytest.raises(ConfigError) as err:
            check_names(shipped(), load_policy(policy))
        assert "'dockr'" in str(err.value)
        assert str(policy) in str(err.value)

    def test_policy_probe_typo_is_an_error(self, tmp_path: Path) -> None:
        """A policy requiring a probe the matrix does not list names it."""
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY.read_text().replace('"fs_read_secrets"', '"fs_read_secret"', 1))
        with pytest.raises(ConfigError) as err:
            check_names(shipped(), load_policy(policy))
        assert "'fs_read_secret'" in str(err.value)

    def test_matrix_probe_outside_the_catalogue_is_an_error(self) -> None:
        """A matrix probe with no payload lists the known probes instead of ERRORing cells."""
        matrix = shipped()
        matrix = dataclasses.replace(matrix, probes=(*matrix.probes, ProbeRow("nosuch", 30.0)))
        with pytest.raises(ConfigError) as err:
            check_names(matrix, load_policy(POLICY))
        assert "probe 'nosuch' is not in the probe catalogue" in str(err.value)
        assert "fs_write_outside" in str(err.value)
