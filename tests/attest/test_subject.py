"""`verify --subject` answers a release pipeline's question about one sandbox build (issue 30).

The reports here are built with a real executable file for bubblewrap (its identity's
`executables` point at it with its true sha256), so `--subject PATH` hashes a file as a
pipeline would. Forged statements are signed with the trusted key itself: the signature holds,
and only the comparison with the signed evidence can refuse them.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest import dsse, policy_from_evidence
from sandbox_attest.attest.keys import public_key_pem
from sandbox_attest.attest.statement import (
    EVIDENCE_PREDICATE,
    TEST_RESULT_PREDICATE,
    configuration,
    report_subjects,
    statement,
    statement_bytes,
)
from sandbox_attest.attest.statement import (
    test_result_predicate as result_predicate,
)
from sandbox_attest.attest.subjects import ALLURE_DIR, FILE_SUBJECTS, tree_sha256
from sandbox_attest.attest.verification import PRE_ISSUE_30_NOTE
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.cli.release import register
from sandbox_attest.report.policy import gate_for
from tests.attest.builder import build_report, make_cells, read_statements, sign

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from sandbox_attest.attest.keys import SigningKey, TrustedKey
    from sandbox_attest.report.policy import Policy

ATT = "attestation.intoto.jsonl"
BWRAP = b"#!/bin/sh\n# a stand-in bwrap build\n"


def built(
    tmp_path: Path,
    policy_file: Path,
    key: SigningKey,
    verdicts: dict[str, str] | None = None,
) -> tuple[Path, Path]:
    """A signed report whose bubblewrap ran `tmp_path/bin/bwrap`; (report dir, that file)."""
    exe = tmp_path / "bin" / "bwrap"
    exe.parent.mkdir(exist_ok=True)
    exe.write_bytes(BWRAP)
    report = build_report(tmp_path / "run", policy_file, make_cells(verdicts=verdicts))
    evidence = json.loads((report / "evidence.json").read_text())
    for backend in evidence["backends"]:
        if backend["name"] == "bubblewrap":
            backend["identity"]["executables"] = {
                "bwrap": {
                    "argv0": "bwrap",
                    "path": str(exe),
                    "realpath": str(exe),
                    "sha256": hashlib.sha256(BWRAP).hexdigest(),
                }
            }
    (report / "evidence.json").write_text(json.dumps(evidence, indent=2, sort_keys=True))
    sign(report, key)
    return report, exe


def run_cli(argv: list[str]) -> int:
    """Parse argv with the registered subcommands and run the chosen one."""
    parser = argparse.ArgumentParser(prog="sandbox-attest")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def verify_argv(report: Path, key: SigningKey, policy_file: Path, tmp_path: Path) -> list[str]:
    """`verify REPORT --trusted-key PUB --policy POLICY`."""
    pub = tmp_path / "k.pub"
    pub.write_bytes(public_key_pem(key.public_key))
    return ["verify", str(report), "--trusted-key", str(pub), "--policy", str(policy_file)]


def resign(report: Path, key: SigningKey, statements: list[dict[str, Any]]) -> None:
    """Replace the report's attestation with `statements`, each signed with `key`."""
    lines = [
        dsse.sign(statement_bytes(s), key.private_key, key.keyid).to_json() for s in statements
    ]
    (report / ATT).write_text("".join(line + "\n" for line in lines))


class TestAnswer:
    def test_the_build_that_ran_passed(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--subject of the executable that ran: exit 0, its backend, PASSED, claims and time."""
        report, exe = built(tmp_path, policy_file, signing_key)
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        assert run_cli([*argv, "--subject", str(exe)]) == 0
        out = capsys.readouterr().out
        assert f"{exe}: backend bubblewrap, sandbox under test: PASSED, run finished" in out
        assert "claims held: " in out
        assert f"OK: {exe} PASSED" in out

    def test_json_carries_the_same_answer(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--json: the digest, the backend's statement with its result, time and claims."""
        report, exe = built(tmp_path, policy_file, signing_key)
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        assert run_cli([*argv, "--subject", str(exe), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        subject = data["subject"]
        assert subject["ok"] is True
        assert subject["digest"] == "sha256:" + hashlib.sha256(BWRAP).hexdigest()
        (stmt,) = subject["statements"]
        assert (stmt["backend"], stmt["result"], stmt["control"]) == ("bubblewrap", "PASSED", False)
        assert stmt["finishedAt"]
        assert stmt["claims"]
        assert len(stmt["passedTests"]) == 7

    def test_a_digest_names_the_same_build(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--subject-digest sha256:HEX answers as --subject does; a malformed one is exit 2."""
        report, _ = built(tmp_path, policy_file, signing_key)
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        digest = "sha256:" + hashlib.sha256(BWRAP).hexdigest()
        assert run_cli([*argv, "--subject-digest", digest]) == 0
        assert "backend bubblewrap" in capsys.readouterr().out
        assert run_cli([*argv, "--subject-digest", "md5:abc"]) == 2
        assert "sha256:<64 hex digits>" in capsys.readouterr().err


class TestRefusals:
    def test_another_build_at_the_same_path_is_refused(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A rebuilt binary at the path that ran is not what was tested: refused, saying so."""
        report, exe = built(tmp_path, policy_file, signing_key)
        exe.write_bytes(BWRAP + b"# patched\n")
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        assert run_cli([*argv, "--subject", str(exe)]) == 1
        err = capsys.readouterr().err
        assert "is not the executable that ran" in err
        assert "backend bubblewrap" in err

    def test_an_unrelated_binary_is_refused(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A file no statement names: refused, listing what the report did test."""
        report, exe = built(tmp_path, policy_file, signing_key)
        other = tmp_path / "runsc"
        other.write_bytes(b"another sandbox\n")
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        assert run_cli([*argv, "--subject", str(other)]) == 1
        err = capsys.readouterr().err
        assert "no statement in this report has subject" in err
        assert str(exe) in err

    def test_the_control_legs_interpreter_is_no_sandbox(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A digest only the control leg's statement names is refused: the control attests none."""
        report, _ = built(tmp_path, policy_file, signing_key)
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        control = "sha256:" + hashlib.sha256(b"exe none").hexdigest()
        assert run_cli([*argv, "--subject-digest", control]) == 1
        assert "the control attests no sandbox" in capsys.readouterr().err

    def test_a_failed_build_is_refused(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The build that ran but FAILED a required probe: refused with its signed result."""
        verdicts = {"bubblewrap-net_denied_host": "FAIL"}
        report, exe = built(tmp_path, policy_file, signing_key, verdicts)
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        assert run_cli([*argv, "--subject", str(exe)]) == 1
        err = capsys.readouterr().err
        assert "signed result is FAILED" in err

    def test_a_statement_for_another_binary_is_refused(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey, trusted: TrustedKey,
        policy: Policy,
    ) -> None:  # fmt: skip
        """A statement naming a digest that is not what the evidence says ran fails verify."""
        report, _ = built(tmp_path, policy_file, signing_key)
        stmts = read_statements(report)
        forged = "sha256:" + hashlib.sha256(b"a leaky bwrap").hexdigest()
        for stmt in stmts:
            for subject in stmt["subject"]:
                if subject["name"].endswith("/bwrap"):
                    subject["digest"]["sha256"] = forged.removeprefix("sha256:")
        resign(report, signing_key, stmts)
        v = verify_report(report, trusted, policy)
        assert any("not the executables the signed evidence says it ran" in r for r in v.reasons), (
            v.reasons
        )

    def test_subject_query_refuses_a_forged_statement_with_the_reason(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--subject of the forged digest: refused, naming the mismatch with what ran."""
        report, _ = built(tmp_path, policy_file, signing_key)
        stmts = read_statements(report)
        leaky = tmp_path / "leaky-bwrap"
        leaky.write_bytes(b"a leaky bwrap")
        for stmt in stmts:
            for subject in stmt["subject"]:
                if subject["name"].endswith("/bwrap"):
                    subject["digest"]["sha256"] = hashlib.sha256(b"a leaky bwrap").hexdigest()
        resign(report, signing_key, stmts)
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        assert run_cli([*argv, "--subject", str(leaky)]) == 1
        err = capsys.readouterr().err
        assert "the report does not verify" in err
        assert "not the executables the signed evidence says it ran" in err

    def test_a_statement_about_a_backend_the_run_never_had_is_refused(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey, trusted: TrustedKey,
        policy: Policy,
    ) -> None:  # fmt: skip
        """A sandbox statement for a backend absent from the evidence fails verify."""
        report, _ = built(tmp_path, policy_file, signing_key)
        stmts = read_statements(report)
        extra = json.loads(json.dumps(stmts[1]))
        for entry in extra["predicate"]["configuration"]:
            if entry["name"] == "sandbox":
                entry["annotations"]["backend"] = "runsc"
        resign(report, signing_key, [*stmts[:-1], extra, stmts[-1]])
        v = verify_report(report, trusted, policy)
        assert any("which the signed evidence does not record" in r for r in v.reasons), v.reasons


def legacy_statements(report: Path) -> list[dict[str, Any]]:
    """The two statements a sandbox-attest from before issue 30 signed for this report."""
    evidence = json.loads((report / "evidence.json").read_text())
    policy = policy_from_evidence(evidence)
    files = {name: (report / name).read_bytes() for name in FILE_SUBJECTS}
    subjects = report_subjects(files, tree_sha256(report / ALLURE_DIR))
    gate = gate_for(evidence, policy)
    config = configuration(evidence, policy.sha256 if policy else None)
    old_result = statement(subjects, TEST_RESULT_PREDICATE, result_predicate(gate, config))
    (evidence_stmt,) = [
        s for s in read_statements(report) if s["predicateType"] == EVIDENCE_PREDICATE
    ]
    return [old_result, evidence_stmt]


class TestOldReports:
    def test_a_report_from_before_issue_30_still_verifies_with_a_note(
        self, signed_report: Path, signing_key: SigningKey, trusted: TrustedKey, policy: Policy
    ) -> None:
        """Old layout (test-result subject = report files): verifies, and a note says so."""
        resign(signed_report, signing_key, legacy_statements(signed_report))
        v = verify_report(signed_report, trusted, policy)
        assert v.reasons == []
        assert PRE_ISSUE_30_NOTE in v.notes
        assert v.sandboxes == []

    def test_subject_of_an_old_report_is_refused_with_the_note(
        self,
        signed_report: Path,
        signing_key: SigningKey,
        policy_file: Path,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--subject on an old report cannot find a sandbox: refused, naming why."""
        resign(signed_report, signing_key, legacy_statements(signed_report))
        argv = verify_argv(signed_report, signing_key, policy_file, tmp_path)
        digest = "sha256:" + hashlib.sha256(b"exe bubblewrap").hexdigest()
        assert run_cli([*argv, "--subject-digest", digest]) == 1
        assert "signed before issue 30" in capsys.readouterr().err

    def test_old_payloads_decode(self, signed_report: Path, signing_key: SigningKey) -> None:
        """The re-signed old layout really names the report files as its test-result subject."""
        resign(signed_report, signing_key, legacy_statements(signed_report))
        line = (signed_report / ATT).read_text().splitlines()[0]
        stmt = json.loads(base64.b64decode(json.loads(line)["payload"]))
        assert [s["name"] for s in stmt["subject"]] == [*FILE_SUBJECTS, "allure-results/"]


class TestVerifyShowsSandboxes:
    def test_text_and_json_list_each_backends_statement(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Plain verify prints each backend's subjects and result; --json carries them too."""
        report, exe = built(tmp_path, policy_file, signing_key)
        argv = verify_argv(report, signing_key, policy_file, tmp_path)
        assert run_cli(argv) == 0
        digest = hashlib.sha256(BWRAP).hexdigest()
        assert f"sandbox bubblewrap (tested, PASSED): {exe} sha256:{digest[:12]}" in (
            capsys.readouterr().out
        )
        assert run_cli([*argv, "--json"]) == 0
        sandboxes = json.loads(capsys.readouterr().out)["sandboxes"]
        by_backend = {s["backend"]: s for s in sandboxes}
        assert {b: s["control"] for b, s in by_backend.items()} == {
            "none": True,
            "bubblewrap": False,
        }
        assert by_backend["bubblewrap"]["subjects"] == [{"name": str(exe), "sha256": digest}]
