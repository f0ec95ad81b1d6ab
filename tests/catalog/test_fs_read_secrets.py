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
from pathlib import Path
from typing import Any

import pytest

from sandbox_attest.backends.base import DeclaredClaims
from sandbox_attest.catalog import CellContext
from sandbox_attest.catalog.fs import FsReadSecrets
from sandbox_attest.payload import INPUT_DIR, STAGED_TASK
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


def stage_task(ctx: CellContext) -> Path:
    """The task the payload would read (cell_dir/input/config.json), as the runner stages it."""
    inputs = ctx.cell_dir / INPUT_DIR
    inputs.mkdir()
    task = inputs / STAGED_TASK
    targets = {"secrets": {k: str(p) for k, p in SPEC.secret_paths(ctx).items()}}
    task.write_text(json.dumps({"nonce": ctx.nonce, "targets": targets}))
    return task


def mountinfo(pid: int) -> str:
    """`pid`'s mountinfo ("/newroot" while bwrap has not pivoted into the sandbox's root)."""
    try:
        return Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return "/newroot"


def agent(ctx: CellContext) -> Path:
    """Where TestMountedElsewhere's sandbox shows the home: an empty dir of the cell's."""
    return ctx.cell_dir / "agent"


class TestMountedElsewhere:
    """The home mounted at another path (its canary folders hidden at their host paths).

    The other path is an empty dir of the cell's (`agent`): the view's / is the host's, read-only,
    so bwrap can make no new mount point in it.
    """

    @pytest.fixture
    def seen(self, planted: CellContext) -> tuple[CellContext, Path]:
        """The rendezvous reading of a payload whose view has the home at `<cell>/agent`."""
        task = stage_task(planted)
        home = SPEC.secret_paths(planted)["ssh"].parent.parent
        (planted.cell_dir / "agent").mkdir()
        with sandboxed([*hiding(planted), "--bind", str(home), str(agent(planted))]) as pid:
            # As at a real rendezvous: the sandbox's root is in place (bwrap has pivoted).
            wait_for(lambda: mountinfo(pid), lambda text: "/newroot" not in text)
            planted.host_view[SPEC.id] = SPEC.at_rendezvous(planted, pid)
            look(planted, pid)
        return planted, task

    def test_the_canaries_are_added_to_the_task_at_their_inside_paths(
        self, seen: tuple[CellContext, Path]
    ) -> None:
        """Each home canary is found at the other path by identity and added to the task."""
        ctx, task = seen
        added = ctx.host_view[SPEC.id]["added"]
        ssh = SPEC.secret_paths(ctx)["ssh"]
        at = agent(ctx)
        assert added[f"ssh@{at}"] == f"{at}/.ssh/{ssh.name}"
        assert set(added) == {f"ssh@{at}", f"aws@{at}", f"docker@{at}"}
        staged = json.loads(task.read_text())["targets"]["secrets"]
        assert staged[f"ssh@{at}"] == added[f"ssh@{at}"]
        assert SPEC.attempt_table({"nonce": ctx.nonce, "targets": {"secrets": {}}}).optional == (
            frozenset(added)
        )

    def test_a_read_there_fails_naming_the_inside_path_and_the_fix(
        self, seen: tuple[CellContext, Path]
    ) -> None:
        """The ssh canary's bytes read at the other path: FAIL naming the mount and the fix."""
        ctx, _ = seen
        rep = refused_report(ctx)
        rep["attempts"].append(
            att(f"ssh@{agent(ctx)}", "escape", "succeeded", sha256=hashes(ctx)["ssh"])
        )
        decision = on_wrapper(ctx, rep)
        assert decision.verdict is Verdict.FAIL, decision.reason
        home = SPEC.secret_paths(ctx)["ssh"].parent.parent
        at = agent(ctx)
        assert f"the sandbox mounts the host's {home} at {at} (writable)" in decision.reason
        assert f"fix: do not mount the host's {home} into the sandbox" in decision.reason

    def test_a_refusal_there_rests_on_the_payloads_word(
        self, seen: tuple[CellContext, Path]
    ) -> None:
        """Every read refused, the added ones too: the canary is in view, so no PASS."""
        ctx, _ = seen
        rep = refused_report(ctx)
        for key in ctx.host_view[SPEC.id]["added"]:
            rep["attempts"].append(att(key, "escape", "refused", errno="EACCES"))
        decision = on_wrapper(ctx, rep)
        assert decision.verdict is Verdict.INCONCLUSIVE, decision.reason
        assert f"ssh at {agent(ctx)}/.ssh/" in decision.reason
        assert "the host could not map" not in decision.reason

    def test_an_added_path_left_untried_is_not_a_pass(self, seen: tuple[CellContext, Path]) -> None:
        """A report without the added paths (a stale task): not PASS, naming them."""
        ctx, _ = seen
        decision = on_wrapper(ctx, refused_report(ctx))
        assert decision.verdict is not Verdict.PASS, decision.reason
        assert "no attempt at the inside paths the host added" in decision.reason
