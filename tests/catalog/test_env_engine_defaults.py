"""env_inheritance: a value the sandbox sets itself is no inherited variable (issue 27).

The reading below is what a container engine hands a payload: docker with `-t` (and podman
always) sets `TERM=xterm` itself, whatever the harness has. Before, a harness that also ran
with `TERM=xterm` saw its own value inside and judged the engine's default inherited: FAIL.
What proves inheritance is a value only the harness had: the planted canaries (random, this
cell's alone) and any other harness value the engine would not have produced by itself.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.catalog import PROBES
from sandbox_attest.catalog.controls import load_state
from sandbox_attest.catalog.env import EnvInheritance, salted_hash
from sandbox_attest.catalog.spec import CellContext
from sandbox_attest.payload import payload_env
from sandbox_attest.verdict import Verdict, decide
from tests.catalog.test_assess import Records
from tests.catalog.test_corroboration import ctx as make_ctx
from tests.catalog.test_env_fds import STDIO

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SPEC = PROBES["env_inheritance"]


def process(env_names: list[str]) -> dict[str, Any]:
    """The host's reading of the payload: its variable names, fds 0-2 only."""
    fds = {n: e["link"] for n, e in STDIO.items()}
    return {"seen": True, "pid": 4242, "env_names": env_names, "fds": fds, "fd_ids": STDIO}


def report(ctx: CellContext, inside: dict[str, str]) -> dict[str, Any]:
    """What the payload writes when its environment is the declared one plus `inside`."""
    salt = str(load_state(ctx)["salt"])
    env = {**payload_env("http://127.0.0.1:1", ctx.workspace), **inside}
    declared = set(EnvInheritance.declared(ctx))
    extra = sorted(n for n in env if n not in declared)

    def attempt(what: str, role: str, outcome: str, **more: Any) -> dict[str, Any]:
        return {"what": what, "role": role, "outcome": outcome, "detail": "", **more}

    return {
        "facts": {"env": {n: salted_hash(salt, v) for n, v in env.items()}, "fds": {}},
        "attempts": [
            attempt(
                "env-declared",
                "control",
                "succeeded",
                check_hash=salted_hash(salt, f"check-{ctx.nonce}"),
            ),
            attempt("env-canary", "escape", "refused", names=[]),
            attempt("env-undeclared", "escape", "succeeded" if extra else "refused", names=extra),
            attempt("fds-std", "control", "succeeded"),
            attempt("fds", "escape", "refused", targets={}),
        ],
    }


@pytest.fixture
def cell(tmp_path: Path) -> Iterator[CellContext]:
    """A prepared env_inheritance cell (canaries planted, canary pipe open), cleaned after."""
    ctx = make_ctx(tmp_path, "env_inheritance", {})
    SPEC.prepare(ctx)
    try:
        yield ctx
    finally:
        SPEC.cleanup(ctx)


def judge(ctx: CellContext, inside: dict[str, str]) -> tuple[Verdict, str, dict[str, Any]]:
    """Assess and decide the cell with the payload's environment so."""
    names = [*payload_env("http://127.0.0.1:1", ctx.workspace), *inside]
    ctx.host_view.update(process(names))
    assessment = SPEC.assess(ctx, report(ctx, inside), Records(), SPEC.host_control(ctx))
    decision = decide(SPEC.expectation(ctx.claims), assessment)
    return decision.verdict, decision.reason, assessment.witness


class TestEngineDefaults:
    def test_docker_term_equal_to_the_harness_is_not_inherited(
        self, cell: CellContext, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Harness TERM=xterm, the engine's own TERM=xterm inside: PASS, the default named."""
        monkeypatch.setenv("TERM", "xterm")
        verdict, reason, witness = judge(cell, {"TERM": "xterm"})
        assert verdict is Verdict.PASS, reason
        assert witness["host_env_hits"] == []
        assert witness["engine_defaults"] == ["TERM"]
        assert "values the sandbox sets itself (an engine's default), which prove no" in reason

    def test_host_hostname_is_what_uname_shows_anyway(
        self, cell: CellContext, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """HOSTNAME equal to the host's name (docker under --network host): no inheritance."""
        monkeypatch.setenv("HOSTNAME", socket.gethostname())
        verdict, reason, _ = judge(cell, {"HOSTNAME": socket.gethostname()})
        assert verdict is Verdict.PASS, reason

    def test_a_term_only_the_harness_had_still_counts(
        self, cell: CellContext, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """TERM with a value no engine sets by itself, equal to the harness's: inherited."""
        monkeypatch.setenv("TERM", "xterm-kitty")
        verdict, reason, witness = judge(cell, {"TERM": "xterm-kitty"})
        assert verdict is Verdict.FAIL, reason
        assert witness["host_env_hits"] == ["TERM"]

    def test_a_real_secret_still_fails(
        self, cell: CellContext, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A harness credential that reached the payload is FAIL, beside an engine default."""
        token = "ghp_" + secrets.token_hex(18)
        monkeypatch.setenv("TERM", "xterm")
        monkeypatch.setenv("GITHUB_TOKEN", token)
        verdict, reason, witness = judge(cell, {"TERM": "xterm", "GITHUB_TOKEN": token})
        assert verdict is Verdict.FAIL, reason
        assert witness["host_env_hits"] == ["GITHUB_TOKEN"]
        assert "undeclared host variables reached the payload: GITHUB_TOKEN" in reason

    def test_the_canaries_still_fail(self, cell: CellContext) -> None:
        """The planted canaries inside: FAIL, whatever else the engine set."""
        planted = {n: os.environ[n] for n in EnvInheritance.names(cell)}
        verdict, reason, _ = judge(cell, {"TERM": "xterm", **planted})
        assert verdict is Verdict.FAIL, reason
        assert "the host's canary variables reached the payload" in reason
