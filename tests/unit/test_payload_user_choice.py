"""Who the payload runs as: a neutral default, a choice of the user's (issue 23)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_attest.errors import ConfigError
from sandbox_attest.host import trust
from sandbox_attest.payload import TELLTALE_WORDS

REPO = Path(__file__).resolve().parents[2]


def test_the_default_account_says_nothing_about_a_test() -> None:
    """The default name and home (both in /etc/passwd) carry no telltale word."""
    shown = f"{trust.PAYLOAD_USER} {trust.PAYLOAD_HOME}".lower()
    assert [w for w in TELLTALE_WORDS if w in shown] == []


def test_a_persons_account_with_the_default_name_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An existing `agent` with a person's uid is never taken over: its home is not ours."""
    person = trust.PayloadUser(trust.PAYLOAD_USER, 1500, 1500, frozenset(), Path("/home/agent"))
    monkeypatch.setattr(trust, "separation_possible", lambda: (True, ""))
    monkeypatch.setattr(trust, "_cached", {})
    monkeypatch.setattr(trust, "_lookup", lambda _name: person)
    monkeypatch.delenv(trust.USER_ENV, raising=False)
    with pytest.raises(ConfigError, match="a person's account") as caught:
        trust.payload_user()
    assert "--payload-user" in str(caught.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="a payload user is looked up only as root")
def test_run_payload_user_is_the_account_looked_up() -> None:
    """`run --payload-user NAME` reaches the lookup: a missing account stops the run, named."""
    env = {k: v for k, v in os.environ.items() if k != trust.USER_ENV}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox_attest.cli",
            "run",
            "--world",
            "loopback",
            "--payload-user",
            "no-such-account-h7",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "'no-such-account-h7' does not exist" in done.stderr
