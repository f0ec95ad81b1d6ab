"""measure_as: a harness function called in a child running as the payload user."""

from __future__ import annotations

import os

import pytest

from sandbox_attest.host.trust import measure_as, payload_user

USER = payload_user()
pytestmark = pytest.mark.skipif(USER is None, reason="needs the root harness's payload user")


def whoami() -> dict[str, int]:
    """The measuring child's own uid and gid (called by name in that child)."""
    return {"uid": os.getuid(), "gid": os.getgid()}


def explode() -> None:
    """A measurement that fails, as a broken host function would."""
    msg = "no measurement here"
    raise RuntimeError(msg)


def test_the_child_runs_as_the_payload_user() -> None:
    """The function's result comes back decoded, measured under the payload user's ids."""
    assert USER is not None
    found, why = measure_as(USER, __name__, "whoami", 30)
    assert why == ""
    assert found == {"uid": USER.uid, "gid": USER.gid}
    assert USER.uid != os.getuid()


def test_a_failed_measurement_says_why() -> None:
    """A child that raises gives no value and the tail of its stderr."""
    assert USER is not None
    found, why = measure_as(USER, __name__, "explode", 30)
    assert found is None
    assert why.startswith("exit 1: ")
    assert "RuntimeError: no measurement here" in why
