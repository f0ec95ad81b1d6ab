"""The GitHub workflows: least privilege, SHA pins, and legs that match matrix/legs.toml.

PyYAML parses the files (a test dependency). Note that YAML 1.1 reads the key `on` as True.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


def load(name: str) -> dict[str, Any]:
    """One workflow file as data."""
    data: dict[str, Any] = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    return data


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps of a job."""
    out: list[dict[str, Any]] = job.get("steps", [])
    return out


def run_text(job: dict[str, Any]) -> str:
    """Every `run:` script of a job, joined."""
    return "\n".join(str(s.get("run", "")) for s in steps(job))


def expected_legs() -> set[tuple[str, str]]:
    """(platform, backend) of every leg in matrix/legs.toml."""
    data = tomllib.loads((ROOT / "matrix" / "legs.toml").read_text(encoding="utf-8"))
    return {(leg["platform"], leg["backend"]) for leg in data["leg"]}


ALL = sorted(p.name for p in WORKFLOWS.glob("*.yml"))
RELEASE_KEY_REF = "secrets.SANDBOX_ATTEST_SIGNING_KEY"  # an expression, not a secret


class TestEveryWorkflow:
    """Hygiene that holds for every workflow file."""

    def test_files_exist(self) -> None:
        """Both workflows exist."""
        assert {"attest.yml", "lint.yml"} <= set(ALL)

    @pytest.mark.parametrize("name", ALL)
    def test_top_level_permissions_empty(self, name: str) -> None:
        """Top-level permissions are empty; every grant is per job."""
        assert load(name)["permissions"] == {}

    @pytest.mark.parametrize("name", ALL)
    def test_every_job_has_timeout_and_permissions(self, name: str) -> None:
        """Every job sets timeout-minutes and its own permissions."""
        for job_id, job in load(name)["jobs"].items():
            assert isinstance(job.get("timeout-minutes"), int), job_id
            assert "permissions" in job, job_id

    @pytest.mark.parametrize("name", ALL)
    def test_actions_pinned_by_sha_with_version_comment(self, name: str) -> None:
        """Every `uses:` is a full commit SHA followed by a `# vX` comment."""
        text = (WORKFLOWS / name).read_text(encoding="utf-8")
        uses = re.findall(r"uses:\s*(\S+)(.*)", text)
        assert uses
        for ref, rest in uses:
            assert PIN.match(ref), ref
            assert re.match(r"\s+# v\d", rest), f"{ref} lacks a '# vX' comment"

    @pytest.mark.parametrize("name", ALL)
    def test_checkout_does_not_persist_credentials(self, name: str) -> None:
        """Every checkout sets persist-credentials: false."""
        for job in load(name)["jobs"].values():
            for step in steps(job):
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False

    @pytest.mark.parametrize("name", ALL)
    def test_concurrency_cancels_in_progress(self, name: str) -> None:
        """A newer run of the same ref cancels the older one."""
        assert load(name)["concurrency"]["cancel-in-progress"] is True

    @pytest.mark.parametrize("name", ALL)
    def test_same_action_same_pin(self, name: str) -> None:
        """One action is pinned to one SHA everywhere (no drift between jobs)."""
        pins: dict[str, set[str]] = {}
        for ref in re.findall(r"uses:\s*(\S+)", (WORKFLOWS / name).read_text(encoding="utf-8")):
            action, sha = ref.split("@")
            pins.setdefault(action, set()).add(sha)
        assert all(len(shas) == 1 for shas in pins.values()), pins


class TestAttest:
    """The attest workflow: legs, uploads, and the gate."""

    @pytest.fixture
    def wf(self) -> dict[str, Any]:
        """attest.yml."""
        return load("attest.yml")

    def test_legs_match_legs_toml(self, wf: dict[str, Any]) -> None:
        """The leg matrix is exactly the set of legs the merge expects."""
        include = wf["jobs"]["leg"]["strategy"]["matrix"]["include"]
        assert {(leg["platform"], leg["backend"]) for leg in include} == expected_legs()
        assert len(include) == len(expected_legs())
        assert wf["jobs"]["leg"]["strategy"]["fail-fast"] is False

    def test_every_leg_requires_its_backend_and_writes_its_dir(self, wf: dict[str, Any]) -> None:
        """The leg runs `sandbox-attest run --backend X --require-backend --out reports/leg-..`."""
        leg = wf["jobs"]["leg"]
        script = run_text(leg)
        assert re.search(
            r'sandbox-attest run --backend "\$BACKEND" --require-backend --out "\$LEG_DIR"', script
        )
        assert leg["env"]["LEG_DIR"] == "reports/leg-${{ matrix.platform }}-${{ matrix.backend }}"

    def test_every_leg_uploads_its_report_even_on_failure(self, wf: dict[str, Any]) -> None:
        """The leg uploads its report dir under a per-leg name, also when the run failed."""
        uploads = [s for s in steps(wf["jobs"]["leg"]) if "upload-artifact" in str(s.get("uses"))]
        assert len(uploads) == 1
        upload = uploads[0]
        assert upload["if"] == "always()"
        assert upload["with"]["path"] == "${{ env.LEG_DIR }}"
        assert upload["with"]["name"] == "leg-${{ matrix.platform }}-${{ matrix.backend }}"
        assert upload["with"]["if-no-files-found"] == "error"

    def test_bubblewrap_leg_prepares_user_namespaces(self, wf: dict[str, Any]) -> None:
        """The bubblewrap leg installs bwrap and lifts the AppArmor userns restriction."""
        script = run_text(wf["jobs"]["leg"])
        assert "apt-get install -y bubblewrap" in script
        assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in script

    def test_gate_needs_every_leg_and_always_runs(self, wf: dict[str, Any]) -> None:
        """The gate waits for every leg, and runs even when a leg failed (to say so)."""
        gate = wf["jobs"]["gate"]
        assert "leg" in gate["needs"]
        assert gate["if"] == "always()"
        legs = [j for j in wf["jobs"] if j.startswith("leg")]
        assert set(legs) <= set(gate["needs"])

    def test_gate_merges_and_verifies_against_the_policy(self, wf: dict[str, Any]) -> None:
        """The gate downloads leg-*, merges with --expect-legs, then verifies the policy."""
        gate = wf["jobs"]["gate"]
        downloads = [s for s in steps(gate) if s.get("with", {}).get("pattern") == "leg-*"]
        assert downloads
        assert downloads[0]["with"]["path"] == "reports"
        script = run_text(gate)
        merge = script.index("sandbox-attest merge reports/leg-* --expect-legs matrix/legs.toml")
        verify = script.index("sandbox-attest verify reports/release --policy matrix/policy.toml")
        assert merge < verify
        assert "--out reports/release --trusted-key" in script
        assert "set +e" not in script  # a failure fails the gate
        assert "|| true" not in script

    def test_id_token_only_on_legs(self, wf: dict[str, Any]) -> None:
        """Only the legs (which sign keyless) may request an OIDC token."""
        for job_id, job in wf["jobs"].items():
            granted = job.get("permissions") or {}
            assert ("id-token" in granted) == (job_id == "leg"), job_id
            assert granted.get("contents", "read") == "read"
            assert all(v in {"read", "write"} for v in granted.values())
        assert wf["jobs"]["leg"]["permissions"]["id-token"] == "write"

    def test_release_secret_only_outside_pull_requests(self, wf: dict[str, Any]) -> None:
        """Every step that references the release key is guarded to push events only."""
        guarded = 0
        for job_id, job in wf["jobs"].items():
            assert RELEASE_KEY_REF not in yaml.safe_dump(job.get("env") or {}), job_id
            assert RELEASE_KEY_REF not in str(job.get("outputs") or {}), job_id
            for step in steps(job):
                if RELEASE_KEY_REF not in yaml.safe_dump(step):
                    continue
                guard = " ".join(str(g) for g in (job.get("if"), step.get("if")) if g)
                assert "github.event_name == 'push'" in guard, (job_id, step.get("name"))
                assert "pull_request" not in guard.replace("!= 'pull_request'", ""), guard
                guarded += 1
        assert guarded >= 2  # the legs' run and the gate's merge

    def test_release_only_on_pushes_to_main_and_tags(self, wf: dict[str, Any]) -> None:
        """A release is a push to main or a tag; pull requests still run, as non-releases."""
        on: dict[str, Any] = wf[True]  # type: ignore[index]  # YAML 1.1 reads `on` as True
        assert on["push"]["branches"] == ["main"]
        assert on["push"]["tags"]
        assert "pull_request" in on
        assert "event_name == 'push'" in wf["jobs"]["keys"]["outputs"]["mode"]

    def test_pull_request_path_is_not_a_release(self, wf: dict[str, Any]) -> None:
        """Off push, legs sign with the per-machine key; the gate allows it and says so."""
        gate = wf["jobs"]["gate"]
        (pr_step,) = [
            s for s in steps(gate) if s.get("if") == "github.event_name != 'push'" and "run" in s
        ]
        script = str(pr_step["run"])
        assert "not a release" in script.lower()
        assert "$GITHUB_STEP_SUMMARY" in script
        assert re.search(r"sandbox-attest verify .*\n.*--allow-untrusted-local", script)
        assert re.search(r"sandbox-attest merge .*(\n.*)*--allow-untrusted-local", script)
        assert RELEASE_KEY_REF not in yaml.safe_dump(pr_step)
        leg_runs = [
            s
            for s in steps(wf["jobs"]["leg"])
            if "sandbox-attest run" in str(s.get("run"))
            and s.get("if") != "github.event_name == 'push'"
        ]
        assert leg_runs
        for step in leg_runs:
            assert RELEASE_KEY_REF not in yaml.safe_dump(step)
            assert "XDG_CONFIG_HOME" in step["env"]  # the run's registered per-machine key

    def test_release_gate_pins_the_commit(self, wf: dict[str, Any]) -> None:
        """The release gate verifies that the legs ran the commit being released."""
        script = run_text(wf["jobs"]["gate"])
        assert '--expect-commit "$COMMIT"' in script


class TestLint:
    """The lint workflow."""

    def test_runs_format_check_ruff_and_mypy(self) -> None:
        """lint.yml runs ruff format --check, ruff check and mypy."""
        script = run_text(load("lint.yml")["jobs"]["lint"])
        for command in ("ruff format --check", "ruff check", "mypy"):
            assert command in script
