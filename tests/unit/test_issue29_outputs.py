"""Issue 29: outputs a CI job, a script and a person at an 80-column terminal can act on.

--fail-on for run, verify and the plugin; `--json` that survives a closed pipe and reports a
gate only when verified; a grid that fits 80 columns; a Ctrl-C that lists each MISSING cell
once; no empty `evidence: ""`; one gate line for a required backend that could not run; the
demonstration backend labelled; `./run attest` installing what its default set runs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sandbox_attest.attest.keys import SigningKey, public_key_pem
from sandbox_attest.cli import MISSING_PREFIX, _print_gate, build_parser
from sandbox_attest.cli.release import register
from sandbox_attest.paths import matrix_dir
from sandbox_attest.plugin import (
    SESSION_KEY,
    WARNED,
    CellFailed,
    MatrixItem,
    pytest_report_teststatus,
)
from sandbox_attest.report.evidence import CellEntry, cell_entry
from sandbox_attest.report.grid import render_grid
from sandbox_attest.run.matrix import load_matrix
from tests.attest.builder import build_report, make_cell, make_cells, sign, write_policy
from tests.attest.conftest import FIXED_SEED

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BACKENDS = ("none", "bubblewrap", "docker", "firejail", "bwrap-generic", "codex", "srt")
PROBES = ("net_denied_host", "proc_namespace_escape", "fs_write_outside_workspace", "dev_access")
VERDICTS = ("PASS", "FAIL", "INCONCLUSIVE", "ERROR", "UNAVAILABLE", "NOT_APPLICABLE")


def grid_cells() -> list[dict[str, Any]]:
    """Every backend x probe, cycling through all six verdicts."""
    cells = []
    for i, (backend, probe) in enumerate((b, p) for b in BACKENDS for p in PROBES):
        cells.append({"backend": backend, "probe": probe, "verdict": VERDICTS[i % 6]})
    return cells


class TestGridAt80Columns:
    def test_every_line_fits_and_the_legend_names_columns_and_codes(self) -> None:
        """Seven backends at 80 columns: no line is wider, and the legend decodes the grid."""
        demo = {"bwrap-generic": "a spec with a known hole, to show a FAIL"}
        lines = render_grid(grid_cells(), width=80, demonstrations=demo)
        assert max(len(line) for line in lines) <= 80
        text = "\n".join(lines)
        for backend in BACKENDS:
            assert f"={backend}" in text
        assert "INC=inconclusive" in text
        assert "UNAV=unavailable" in text
        assert "* bwrap-generic is a demonstration: a spec with a known hole" in text
        # The demonstration's column letter carries the mark in the header row.
        assert "E*" in lines[0].split()

    def test_colour_only_when_asked_and_width_still_holds(self) -> None:
        """Colour wraps verdicts in SGR codes; without them the text is the same and fits."""
        plain = render_grid(grid_cells(), width=80, colour=False)
        painted = render_grid(grid_cells(), width=80, colour=True)
        assert not any("\x1b[" in line for line in plain)
        assert any("\x1b[1;31mFAIL" in line for line in painted)
        assert [ANSI.sub("", line) for line in painted] == plain

    def test_wide_terminal_keeps_full_words(self) -> None:
        """Where the natural grid fits, verdicts and backends are spelled out, no legend."""
        lines = render_grid(grid_cells(), width=400)
        assert "bwrap-generic" in lines[0]
        assert "NOT_APPLICABLE" in "\n".join(lines)
        assert not any(line.startswith("columns:") for line in lines)

    def test_narrow_terminal_splits_columns_into_blocks(self) -> None:
        """At 40 columns the grid is cut into blocks of columns; each line still fits."""
        lines = render_grid(grid_cells(), width=40)
        assert max(len(line) for line in lines) <= 40
        assert sum(1 for line in lines if line.startswith("probe")) > 1

    def test_shipped_matrix_labels_bwrap_generic_a_demonstration(self) -> None:
        """The shipped matrix says why bwrap-generic is in the default set: to show a FAIL."""
        rows = {row.name: row for row in load_matrix(matrix_dir() / "matrix.toml").backends}
        assert "proc_syscall_surface FAILs" in rows["bwrap-generic"].demonstration
        assert rows["bubblewrap"].demonstration == ""


class TestFailOn:
    def test_warned_exits_1_only_with_fail_on_warned(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A WARNED gate exits 0 by default and 1 with --fail-on warned; the word stays WARNED."""
        warnings = ["firejail-net_denied_host is FAIL (not required)"]
        assert _print_gate([], warnings, "WARNED") == 0
        assert _print_gate([], warnings, "WARNED", "warned") == 1
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.startswith("gate: WARNED")
        assert "exit 1 (--fail-on warned)" in last

    def test_passed_is_0_either_way(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--fail-on warned does not fail a PASSED gate."""
        assert _print_gate([], [], "PASSED", "warned") == 0
        assert capsys.readouterr().out.strip() == "gate: PASSED (every required cell PASSed)"

    @pytest.mark.parametrize("command", ["run", "verify"])
    def test_help_documents_fail_on_with_the_exit_codes(
        self, command: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Both run and verify --help name --fail-on and what exit 1 means with it."""
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--fail-on {failed,warned}" in text
        assert "--fail-on warned was given" in text
        assert "strictness asked for PASSED" not in text

    def test_plugin_shows_an_unrequired_fail_as_warned(self) -> None:
        """An optional FAIL is pytest's 'warned' (not a red 'failed') with its verdict word."""
        report = SimpleNamespace(
            when="call", outcome="passed", user_properties=[("verdict", "FAIL"), (WARNED, True)]
        )
        config = SimpleNamespace(stash={SESSION_KEY: object()})
        status = pytest_report_teststatus(cast("Any", report), cast("Any", config))
        assert status is not None
        assert status[0] == WARNED
        assert status[2] == ("FAIL (not required)", {"yellow": True})


class TestVerifyJsonAndFailOn:
    @staticmethod
    def verify(argv: list[str]) -> int:
        """Run `verify` through its registered parser."""
        parser = argparse.ArgumentParser(prog="sandbox-attest")
        register(parser.add_subparsers())
        args = parser.parse_args(argv)
        return int(args.func(args))

    @staticmethod
    def warned_report(tmp_path: Path) -> tuple[Path, list[str]]:
        """A signed report whose gate is WARNED (an unrequired backend FAILs), and verify argv."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
            Ed25519PrivateKey,
        )

        key = SigningKey.from_private_key(
            Ed25519PrivateKey.from_private_bytes(FIXED_SEED), "file:t"
        )
        policy = write_policy(tmp_path / "policy.toml")
        cells = [*make_cells(), make_cell("firejail", "net_denied_host", "FAIL")]
        report = build_report(tmp_path / "run", policy, cells)
        sign(report, key)
        pub = tmp_path / "k.pub"
        pub.write_bytes(public_key_pem(key.public_key))
        argv = ["verify", str(report), "--trusted-key", str(pub), "--policy", str(policy)]
        return report, argv

    def test_warned_report_verifies_unless_fail_on_warned(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A WARNED report: verify exits 0, and 1 (REFUSED, naming why) with --fail-on warned."""
        _, argv = self.warned_report(tmp_path)
        assert self.verify([*argv, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["gate"] == "WARNED"
        assert self.verify([*argv, "--fail-on", "warned"]) == 1
        assert "--fail-on warned" in capsys.readouterr().err

    def test_tampered_report_has_no_gate(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """On a report that does not verify, --json's gate is null, never the report's word."""
        report, argv = self.warned_report(tmp_path)
        data = bytearray((report / "evidence.json").read_bytes())
        data[40] ^= 1
        (report / "evidence.json").write_bytes(bytes(data))
        assert self.verify([*argv, "--json"]) == 1
        out = json.loads(capsys.readouterr().out)
        assert out["ok"] is False
        assert out["gate"] is None


def closed_pipe_run(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run the CLI with a stdout pipe whose reader is gone before the command writes."""
    import os  # noqa: PLC0415

    read, write = os.pipe()
    os.close(read)  # the reader leaves first: the first write meets EPIPE, every time
    try:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_attest.cli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write)


class TestClosedPipe:
    def test_verify_json_into_a_gone_reader(self, tmp_path: Path) -> None:
        """A verify --json whose reader left: no traceback, and its own status (1: refused)."""
        proc = closed_pipe_run(
            [
                "verify",
                str(tmp_path),
                "--trusted-key",
                str(write_key(tmp_path)),
                "--policy",
                str(write_policy(tmp_path / "policy.toml")),
                "--json",
            ]
        )
        assert b"Traceback" not in proc.stderr
        assert b"BrokenPipe" not in proc.stderr
        assert proc.returncode == 1

    def test_help_into_a_gone_reader_exits_0(self) -> None:
        """A command whose status is 0 keeps it when its reader is gone (`| head -1`)."""
        proc = closed_pipe_run(["--help"])
        # argparse's --help exits through SystemExit(0) after printing: still no traceback.
        assert b"Traceback" not in proc.stderr
        assert proc.returncode == 0


def write_key(tmp_path: Path) -> Path:
    """A public key file for verify's --trusted-key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    pub = tmp_path / "k.pub"
    pub.write_bytes(public_key_pem(Ed25519PrivateKey.from_private_bytes(FIXED_SEED).public_key()))
    return pub


def raised(entry: CellEntry) -> pytest.ExceptionInfo[CellFailed]:
    """CellFailed(entry) as pytest holds it after the cell raised it."""
    with pytest.raises(CellFailed) as excinfo:
        raise CellFailed(entry)
    return excinfo


class TestQuietFailures:
    def test_no_empty_evidence_line(self) -> None:
        """A failure whose payload wrote nothing on stderr ends at its reason."""

        def entry(stderr: str) -> CellEntry:
            return cell_entry(
                cell_id="bwrap-generic-x",
                backend="bwrap-generic",
                probe="x",
                platform="linux",
                verdict="FAIL",
                reason="why; fix: how",
                run={"started": True, "stderr": stderr},
            )

        text = MatrixItem.repr_failure(cast("Any", None), raised(entry("")))
        assert text.splitlines()[-1] == "  reason: why; fix: how"
        assert 'evidence: ""' not in text
        said = raised(entry("boom\n"))
        assert MatrixItem.repr_failure(cast("Any", None), said).endswith('evidence: "boom\\n"')

    def test_missing_cells_are_counted_not_relisted(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The gate counts MISSING cells (the summary listed each once) and still FAILs."""
        missing = [f"{MISSING_PREFIX}docker-p{i}" for i in range(35)]
        assert _print_gate(missing, [], "FAILED") == 1
        out = capsys.readouterr().out
        assert "docker-p7" not in out
        assert "gate: 35 required cells never ran" in out
        assert out.splitlines()[-1] == "gate: FAILED"


class TestRunAttestInstalls:
    @staticmethod
    def packages(*args: str) -> list[str]:
        """The Debian packages `./run attest ARGS` would ensure (its functions, apt stubbed)."""
        script = (REPO / "run").read_text()
        funcs = "\n".join(
            re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", script, re.DOTALL | re.MULTILINE).group(0)  # type: ignore[union-attr]
            for name in ("requested_backends", "attest_apt")
        )
        bash = f'say() {{ :; }}\nensure_apt() {{ echo "$@"; }}\n{funcs}\nattest_apt "$@"\n'
        out = subprocess.run(
            ["bash", "-c", bash, "run", *args], capture_output=True, text=True, check=True
        )
        return out.stdout.split()

    def test_default_set_gets_every_wrapper_it_runs(self) -> None:
        """No --backend: bubblewrap and firejail are installed, so no column is UNAVAILABLE."""
        assert {"bubblewrap", "firejail"} <= set(self.packages())

    def test_named_backends_get_only_theirs(self) -> None:
        """--backend bwrap-generic installs bubblewrap only; --backend firejail firejail only."""
        assert "firejail" not in self.packages("--backend", "bwrap-generic")
        assert "bubblewrap" in self.packages("--backend", "bwrap-generic")
        assert "bubblewrap" not in self.packages("--backend=firejail")
        assert "firejail" in self.packages("--backend=firejail")


class TestUnavailableRequiredBackend:
    def test_one_line_one_count_no_contradicting_warning(self, tmp_path: Path) -> None:
        """Docker down on a default run: one gate line counting all its cells, no warning."""
        from tests.unit.test_session import record, session  # noqa: PLC0415

        run = session(tmp_path, ["none", "bubblewrap", "docker"], set())
        docker = [c for c in run.cells() if c.backend == "docker"]
        for cell in run.cells():
            record(run, cell, "UNAVAILABLE" if cell.backend == "docker" else "PASS")
        required = [c for c in run.writer.cells if c["backend"] == "docker" and c["required"]]
        assert required, "the shipped policy requires the docker leg"
        lines = [f for f in run.gate_failures() if "docker" in f]
        assert len(lines) == 1
        assert lines[0].startswith(
            f"backend docker is UNAVAILABLE and {len(required)} of its {len(docker)} cells"
        )
        assert "the release policy" in lines[0]
        assert not any("docker" in w for w in run.gate_warnings())


class TestDemonstrationInTheReport:
    def test_report_html_badges_the_demonstration_column(self, tmp_path: Path) -> None:
        """A backend the evidence marks as a demonstration is labelled in the grid and table."""
        from sandbox_attest.report.policy import load_policy  # noqa: PLC0415
        from sandbox_attest.report.views import render_html  # noqa: PLC0415

        policy_path = write_policy(tmp_path / "policy.toml")
        cells = [*make_cells(), make_cell("bwrap-generic", "net_denied_host", "FAIL")]
        report = build_report(tmp_path / "run", policy_path, cells)
        evidence = json.loads((report / "evidence.json").read_text())
        for backend in evidence["backends"]:
            if backend["name"] == "bwrap-generic":
                backend["demonstration"] = "a spec with a known hole, to show a FAIL"
        page = render_html(evidence, None, load_policy(policy_path))
        assert "<span class='badge demo' title='a spec with a known hole" in page
        assert "bwrap-generic (demonstration: a spec with a known hole, to show a FAIL)" in page


class TestPluginOption:
    def test_pytest_help_lists_fail_on(self) -> None:
        """Plain pytest knows --sandbox-attest-fail-on {failed,warned}, documented."""
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--help"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
            check=True,
        )
        text = " ".join(proc.stdout.split())
        assert "--sandbox-attest-fail-on={failed,warned}" in text
        assert "such a cell fails like a required one" in text


class TestBackendsListsTheDemonstration:
    def test_backends_json_and_text_say_why_bwrap_generic_is_there(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`backends` (JSON and text) carries bwrap-generic's demonstration reason."""
        from sandbox_attest.cli import main  # noqa: PLC0415

        assert main(["backends", "--json"]) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["backends"]}
        assert "known hole" in rows["bwrap-generic"]["demonstration"]
        assert "demonstration" not in rows["bubblewrap"]
        assert main(["backends"]) == 0
        assert "demonstration: a spec with a known hole" in capsys.readouterr().out


class TestDemonstrationInTheSummary:
    def test_summary_md_labels_the_demonstration_column(self, tmp_path: Path) -> None:
        """summary.md's grid header and a line under it say bwrap-generic is a demonstration."""
        from sandbox_attest.report.policy import load_policy  # noqa: PLC0415
        from sandbox_attest.report.views import render_summary  # noqa: PLC0415

        policy_path = write_policy(tmp_path / "policy.toml")
        cells = [*make_cells(), make_cell("bwrap-generic", "net_denied_host", "FAIL")]
        report = build_report(tmp_path / "run", policy_path, cells)
        evidence = json.loads((report / "evidence.json").read_text())
        for backend in evidence["backends"]:
            if backend["name"] == "bwrap-generic":
                backend["demonstration"] = "a spec with a known hole"
        text = render_summary(evidence, None, load_policy(policy_path))
        header = next(line for line in text.splitlines() if line.startswith("| probe |"))
        assert "bwrap-generic (demonstration)" in header
        assert "is a demonstration: a spec with a known hole" in text


class TestRunJsonGateWord:
    def test_fail_on_warned_keeps_the_word_warned(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A WARNED run with --json and --fail-on warned: exit_code 1, gate still WARNED."""
        from sandbox_attest.cli import _GateWatch, _print_run_json  # noqa: PLC0415

        gate = _GateWatch()
        gate.failures, gate.warnings, gate.signed = [], ["x is FAIL (not required)"], "WARNED"
        _print_run_json("rid", tmp_path, gate, 1, "warned")
        out = json.loads(capsys.readouterr().out)
        assert (out["gate"], out["exit_code"], out["fail_on"]) == ("WARNED", 1, "warned")
        gate.failures = ["required cell bubblewrap-x is FAIL"]
        _print_run_json("rid", tmp_path, gate, 1)
        assert json.loads(capsys.readouterr().out)["gate"] == "FAILED"
