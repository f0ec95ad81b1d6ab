"""Unit tests of the allowlist: canonical hosts, label boundaries, ports, address checks.

These are pure functions: no sockets are opened, so the private and public addresses below
are only strings handed to `address_allowed`, never dialed.
"""

from __future__ import annotations

import pytest

from sandbox_attest.world.egress.rules import (
    Allowlist,
    EgressRequest,
    HostError,
    Rule,
    address_allowed,
    canonical_host,
)


class TestCanonicalHost:
    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            ("allowed.test", "allowed.test"),
            ("ALLOWED.Test", "allowed.test"),
            ("allowed.test.", "allowed.test"),
            ("a-b_c.allowed.test", "a-b_c.allowed.test"),
            ("bücher.test", "xn--bcher-kva.test"),
            ("127.0.0.1", "127.0.0.1"),
            ("0.0.0.0", "0.0.0.0"),
            ("[::1]", "::1"),
            ("::1", "::1"),
            ("[0:0:0:0:0:0:0:1]", "::1"),
            ("[::FFFF:127.0.0.1]", "::ffff:7f00:1"),
            ("1e100.test", "1e100.test"),
            ("0x7f.test", "0x7f.test"),
        ],
        ids=repr,
    )
    def test_canonical_spellings(self, raw: str, expected: str) -> None:
        """Case, one trailing dot, IDNA and IP literal forms reduce to one spelling."""
        assert canonical_host(raw) == expected

    @pytest.mark.parametrize(
        "raw",
        [
            "",
            ".",
            "allowed.test..",
            "a..test",
            ".allowed.test",
            "allowed .test",
            "allowed\x00.test",
            "allowed\t.test",
            "allowed.test\x7f",
            "allowed.test\\evil.test",
            "user@allowed.test",
            "allowed.test%2f",
            "[::1%25lo]",
            "127.1",
            "127.0.1",
            "0x7f.0.0.1",
            "0x7f000001",
            "2130706433",
            "0177.0.0.1",
            "127.000.0.1",
            "256.0.0.1",
            "1.2.3.4.5",
            "foo.127",
            "foo.0x10",
            "[127.0.0.1]",
            "[::1",
            "[gg::1]",
            "a:b",
            "allowed.test/x",
            "allowed.test?",
            "-lead.test",
            "x" * 64 + ".test",
            ("a" * 60 + ".") * 5 + "test",
        ],
        ids=lambda v: repr(v)[:40],
    )
    def test_rejected_spellings(self, raw: str) -> None:
        """Ambiguous, numeric and malformed hosts are refused, never normalised into a match."""
        with pytest.raises(HostError):
            canonical_host(raw)

    def test_error_names_the_problem(self) -> None:
        """The numeric-spelling error says what is accepted instead."""
        with pytest.raises(HostError, match="dotted-quad"):
            canonical_host("0x7f.0.0.1")


class TestRule:
    def test_non_canonical_rule_host_is_refused(self) -> None:
        """A rule must be written canonically, and the error names the canonical form."""
        with pytest.raises(HostError, match=r"'allowed\.test'"):
            Rule("Allowed.Test.")

    def test_port_out_of_range_is_refused(self) -> None:
        """A rule port must be a real TCP port."""
        with pytest.raises(HostError, match="outside 1-65535"):
            Rule("allowed.test", ports=(0,))


class TestDecide:
    allowlist = Allowlist(
        (
            Rule("allowed.test"),
            Rule("allowed.test", suffix=True, ports=(443,)),
            Rule("127.0.0.1", ports=(8080,)),
        )
    )

    @pytest.mark.parametrize(
        ("host", "port", "allowed"),
        [
            ("allowed.test", 443, True),
            ("ALLOWED.TEST.", 80, True),
            ("a.allowed.test", 443, True),
            ("deep.a.allowed.test", 443, True),
            ("a.allowed.test", 80, False),
            ("allowed.test", 22, False),
            ("evilallowed.test", 443, False),
            ("allowed.test.evil.test", 443, False),
            ("allowed.testx", 443, False),
            ("xallowed.test", 443, False),
            ("127.0.0.1", 8080, True),
            ("127.1", 8080, False),
            ("2130706433", 8080, False),
            ("denied.test", 443, False),
        ],
    )
    def test_matching_table(self, host: str, port: int, allowed: bool) -> None:
        """Exact and suffix rules match only canonical hosts at a label boundary, on their ports."""
        assert self.allowlist.decide(EgressRequest(host, port)).allowed is allowed

    def test_suffix_rule_does_not_cover_its_apex(self) -> None:
        """A suffix rule means `*.host`: the apex needs its own exact rule."""
        allowlist = Allowlist((Rule("allowed.test", suffix=True),))
        assert allowlist.decide(EgressRequest("allowed.test", 443)).reason == "no rule matched"

    def test_port_denial_names_the_rule_ports(self) -> None:
        """A host match on the wrong port says which ports the rule allows."""
        decision = self.allowlist.decide(EgressRequest("allowed.test", 22))
        assert decision.rule == Rule("allowed.test")
        assert decision.reason == "port 22 not allowed (rule allows [80, 443])"

    def test_bad_host_is_a_denial_not_an_exception(self) -> None:
        """`decide` never raises; a bad host is a deny with the reason."""
        decision = self.allowlist.decide(EgressRequest("127.1", 443))
        assert not decision.allowed
        assert decision.reason.startswith("bad host:")
        assert decision.rule is None


class TestAddressAllowed:
    strict = Rule("allowed.test")
    lenient = Rule("allowed.test", allow_private=True)

    @pytest.mark.parametrize(
        ("ip", "kind"),
        [
            ("127.0.0.1", "loopback"),
            ("127.9.9.9", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("169.254.7.7", "link-local"),
            ("fe80::1", "link-local"),
            ("10.1.2.3", "private"),
            ("192.168.1.1", "private"),
            ("172.16.0.1", "private"),
            ("fd00::1", "private"),
            ("0.0.0.0", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("240.0.0.1", "reserved"),
            ("100.64.0.1", "not global"),
        ],
    )
    def test_non_global_refused(self, ip: str, kind: str) -> None:
        """Every non-global address is refused under a strict rule, naming its kind."""
        ok, reason = address_allowed(ip, self.strict)
        assert not ok
        assert f"is {kind}" in reason

    def test_allow_private_admits_loopback(self) -> None:
        """`allow_private` is the one way to reach a loopback fixture origin."""
        ok, reason = address_allowed("127.0.0.1", self.lenient)
        assert ok
        assert "allowed by rule" in reason

    @pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "10.1.2.3", "169.254.1.1"])
    def test_allow_private_admits_every_kind(self, ip: str) -> None:
        """`allow_private` admits every non-global kind (no public address appears here)."""
        assert address_allowed(ip, self.lenient)[0] is True

    def test_remote_networks_admit_only_themselves(self) -> None:
        """The lab's internet counts as remote hosts; private ranges and its link do not."""
        remote = ("198.19.0.0/24",)
        ok, reason = address_allowed("198.19.0.10", self.strict, remote=remote)
        assert ok
        assert "remote host of the lab" in reason
        for ip in ("198.18.0.1", "10.1.2.3", "127.0.0.1"):
            assert address_allowed(ip, self.strict, remote=remote)[0] is False

    def test_garbage_refused(self) -> None:
        """Something that is not an address is refused, not raised."""
        assert address_allowed("not-an-ip", self.lenient)[0] is False
