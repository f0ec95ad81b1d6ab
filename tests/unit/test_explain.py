"""Per-probe docs: one file, read by `explain`, the probes README and every FAIL's fix.

The shipped probes/docs.toml is read for real; the CLI runs in-process through `main`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.cli import main
from sandbox_attest.paths import probes_dir
from sandbox_attest.report.explain import (
    FIELDS,
    probe_docs,
    readme_section,
    readme_with_section,
    with_fix,
)

ROOT = Path(__file__).parents[2]


class TestDocs:
    def test_every_catalogue_probe_is_documented(self) -> None:
        """docs.toml has exactly the catalogue's probes, each with every field filled."""
        docs = probe_docs()
        assert set(docs) == set(PROBES)
        for doc in docs.values():
            assert all(getattr(doc, name) for name in FIELDS)

    def test_probes_readme_is_up_to_date(self) -> None:
        """probes/README.md holds the section generated from docs.toml, unchanged."""
        readme = (probes_dir() / "README.md").read_text(encoding="utf-8")
        assert readme_with_section(readme, readme_section()) == readme, (
            "probes/README.md is stale; run: python -m sandbox_attest.report.explain --write-readme"
        )

    def test_readme_section_is_replaced_not_appended(self) -> None:
        """Regenerating a README that has the section replaces it in place, keeping the rest."""
        base = "# Probes\n\nintro\n"
        once = readme_with_section(base, readme_section())
        twice = readme_with_section(once + "\n## After\n", readme_section())
        assert twice.count("## Every probe, one by one") == 1
        assert twice.startswith(base)
        assert twice.endswith("## After\n")


class TestExplain:
    def test_prints_every_part(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`explain PROBE` prints what it attempts, its control, witness, claim and fix."""
        assert main(["explain", "proc_syscall_surface"]) == 0
        out = capsys.readouterr().out
        for label in ("attempts:", "control:", "witness:", "judges the claim:", "usual fix:"):
            assert label in out
        assert "seccomp" in out

    def test_same_words_as_the_readme(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The terminal text and the README render the same fix sentence."""
        main(["explain", "fs_read_secrets"])
        out = " ".join(capsys.readouterr().out.split())
        readme = (probes_dir() / "README.md").read_text(encoding="utf-8")
        fix = probe_docs()["fs_read_secrets"].fix
        assert fix in out
        assert fix in readme

    def test_unknown_probe_suggests_the_nearest(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A misspelt probe exits 2 and names the probe that was probably meant."""
        assert main(["explain", "net_denied_hots"]) == 2
        assert "did you mean net_denied_host?" in capsys.readouterr().err


class TestFailFix:
    def test_fix_is_appended(self) -> None:
        """A FAIL reason that names no fix gets the probe's usual fix."""
        reason = with_fix("proc_syscall_surface", "escape observed by the host: bpf succeeded")
        assert reason.startswith("escape observed by the host: bpf succeeded; fix: ")
        assert reason.endswith(probe_docs()["proc_syscall_surface"].fix)

    def test_a_reason_with_a_fix_is_left_alone(self) -> None:
        """A reason that already says what to do is not given a second fix."""
        reason = "escape observed: x; fix: bind it read-only"
        assert with_fix("fs_write_outside", reason) == reason


class TestMatrixPointers:
    def test_documents_named_in_matrix_toml_exist(self) -> None:
        """Every document the shipped matrix's comments point to is in the repository."""
        text = (ROOT / "matrix" / "matrix.toml").read_text(encoding="utf-8")
        named = set(re.findall(r"[\w./-]+\.md\b", text))
        assert named
        assert [n for n in sorted(named) if not (ROOT / n).is_file()] == []
