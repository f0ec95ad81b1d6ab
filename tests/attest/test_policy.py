"""Policy loading (unknown keys, empty policies) and the gate derived from cells."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox_attest.errors import ConfigError
from sandbox_attest.report.evidence import CellEntry, cell_entry
from sandbox_attest.report.policy import evaluate, load_policy, missing_legs
from tests.attest.builder import make_cells, write_policy

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.report.policy import Policy


class TestLoadPolicy:
    def test_repo_policy_loads(self) -> None:
        """The repository's matrix/policy.toml is a valid policy with its two linux legs."""
        from pathlib import Path  # noqa: PLC0415  (runtime import; the module imports it for typing only)

        policy = load_policy(Path(__file__).resolve().parents[2] / "matrix" / "policy.toml")
        assert ("linux", "bubblewrap") in policy.legs()
        assert len(policy.sha256) == 64

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (
                '[policy]\nnmae = "x"\n',
                r"\[policy\]: unknown key 'nmae'; allowed keys are name, version",
            ),
            (
                '[[require]]\nplatform="linux"\nbackend="none"\nprobe=["a"]\n',
                r"\[\[require\]\] #1: unknown key 'probe'",
            ),
            ("[polcy]\n", r"unknown key 'polcy'"),
        ],
        ids=["policy-table", "require-table", "top-level"],
    )
    def test_unknown_key_names_file_key_and_fix(
        self, tmp_path: Path, text: str, message: str
    ) -> None:
        """An unknown key is refused with the file, the key and the allowed keys."""
        path = tmp_path / "p.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            load_policy(path)
        assert str(path) in str(info.value)

    def test_empty_policy_is_refused(self, tmp_path: Path) -> None:
        """A policy that requires nothing is refused: it would let any run pass."""
        path = tmp_path / "empty.toml"
        path.write_text('[policy]\nname = "empty"\n')
        with pytest.raises(ConfigError, match="requires nothing"):
            load_policy(path)

    def test_empty_probe_list_is_refused(self, tmp_path: Path) -> None:
        """A [[require]] with no probes is refused."""
        path = tmp_path / "p.toml"
        path.write_text('[[require]]\nplatform="linux"\nbackend="none"\nprobes=[]\n')
        with pytest.raises(ConfigError, match="probes is empty"):
            load_policy(path)

    def test_exclusion_contradicting_a_requirement_is_refused(self, tmp_path: Path) -> None:
        """An [[exclude]] naming a probe that a matching [[require]] lists is refused."""
        path = write_policy(tmp_path / "p.toml", probes=("net_denied_host",))
        with path.open("a") as handle:
            handle.write(
                '\n[[exclude]]\nplatform = "linux"\nbackend = "*"\n'
                'probe = "net_denied_host"\nreason = "flaky"\n'
            )
        with pytest.raises(ConfigError, match=r"\[\[exclude\]\] #1: excludes net_denied_host"):
            load_policy(path)

    def test_wildcard_exclusion_leaves_requirements(self, tmp_path: Path) -> None:
        """A wildcard probe excludes only what is not required (the repository policy's pattern)."""
        path = write_policy(tmp_path / "p.toml", probes=("net_denied_host",))
        with path.open("a") as handle:
            handle.write('\n[[exclude]]\nplatform = "linux"\nprobe = "*"\nreason = "later"\n')
        assert load_policy(path).excludes[0].probe == "*"

    def test_bad_toml(self, tmp_path: Path) -> None:
        """Invalid TOML is a ConfigError naming the file."""
        path = tmp_path / "p.toml"
        path.write_text("[[require]\n")
        with pytest.raises(ConfigError, match="not valid TOML"):
            load_policy(path)


class TestEvaluate:
    def test_all_pass_is_passed(self, policy: Policy) -> None:
        """Every required cell PASS gives PASSED with every cell in passedTests."""
        gate = evaluate(make_cells(), policy, default_platform="linux")
        assert gate.result == "PASSED"
        assert len(gate.passed) == 14
        assert gate.failed == gate.warned == gate.problems == ()

    def test_zero_cells_never_pass(self, policy: Policy) -> None:
        """A run with zero cells is FAILED."""
        gate = evaluate([], policy, default_platform="linux")
        assert gate.result == "FAILED"
        assert "zero cells" in gate.problems[0]

    def test_optional_inconclusive_warns(self, tmp_path: Path) -> None:
        """An INCONCLUSIVE cell nothing requires gives WARNED, not FAILED."""
        policy = load_policy(write_policy(tmp_path / "p.toml", probes=("net_denied_host",)))
        cells = make_cells(verdicts={"bubblewrap-dns_resolution": "INCONCLUSIVE"})
        gate = evaluate(cells, policy, default_platform="linux")
        assert gate.result == "WARNED"
        assert gate.warned == ("bubblewrap-dns_resolution",)

    def test_required_not_pass_fails(self, policy: Policy) -> None:
        """A required cell that is UNAVAILABLE fails the gate: only PASS satisfies the policy."""
        cells = make_cells(verdicts={"bubblewrap-dns_resolution": "UNAVAILABLE"})
        gate = evaluate(cells, policy, default_platform="linux")
        assert gate.result == "FAILED"
        assert "only PASS satisfies the policy" in gate.problems[0]

    def test_missing_legs(self, policy: Policy) -> None:
        """A policy leg with no cells is reported by missing_legs (evaluate judges present legs)."""
        assert missing_legs(policy, {("linux", "none")}) == ["linux/bubblewrap"]

    def test_control_leg_alone_fails(self, policy: Policy) -> None:
        """Only the control backend `none` ran: nothing confined was attested, so FAILED.

        (This used to be PASSED, leaving the missing sandbox leg to `missing_legs` alone.)
        """
        gate = evaluate(make_cells(backends=("none",)), policy, default_platform="linux")
        assert gate.result == "FAILED"
        assert "the control leg `none` alone attests nothing" in gate.problems[-1]

    def test_unavailable_unrequired_cell_alone_fails(self, policy: Policy) -> None:
        """One UNAVAILABLE cell of a backend nothing requires is FAILED, not an empty PASSED."""
        cells = make_cells(backends=("docker",), probes=("net_denied_host",))
        cells[0]["verdict"] = "UNAVAILABLE"
        gate = evaluate(cells, policy, default_platform="linux")
        assert (gate.result, gate.passed) == ("FAILED", ())
        assert "alone attests nothing" in gate.problems[0]


class TestRequiredByTheRun:
    def test_escape_in_a_backend_nobody_requires_warns(self, tmp_path: Path) -> None:
        """A FAIL outside the policy is WARNED: visible, never PASSED, not a release blocker."""
        policy = load_policy(write_policy(tmp_path / "p.toml", probes=("net_denied_host",)))
        cells = make_cells(verdicts={"bubblewrap-dns_resolution": "FAIL"})
        gate = evaluate(cells, policy, default_platform="linux")
        assert gate.result == "WARNED"
        assert gate.warned == ("bubblewrap-dns_resolution",)

    def test_escape_in_a_backend_the_run_named_fails(self, tmp_path: Path) -> None:
        """A cell the run marked required (its backend was named) must PASS like a policy one."""
        policy = load_policy(write_policy(tmp_path / "p.toml", probes=("net_denied_host",)))
        cells = make_cells(verdicts={"bubblewrap-dns_resolution": "FAIL"})
        for cell in cells:
            cell["required"] = cell["cell_id"] == "bubblewrap-dns_resolution"
        gate = evaluate(cells, policy, default_platform="linux")
        assert gate.result == "FAILED"
        assert "bubblewrap-dns_resolution is FAIL" in gate.problems[0]


class TestWorldRequirement:
    POLICY = """
[policy]
name = "world"
[[require]]
platform = "linux"
backend = "bubblewrap"
probes = ["net_direct_egress"]
world = "lab"
"""

    def cells(self) -> list[CellEntry]:
        """One passing bubblewrap cell on Linux."""
        return [
            cell_entry(
                cell_id="bubblewrap-net_direct_egress",
                backend="bubblewrap",
                probe="net_direct_egress",
                platform="linux",
                verdict="PASS",
                reason="",
            )
        ]

    def test_a_leg_that_requires_the_lab_fails_in_the_loopback_world(self, tmp_path: Path) -> None:
        """World = "lab": the same PASS cells are FAILED when the run's world was loopback."""
        path = tmp_path / "policy.toml"
        path.write_text(self.POLICY)
        policy = load_policy(path)
        assert policy.requirements[0].world == "lab"
        ok = evaluate(self.cells(), policy, default_platform="linux", world="lab")
        assert ok.result == "PASSED", ok.problems
        bad = evaluate(self.cells(), policy, default_platform="linux", world="loopback")
        assert bad.result == "FAILED"
        assert any("requires world = 'lab'" in p and "as root" in p for p in bad.problems)
        unknown = evaluate(self.cells(), policy, default_platform="linux", world="not recorded")
        assert unknown.result == "FAILED"

    def test_an_unknown_world_is_refused(self, tmp_path: Path) -> None:
        """A typo in world names the choices."""
        path = tmp_path / "policy.toml"
        path.write_text(self.POLICY.replace('world = "lab"', 'world = "labb"'))
        with pytest.raises(ConfigError, match="use one of lab, loopback"):
            load_policy(path)
