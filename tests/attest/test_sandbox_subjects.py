"""What each backend's test-result statement is about (issue 30): the sandbox it ran.

`sandbox_subjects` reads a backend's evidence record (its identity's executables, a docker
image, a command spec) and names each thing by sha256; these tests feed it the shapes the
backends record (sandbox_attest/backends/base.py `Identity.as_dict`, docker_image.py).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from sandbox_attest.attest.statement import backend_records, ci_url, sandbox_subjects
from tests.attest.builder import build_report, sandbox_statement, sign

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.attest.keys import SigningKey


def sha(text: str) -> str:
    """sha256 hex of `text`."""
    return hashlib.sha256(text.encode()).hexdigest()


def facts(argv0: str, path: str, **extra: Any) -> dict[str, Any]:
    """`provenance.executable_facts` for one program."""
    return {"argv0": argv0, "path": path, "realpath": path, "sha256": sha(path), **extra}


def pairs(subjects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(name, sha256) of each subject."""
    return {(s["name"], s["digest"]["sha256"]) for s in subjects}


class TestSandboxSubjects:
    def test_a_wrapper_script_names_itself_and_its_interpreter(self) -> None:
        """Srt's cli.js and the node that runs it, the spec's bytes, and the payload python."""
        node = facts("node", "/opt/npm/bin/node")
        record = {
            "name": "srt",
            "identity": {
                "executables": {
                    "srt": facts("srt", "/opt/npm/lib/cli.js", interpreter=node),
                    # As base.program_facts records it: keyed "{python}", argv0 its path.
                    "{python}": facts("/usr/bin/python3.11", "/usr/bin/python3.11"),
                },
                "spec_sha256": sha("spec bytes"),
            },
        }
        subjects = sandbox_subjects(record)
        assert pairs(subjects) == {
            ("/opt/npm/lib/cli.js", sha("/opt/npm/lib/cli.js")),
            ("/opt/npm/bin/node", sha("/opt/npm/bin/node")),
            ("/usr/bin/python3.11", sha("/usr/bin/python3.11")),
            ("backend-spec:srt", sha("spec bytes")),
        }
        kinds = {s["name"]: s["annotations"]["kind"] for s in subjects}
        assert kinds["/usr/bin/python3.11"] == "payload interpreter"
        assert kinds["/opt/npm/lib/cli.js"] == "executable"

    def test_docker_names_its_runtime_and_image(self) -> None:
        """The runtime binary (runsc, runc) and the image by its id."""
        image_id = "sha256:" + sha("image")
        record = {
            "name": "docker",
            "identity": {
                "executables": {"runsc": facts("runsc", "/usr/local/bin/runsc")},
                "profile": {"image": {"ref": "sandbox-attest/payload:1", "id": image_id}},
            },
        }
        assert pairs(sandbox_subjects(record)) == {
            ("/usr/local/bin/runsc", sha("/usr/local/bin/runsc")),
            ("sandbox-attest/payload:1", sha("image")),
        }

    def test_an_executable_not_found_is_no_subject(self) -> None:
        """A program the identity could not hash has no digest, so it names nothing."""
        record = {
            "name": "codex",
            "identity": {
                "executables": {
                    "codex": {"argv0": "codex", "error": "not found"},
                    "bwrap": facts("bwrap", "/usr/bin/bwrap"),
                }
            },
        }
        assert pairs(sandbox_subjects(record)) == {("/usr/bin/bwrap", sha("/usr/bin/bwrap"))}

    def test_an_unavailable_backend_gets_a_subject_no_file_matches(self) -> None:
        """No identity at all: one `backend:NAME` subject pinned by the record itself."""
        (subject,) = sandbox_subjects({"name": "nsjail", "available": False, "reason": "x"})
        assert subject["name"] == "backend:nsjail"
        assert len(subject["digest"]["sha256"]) == 64

    def test_cells_without_a_backend_record_still_get_one(self) -> None:
        """A backend only the cells name gets a bare record, so its cells have a statement."""
        evidence = {"backends": [{"name": "none"}], "cells": [{"backend": "firejail"}]}
        assert [r["name"] for r in backend_records(evidence)] == ["none", "firejail"]


class TestUrl:
    def test_github_run_url(self) -> None:
        """The three GitHub variables make the run's URL; any one missing makes none."""
        env = {
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "o/r",
            "GITHUB_RUN_ID": "42",
        }
        assert ci_url(env) == "https://github.com/o/r/actions/runs/42"
        assert ci_url({**env, "GITHUB_RUN_ID": ""}) == ""

    def test_signed_statement_carries_the_url(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey
    ) -> None:
        """Signed in a CI run, each sandbox statement's predicate has `url`; elsewhere none."""
        from sandbox_attest.attest import sign_report  # noqa: PLC0415

        report = build_report(tmp_path / "run", policy_file)
        env = {
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "o/r",
            "GITHUB_RUN_ID": "7",
        }
        sign_report(report, signing_key, env=env)
        stmt = sandbox_statement(report, "bubblewrap")
        assert stmt["predicate"]["url"] == "https://github.com/o/r/actions/runs/7"
        other = build_report(tmp_path / "local", policy_file)
        sign(other, signing_key)
        assert "url" not in sandbox_statement(other, "bubblewrap")["predicate"]
