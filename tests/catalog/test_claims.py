"""Each assessor judges against the claim, and each FAIL names the claim it broke.

Hand-made reports against real planted files and real evidence shapes (the host view as
run/hostview.py writes it, witness records as the world logs them): for every probe that
reads a new claim, the branch where the claim holds, where it breaks (FAIL naming it), and
where it is not made (not judged, or NOT_APPLICABLE through `not_claimed`).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import PROBES, CellContext
from sandbox_attest.catalog.env import EnvInheritance, salted_hash
from sandbox_attest.catalog.fs import FsLinkEscape, FsProtectedInWorkspace, FsReadSecrets
from sandbox_attest.verdict import Decision, Verdict, decide
from sandbox_attest.world.info import PROBE_NAME_SUFFIX
from tests.catalog.test_host import OK_CONTROL, Records, att, make_ctx, report

__all__ = ["make_ctx"]  # the fixture, imported so this module's tests can ask for it

SCRUBBED = DeclaredClaims("proxy", "workspace", "isolated")
SSH_ONLY = DeclaredClaims("proxy", "workspace", "isolated", reads="deny", read_deny=("~/.ssh",))
OPEN_READS = DeclaredClaims("proxy", "workspace", "isolated", reads="open")
HOOKS = DeclaredClaims("proxy", "workspace", "isolated", protected=(".git/hooks",))
SECCOMP = DeclaredClaims("none", "open", "open", network_cut="seccomp")
NAMESPACE = DeclaredClaims("none", "open", "open")
NON_ROOT = DeclaredClaims("proxy", "workspace", "isolated", runs_as="non-root")


def judge(spec: Any, ctx: CellContext, rep: dict[str, Any], witness: Any = None) -> Decision:
    """Assess one cell with an ok host control and decide it on the spec's expectation."""
    assessment = spec.assess(ctx, rep, witness or Records(), OK_CONTROL)
    return decide(spec.expectation(ctx.claims), assessment)


class TestReadSecrets:
    def _read(self, spec: FsReadSecrets, ctx: CellContext, *leaked: str) -> dict[str, Any]:
        """A report in which `leaked` canaries were read (by their real hashes), others refused."""
        hashes = spec_hashes(ctx)
        attempts = [att("workspace", "control", "succeeded", sha256=hashes["workspace"])]
        for key in spec.secret_paths(ctx):
            if key in leaked:
                attempts.append(att(key, "escape", "succeeded", sha256=hashes[key]))
            else:
                attempts.append(att(key, "escape", "refused", errno="EACCES"))
        return report(*attempts)

    def test_workspace_claim_names_the_path_read(self, make_ctx: Any) -> None:
        """Under reads = "workspace" a canary read is FAIL naming the claim and the path."""
        spec = FsReadSecrets()
        ctx = make_ctx(spec, SCRUBBED)
        spec.prepare(ctx)
        decision = judge(spec, ctx, self._read(spec, ctx, "ssh"))
        assert decision.verdict is Verdict.FAIL
        path = spec.secret_paths(ctx)["ssh"]
        assert decision.reason.startswith(
            "escape observed by the host: claims reads limited to the workspace (implied by "
            f'filesystem = "workspace"); the payload read the host\'s canary bytes: ssh ({path})'
        )

    def test_deny_list_judges_only_what_it_names(self, make_ctx: Any) -> None:
        """A deny-list of ~/.ssh leaves the aws read unjudged (PASS) and fails the ssh read."""
        spec = FsReadSecrets()
        ctx = make_ctx(spec, SSH_ONLY)
        spec.prepare(ctx)
        held = judge(spec, ctx, self._read(spec, ctx, "aws", "docker", "dotenv"))
        assert held.verdict is Verdict.PASS, held.reason
        assert "not judged, the reads claim lets them be read: aws, docker, dotenv" in held.reason
        broken = judge(spec, ctx, self._read(spec, ctx, "ssh"))
        assert broken.verdict is Verdict.FAIL
        assert "claims ~/.ssh unreadable (reads deny-list); the payload read" in broken.reason

    def test_deny_list_naming_no_canary_is_inconclusive(self, make_ctx: Any) -> None:
        """A deny-list this probe plants nothing under proves nothing either way."""
        spec = FsReadSecrets()
        declared = DeclaredClaims(
            "proxy", "workspace", "isolated", reads="deny", read_deny=("/srv",)
        )
        ctx = make_ctx(spec, declared)
        spec.prepare(ctx)
        decision = judge(spec, ctx, self._read(spec, ctx))
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert "claims /srv unreadable (reads deny-list), which names none" in decision.reason

    def test_open_reads_are_not_applicable(self) -> None:
        """Under open reads the probe says NOT_APPLICABLE with the claim."""
        assert FsReadSecrets().not_claimed(OPEN_READS) == (
            "the backend claims open reads; fs_read_secrets tests only the reads claim"
        )
        assert FsReadSecrets().not_claimed(SSH_ONLY) is None


class TestProtected:
    def _wrote(self, spec: FsProtectedInWorkspace, ctx: CellContext, *keys: str) -> dict[str, Any]:
        """Plant the nonce in `keys` (as a payload that got through would) and report them."""
        for key in keys:
            path = ctx.workspace / {"git-hook": ".git/hooks/pre-commit", "bashrc": ".bashrc"}[key]
            path.write_text(f"#!/bin/sh\n# {ctx.nonce}\n")
            path.chmod(0o755)
        (ctx.workspace / spec.control_name(ctx)).write_text(ctx.nonce)
        attempts = [att("workspace-file", "control", "succeeded")]
        for key in ("git-hook", "git-config", "bashrc"):
            outcome = "succeeded" if key in keys else "refused"
            attempts.append(att(key, "escape", outcome, errno=None if key in keys else "EROFS"))
        return report(*attempts)

    def test_protected_hook_written_is_fail_naming_the_claim(self, make_ctx: Any) -> None:
        """A write to a claimed-protected hook is FAIL naming the claim and the path."""
        spec = FsProtectedInWorkspace()
        ctx = make_ctx(spec, HOOKS)
        spec.prepare(ctx)
        decision = judge(spec, ctx, self._wrote(spec, ctx, "git-hook"))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(
            "escape observed by the host: claims .git/hooks protected inside the workspace; "
            "the payload wrote git-hook (.git/hooks/pre-commit)"
        )

    def test_unclaimed_path_is_exposure_not_fail(self, make_ctx: Any) -> None:
        """A .bashrc write under a .git/hooks claim is reported as exposure; the claim held."""
        spec = FsProtectedInWorkspace()
        ctx = make_ctx(spec, HOOKS)
        spec.prepare(ctx)
        decision = judge(spec, ctx, self._wrote(spec, ctx, "bashrc"))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "exposure, not claimed protected: the payload planted bashrc" in decision.reason

    def test_claim_this_probe_cannot_test_is_inconclusive(self, make_ctx: Any) -> None:
        """Protected paths this probe never writes leave the claim untested."""
        spec = FsProtectedInWorkspace()
        ctx = make_ctx(spec, DeclaredClaims("proxy", "workspace", "isolated", protected=("docs",)))
        spec.prepare(ctx)
        decision = judge(spec, ctx, self._wrote(spec, ctx))
        assert decision.verdict is Verdict.INCONCLUSIVE
        assert "claims docs protected inside the workspace, none of which" in decision.reason


class TestLinkEscape:
    def _ops(self, ctx: CellContext, **outcomes: str) -> dict[str, Any]:
        """Every canary op refused unless named (`sibling_symlink_read="succeeded"`)."""
        attempts = []
        for key in ("sibling", "tmp"):
            for op in ("symlink-read", "symlink-write", "hardlink", "rename-in", "rename-out"):
                outcome = outcomes.get(f"{key}_{op.replace('-', '_')}", "refused")
                attempts.append(att(f"{key}:{op}", "escape", outcome, errno="EACCES"))
        del ctx
        return report(*attempts)

    def test_open_reads_leave_the_read_part_unjudged(self, make_ctx: Any) -> None:
        """Under reads = "open" a symlink read of a canary is no escape; writes still count."""
        spec = FsLinkEscape()
        ctx = make_ctx(spec, OPEN_READS)
        spec.prepare(ctx)
        rep = self._ops(ctx, sibling_symlink_read="succeeded")
        assessment = spec.assess(ctx, rep, Records(), OK_CONTROL)
        assert assessment.escape == "refused"
        assert "the reads part is not judged: the backend claims open reads" in assessment.reasons

    def test_hardlink_under_workspace_writes_names_the_writes_claim(self, make_ctx: Any) -> None:
        """A hardlink that changed a canary is an escape naming the writes claim."""
        spec = FsLinkEscape()
        ctx = make_ctx(spec, OPEN_READS)
        spec.prepare(ctx)
        os.link(spec.canaries(ctx)["sibling"], ctx.workspace / "stolen")
        assessment = spec.assess(ctx, self._ops(ctx), Records(), OK_CONTROL)
        assert assessment.escape == "escaped"
        assert assessment.reasons[0].startswith(
            'claims writes limited to the workspace (implied by filesystem = "workspace"); '
            "host sees the canary reached: sibling"
        )

    def test_open_reads_and_writes_are_not_applicable(self) -> None:
        """A backend that claims neither reads nor writes confined is NOT_APPLICABLE here."""
        declared = DeclaredClaims("none", "open", "isolated")
        assert FsLinkEscape().not_claimed(declared) == (
            "the backend claims open reads and writes; fs_link_escape tests only those"
        )


class TestEnvironment:
    def _leak(self, make_ctx: Any, declared: DeclaredClaims) -> Decision:
        """The payload saw a planted canary variable (by its salted hash)."""
        spec = EnvInheritance()
        ctx = make_ctx(spec, declared)
        targets = spec.prepare(ctx)
        salt, name = targets["salt"], spec.names(ctx)[0]
        rep = report(
            att(
                "env-declared",
                "control",
                "succeeded",
                check_hash=salted_hash(salt, f"check-{ctx.nonce}"),
            ),
            att("env-canary", "escape", "refused"),
            att("env-undeclared", "escape", "refused"),
            att("fds-std", "control", "succeeded"),
            att("fds", "escape", "refused", targets={}),
            env={name: salted_hash(salt, os.environ[name])},
        )
        return decide("denied", spec.assess(ctx, rep, Records(), spec.host_control(ctx)))

    def test_scrubbed_claim_fail_names_it(self, make_ctx: Any) -> None:
        """Under a scrubbed environment a canary variable inside is FAIL naming the claim."""
        decision = self._leak(make_ctx, SCRUBBED)
        assert decision.verdict is Verdict.FAIL
        assert (
            "claims a scrubbed environment; the host's canary variables reached the payload"
            in decision.reason
        )

    def test_passthrough_leaves_the_scrub_part_not_applicable(self, make_ctx: Any) -> None:
        """Under environment = "passthrough" the variables are not judged; the rest is."""
        passthrough = DeclaredClaims("proxy", "workspace", "isolated", environment="passthrough")
        decision = self._leak(make_ctx, passthrough)
        assert decision.verdict is Verdict.PASS, decision.reason
        assert decision.reason.startswith(
            "claims environment passthrough, so the scrub part is NOT_APPLICABLE"
        )


def spec_hashes(ctx: CellContext) -> dict[str, str]:
    """The hashes fs_read_secrets planted, from its saved state."""
    import json  # noqa: PLC0415

    return dict(json.loads((ctx.cell_dir / "host-state.json").read_text())["hashes"])


def net_report(outcome: str) -> dict[str, Any]:
    """A net_direct_egress report whose two direct attempts had `outcome` (EPERM if refused)."""
    errno = "EPERM" if outcome == "refused" else None
    return report(
        att("tcp-direct", "escape", outcome, errno=errno),
        att("udp-direct", "escape", outcome, errno=errno),
    )


SHARED_VIEW: dict[str, Any] = {
    "seen": True,
    "pid": 4242,
    "shared_with_harness": ["net", "user"],
    "namespaces": {"net": "net:[4026531840]"},
    "status": {"Uid": "1000 1000 1000 1000", "Seccomp": "2", "CapEff": "0000000000000000"},
    "default_routes": [],
}


class TestNetworkCut:
    def _ctx(self, make_ctx: Any, probe: str, declared: DeclaredClaims) -> CellContext:
        ctx: CellContext = make_ctx(PROBES[probe], declared)
        ctx.host_view.update(SHARED_VIEW)
        return ctx

    def test_seccomp_cut_in_the_shared_netns_is_judged_by_refusals(self, make_ctx: Any) -> None:
        """A seccomp cut sharing the harness netns PASSes when every connect was refused."""
        ctx = self._ctx(make_ctx, "net_direct_egress", SECCOMP)
        decision = judge(PROBES["net_direct_egress"], ctx, net_report("refused"))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert decision.reason.startswith(
            'claims network = "none" cut by seccomp: it shares the harness\'s network '
            "namespace by design, so it is judged by the refused connects: every direct attempt "
            "was refused and no witness heard anything"
        )

    def test_seccomp_cut_with_a_witness_hit_is_fail_naming_it(self, make_ctx: Any) -> None:
        """A seccomp claim the listener heard through is FAIL naming the claim first."""
        ctx = self._ctx(make_ctx, "net_direct_egress", SECCOMP)
        heard = Records(direct_tcp=[{"peer": "127.0.0.1:5", "data": f"nonce={ctx.nonce}"}])
        decision = judge(PROBES["net_direct_egress"], ctx, net_report("succeeded"), heard)
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(
            'escape observed by the host: claims network = "none" cut by seccomp; the listener '
            "heard the payload"
        )

    def test_namespace_cut_in_the_shared_netns_is_fail(self, make_ctx: Any) -> None:
        """A namespace claim whose payload shares the harness netns FAILs on the host's view."""
        ctx = self._ctx(make_ctx, "net_direct_egress", NAMESPACE)
        decision = judge(PROBES["net_direct_egress"], ctx, net_report("refused"))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(
            'escape observed by the host: claims network = "none" cut by namespace; the payload '
            "(host pid 4242) ran in the harness's network namespace"
        )

    def test_dns_hit_names_the_network_claim(self, make_ctx: Any) -> None:
        """A query the DNS fixture heard under a network claim is FAIL naming it."""
        ctx = self._ctx(make_ctx, "dns_resolution", SECCOMP)
        rep = report(att("udp-query", "escape", "succeeded"), att("tcp-query", "escape", "refused"))
        query = {"name": f"{ctx.nonce}.{PROBE_NAME_SUFFIX}", "qtype": "A", "transport": "udp"}
        heard = Records(dns=[query])
        decision = judge(PROBES["dns_resolution"], ctx, rep, heard)
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(
            'escape observed by the host: claims network = "none" cut by seccomp; the DNS '
            "fixture heard the payload"
        )


class TestProcClaims:
    BASELINE: dict[str, Any] = {  # noqa: RUF012  (read only)
        "attempts": [att("getpid", "control", "succeeded"), att("keyctl", "escape", "succeeded")]
    }

    def test_reached_syscall_names_the_filtered_claim(self, make_ctx: Any) -> None:
        """A call the baseline reaches, reached inside under a filtered claim: FAIL naming it.

        The host read no filter state here, so the escape is the payload's word, believed
        against the sandbox, and the reason says so (issue 27).
        """
        spec = PROBES["proc_syscall_surface"]
        ctx = make_ctx(spec, SCRUBBED)
        rep = report(att("getpid", "control", "succeeded"), att("keyctl", "escape", "succeeded"))
        control = OK_CONTROL | {"baseline": self.BASELINE}
        decision = decide(spec.expectation(ctx.claims), spec.assess(ctx, rep, Records(), control))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(
            "escape reported by the payload (not seen by the host): claims a filtered syscall "
            'surface (implied by ipc = "isolated"); the payload reached keyctl'
        )

    @pytest.mark.parametrize(
        ("status", "said"),
        [
            ({"Seccomp": "0"}, "escape observed by the host: "),
            ({"Seccomp": "2", "Seccomp_filters": "1"}, "escape reported by the payload"),
        ],
        ids=["no-filter-seen", "filter-seen"],
    )
    def test_a_reach_is_host_seen_only_where_no_filter_could_refuse(
        self, make_ctx: Any, status: dict[str, str], said: str
    ) -> None:
        """Keyctl reached: the host backs it where it sees no seccomp filter on the payload."""
        spec = PROBES["proc_syscall_surface"]
        ctx = make_ctx(spec, SCRUBBED)
        ctx.host_view.update(SHARED_VIEW | {"status": status})
        rep = report(att("getpid", "control", "succeeded"), att("keyctl", "escape", "succeeded"))
        control = OK_CONTROL | {"baseline": self.BASELINE}
        decision = decide(spec.expectation(ctx.claims), spec.assess(ctx, rep, Records(), control))
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(said), decision.reason

    def _privileges(self, make_ctx: Any, uids: str) -> Decision:
        spec = PROBES["proc_privileges"]
        ctx = make_ctx(spec, NON_ROOT)
        ctx.host_view.update(SHARED_VIEW | {"status": {"Uid": uids, "CapEff": "0" * 16}})
        rep = report(
            att("read-status", "control", "succeeded"),
            att("effective-capabilities", "escape", "refused"),
            att("setuid-elevation", "escape", "refused", errno="EPERM"),
            att("writable-root-path", "escape", "refused", errno="EROFS"),
            status={"CapEff": "0" * 16},
        )
        control = OK_CONTROL | {"baseline": {"facts": {"status": {"CapEff": "0" * 16}}}}
        return decide(spec.expectation(ctx.claims), spec.assess(ctx, rep, Records(), control))

    def test_runs_as_is_held_to_the_host_uid_reading(self, make_ctx: Any) -> None:
        """A non-root claim the host sees running with uid 0 is FAIL naming the claim."""
        decision = self._privileges(make_ctx, "0 0 0 0")
        assert decision.verdict is Verdict.FAIL
        assert decision.reason.startswith(
            'escape observed by the host: claims runs_as = "non-root"; the host sees the '
            "payload (host pid 4242) run with uids 0 0 0 0"
        )

    def test_runs_as_that_holds_is_recorded(self, make_ctx: Any) -> None:
        """A non-root claim the host sees holding leaves the verdict to the rest, and says so."""
        decision = self._privileges(make_ctx, "1000 1000 1000 1000")
        assert decision.verdict is Verdict.PASS, decision.reason
        assert 'claims runs_as = "non-root": the host sees host pid 4242 with uids 1000' in (
            decision.reason
        )
