"""`run --probe`: the derived matrix and policy hold just the named cells and the control leg.

The shipped matrix and policy are derived from for real and loaded back by the loaders a run
uses, so a derived pair that a run would refuse fails here first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_attest.errors import ConfigError
from sandbox_attest.paths import default_matrix, default_policy
from sandbox_attest.report.policy import load_policy
from sandbox_attest.run.focus import FOCUS_POLICY_NAME, dumps, focused, focused_inputs
from sandbox_attest.run.matrix import load_matrix

SPEC = Path(__file__).parents[2] / "matrix" / "backends" / "bwrap-generic.toml"


def derive(tmp_path: Path, probes: list[str], backends: list[str]) -> tuple[Path, Path]:
    """The derived pair for `probes` on `backends` on linux, from the shipped inputs."""
    return focused_inputs(default_matrix(), default_policy(), probes, backends, "linux", tmp_path)


class TestFocusedInputs:
    def test_only_the_named_probe_and_legs(self, tmp_path: Path) -> None:
        """The matrix keeps the named probe and the chosen and control rows alone."""
        matrix_path, policy_path = derive(tmp_path, ["net_denied_host"], ["bubblewrap"])
        matrix = load_matrix(matrix_path)
        assert [p.id for p in matrix.probes] == ["net_denied_host"]
        assert {b.name for b in matrix.backends} == {"none", "bubblewrap"}
        policy = load_policy(policy_path)
        assert policy.name == FOCUS_POLICY_NAME
        legs = {(r.backend, r.probes) for r in policy.requirements}
        assert legs == {("none", ("net_denied_host",)), ("bubblewrap", ("net_denied_host",))}

    def test_a_written_exclusion_still_holds(self, tmp_path: Path) -> None:
        """The release's exclusion of lifecycle_orphans on the control leg is kept, not required."""
        _, policy_path = derive(tmp_path, ["lifecycle_orphans"], ["bwrap-generic"])
        policy = load_policy(policy_path)
        assert [(r.backend, r.probes) for r in policy.requirements] == [
            ("bwrap-generic", ("lifecycle_orphans",))
        ]
        assert [(e.backend, e.probe) for e in policy.excludes] == [("none", "lifecycle_orphans")]

    def test_a_probe_of_another_platform_is_refused(self, tmp_path: Path) -> None:
        """A probe the matrix limits to other platforms is refused with the matrix's reason."""
        with pytest.raises(ConfigError, match="does not run on windows"):
            focused_inputs(
                default_matrix(),
                default_policy(),
                ["proc_visibility"],
                ["appcontainer"],
                "windows",
                tmp_path,
            )

    def test_a_matrix_exclusion_is_not_required(self, tmp_path: Path) -> None:
        """A cell the matrix excludes stays in the matrix with its reason and is not required."""
        matrix = tmp_path / "matrix.toml"
        matrix.write_text(
            default_matrix().read_text(encoding="utf-8")
            + '\n[[exclude]]\nbackend = "bubblewrap"\nprobe = "dev_access"\n'
            'reason = "a written reason for the test"\n'
            '\n[[exclude]]\nbackend = "docker"\nprobe = "dev_access"\n'
            'reason = "a row the focused matrix drops"\n',
            encoding="utf-8",
        )
        out = tmp_path / "out"
        out.mkdir()
        matrix_path, policy_path = focused_inputs(
            matrix,
            default_policy(),
            ["dev_access", "net_denied_host"],
            ["bubblewrap"],
            "linux",
            out,
        )
        assert load_matrix(matrix_path).exclusions == {
            ("bubblewrap", "dev_access"): "a written reason for the test"
        }
        legs = {r.backend: r.probes for r in load_policy(policy_path).requirements}
        assert legs["bubblewrap"] == ("net_denied_host",)
        assert legs["none"] == ("dev_access", "net_denied_host")

    def test_unknown_probe_names_the_known_ones(self, tmp_path: Path) -> None:
        """A probe the matrix lacks is refused with the matrix's probes and the explain hint."""
        with pytest.raises(ConfigError, match="not a probe of") as info:
            derive(tmp_path, ["net_denied_hots"], ["bubblewrap"])
        assert "net_denied_host" in str(info.value)
        assert "sandbox-attest explain" in str(info.value)

    def test_no_backend_names_the_flags(self, tmp_path: Path) -> None:
        """Without a backend the error names --backend and --backend-spec."""
        with pytest.raises(ConfigError, match="--backend NAME or --backend-spec FILE"):
            derive(tmp_path, ["net_denied_host"], [])

    def test_spec_names_are_chosen(self) -> None:
        """A --backend-spec file's backend is required; the files go when the run ends."""
        with focused(["net_denied_host"], default_matrix(), default_policy(), [], [str(SPEC)]) as (
            matrix_path,
            policy_path,
        ):
            backends = {r.backend for r in load_policy(policy_path).requirements}
            assert backends == {"none", "bwrap-generic"}
        assert not matrix_path.exists()

    def test_without_probe_the_inputs_pass_through(self) -> None:
        """With no --probe the run's own matrix and policy are used unchanged."""
        with focused([], default_matrix(), default_policy(), [], []) as inputs:
            assert inputs == (default_matrix(), default_policy())


class TestDumps:
    def test_round_trips_through_tomllib(self) -> None:
        """Tables, arrays of tables, inline tables and awkward strings read back unchanged."""
        import tomllib  # noqa: PLC0415

        data = {
            "matrix": {"control": "none"},
            "probe": [{"id": "a", "timeout": 60, "platforms": ["linux"], "reason": 'a "b"\n\\'}],
            "require": [{"claims": {"network": "none|proxy"}, "ok": True, "n": 1.5}],
        }
        assert tomllib.loads(dumps(data)) == data
