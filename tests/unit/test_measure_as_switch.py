"""measure_as imports as root, then runs the function as the payload user and nothing more."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sandbox_attest.host.trust import measure_as, payload_user

USER = payload_user()
pytestmark = pytest.mark.skipif(USER is None, reason="needs the root harness's payload user")


def credentials() -> dict[str, str]:
    """The measuring child's ids, groups, capabilities and parent-death signal."""
    import ctypes  # noqa: PLC0415  (in the child only)

    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    signo = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(signo), 0, 0, 0)  # GET_PDEATHSIG
    return {
        "uid": " ".join(status["Uid"].split()),
        "gid": " ".join(status["Gid"].split()),
        "groups": status["Groups"].strip(),
        "cap_eff": status["CapEff"].strip(),
        "cap_prm": status["CapPrm"].strip(),
        "pdeathsig": str(signo.value),
    }


def echo(argument: object) -> object:
    """The argument back, as the child received it."""
    return {"got": argument, "uid": os.getuid()}


def test_the_function_runs_with_the_users_ids_and_no_capabilities() -> None:
    """All uids and gids are the user's, no capability is left, and it still dies with us."""
    assert USER is not None
    found, why = measure_as(USER, __name__, "credentials", 30)
    assert why == ""
    assert found["uid"] == " ".join([str(USER.uid)] * 4)
    assert found["gid"] == " ".join([str(USER.gid)] * 4)
    assert found["groups"].split() == [str(g) for g in sorted(USER.groups)]
    assert int(found["cap_eff"], 16) == 0
    assert int(found["cap_prm"], 16) == 0
    assert found["pdeathsig"] == str(int(signal.SIGKILL))


def test_an_argument_reaches_the_function_as_json() -> None:
    """A given argument is handed to the function (None too); without one it gets none."""
    assert USER is not None
    found, why = measure_as(USER, __name__, "echo", 30, argument={"dirs": ["/tmp"], "n": 2})
    assert why == ""
    assert found == {"got": {"dirs": ["/tmp"], "n": 2}, "uid": USER.uid}
    found, why = measure_as(USER, __name__, "echo", 30, argument=None)
    assert (found, why) == ({"got": None, "uid": USER.uid}, "")
    found, why = measure_as(USER, __name__, "echo", 30)
    assert found is None
    assert "TypeError" in why
