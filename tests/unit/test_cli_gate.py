"""The CLI's last gate line uses the signed result's word, never a milder one."""

from __future__ import annotations

import pytest

from sandbox_attest.cli import _print_gate, build_parser


class TestGateWord:
    def test_warned_run_says_warned_like_the_attestation(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Unrequired FAIL cells: exit 0, and the final word is WARNED, as signing.json says."""
        code = _print_gate([], ["firejail-x is FAIL (not required)"], "WARNED")
        out = capsys.readouterr().out
        assert code == 0
        assert out.splitlines()[-1].startswith("gate: WARNED")
        assert "PASSED" not in out

    def test_signed_failed_is_failed_even_without_session_failures(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """If evaluate() says FAILED, the CLI never exits 0."""
        assert _print_gate([], [], "FAILED") == 1
        assert capsys.readouterr().out.splitlines()[-1] == "gate: FAILED"

    def test_session_failure_fails_a_signed_pass(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A session-only failure (an unsigned report, say) fails whatever evaluate said."""
        assert _print_gate(["the attestation was not written"], [], "PASSED") == 1
        assert capsys.readouterr().out.splitlines()[-1] == "gate: FAILED"


class TestHelp:
    def test_require_backend_help_says_what_it_does(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Naming a backend already requires its UNAVAILABLE cells; the flag adds the rest."""
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "do not apply here" in text
        assert "instead of being skipped" not in text
