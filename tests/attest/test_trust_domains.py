"""Trust domains are measured, signed, and enforced (issue 23, part 2).

The measurement (`sandbox_attest.host.separation`) over host readings shaped as hostview writes
them; the signer's refusal of a release key for a run that is not separated (the real signer
process, with a per-machine key under a temporary HOME); and `verify`'s refusal of such a run
and of a report whose fact was declared rather than measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox_attest.attest.keys import (
    ENV_VAR,
    TrustedKey,
    keyid_of,
    private_key_pem,
    public_key_pem,
)
from sandbox_attest.attest.legs import load_expected_legs
from sandbox_attest.attest.merge import MergeResult, merge_legs
from sandbox_attest.attest.signer import Signer
from sandbox_attest.attest.subjects import EVIDENCE, HTML, JUNIT, SARIF, SUMMARY
from sandbox_attest.attest.verification import Checks
from sandbox_attest.attest.verify import verify_report
from sandbox_attest.cli.release import register
from sandbox_attest.host import separation
from sandbox_attest.host.separation import trust_domains
from sandbox_attest.host.trust import PayloadUser
from sandbox_attest.report.files import make_report_dir
from sandbox_attest.report.sarif import render_sarif
from sandbox_attest.report.views import render_html, render_summary
from tests.attest.builder import PAYLOAD_UID, build_report, make_cells, measured_domains, sign

if TYPE_CHECKING:
    from sandbox_attest.attest.keys import SigningKey
    from sandbox_attest.report.policy import Policy

linux = pytest.mark.skipif(sys.platform != "linux", reason="the signer process is Linux-only")
HARNESS = (0, 0)
NOT_SEPARATED = "trust domains were NOT separated"
USER = PayloadUser("sa-test", 990, 990, frozenset(), Path("/nonexistent"))


def ids(n: int) -> str:
    """A status `Uid:`/`Gid:` value: real, effective, saved and fs ids all `n`."""
    return f"{n} {n} {n} {n}"


def cell(backend: str, view: dict[str, Any] | None) -> dict[str, Any]:
    """An evidence cell of `backend` with the host view `view` (None: it never ran)."""
    out: dict[str, Any] = {"backend": backend, "cell_id": f"{backend}-p", "verdict": "PASS"}
    if view is not None:
        out["host_view"] = view
    return out


def seen(uid: int, gid: int | None = None) -> dict[str, Any]:
    """A host view of one payload read at its rendezvous, running as `uid`."""
    g = uid if gid is None else gid
    return {"seen": True, "pid": 100 + uid, "status": {"Uid": ids(uid), "Gid": ids(g)}}


PAYLOAD = separation.Launch(990, 990, "the run's payload user sa-test")


class TestBackendFact:
    def test_payload_readings_are_separated(self) -> None:
        """Every process read ran as the payload user and it was launched so: separated."""
        fact = separation.backend_fact("bw", [cell("bw", seen(990))] * 3, PAYLOAD, HARNESS)
        assert fact["status"] == separation.SEPARATED
        assert (fact["uids"], fact["gids"], fact["processes_read"]) == ([990], [990], 3)

    @pytest.mark.parametrize(
        ("uid", "gid"), [(0, 990), (990, 0), (1000, 990)], ids=["root", "root-gid", "harness"]
    )
    def test_root_or_the_harness_uid_is_shared(self, uid: int, gid: int) -> None:
        """One process as root, root's group or the harness's uid makes the backend shared."""
        fact = separation.backend_fact(
            "bw", [cell("bw", seen(990)), cell("bw", seen(uid, gid))], PAYLOAD, (1000, 1000)
        )
        assert fact["status"] == separation.SHARED
        assert "root or the harness's own" in fact["reason"]

    def test_processes_list_wins_over_the_single_reading(self) -> None:
        """Where the view lists every process of the cell, a root one among them is found."""
        view = {
            **seen(990),
            "processes": [
                {"pid": 1, "uids": [990, 990, 990, 990], "gids": [990] * 4},
                {"pid": 2, "uids": [990, 0, 0, 0], "gids": [990] * 4},
            ],
        }
        fact = separation.backend_fact("w", [cell("w", view)], PAYLOAD, HARNESS)
        assert fact["status"] == separation.SHARED
        assert fact["uids"] == [0, 990]
        assert fact["processes_read"] == 2

    def test_processes_count_where_the_payload_was_not_seen(self) -> None:
        """A cell whose payload missed the rendezvous is still judged by the processes read."""
        view = {"seen": False, "why": "gone", "processes": [{"pid": 3, "uids": [0] * 4,
                                                             "gids": [0] * 4}]}  # fmt: skip
        fact = separation.backend_fact("w", [cell("w", view)], PAYLOAD, HARNESS)
        assert fact["status"] == separation.SHARED
        assert fact["processes_read"] == 1

    def test_a_refused_reading_is_unmeasured_but_an_exited_one_is_not(self) -> None:
        """A process the host was refused reading may be anyone's; one that exited is nothing."""
        ok = {"pid": 1, "uids": [990] * 4, "gids": [990] * 4}
        exited = {**seen(990), "processes": [ok, {"pid": 2, "unread": "exited before the host "
                                                  "read it"}]}  # fmt: skip
        refused = {**seen(990), "processes": [ok, {"pid": 3, "unread": "unreadable: EACCES"}]}
        fact = separation.backend_fact("w", [cell("w", exited)], PAYLOAD, HARNESS)
        assert fact["status"] == separation.SEPARATED
        fact = separation.backend_fact("w", [cell("w", refused)], PAYLOAD, HARNESS)
        assert fact["status"] == separation.UNMEASURED
        assert "pid 3: unreadable: EACCES" in fact["reason"]

    def test_decoys_in_others_are_read_too(self) -> None:
        """Without `processes`, the payload's `others` (decoy launchers) are counted as well."""
        view = {**seen(990), "others": [seen(0)]}
        fact = separation.backend_fact("w", [cell("w", view)], PAYLOAD, HARNESS)
        assert fact["status"] == separation.SHARED

    def test_a_root_launch_is_shared_whatever_was_read(self) -> None:
        """A wrapper started as root (`[run] user = "root"`) is shared over payload readings too."""
        root = separation.Launch(0, 0, 'the spec\'s [run] user = "root"')
        fact = separation.backend_fact("w", [cell("w", seen(990))], root, HARNESS)
        assert fact["status"] == separation.SHARED
        assert '[run] user = "root"' in fact["reason"]

    def test_nothing_read_nor_launched_is_unmeasured(self) -> None:
        """Containers the host never read, started by the engine, leave the backend unmeasured."""
        gone = {"seen": False, "why": "the payload exited before the host read it"}
        fact = separation.backend_fact("docker", [cell("docker", gone)] * 2, None, HARNESS)
        assert fact["status"] == separation.UNMEASURED
        assert fact["separated"] is False
        assert fact["cells_unread"] == 2

    def test_an_unread_wrapper_rests_on_its_launch(self) -> None:
        """A wrapper that never ran its payload is judged by the uid the harness started it as."""
        gone = {"seen": False, "why": "the payload never reached the rendezvous"}
        fact = separation.backend_fact("w", [cell("w", gone)] * 2, PAYLOAD, HARNESS)
        assert fact["status"] == separation.SEPARATED
        assert (fact["processes_read"], fact["launches"], fact["cells_unread"]) == (0, 2, 2)
        harness_launch = separation.Launch(1000, 1000, "the harness's own uid")
        shared = separation.backend_fact("w", [cell("w", gone)], harness_launch, (1000, 1000))
        assert shared["status"] == separation.SHARED

    def test_a_backend_that_ran_nothing_does_not_decide(self) -> None:
        """UNAVAILABLE cells (no host view) make `ran nothing`, which neither helps nor hurts."""
        fact = separation.backend_fact("docker", [cell("docker", None)], None, HARNESS)
        assert fact["status"] == separation.RAN_NOTHING


class TestRunFact:
    def test_unmeasured_fact_is_never_separated(self) -> None:
        """Before any cell is judged the fact says "not measured", not separated."""
        fact = trust_domains(USER)
        assert fact["separated"] is False
        assert fact["measured"] is False

    def test_one_shared_backend_makes_the_run_not_separated(self) -> None:
        """A run is separated only when every backend that ran is; the reason names the one."""
        facts = {
            "none": separation.backend_fact("none", [cell("none", seen(990))], PAYLOAD, HARNESS),
            "w": separation.backend_fact("w", [cell("w", seen(0))], PAYLOAD, HARNESS),
        }
        fact = separation.summarize(facts, HARNESS, USER)
        assert fact["separated"] is False
        assert fact["reason"].startswith("w's processes ran as uid 0")

    def test_only_ran_nothing_is_not_separated(self) -> None:
        """A run none of whose backends ran a cell measured nothing: not separated."""
        facts = {"docker": separation.backend_fact("docker", [cell("docker", None)], None, HARNESS)}
        assert separation.summarize(facts, HARNESS, USER)["separated"] is False

    def test_command_wrapper_launch_follows_its_run_user(self) -> None:
        """A wrapper whose spec says `[run] user = "root"` is launched as the harness's root."""

        @dataclass
        class Spec:
            run_user: str
            source: str = "matrix/backends/w.toml"

        @dataclass
        class Wrapper:
            spec: Spec
            name: str = "w"

            def user(self) -> PayloadUser | None:
                return USER

        root = separation.launch_of(Wrapper(Spec("root")), USER)
        assert root.uid == os.geteuid()
        assert "matrix/backends/w.toml" in root.how
        assert separation.launch_of(Wrapper(Spec("")), USER).uid == USER.uid

    def test_a_forged_separated_status_does_not_hold(self) -> None:
        """`decide` with the harness ids re-checks a SEPARATED status against its own uids."""
        fact = separation.backend_fact("w", [cell("w", seen(990))], PAYLOAD, HARNESS)
        forged = {**fact, "uids": [0, 990]}
        ok, why = separation.decide({"w": forged}, HARNESS)
        assert ok is False
        assert "include root's or the harness's" in why


def shared_report(tmp_path: Path, policy_file: Path, uid: int = 0) -> Path:
    """A built report whose bubblewrap payloads the host read running as `uid` (root)."""
    cells = make_cells()
    for c in cells:
        if c["backend"] == "bubblewrap":
            c["host_view"]["status"] = {"Uid": ids(uid), "Gid": ids(uid)}
    return build_report(tmp_path / "shared", policy_file, cells)


def verify_reasons(
    report: Path, trusted: TrustedKey, policy: Policy, *, allow_shared: bool = False
) -> list[str]:
    """Reasons `verify_report` gives (no registry, so the fixed key counts as a release key)."""
    return verify_report(
        report,
        trusted,
        policy,
        checks=Checks(untrusted_keyids=frozenset()),
        allow_shared_trust_domain=allow_shared,
    ).reasons


class TestVerify:
    def test_measured_separated_report_verifies(
        self, signed_report: Path, trusted: TrustedKey, policy: Policy
    ) -> None:
        """The builder's root run with payloads read as nobody verifies, and says separated."""
        v = verify_report(
            signed_report, trusted, policy, checks=Checks(untrusted_keyids=frozenset())
        )
        assert v.reasons == []
        assert v.trust_domains["separated"] is True
        assert v.trust_domains["backends"]["bubblewrap"]["uids"] == [PAYLOAD_UID]

    def test_not_separated_is_refused_unless_allowed(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signing_key: SigningKey,
        trusted: TrustedKey,
    ) -> None:  # fmt: skip
        """A signed run whose payloads ran as root is refused; the flag accepts it, with a note."""
        report = shared_report(tmp_path, policy_file)
        sign(report, signing_key)
        found = verify_reasons(report, trusted, policy)
        assert len(found) == 1, found
        assert "trust domains were NOT separated: bubblewrap's processes ran as uid 0" in found[0]
        assert "--allow-shared-trust-domain" in found[0]
        v = verify_report(
            report, trusted, policy, checks=Checks(untrusted_keyids=frozenset()),
            allow_shared_trust_domain=True,
        )  # fmt: skip
        assert v.ok, v.reasons
        assert any("accepted with --allow-shared-trust-domain" in n for n in v.notes)

    def test_declared_fact_of_an_old_report_is_refused(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signing_key: SigningKey,
        trusted: TrustedKey,
    ) -> None:  # fmt: skip
        """A report from before issue 23 says "separated" without measuring: refused by default."""
        declared = {
            "separated": True, "harness_uid": 0, "payload_uid": 65534,
            "payload_user": "nobody", "reason": "payloads run as nobody",
        }  # fmt: skip
        report = build_report(tmp_path / "old", policy_file, extra={"trust_domains": declared})
        sign(report, signing_key)
        found = verify_reasons(report, trusted, policy)
        assert any("declared, not measured" in r for r in found), found
        assert verify_reasons(report, trusted, policy, allow_shared=True) == []

    def test_a_fact_that_does_not_follow_from_the_cells_is_refused(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signing_key: SigningKey,
        trusted: TrustedKey,
    ) -> None:  # fmt: skip
        """A signed "separated" over cells the host read as root is named, even with the flag."""
        cells = make_cells()
        honest = measured_domains(cells)
        for c in cells:
            c["host_view"]["status"] = {"Uid": ids(0), "Gid": ids(0)}
        report = build_report(
            tmp_path / "forged", policy_file, cells, extra={"trust_domains": honest}
        )
        sign(report, signing_key)
        found = verify_reasons(report, trusted, policy, allow_shared=True)
        assert any("says uids [65534], but its signed cells give [0]" in r for r in found), found

    def test_json_carries_the_signed_fact(
        self, tmp_path: Path, policy_file: Path, signing_key: SigningKey,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    ) -> None:  # fmt: skip
        """`verify --json` exits 1 on a shared run and carries each backend's uids and status."""
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        report = shared_report(tmp_path, policy_file)
        sign(report, signing_key)
        pub = tmp_path / "k.pub"
        pub.write_bytes(public_key_pem(signing_key.public_key))
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers())
        base = ["verify", str(report), "--trusted-key", str(pub), "--policy", str(policy_file)]
        args = parser.parse_args([*base, "--json"])
        assert args.func(args) == 1
        got = json.loads(capsys.readouterr().out)
        assert got["trust_domains"]["separated"] is False
        assert got["trust_domains"]["backends"]["bubblewrap"]["uids"] == [0]
        assert got["trust_domains"]["backends"]["bubblewrap"]["status"] == "shared"
        args = parser.parse_args([*base, "--allow-shared-trust-domain", "--json"])
        assert args.func(args) == 0


class TestMerge:
    def test_a_shared_leg_is_merged_only_when_allowed(
        self, tmp_path: Path, policy_file: Path, policy: Policy, signing_key: SigningKey,
        trusted: TrustedKey,
    ) -> None:  # fmt: skip
        """`merge` refuses a leg whose trust domains were shared; the flag merges it."""
        legs = tmp_path / "legs.toml"
        legs.write_text(
            '[[leg]]\nplatform = "linux"\nbackend = "none"\n'
            '[[leg]]\nplatform = "linux"\nbackend = "bubblewrap"\n'
        )
        report = shared_report(tmp_path, policy_file)
        sign(report, signing_key)
        expected = load_expected_legs(legs)
        checks = Checks(untrusted_keyids=frozenset())

        def merge(out: str, *, allow: bool) -> MergeResult:
            return merge_legs(
                [report], expected=expected, trusted=trusted, policy=policy, key=signing_key,
                out_dir=tmp_path / out, env={}, checks=checks, allow_shared_trust_domain=allow,
            )  # fmt: skip

        refused = merge("no", allow=False)
        assert any(NOT_SEPARATED in r for r in refused.reasons), refused.reasons
        assert refused.attestation is None
        merged = merge("yes", allow=True)
        assert merged.reasons == []
        assert merged.attestation is not None


@linux
class TestSignerRefusesTheReleaseKey:
    @staticmethod
    def files(report: Path, signer: Signer, policy: Policy) -> dict[str, bytes]:
        """The judged bytes of a built report, with views naming the signer's key now."""
        evidence = json.loads((report / EVIDENCE).read_bytes())
        return {
            EVIDENCE: (report / EVIDENCE).read_bytes(),
            JUNIT: (report / JUNIT).read_bytes(),
            HTML: render_html(evidence, signer.facts, policy).encode(),
            SUMMARY: render_summary(evidence, signer.facts, policy).encode(),
            SARIF: render_sarif(evidence),
        }

    @staticmethod
    def key(tmp_path: Path) -> Path:
        """A release key file, 0600."""
        path = tmp_path / "release.pem"
        path.write_bytes(private_key_pem(Ed25519PrivateKey.generate()))
        path.chmod(0o600)
        return path

    def test_insisted_key_is_swapped_for_the_local_key(
        self, tmp_path: Path, policy_file: Path, policy: Policy
    ) -> None:
        """--key on a shared run: the per-machine key signs, the line says why and exit 2."""
        key = self.key(tmp_path)
        report = shared_report(tmp_path, policy_file)
        env = {"HOME": str(tmp_path / "home")}
        with Signer.start(key, env, payload=None) as signer:
            release = signer.keyid
            line = signer.refuse_release("bubblewrap's processes ran as uid 0")
            assert signer.trust == "untrusted-local"
            assert signer.keyid != release
            out = make_report_dir(tmp_path / "out")
            (out / "allure-results").mkdir()
            signer.sign_report(
                out, self.files(report, signer, policy), policy_bytes=policy_file.read_bytes(),
                policy_path=str(policy_file), gate="PASSED",
            )  # fmt: skip
        assert f"the release key {release} (--key) was NOT used" in line
        assert "exits 2" in line
        signing = json.loads((out / "signing.json").read_text())
        assert signing["trust"] == "untrusted-local"
        from cryptography.hazmat.primitives.serialization import load_pem_private_key  # noqa: PLC0415

        loaded: Any = load_pem_private_key(key.read_bytes(), password=None)
        release_pub = TrustedKey(loaded.public_key(), keyid_of(loaded.public_key()), "release")
        refused = verify_reasons(out, release_pub, policy, allow_shared=True)
        assert any("signature check failed" in r for r in refused), refused

    def test_the_signer_refuses_on_its_own(
        self, tmp_path: Path, policy_file: Path, policy: Policy
    ) -> None:
        """A session that forgets to ask still gets no release signature over a shared run."""
        key = self.key(tmp_path)
        report = shared_report(tmp_path, policy_file)
        env = {"HOME": str(tmp_path / "home"), ENV_VAR: str(key)}
        with Signer.start(None, env, payload=None) as signer:
            out = make_report_dir(tmp_path / "out")
            (out / "allure-results").mkdir()
            signer.sign_report(
                out, self.files(report, signer, policy), policy_bytes=policy_file.read_bytes(),
                policy_path=str(policy_file), gate="PASSED",
            )  # fmt: skip
            assert signer.trust == "untrusted-local"
            assert f"(${ENV_VAR}) was NOT used" in signer.refusal
            assert "exits 2" not in signer.refusal
        assert json.loads((out / "signing.json").read_text())["trust"] == "untrusted-local"

    def test_no_keyless_identity_vouches_for_a_shared_run(
        self, tmp_path: Path, policy_file: Path, policy: Policy
    ) -> None:
        """With an OIDC token at hand, a shared run still gets no keyless signature, and says why.

        The token's request variables were readable by the same code that could read the key,
        so the workflow's identity must not vouch for the run either. Nothing is sent: the
        refusal comes before any keyless attempt.
        """
        env = {"HOME": str(tmp_path / "home"), "SIGSTORE_ID_TOKEN": "not-a-real-token"}
        report = shared_report(tmp_path, policy_file)
        with Signer.start(None, env, payload=None) as signer:
            signer.refuse_release("bubblewrap's processes ran as uid 0")
            assert signer.sigstore.attempt is False
            assert signer.sigstore.reason.startswith("keyless signing skipped: the trust")
            out = make_report_dir(tmp_path / "out")
            (out / "allure-results").mkdir()
            signer.sign_report(
                out, self.files(report, signer, policy), policy_bytes=policy_file.read_bytes(),
                policy_path=str(policy_file), gate="PASSED",
            )  # fmt: skip
        sidecar = json.loads((out / "signing.json").read_text())["sigstore"]
        assert sidecar["status"] == "ed25519 only"
        assert sidecar["reason"].startswith("keyless signing skipped")
        assert not (out / "attestation.sigstore.jsonl").exists()

    def test_a_separated_run_keeps_the_release_key(
        self, tmp_path: Path, policy_file: Path, policy: Policy
    ) -> None:
        """The measured, separated run is signed with the key given, and verifies with it."""
        key = self.key(tmp_path)
        report = build_report(tmp_path / "ok", policy_file)
        with Signer.start(key, {"HOME": str(tmp_path / "home")}, payload=None) as signer:
            out = make_report_dir(tmp_path / "out")
            (out / "allure-results").mkdir()
            signer.sign_report(
                out, self.files(report, signer, policy), policy_bytes=policy_file.read_bytes(),
                policy_path=str(policy_file), gate="PASSED",
            )  # fmt: skip
            assert signer.trust == "provided"
            assert signer.refusal == ""
        assert json.loads((out / "signing.json").read_text())["trust"] == "provided"
        assert not (tmp_path / "home").exists()  # no per-machine key was made
