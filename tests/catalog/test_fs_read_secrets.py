"""fs_read_secrets: the host's own look at the denied canaries in the payload's view.

Real canaries planted by the spec, real processes read from the host at /proc/<pid>/root:
under bubblewrap with a tmpfs over each canary's folder (not in the view), with a file of
the sandbox's own at a canary's path (another inode), and unconfined (the host's own inode).
Each cell is judged as on a command wrapper, where only a host reading makes a PASS.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import CellContext
from sandbox_attest.catalog.fs import FsReadSecrets
from sandbox_attest.run.hostview import read_process
from sandbox_attest.verdict import Decision, Verdict, believe, decide
from tests.catalog.test_host import OK_CONTROL, Records, att, make_ctx, report
from tests.unit.test_hostview import SLEEPER, sandboxed, started, wait_for

__all__ = ["make_ctx"]  # the fixture, imported so this module's tests can ask for it

SCRUBBED = DeclaredClaims("proxy", "workspace", "isolated")
SSH_ONLY = DeclaredClaims("proxy", "workspace", "isolated", reads="deny", read_deny=("~/.ssh",))
SPEC = FsReadSecrets()
CORROBORATED = ["the payload's view of the canary paths, read by the host"]

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
    # The canaries go in the harness user's home, owned by root, which the sandboxes cover.
    pytest.mark.skipif(os.geteuid() != 0, reason="bubblewrap's --tmpfs over /root needs root"),
]


def hashes(ctx: CellContext) -> dict[str, str]:
    """The hashes prepare planted, from its saved state."""
    return dict(json.loads((ctx.cell_dir / "host-state.json").read_text())["hashes"])


def refused_report(ctx: CellContext, *leaked: str) -> dict[str, Any]:
    """The workspace control read; `leaked` canaries read by their real bytes, others refused."""
    planted = hashes(ctx)
    attempts = [att("workspace", "control", "succeeded", sha256=planted["workspace"])]
    for key in SPEC.secret_paths(ctx):
        if key in leaked:
            attempts.append(att(key, "escape", "succeeded", sha256=planted[key]))
        else:
            attempts.append(att(key, "escape", "refused", errno="EACCES"))
    return report(*attempts)


def on_wrapper(ctx: CellContext, rep: dict[str, Any]) -> Decision:
    """The decision as the runner makes it for a command wrapper's cell."""
    assessment = SPEC.assess(ctx, rep, Records(), OK_CONTROL)
    return believe(
        decide(SPEC.expectation(ctx.claims), assessment), assessment, crossed_wrapper=True
    )


def look(ctx: CellContext, pid: int) -> None:
    """Take the rendezvous reading of `pid` with the spec's look paths, as the runner does."""
    ctx.host_view.update({"seen": True, **read_process(pid, SPEC.look_paths(ctx))})


def hiding(ctx: CellContext) -> list[str]:
    """The bubblewrap options that cover every canary's folder with a tmpfs of the sandbox's own."""
    folders = sorted({str(p.parent) for p in SPEC.secret_paths(ctx).values()})
    return [opt for folder in folders for opt in ("--tmpfs", folder)]


@pytest.fixture
def planted(make_ctx: Any) -> CellContext:
    """A cell under reads = "workspace" with its canaries planted (make_ctx cleans up)."""
    ctx: CellContext = make_ctx(SPEC, SCRUBBED)
    SPEC.prepare(ctx)
    return ctx


class TestLookPaths:
    def test_every_canary_is_looked_at_under_a_workspace_claim(self, planted: CellContext) -> None:
        """Under reads = "workspace" the host looks for every planted canary."""
        assert SPEC.look_paths(planted) == [str(p) for p in SPEC.secret_paths(planted).values()]

    def test_only_the_denied_canaries_are_looked_at(self, make_ctx: Any) -> None:
        """Under a deny-list of ~/.ssh only the ssh canary is looked at."""
        ctx = make_ctx(SPEC, SSH_ONLY)
        assert SPEC.look_paths(ctx) == [str(SPEC.secret_paths(ctx)["ssh"])]


class TestOnAWrapper:
    def test_canaries_absent_from_the_view_back_the_refusal(self, planted: CellContext) -> None:
        """Every canary absent from the payload's view: the refusal is a corroborated PASS."""
        with sandboxed(hiding(planted)) as pid:
            look(planted, pid)
        decision = on_wrapper(planted, refused_report(planted))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "absent there [aws, docker, dotenv, ssh]" in decision.reason
        assert SPEC.corroboration(planted, {}) == CORROBORATED

    def test_the_sandboxs_own_file_at_a_canary_path_backs_it_too(
        self, planted: CellContext
    ) -> None:
        """A file of the sandbox's own where the ssh canary is (another inode) backs the PASS."""
        ssh = SPEC.secret_paths(planted)["ssh"]
        code = f"open({str(ssh)!r}, 'w').write('decoy'); {SLEEPER}"
        with sandboxed(hiding(planted), code) as pid:
            wait_for(lambda: read_process(pid, [str(ssh)]), lambda v: v["looked"][0]["visible"])
            look(planted, pid)
        decision = on_wrapper(planted, refused_report(planted))
        assert decision.verdict is Verdict.PASS, decision.reason
        assert "another file than the host's [ssh]" in decision.reason

    def test_a_canary_in_view_at_the_hosts_inode_stays_on_the_payloads_word(
        self, planted: CellContext
    ) -> None:
        """An unconfined view holds the host's own canaries: a reported refusal is INCONCLUSIVE."""
        with started([sys.executable, "-c", SLEEPER]) as proc:
            look(planted, proc.pid)
        decision = on_wrapper(planted, refused_report(planted))
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason
        assert "visible in the payload's view as the host's own file" in decision.reason
        assert SPEC.corroboration(planted, {}) == []

    def test_a_canary_read_is_fail_whatever_the_view(self, planted: CellContext) -> None:
        """The ssh canary's bytes in the report: FAIL, even though the host saw it hidden."""
        with sandboxed(hiding(planted)) as pid:
            look(planted, pid)
        decision = on_wrapper(planted, refused_report(planted, "ssh"))
        assert decision.verdict is Verdict.FAIL, decision.reason
        assert "the payload read the host's canary bytes: ssh" in decision.reason

    def test_no_rendezvous_is_no_corroboration(self, planted: CellContext) -> None:
        """Where the host never saw the payload, a refusal stays INCONCLUSIVE, saying why."""
        planted.host_view.update({"seen": False, "why": "the payload never reached the rendezvous"})
        decision = on_wrapper(planted, refused_report(planted))
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason
        assert (
            "the host did not look at the payload's view of the canaries: the payload never "
            "reached the rendezvous" in decision.reason
        )

    def test_a_decoy_process_seeing_the_canary_spoils_it(self, planted: CellContext) -> None:
        """Two payload processes, one of which sees the host's canaries: not corroborated."""
        with (
            sandboxed(hiding(planted)) as pid,
            started([sys.executable, "-c", SLEEPER]) as other,
        ):
            look(planted, pid)
            planted.host_view["others"] = [read_process(other.pid, SPEC.look_paths(planted))]
        decision = on_wrapper(planted, refused_report(planted))
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason
