"""The release policy's `claims` requirements, and `verify` showing each leg's claims.

A probe is NOT_APPLICABLE to a claim its backend does not make, so a policy that only listed
probes could be satisfied by a backend that claims nothing. `[[require]] claims = {...}` closes
that: `verify` holds each leg present to the claims its backend's signed identity records.
Real signed reports (tests/attest/builder.py), the real verifier and the real CLI.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.attest.keys import SigningKey, TrustedKey, public_key_pem
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.backends.bubblewrap import CLAIMS as BUBBLEWRAP
from sandbox_attest.backends.docker.backend import DockerBackend
from sandbox_attest.backends.none import CLAIMS as NONE
from sandbox_attest.cli.release import claims_line, register
from sandbox_attest.errors import ConfigError
from sandbox_attest.report.policy import claim_problems, leg_claims, load_policy, parse_policy
from tests.attest.builder import CORE_PROBES, build_report, sign

REPO = Path(__file__).parent.parent.parent
LISTED = ", ".join(f'"{p}"' for p in CORE_PROBES)


def policy_with(tmp_path: Path, claims: str) -> Path:
    """A policy requiring the core probes on linux/none and on linux/bubblewrap with `claims`."""
    path = tmp_path / "claims-policy.toml"
    path.write_text(
        '[policy]\nname = "claims"\nversion = 1\n\n'
        f'[[require]]\nplatform = "linux"\nbackend = "none"\nprobes = [{LISTED}]\n\n'
        f'[[require]]\nplatform = "linux"\nbackend = "bubblewrap"\n{claims}\n'
        f"probes = [{LISTED}]\n"
    )
    return path


def identities(**claims: dict[str, Any]) -> dict[str, Any]:
    """Evidence whose backends carry exactly these `claims` in their identities."""
    return {
        "backends": [
            {"name": name, "identity": {"name": name, "claims": value}}
            for name, value in claims.items()
        ]
    }


class TestParsing:
    def test_claims_parse_into_words_and_alternatives(self, tmp_path: Path) -> None:
        """`claims` values are one word or alternatives joined by '|', kept in order."""
        path = policy_with(tmp_path, 'claims = { network = "none|proxy", reads = "workspace" }')
        (_, bwrap) = load_policy(path).requirements
        assert bwrap.claims == (("network", ("none", "proxy")), ("reads", ("workspace",)))

    @pytest.mark.parametrize(
        ("claims", "needle"),
        [
            ('claims = { filesystem = "workspace" }', "claims.filesystem is not a claim"),
            ('claims = { reads = "mostly" }', "names ['mostly']; write one or more of open"),
            ('claims = { network = "" }', "names nothing"),
            ("claims = { syscalls = 1 }", "names nothing"),
            ('claims = "workspace"', "claims must be a table"),
        ],
        ids=["unknown-claim", "unknown-word", "empty", "not-a-string", "not-a-table"],
    )
    def test_bad_claims_name_the_key_and_the_fix(
        self, tmp_path: Path, claims: str, needle: str
    ) -> None:
        """A bad `claims` value is a ConfigError naming the file, the table and the fix."""
        path = policy_with(tmp_path, claims)
        with pytest.raises(ConfigError, match="claims") as info:
            load_policy(path)
        assert needle in str(info.value)
        assert "[[require]] #2" in str(info.value)

    def test_runs_as_takes_a_user_or_a_uid(self, tmp_path: Path) -> None:
        """`runs_as` accepts its two words, a user name and a uid."""
        path = policy_with(
            tmp_path, 'claims = { runs_as = "non-root|payload-user|sa-payload|1000" }'
        )
        (_, bwrap) = load_policy(path).requirements
        assert bwrap.claims == (("runs_as", ("non-root", "payload-user", "sa-payload", "1000")),)


class TestProblems:
    def test_a_claim_not_made_is_a_problem_naming_both_sides(self, tmp_path: Path) -> None:
        """A leg whose backend claims open reads fails a reads = "workspace" requirement."""
        policy = load_policy(policy_with(tmp_path, 'claims = { reads = "workspace" }'))
        made = leg_claims(identities(bubblewrap={"network": "proxy", "reads": "open"}))
        (problem,) = claim_problems(policy, made, {("linux", "none"), ("linux", "bubblewrap")})
        assert problem.startswith(
            "leg linux/bubblewrap requires claims reads = 'workspace', but bubblewrap claims "
            "reads = 'open': a backend cannot pass by claiming less"
        )

    def test_deny_list_and_alternatives_match_by_word(self, tmp_path: Path) -> None:
        """A reads deny-list is the word "deny"; any listed alternative satisfies."""
        policy = load_policy(
            policy_with(tmp_path, 'claims = { reads = "workspace|deny", network = "none|proxy" }')
        )
        made = leg_claims(identities(bubblewrap={"network": "none", "reads": {"deny": ["~/.ssh"]}}))
        assert claim_problems(policy, made, {("linux", "bubblewrap")}) == []

    def test_absent_leg_is_not_judged_and_a_leg_without_identity_is(self, tmp_path: Path) -> None:
        """Only present legs are held to claims; one with no identity made none."""
        policy = load_policy(policy_with(tmp_path, 'claims = { reads = "workspace" }'))
        assert claim_problems(policy, {}, {("linux", "none")}) == []
        (problem,) = claim_problems(policy, {}, {("linux", "bubblewrap")})
        assert "records no identity for bubblewrap, so it made none" in problem

    def test_old_evidence_claims_what_its_three_keys_meant(self) -> None:
        """An identity with only `policy` (older evidence) claims what those keys meant."""
        evidence = {
            "backends": [
                {
                    "name": "bubblewrap",
                    "identity": {
                        "policy": {"network": "proxy", "filesystem": "workspace", "ipc": "isolated"}
                    },
                },
                {"name": "docker", "available": False, "identity": None},
            ]
        }
        assert leg_claims(evidence) == {
            "bubblewrap": {
                "network": "proxy",
                "network_cut": "namespace",
                "reads": "workspace",
                "writes": "workspace",
                "ipc": "isolated",
                "environment": "scrubbed",
                "syscalls": "filtered",
            }
        }

    @pytest.mark.parametrize("backend", ["bubblewrap", "docker"])
    def test_shipped_policy_claims_hold_for_the_release_backends(self, backend: str) -> None:
        """matrix/policy.toml's claims for bubblewrap and docker are what those backends claim."""
        policy = load_policy(REPO / "matrix" / "policy.toml")
        declared = BUBBLEWRAP if backend == "bubblewrap" else DockerBackend().claims()
        made = {backend: declared.claims(), "none": NONE.claims()}
        legs = {("linux", backend), ("linux", "none")}
        assert claim_problems(policy, made, legs) == []
        # And the requirement is real: a backend claiming less is refused.
        weaker = {backend: {**declared.claims(), "reads": "open"}}
        assert claim_problems(policy, weaker, legs)


class TestVerify:
    def test_verify_holds_the_signed_claims_and_keeps_them(
        self, tmp_path: Path, signing_key: SigningKey, trusted: TrustedKey
    ) -> None:
        """A report whose signed claims meet the policy verifies, and carries them per backend."""
        path = policy_with(
            tmp_path,
            'claims = { network = "proxy|none", reads = "workspace", syscalls = "filtered" }',
        )
        report = build_report(tmp_path / "run", path)
        sign(report, signing_key)
        v = verify_report(report, trusted, load_policy(path))
        assert v.reasons == []
        assert v.claims["bubblewrap"]["reads"] == "workspace"
        assert v.claims["none"]["reads"] == "open"

    def test_verify_refuses_a_leg_that_claims_less(
        self, tmp_path: Path, signing_key: SigningKey, trusted: TrustedKey
    ) -> None:
        """A leg whose signed identity does not make a required claim does not verify."""
        path = policy_with(tmp_path, 'claims = { environment = "passthrough" }')
        report = build_report(tmp_path / "run", path)
        sign(report, signing_key)
        reasons = verify_report(report, trusted, load_policy(path)).reasons
        assert reasons == [
            (
                "leg linux/bubblewrap requires claims environment = 'passthrough', but "
                "bubblewrap claims environment = 'scrubbed': a backend cannot pass by claiming "
                "less; declare the claim in its [claims] (and hold it) or change the requirement"
            )
        ]

    def test_cli_prints_each_legs_claims(
        self,
        tmp_path: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """`verify` prints every backend's claims, and `--json` carries them."""
        path = policy_with(tmp_path, 'claims = { reads = "workspace" }')
        report = build_report(tmp_path / "run", path)
        sign(report, signing_key)
        pub = tmp_path / "k.pub"
        pub.write_bytes(public_key_pem(signing_key.public_key))
        parser = argparse.ArgumentParser(prog="sandbox-attest")
        register(parser.add_subparsers())
        argv = ["verify", str(report), "--trusted-key", str(pub), "--policy", str(path)]
        args = parser.parse_args(argv)
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert (
            "claims of bubblewrap: network=proxy, reads=workspace, writes=workspace, "
            "ipc=isolated, environment=scrubbed, syscalls=filtered, network_cut=namespace"
        ) in out
        assert "claims of none: network=open, reads=open, writes=open, ipc=open" in out
        args = parser.parse_args([*argv, "--json"])
        assert args.func(args) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["claims"]["bubblewrap"]["syscalls"] == "filtered"

    def test_claims_line_shows_lists(self) -> None:
        """Deny-lists, allow-lists and protected paths are shown with their paths."""
        line = claims_line(
            {"reads": {"deny": ["~/.ssh", "~/.aws"]}, "protected": [".bashrc"], "runs_as": "1000"}
        )
        assert line == "reads=deny[~/.ssh, ~/.aws], protected=[.bashrc], runs_as=1000"


def test_parse_policy_keeps_the_exact_bytes_digest(tmp_path: Path) -> None:
    """A policy with claims is still digested over its exact bytes (the signer relies on it)."""
    path = policy_with(tmp_path, 'claims = { reads = "workspace" }')
    assert parse_policy(path.read_bytes(), path) == load_policy(path)
