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

from sandbox_attest.attest.legs import load_expected_legs
from sandbox_attest.report.policy import load_policy

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
# A leg's run command, whether started directly or through sudo.
RUN_COMMAND = re.compile(
    r'sandbox-attest\)?"? run --backend "\$BACKEND" --require-backend --out "\$LEG_DIR"'
)
# The jobs that run legs: `leg` (Linux, the harness as root: separated) and
# `leg-unseparated` (where uid separation is impossible: never a release).
LEG_JOBS = ("leg", "leg-unseparated")
# The guard of each `leg` step that runs the matrix: the release key on pushes only.
ROOT_RUN_GUARDS = ("github.event_name == 'push'", "github.event_name != 'push'")
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
        """The two leg jobs' matrices together are exactly the legs the merge expects."""
        include = [
            leg for job in LEG_JOBS for leg in wf["jobs"][job]["strategy"]["matrix"]["include"]
        ]
        assert {(leg["platform"], leg["backend"]) for leg in include} == expected_legs()
        assert len(include) == len(expected_legs())
        for job in LEG_JOBS:
            assert wf["jobs"][job]["strategy"]["fail-fast"] is False

    def test_release_legs_are_the_separated_ones(self, wf: dict[str, Any]) -> None:
        """The legs that decide a release run in `leg` (separated); the rest are informational.

        The release policy requires only the deciding legs' platforms, so a release can pass
        although macOS and Windows can never sign with the release key (issue 30).
        """
        expected = load_expected_legs(ROOT / "matrix" / "legs.toml")
        rows = {
            job: {
                (r["platform"], r["backend"])
                for r in wf["jobs"][job]["strategy"]["matrix"]["include"]
            }
            for job in LEG_JOBS
        }
        assert rows["leg"] == set(expected.legs)
        assert rows["leg-unseparated"] == set(expected.informational)
        policy = load_policy(ROOT / "matrix" / "policy.toml")
        required = {platform for platform, _ in policy.legs()}
        assert required == {platform for platform, _ in expected.legs}
        assert not required & {platform for platform, _ in expected.informational}

    def test_every_leg_requires_its_backend_and_writes_its_dir(self, wf: dict[str, Any]) -> None:
        """Every run step is `sandbox-attest run --backend X --require-backend --out reports/..`."""
        for job, count in zip(LEG_JOBS, (len(ROOT_RUN_GUARDS), 1), strict=True):
            leg = wf["jobs"][job]
            runs = [s for s in steps(leg) if "sandbox-attest" in str(s.get("run"))]
            assert len(runs) == count, job
            for step in runs:
                assert RUN_COMMAND.search(str(step["run"])), step["name"]
            want = "reports/leg-${{ matrix.platform }}-${{ matrix.backend }}"
            assert leg["env"]["LEG_DIR"] == want

    def test_linux_legs_run_the_harness_as_root(self, wf: dict[str, Any]) -> None:
        """On Linux the harness runs under sudo, so wrappers run as the separate payload user.

        Values reach root by name (`--preserve-env=NAME,...`), never in an argv; the report
        root wrote is handed back to the runner user before the upload, whatever happened.
        """
        leg = wf["jobs"]["leg"]
        assert {row["platform"] for row in leg["strategy"]["matrix"]["include"]} == {"linux"}
        guards = {str(s.get("if")): s for s in steps(leg) if "sandbox-attest" in str(s.get("run"))}
        assert set(guards) == set(ROOT_RUN_GUARDS)
        for step in guards.values():
            script = str(step["run"])
            assert re.search(r"sudo --preserve-env=[\w,]+,\$\{\{ env\.ROOT_ENV \}\}", script)
            assert '"$(command -v sandbox-attest)" run' in script
        for name in (
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
            "GITHUB_STEP_SUMMARY",
            # The run's URL for each statement's `url` (issue 30).
            "GITHUB_SERVER_URL",
            "GITHUB_REPOSITORY",
            "GITHUB_RUN_ID",
        ):
            assert name in leg["env"]["ROOT_ENV"].split(",")
        (handback,) = [s for s in steps(leg) if 'chown -R "$(id -u)' in str(s.get("run"))]
        assert handback["if"] == "always()"
        upload = next(
            i for i, s in enumerate(steps(leg)) if "upload-artifact" in str(s.get("uses"))
        )
        assert steps(leg).index(handback) < upload

    def test_only_linux_legs_ever_hold_the_release_key(self, wf: dict[str, Any]) -> None:
        """The release key reaches a leg only on a push and only on Linux (where it separates)."""
        holders = [s for s in steps(wf["jobs"]["leg"]) if RELEASE_KEY_REF in yaml.safe_dump(s)]
        assert [s["if"] for s in holders] == ["github.event_name == 'push'"]
        assert RELEASE_KEY_REF not in yaml.safe_dump(wf["jobs"]["leg-unseparated"])

    def test_a_leg_that_cannot_separate_says_it_is_not_a_release(self, wf: dict[str, Any]) -> None:
        """macOS/Windows legs sign with the per-run key, pushes too, and their summary says so.

        Their job holds no OIDC grant either: code sharing the harness's uid could request a
        token and sign as this workflow.
        """
        leg = wf["jobs"]["leg-unseparated"]
        assert {row["platform"] for row in leg["strategy"]["matrix"]["include"]} == {
            "darwin",
            "windows",
        }
        assert leg["permissions"] == {"contents": "read"}
        assert "not a release" in leg["name"]
        (step,) = [s for s in steps(leg) if "sandbox-attest run" in str(s.get("run"))]
        script = str(step["run"])
        assert "not a release" in script
        assert "$GITHUB_STEP_SUMMARY" in script
        assert script.index("$GITHUB_STEP_SUMMARY") < script.index("sandbox-attest run")
        assert "sudo" not in script
        assert "if" not in step
        assert "XDG_CONFIG_HOME" in step["env"]
        fetch = [s for s in steps(leg) if s.get("with", {}).get("name") == "ephemeral-signing-key"]
        assert len(fetch) == 1
        assert "if" not in fetch[0]
        # The key job makes the per-run key on every event, pushes included.
        for key_step in steps(wf["jobs"]["keys"]):
            assert "if" not in key_step, key_step.get("name")

    def test_only_the_non_release_gate_accepts_shared_trust_domains(
        self, wf: dict[str, Any]
    ) -> None:
        """The release merge and verify never pass --allow-shared-trust-domain; the PR path does."""
        gate = wf["jobs"]["gate"]
        for step in steps(gate):
            script = str(step.get("run", ""))
            if "sandbox-attest" not in script:
                continue
            commands = re.findall(r"sandbox-attest (?:merge|verify)(?:[^\n]*\\\n)*[^\n]*", script)
            assert len(commands) == 2, step.get("name")
            for command in commands:
                allowed = "--allow-shared-trust-domain" in command
                assert allowed == (step["if"] == "github.event_name != 'push'"), command
        (why,) = [
            s for s in steps(gate) if s.get("if") == "failure() && github.event_name == 'push'"
        ]
        assert "Not a release" in str(why["run"])

    @pytest.mark.parametrize("job", LEG_JOBS)
    def test_every_leg_uploads_its_report_even_on_failure(
        self, wf: dict[str, Any], job: str
    ) -> None:
        """Each leg uploads its report dir under a per-leg name, also when the run failed."""
        uploads = [s for s in steps(wf["jobs"][job]) if "upload-artifact" in str(s.get("uses"))]
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

    def test_gate_verifies_the_release_with_independent_tools(self, wf: dict[str, Any]) -> None:
        """After the merge, in-toto and Sigstore's verifier check the release at pinned versions.

        The versions are the ones the project pins elsewhere (pyproject.toml's dev group and
        scripts/real-sandboxes.sh), so CI and `./run test` exercise the same verifiers.
        """
        gate = wf["jobs"]["gate"]
        names = [str(s.get("name", "")) for s in steps(gate)]
        (index,) = [i for i, n in enumerate(names) if "independent tools" in n]
        merges = [
            i for i, s in enumerate(steps(gate)) if "sandbox-attest merge" in str(s.get("run"))
        ]
        assert merges
        assert max(merges) < index
        step = steps(gate)[index]
        assert "if" not in step  # only after a merge that held, on every event
        script = str(step["run"])
        assert (
            'scripts/verify-independently.sh reports/release "$RUNNER_TEMP/trusted.pub"' in script
        )
        real = (ROOT / "scripts" / "real-sandboxes.sh").read_text(encoding="utf-8")
        for package in re.findall(r"@sigstore/\w+@[0-9.]+", script):
            assert package in real, package
        pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
        for package in re.findall(r"(?:in-toto|securesystemslib)==[0-9.]+", script):
            assert f'"{package}"' in pyproject, package
        assert re.findall(r"@sigstore/\w+@[0-9.]+", script)

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
            for job in LEG_JOBS
            for s in steps(wf["jobs"][job])
            if RUN_COMMAND.search(str(s.get("run")))
            and "github.event_name == 'push'" not in str(s.get("if"))
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
