"""The CI release gate end to end: `merge` legs into one directory, then `verify` it."""

from __future__ import annotations

import argparse
import base64
import json
import shutil
from typing import TYPE_CHECKING

import pytest

import sandbox_attest.attest.merge
import sandbox_attest.attest.verify
from sandbox_attest.attest.keys import private_key_pem, public_key_pem
from sandbox_attest.attest.legs import load_expected_legs
from sandbox_attest.attest.merge import merge_legs
from sandbox_attest.cli.release import register
from tests.attest.builder import build_report, make_cells, sign

if TYPE_CHECKING:
    from pathlib import Path

    from sandbox_attest.attest.keys import SigningKey, TrustedKey
    from sandbox_attest.attest.verification import Verification
    from sandbox_attest.report.policy import Policy

LEGS_TOML = (
    '[[leg]]\nplatform = "linux"\nbackend = "bubblewrap"\n'
    '[[leg]]\nplatform = "linux"\nbackend = "docker"\n'
)


def run_cli(argv: list[str]) -> int:
    """Parse argv with the registered subcommands and run the chosen one."""
    parser = argparse.ArgumentParser(prog="sandbox-attest")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


@pytest.fixture
def ci(tmp_path: Path, policy_file: Path, signing_key: SigningKey) -> dict[str, Path]:
    """Two signed CI legs (each running the `none` control first), keys and legs.toml."""
    paths = {"legs": tmp_path / "legs.toml", "key": tmp_path / "k.pem", "pub": tmp_path / "k.pub"}
    paths["legs"].write_text(LEGS_TOML)
    paths["key"].write_bytes(private_key_pem(signing_key.private_key))
    paths["pub"].write_bytes(public_key_pem(signing_key.public_key))
    for backend in ("bubblewrap", "docker"):
        leg = build_report(
            tmp_path / "reports" / f"leg-{backend}",
            policy_file,
            make_cells(backends=("none", backend), required=(backend,)),
        )
        sign(leg, signing_key)
        paths[backend] = leg
    paths["policy"] = policy_file
    paths["out"] = tmp_path / "reports" / "release"
    return paths


def merge_argv(ci: dict[str, Path]) -> list[str]:
    """The workflow's merge command line."""
    return [
        "merge",
        str(ci["bubblewrap"]),
        str(ci["docker"]),
        "--expect-legs",
        str(ci["legs"]),
        "--out",
        str(ci["out"]),
        "--trusted-key",
        str(ci["pub"]),
        "--key",
        str(ci["key"]),
        "--policy",
        str(ci["policy"]),
    ]


def verify_argv(ci: dict[str, Path]) -> list[str]:
    """The workflow's verify command line, on the merged directory."""
    return [
        "verify",
        str(ci["out"]),
        "--trusted-key",
        str(ci["pub"]),
        "--policy",
        str(ci["policy"]),
    ]


class TestReleaseGate:
    def test_merge_then_verify_passes_and_a_tampered_copy_is_named(
        self,
        ci: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The CI sequence merge -> verify exits 0; one flipped byte of a copied leg exits 1."""
        monkeypatch.delenv("SIGSTORE_ID_TOKEN", raising=False)
        monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
        assert run_cli(merge_argv(ci)) == 0, capsys.readouterr().err
        copied = ci["out"] / "legs" / "01-leg-bubblewrap"
        assert (copied / "junit.xml").read_bytes() == (ci["bubblewrap"] / "junit.xml").read_bytes()
        capsys.readouterr()
        assert run_cli(verify_argv(ci)) == 0, capsys.readouterr().err
        assert "OK:" in capsys.readouterr().out

        data = bytearray((copied / "junit.xml").read_bytes())
        data[60] ^= 0x01
        (copied / "junit.xml").write_bytes(bytes(data))
        assert run_cli(verify_argv(ci)) == 1
        assert "legs/01-leg-bubblewrap/junit.xml does not match" in capsys.readouterr().err

    def test_merged_result_is_rederived_not_believed(
        self,
        ci: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A copied leg swapped for another validly signed leg report still fails verify."""
        monkeypatch.delenv("SIGSTORE_ID_TOKEN", raising=False)
        monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
        assert run_cli(merge_argv(ci)) == 0
        copied = ci["out"] / "legs" / "02-leg-docker"
        for name in ("evidence.json", "junit.xml", "attestation.intoto.jsonl"):
            (copied / name).write_bytes((ci["bubblewrap"] / name).read_bytes())
        assert run_cli(verify_argv(ci)) == 1
        err = capsys.readouterr().err
        assert "legs/02-leg-docker/evidence.json does not match" in err
        assert "duplicate leg linux/bubblewrap" in err

    def test_merge_signs_the_bytes_it_verified(
        self,
        ci: dict[str, Path],
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A leg file deleted right after its check is still copied as verified (no re-read)."""
        real = sandbox_attest.attest.verify.verify_report

        def verify_then_delete(*args: object, **kwargs: bool) -> Verification:
            v = real(*args, **kwargs)  # type: ignore[arg-type]
            (v.report_dir / "junit.xml").unlink()
            return v

        original = (ci["docker"] / "junit.xml").read_bytes()
        monkeypatch.setattr(sandbox_attest.attest.verify, "verify_report", verify_then_delete)
        result = merge_legs(
            [ci["bubblewrap"], ci["docker"]],
            expected=load_expected_legs(ci["legs"]),
            trusted=trusted,
            policy=policy,
            key=signing_key,
            out_dir=ci["out"],
            env={},
        )
        assert result.reasons == []
        assert (ci["out"] / "legs" / "02-leg-docker" / "junit.xml").read_bytes() == original


class TestOutDir:
    def test_out_pointing_at_a_leg_is_refused_and_the_leg_kept(
        self, ci: dict[str, Path], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--out naming a leg directory is refused (exit 2, naming the fix); the leg is intact."""
        before = (ci["docker"] / "attestation.intoto.jsonl").read_bytes()
        argv = merge_argv(ci)
        argv[argv.index("--out") + 1] = str(ci["docker"])
        assert run_cli(argv) == 2
        assert "choose an empty --out" in capsys.readouterr().err
        assert (ci["docker"] / "attestation.intoto.jsonl").read_bytes() == before
        assert not (ci["docker"] / "legs").exists()

    def test_failed_write_leaves_nothing(
        self,
        ci: dict[str, Path],
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A merge that fails while writing leaves no --out and no temporary directory."""

        def boom(*_args: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(sandbox_attest.attest.merge, "write_signing_sidecar", boom)
        with pytest.raises(OSError, match="No space"):
            merge_legs(
                [ci["bubblewrap"], ci["docker"]],
                expected=load_expected_legs(ci["legs"]),
                trusted=trusted,
                policy=policy,
                key=signing_key,
                out_dir=ci["out"],
                env={},
            )
        assert sorted(p.name for p in ci["out"].parent.iterdir()) == [
            "leg-bubblewrap",
            "leg-docker",
        ]

    def test_empty_out_is_used(
        self,
        ci: dict[str, Path],
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """An existing empty --out is fine (CI may create it first)."""
        monkeypatch.delenv("SIGSTORE_ID_TOKEN", raising=False)
        monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
        ci["out"].mkdir()
        assert run_cli(merge_argv(ci)) == 0, capsys.readouterr().err
        assert (ci["out"] / "attestation.intoto.jsonl").is_file()


class TestMergeSigner:
    def test_local_key_refused_without_the_flag(
        self,
        ci: dict[str, Path],
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """With no --key and no $SANDBOX_ATTEST_SIGNING_KEY the merge is refused, naming both."""
        monkeypatch.delenv("SANDBOX_ATTEST_SIGNING_KEY", raising=False)
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
        argv = merge_argv(ci)
        del argv[argv.index("--key") : argv.index("--key") + 2]
        assert run_cli(argv) == 2
        err = capsys.readouterr().err
        assert "--key" in err
        assert "$SANDBOX_ATTEST_SIGNING_KEY" in err
        assert not ci["out"].exists()

    def test_merged_statement_names_its_signer(
        self, ci: dict[str, Path], monkeypatch: pytest.MonkeyPatch, signing_key: SigningKey
    ) -> None:
        """The signed merged statement carries the signer's keyid and trust."""
        monkeypatch.delenv("SIGSTORE_ID_TOKEN", raising=False)
        monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
        assert run_cli(merge_argv(ci)) == 0
        # Line 1 is the merged test-result statement (line 2 the release summary).
        line = (ci["out"] / "attestation.intoto.jsonl").read_text().splitlines()[0]
        stmt = json.loads(base64.b64decode(json.loads(line)["payload"]))
        (signer,) = [c for c in stmt["predicate"]["configuration"] if c["name"] == "signer"]
        assert signer["digest"] == {"sha256": signing_key.keyid}
        assert signer["annotations"]["trust"] == "provided"


class TestDuplicateLeg:
    def test_duplicate_leg_gives_one_reason(
        self,
        ci: dict[str, Path],
        trusted: TrustedKey,
        policy: Policy,
        signing_key: SigningKey,
    ) -> None:
        """A leg passed twice is refused with the one real reason, not a line per repeated cell."""
        twin = ci["bubblewrap"].parent / "leg-bubblewrap-again"
        shutil.copytree(ci["bubblewrap"], twin)
        result = merge_legs(
            [ci["bubblewrap"], ci["docker"], twin],
            expected=load_expected_legs(ci["legs"]),
            trusted=trusted,
            policy=policy,
            key=signing_key,
            out_dir=ci["out"],
            env={},
        )
        assert len(result.reasons) == 1, result.reasons
        assert "duplicate leg linux/bubblewrap" in result.reasons[0]
        assert not ci["out"].exists()
