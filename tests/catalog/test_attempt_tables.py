"""Each probe's table of attempts, and the check that a report lists exactly those.

The tables are read against hand-made reports here; the live tests (tests/catalog/test_host.py,
tests/catalog/test_net.py, tests/integration/test_report_belief.py) run the real payloads
through the real runner, where every report passes the same check.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_attest.catalog import PROBES, AttemptTable, report_mismatch
from sandbox_attest.catalog.attempts import attempts_of
from sandbox_attest.catalog.spec import CRASH_ATTEMPT

# A task for every probe whose table reads its targets, shaped as its spec's prepare makes it.
TASKS: dict[str, dict[str, Any]] = {
    "net_direct_egress": {
        "targets": {
            "tcp": "198.18.0.2:4000",
            "udp": "198.18.0.2:4001",
            "extra_addresses": ["198.18.0.2", "2001:db8::2"],
        }
    },
    "dns_resolution": {"targets": {"system_resolver": True}},
    "ipc_unix_socket_escape": {
        "targets": {"abstract": "sa-abstract", "docker_sockets": ["/run/docker.sock"]}
    },
    "ipc_proxy_socket_tamper": {"proxy_url": "http://127.0.0.1:3128"},
    "fs_write_outside": {"targets": {"dirs": {"home": "/h", "tmp": "/t"}}},
    "fs_read_secrets": {"targets": {"secrets": {"ssh": "/h/.ssh/id", "aws": "/h/.aws/c"}}},
    "fs_protected_in_workspace": {"targets": {"paths": {"bashrc": ".bashrc"}}},
    "fs_link_escape": {"targets": {"canaries": {"tmp": "/t/c"}}},
    "net_host_canonical": {"targets": {"requests": [{"what": "connect-canonical"}]}},
    "net_proxy_confusion": {"targets": {"requests": [{"what": "get-duplicate-host"}]}},
    "net_private_address": {"targets": {"requests": [{"what": "connect-loopback"}]}},
    "net_proxy_smuggling": {"targets": {"requests": [{"what": "cl-te"}]}},
    "net_proxy_upgrade": {"targets": {"requests": [{"what": "upgrade-h2c-allowed"}]}},
    "net_dns_rebinding": {"targets": {"requests": [{"what": "get-rebind"}]}},
    "net_proxy_relay": {"targets": {"requests": [{"what": "relay-through-proxy"}]}},
}


def report(*names: str, outcome: str = "refused") -> list[dict[str, Any]]:
    """Attempts by these names, all with one outcome."""
    return [{"what": n, "role": "escape", "outcome": outcome} for n in names]


def full(table: AttemptTable) -> list[dict[str, Any]]:
    """Exactly the required attempts of `table`."""
    return report(*sorted(table.required))


class TestEverySpec:
    @pytest.mark.parametrize("probe", sorted(PROBES))
    def test_declares_a_table(self, probe: str) -> None:
        """Every spec in the catalogue lists the attempts its payload makes."""
        table = PROBES[probe].attempt_table(TASKS.get(probe, {}))
        assert table.required
        assert CRASH_ATTEMPT not in table.required

    @pytest.mark.parametrize("probe", sorted(PROBES))
    def test_its_own_attempts_match(self, probe: str) -> None:
        """A report with exactly the required attempts matches its probe."""
        table = PROBES[probe].attempt_table(TASKS.get(probe, {}))
        assert table.mismatch(full(table)) is None

    @pytest.mark.parametrize("probe", sorted(PROBES))
    def test_one_invented_attempt_is_a_mismatch(self, probe: str) -> None:
        """The forged one-line report `{"what": "all", "outcome": "refused"}` matches no probe."""
        table = PROBES[probe].attempt_table(TASKS.get(probe, {}))
        reason = table.mismatch(report("all"))
        assert reason is not None
        assert reason.startswith("report does not match probe: missing [")
        assert reason.endswith("unexpected [all]")


class TestTheCheck:
    TABLE = AttemptTable(
        required=attempts_of("control", ("home", ("create", "chmod"))),
        optional=frozenset({"docker:/run/docker.sock"}),
        discovered=("tcp-own-",),
        excuses=(("setup", frozenset({"control"})),),
    )

    def test_exact_report_matches(self) -> None:
        """The required names, plus optional and discovered ones, match."""
        names = ("control", "home:create", "home:chmod", "docker:/run/docker.sock", "tcp-own-::1")
        assert self.TABLE.mismatch(report(*names)) is None

    def test_missing_and_unexpected_are_both_named(self) -> None:
        """A dropped attempt and an invented one are named, sorted, in the reason."""
        reason = self.TABLE.mismatch(report("control", "home:create", "home:delete"))
        assert reason == (
            "report does not match probe: missing [home:chmod], unexpected [home:delete]"
        )

    def test_an_attempt_listed_twice_is_unexpected(self) -> None:
        """Each attempt is made once; a repeated name is not the probe's."""
        reason = self.TABLE.mismatch(report("control", "home:create", "home:chmod", "control"))
        assert reason is not None
        assert "control (listed 2 times)" in reason

    def test_crash_attempt_excuses_what_is_missing(self) -> None:
        """The payload's own crash, reported as an error, accounts for the attempts not made."""
        assert self.TABLE.mismatch(report("control", CRASH_ATTEMPT, outcome="error")) is None

    def test_a_refused_crash_attempt_excuses_nothing(self) -> None:
        """Only an `error` outcome states a reason; the name alone does not."""
        reason = self.TABLE.mismatch(report(CRASH_ATTEMPT))
        assert reason is not None
        assert "missing [control, home:chmod, home:create]" in reason

    def test_an_excuse_stands_for_its_names_only(self) -> None:
        """A setup error accounts for the control it prevented, not for the escapes."""
        errors = [*report("setup", outcome="error"), *report("home:create", "home:chmod")]
        assert self.TABLE.mismatch(errors) is None
        reason = self.TABLE.mismatch(report("setup", outcome="error"))
        assert reason is not None
        assert "missing [home:chmod, home:create]" in reason


class TestDerivedFromTheTask:
    def test_direct_egress_dials_every_lab_address_once(self) -> None:
        """net_direct_egress expects TCP and UDP to each given address but the listener's own."""
        table = PROBES["net_direct_egress"].attempt_table(TASKS["net_direct_egress"])
        assert table.required == {"tcp-direct", "udp-direct", "tcp-2001:db8::2", "udp-2001:db8::2"}

    def test_dns_system_resolver_only_when_asked(self) -> None:
        """The system resolver is an attempt only where the task asks for it."""
        spec = PROBES["dns_resolution"]
        assert "system-resolver" in spec.attempt_table(TASKS["dns_resolution"]).required
        assert "system-resolver" not in spec.attempt_table({"targets": {}}).required

    def test_route_after_only_with_a_proxy_url(self) -> None:
        """The tamper probe checks the route afterwards only through a proxy URL it was given."""
        spec = PROBES["ipc_proxy_socket_tamper"]
        assert "route-after" in spec.attempt_table(TASKS["ipc_proxy_socket_tamper"]).required
        assert "route-after" not in spec.attempt_table({"proxy_url": "from-env"}).required

    def test_a_mismatch_never_reaches_an_assessor(self) -> None:
        """report_mismatch rejects attempts that are not objects before any table is read."""
        reason = report_mismatch(PROBES["dns_resolution"], {}, {"attempts": ["udp-query"]})
        assert reason == "report does not match probe: its attempts are not a list of objects"
