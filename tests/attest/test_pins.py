"""What a signature pins (issue 12): subjects, times, commit, executables, and trust from keys."""

from __future__ import annotations

import argparse
import base64
import json
import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.attest import dsse
from sandbox_attest.attest.keys import (
    SigningKey,
    TrustedKey,
    check_key_file_private,
    load_signing_key,
    private_key_pem,
    public_key_pem,
    read_untrusted_keyids,
    register_untrusted,
    untrusted_registry_path,
)
from sandbox_attest.attest.legs import load_expected_legs
from sandbox_attest.attest.merge import merge_legs
from sandbox_attest.attest.statement import configuration, statement_bytes
from sandbox_attest.attest.subjects import read_tree, tree_digest_of, tree_sha256
from sandbox_attest.attest.verification import Checks, parse_commit, parse_max_age
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.cli.release import register
from sandbox_attest.errors import ConfigError
from tests.attest.builder import COMMIT, build_report, make_cells, sign

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.report.policy import Policy

ATT = "attestation.intoto.jsonl"


def statements(report: Path) -> list[dict[str, Any]]:
    """The decoded statements of a report's attestation."""
    lines = (report / ATT).read_text().splitlines()
    return [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in lines]


def resign(report: Path, key: SigningKey, edit: Any) -> None:
    """Re-sign every statement of a report with `key` after `edit(stmt)` changed it."""
    lines = []
    for stmt in statements(report):
        edit(stmt)
        lines.append(dsse.sign(statement_bytes(stmt), key.private_key, key.keyid).to_json())
    (report / ATT).write_text("".join(line + "\n" for line in lines))


def reasons(report: Path, trusted: TrustedKey, policy: Policy, **kw: Any) -> list[str]:
    """The verification reasons (empty when it verifies)."""
    return verify_report(report, trusted, policy, **kw).reasons


def has(found: list[str], needle: str) -> bool:
    """One reason contains `needle`."""
    return any(needle in r for r in found)


class TestTrustFromKeys:
    def test_forged_trust_field_is_still_refused(
        self, tmp_path: Path, policy_file: Path, policy: Policy
    ) -> None:
        """A local-key report re-signed with signer.trust = "provided" is still untrusted."""
        env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
        key = load_signing_key(None, env)
        report = sign_built(tmp_path, policy_file, key)

        def forge(stmt: dict[str, Any]) -> None:
            if "signer" in stmt["predicate"]:
                stmt["predicate"]["signer"]["trust"] = "provided"

        resign(report, key, forge)
        assert statements(report)[-1]["predicate"]["signer"]["trust"] == "provided"
        trusted = TrustedKey(key.public_key, key.keyid, "local.pub")
        checks = Checks(untrusted_keyids=read_untrusted_keyids(untrusted_registry_path(env)))
        found = reasons(report, trusted, policy, checks=checks)
        assert has(found, "signed by an untrusted local key"), found
        assert reasons(report, trusted, policy, checks=checks, allow_untrusted_local=True) == []

    def test_provided_key_listed_in_registry_needs_the_flag(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signing_key: SigningKey
    ) -> None:
        """A key signed as "provided" whose keyid the registry lists needs the flag."""
        report = sign_built(tmp_path, policy_file, signing_key)
        trusted = TrustedKey(signing_key.public_key, signing_key.keyid, "k.pub")
        checks = Checks(untrusted_keyids=frozenset({signing_key.keyid}))
        assert has(reasons(report, trusted, policy, checks=checks), "untrusted-keys registry")
        assert reasons(report, trusted, policy, checks=Checks(untrusted_keyids=frozenset())) == []

    def test_local_key_file_passed_as_key_is_untrusted(self, tmp_path: Path) -> None:
        """Passing the per-machine key's own file as --key does not make it trusted."""
        env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
        local = load_signing_key(None, env)
        path = tmp_path / "cfg" / "sandbox-attest" / "local-signing-key.pem"
        assert load_signing_key(path, env).trust == "untrusted-local"
        assert local.trust == "untrusted-local"


class TestRegistry:
    def test_created_private_and_appended_once(self, tmp_path: Path) -> None:
        """The registry is created 0600 and a keyid is listed once however often it loads."""
        env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
        key = load_signing_key(None, env)
        load_signing_key(None, env)
        register_untrusted(untrusted_registry_path(env), "ab" * 32)
        path = untrusted_registry_path(env)
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.read_text().splitlines() == [key.keyid, "ab" * 32]

    def test_writable_by_others_is_refused(self, tmp_path: Path) -> None:
        """A registry others could edit (and so delete a line from) is refused with the fix."""
        path = tmp_path / "untrusted-keys"
        register_untrusted(path, "cd" * 32)
        path.chmod(0o666)
        with pytest.raises(ConfigError, match="chmod 600"):
            read_untrusted_keyids(path)

    def test_symlink_is_refused(self, tmp_path: Path) -> None:
        """A registry that is a symlink is refused, not followed."""
        (tmp_path / "real").write_text("")
        (tmp_path / "untrusted-keys").symlink_to(tmp_path / "real")
        with pytest.raises(ConfigError, match="not a symlink"):
            read_untrusted_keyids(tmp_path / "untrusted-keys")


class TestKeyFilePrivate:
    @pytest.fixture
    def key_file(self, tmp_path: Path) -> Path:
        """A 0600 key file owned by the current user."""
        path = tmp_path / "k.pem"
        path.write_text("x")
        path.chmod(0o600)
        return path

    def test_private_file_passes(self, key_file: Path) -> None:
        """A 0600 file owned by someone other than the payload uid passes."""
        check_key_file_private(key_file, os.getuid() + 1, set())

    def test_owned_by_payload_uid(self, key_file: Path) -> None:
        """A key owned by the payload uid is refused, naming chown and chmod."""
        with pytest.raises(ConfigError, match="owned by the payload uid"):
            check_key_file_private(key_file, os.getuid(), set())

    def test_group_readable_by_payload_group(self, key_file: Path) -> None:
        """A key readable through a group the payload uid is in is refused."""
        key_file.chmod(0o640)
        gid = key_file.stat().st_gid
        with pytest.raises(ConfigError, match=r"chown root:root .* && chmod 600"):
            check_key_file_private(key_file, os.getuid() + 1, {gid})
        check_key_file_private(key_file, os.getuid() + 1, {gid + 1})

    def test_world_readable(self, key_file: Path) -> None:
        """A world-readable key is refused even when the domains are not separated."""
        key_file.chmod(0o604)
        with pytest.raises(ConfigError, match="accessible to everyone"):
            check_key_file_private(key_file, None, set())


def sign_built(tmp_path: Path, policy_file: Path, key: SigningKey, **kw: Any) -> Path:
    """Build and sign a report under tmp_path/run-N."""
    index = len(list(tmp_path.glob("run-*")))
    report = build_report(tmp_path / f"run-{index}", policy_file, **kw)
    sign(report, key)
    return report


class TestSubjects:
    @pytest.mark.parametrize("name", ["report.html", "summary.md", "junit.xml", "evidence.json"])
    def test_changed_file_is_named(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy, name: str
    ) -> None:
        """Appending to any readable file fails, naming that file."""
        with (signed_report / name).open("a") as handle:
            handle.write(" ")
        assert has(reasons(signed_report, trusted, policy), f"{name} does not match")

    def test_missing_file_is_named(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """A deleted summary.md fails, naming it."""
        (signed_report / "summary.md").unlink()
        assert has(reasons(signed_report, trusted, policy), "summary.md is missing")

    def test_allure_file_added_or_edited(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """A file planted in allure-results/ fails on the tree digest."""
        (signed_report / "allure-results" / "x-result.json").write_text("{}")
        assert has(reasons(signed_report, trusted, policy), "allure-results/ does not match")

    def test_statement_without_a_subject_fails(
        self,
        signed_report: Path,
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
    ) -> None:
        """A validly signed statement that does not name report.html fails, naming it."""

        def drop(stmt: dict[str, Any]) -> None:
            stmt["subject"] = [s for s in stmt["subject"] if s["name"] != "report.html"]

        resign(signed_report, signing_key, drop)
        assert has(
            reasons(signed_report, trusted, policy), "the attestation does not cover report.html"
        )

    def test_in_memory_tree_digest_matches_subjects(self, signed_report: Path) -> None:
        """The digest verify computes from the bytes it read equals subjects.tree_sha256."""
        root = signed_report / "allure-results"
        assert tree_digest_of(read_tree(root)) == tree_sha256(root)


class TestFreshness:
    def test_old_report_fails_with_age_and_flag(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A report finished 40 days ago fails the default 30-day --max-age, naming both."""
        old = (datetime.now(UTC) - timedelta(days=40)).replace(microsecond=0)
        report = sign_built(tmp_path, policy_file, signing_key, finished_at=old)
        # Judged at exactly 40 days after the signed (whole-second) finish: against the
        # running clock the age gains the seconds signing took and reads "40.0d".
        found = reasons(report, trusted, policy, checks=Checks(now=old + timedelta(days=40)))
        assert has(found, "40d old"), found
        assert has(found, "older than --max-age 30d")
        assert reasons(report, trusted, policy, checks=Checks(max_age=timedelta(days=60))) == []

    def test_future_report_fails(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A report finished an hour in the future fails; two minutes ahead is clock skew."""
        ahead = datetime.now(UTC) + timedelta(hours=1)
        report = sign_built(tmp_path, policy_file, signing_key, finished_at=ahead)
        assert has(reasons(report, trusted, policy), "in the future")
        near = datetime.now(UTC) + timedelta(minutes=2)
        report = sign_built(tmp_path, policy_file, signing_key, finished_at=near)
        assert reasons(report, trusted, policy) == []

    def test_none_disables_and_says_so(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """--max-age none accepts an old report and records a note that it did not check."""
        old = datetime.now(UTC) - timedelta(days=400)
        report = sign_built(tmp_path, policy_file, signing_key, finished_at=old)
        v = verify_report(report, trusted, policy, checks=Checks(max_age=None))
        assert v.reasons == []
        assert any("not checked (--max-age none)" in n for n in v.notes)

    @pytest.mark.parametrize(
        ("text", "want"),
        [
            ("30d", timedelta(days=30)),
            ("12h", timedelta(hours=12)),
            ("2w", timedelta(weeks=2)),
            ("0", None),
            ("none", None),
        ],
    )
    def test_parse_max_age(self, text: str, want: timedelta | None) -> None:
        """--max-age takes a number with a unit, or 0 / none."""
        assert parse_max_age(text) == want

    @pytest.mark.parametrize("text", ["30", "d", "-1d", "1y", "0d"])
    def test_parse_max_age_refuses(self, text: str) -> None:
        """A --max-age that is not a positive duration is a usage error naming the forms."""
        with pytest.raises(ConfigError, match=r"e\.g\. 30d, 12h"):
            parse_max_age(text)


class TestExpectCommit:
    def test_prefix_matches(self, signed_report: Path, trusted: TrustedKey, policy: Policy) -> None:
        """A 7-digit prefix of the signed commit holds."""
        checks = Checks(expect_commit=COMMIT[:7])
        assert reasons(signed_report, trusted, policy, checks=checks) == []

    def test_other_commit_fails(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """Another commit fails, naming the signed one."""
        found = reasons(signed_report, trusted, policy, checks=Checks(expect_commit="deadbee"))
        assert has(found, f"made by harness commit {COMMIT}, not --expect-commit deadbee")

    def test_wheel_report_has_no_commit(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """A report with no commit (a wheel install) fails --expect-commit with the reason."""
        report = sign_built(tmp_path, policy_file, signing_key, commit=None)
        found = reasons(report, trusted, policy, checks=Checks(expect_commit=COMMIT))
        assert has(found, "records no harness commit (installed from a wheel")

    def test_dirty_checkout_fails(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """The right commit from a dirty checkout fails: what ran is not that commit."""
        harness = {"version": "0.1.0", "commit": COMMIT, "dirty": True, "probes_sha256": "00"}
        report = sign_built(tmp_path, policy_file, signing_key, extra={"harness": harness})
        found = reasons(report, trusted, policy, checks=Checks(expect_commit=COMMIT))
        assert has(found, "had uncommitted changes")

    @pytest.mark.parametrize("text", ["abc", "xyz12345", "a" * 41])
    def test_parse_commit_refuses(self, text: str) -> None:
        """--expect-commit needs 7 to 40 hex digits."""
        with pytest.raises(ConfigError, match="7 to 40 hex digits"):
            parse_commit(text)


class TestConfiguration:
    def test_backend_digest_covers_executables_and_spec(
        self, tmp_path: Path, policy_file: Path
    ) -> None:
        """Changing a backend's executable digest or spec digest changes its pinned digest."""
        report = build_report(tmp_path / "r", policy_file)
        evidence = json.loads((report / "evidence.json").read_text())

        def backend_digest(ev: dict[str, Any]) -> str:
            entries = {c["name"]: c for c in configuration(ev, None)}
            return str(entries["backend:bubblewrap"]["digest"]["sha256"])

        before = backend_digest(evidence)
        (identity,) = [b["identity"] for b in evidence["backends"] if b["name"] == "bubblewrap"]
        identity["executables"]["bubblewrap"]["sha256"] = "11" * 32
        after_exe = backend_digest(evidence)
        identity["spec_sha256"] = "22" * 32
        assert len({before, after_exe, backend_digest(evidence)}) == 3

    def test_pins_recorded(self, tmp_path: Path, policy_file: Path) -> None:
        """Harness, run times, trust domains and world are configuration entries."""
        world = {"kind": "loopback", "reason": "namespaces refused"}
        report = build_report(tmp_path / "r", policy_file, extra={"world": world})
        evidence = json.loads((report / "evidence.json").read_text())
        entries = {c["name"]: c for c in configuration(evidence, None)}
        assert entries["harness"]["digest"]["gitCommit"] == COMMIT
        assert (
            entries["harness"]["annotations"]["probesSha256"]
            == evidence["harness"]["probes_sha256"]
        )
        assert entries["run"]["annotations"]["finishedAt"] == evidence["finished_at"]
        assert entries["trust-domains"]["annotations"]["payload_user"] == "nobody"
        assert entries["world"]["annotations"] == world
        assert entries["matrix"]["uri"] == "matrix/linux.toml"


class TestMergePins:
    EXPECT = (
        '[[leg]]\nplatform = "linux"\nbackend = "bubblewrap"\n'
        '[[leg]]\nplatform = "linux"\nbackend = "docker"\n'
    )

    def legs(
        self, tmp_path: Path, policy_file: Path, key: SigningKey, **per_leg: dict[str, Any]
    ) -> list[Path]:
        """Two signed Linux legs (bubblewrap, docker), each with the given build options."""
        out = []
        for backend in ("bubblewrap", "docker"):
            report = build_report(
                tmp_path / f"leg-{backend}",
                policy_file,
                make_cells(backends=("none", backend), required=(backend,)),
                **per_leg.get(backend, {}),
            )
            sign(report, key)
            out.append(report)
        return out

    def merge(
        self,
        tmp_path: Path,
        dirs: list[Path],
        trusted: TrustedKey,
        policy: Policy,
        key: SigningKey,
    ) -> Any:
        """Merge `dirs` into tmp_path/out (no Sigstore)."""
        path = tmp_path / "legs.toml"
        path.write_text(self.EXPECT)
        return merge_legs(
            dirs,
            expected=load_expected_legs(path),
            trusted=trusted,
            policy=policy,
            key=key,
            out_dir=tmp_path / "out",
            env={},
        )

    def test_different_commits_refused(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """Legs made by two commits refuse the merge, listing each leg's commit."""
        dirs = self.legs(tmp_path, policy_file, signing_key, docker={"commit": "ab" * 20})
        result = self.merge(tmp_path, dirs, trusted, policy, signing_key)
        listed = f"01-leg-bubblewrap: {COMMIT}; 02-leg-docker: {'ab' * 20}"
        assert has(result.reasons, f"different harness commits ({listed})")
        assert not (tmp_path / "out").exists()

    def test_different_probes_refused(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """Legs that ran different probes refuse the merge."""
        dirs = self.legs(tmp_path, policy_file, signing_key, docker={"probes_sha256": "cd" * 32})
        result = self.merge(tmp_path, dirs, trusted, policy, signing_key)
        assert has(result.reasons, "different probes digests")

    def test_every_subject_copied_and_rechecked(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        trusted: TrustedKey,
        policy: Policy,
    ) -> None:
        """The merge copies every leg subject (allure tree too); verify re-checks the copies."""
        dirs = self.legs(tmp_path, policy_file, signing_key)
        result = self.merge(tmp_path, dirs, trusted, policy, signing_key)
        assert result.reasons == []
        copy = tmp_path / "out" / "legs" / "01-leg-bubblewrap"
        for name in ("evidence.json", "junit.xml", "report.html", "summary.md", ATT):
            assert (copy / name).read_bytes() == (dirs[0] / name).read_bytes()
        assert tree_sha256(copy / "allure-results") == tree_sha256(dirs[0] / "allure-results")
        v = verify_report(tmp_path / "out", trusted, policy)
        assert v.reasons == []
        assert v.harness["commit"] == COMMIT
        assert [leg.harness["commit"] for _, leg in v.leg_results] == [COMMIT, COMMIT]
        (copy / "allure-results" / "attachments" / "stderr.txt").write_text("edited")
        found = reasons(tmp_path / "out", trusted, policy)
        assert has(found, "legs/01-leg-bubblewrap/allure-results/ does not match"), found


class TestCliOutput:
    def test_verify_prints_commit_trust_domains_and_world(
        self,
        tmp_path: Path,
        policy_file: Path,
        signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Verify prints the signed harness commit, trust domains and world; none says so."""
        world = {"kind": "loopback", "reason": "no lab here"}
        report = sign_built(tmp_path, policy_file, signing_key, extra={"world": world})
        pub = tmp_path / "k.pub"
        pub.write_bytes(public_key_pem(signing_key.public_key))
        (tmp_path / "k.pem").write_bytes(private_key_pem(signing_key.private_key))
        parser = argparse.ArgumentParser(prog="sandbox-attest")
        register(parser.add_subparsers())
        base = ["verify", str(report), "--trusted-key", str(pub), "--policy", str(policy_file)]
        args = parser.parse_args([*base, "--max-age", "none", "--expect-commit", COMMIT[:10]])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert f"commit {COMMIT} (clean)" in out
        assert "trust domains: separated (payloads ran as nobody, uid 65534" in out
        assert "world: loopback no lab here" in out
        assert "note: freshness of the report not checked (--max-age none)" in out
        args = parser.parse_args([*base, "--expect-commit", "xyz"])
        assert args.func(args) == 2
        assert "7 to 40 hex digits" in capsys.readouterr().err
