"""ipc_unix_socket_escape's decision table on the control leg (hand-made reports).

The confined-leg rows live in test_assess.py; these pin what the open control leg may vouch
for: only the fake daemon's own log, never the real Docker socket's unwitnessed answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_attest.catalog import PROBES
from sandbox_attest.verdict import Verdict, decide
from tests.catalog.test_proc import CONFINED, OK_CONTROL, OPEN, Records, att, make_ctx


def report(daemon: str, docker: str) -> dict[str, Any]:
    """Fake-daemon attempts with `daemon`, a real Docker attempt with `docker`."""
    docker_attempt = att("docker:/run/docker.sock", docker, status=200, real_docker=True)
    return {
        "attempts": [
            att("socketpair", "succeeded", "control"),
            att("daemon-unix", daemon),
            att("daemon-abstract", daemon),
            docker_attempt,
        ],
        "facts": {},
    }


def test_control_leg_needs_the_fake_daemon_hits(tmp_path: Path) -> None:
    """A real Docker answer cannot stand in for broken fake-daemon attempts on the open leg."""
    ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", OPEN, "none")
    spec = PROBES[ctx.probe]
    assessment = spec.assess(ctx, report("error", "succeeded"), Records(), OK_CONTROL)
    assert assessment.escape == "undecided"
    assert decide("allowed", assessment).verdict is Verdict.INCONCLUSIVE


def test_control_leg_passes_on_fake_daemon_hits(tmp_path: Path) -> None:
    """The fake daemon logged the payload's nonce: the control leg sees its escape."""
    ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", OPEN, "none")
    spec = PROBES[ctx.probe]
    hits = Records(daemon=[{"socket": "unix", "nonce": ctx.nonce}])
    assessment = spec.assess(ctx, report("succeeded", "refused"), hits, OK_CONTROL)
    assert decide("allowed", assessment).verdict is Verdict.PASS


def test_confined_leg_real_docker_answer_still_fails(tmp_path: Path) -> None:
    """Where denial is expected, the real Docker answer alone is still FAIL."""
    ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
    spec = PROBES[ctx.probe]
    assessment = spec.assess(ctx, report("refused", "succeeded"), Records(), OK_CONTROL)
    assert decide("denied", assessment).verdict is Verdict.FAIL


def test_a_cell_without_a_session_says_that_class_went_untested(tmp_path: Path) -> None:
    """No login session was planted for the cell (never prepared here): the reasons say so."""
    ctx = make_ctx(tmp_path, "ipc_unix_socket_escape", CONFINED)
    spec = PROBES[ctx.probe]
    assessment = spec.assess(ctx, report("refused", "refused"), Records(), OK_CONTROL)
    untested = [r for r in assessment.reasons if "login session's sockets were not tested" in r]
    why = "no login session for this cell"
    assert untested == [f"the login session's sockets were not tested: {why}"]
