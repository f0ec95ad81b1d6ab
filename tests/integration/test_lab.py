"""The lab, live: what it guarantees, what it leaves behind, and the guard outside it.

Each scenario that enters the lab runs in a process of its own (`tests.lab_driver`):
entering moves a whole process into new namespaces, and the pytest process must stay in
the real host's, where the guard is shown to refuse a send to a lab address.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_attest.host import disguise
from sandbox_attest.world.dns import DnsFixture
from sandbox_attest.world.egress.config import ProxyConfig
from sandbox_attest.world.egress.proxy import start_proxy
from sandbox_attest.world.egress.rules import Rule
from sandbox_attest.world.egress.wire import PROXY_USER
from sandbox_attest.world.lab import INTERNET_NET, ORIGIN_ADDRESS, lab_possible, lab_supported
from sandbox_attest.world.netguard import OutsideLabError, check_destination, current_netns

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[2]
needs_lab = pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (CI runs as root)")


def scenario(name: str) -> dict[str, Any]:
    """Run one lab scenario in its own process; its JSON result."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.lab_driver", name],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def host_state() -> dict[str, list[str]]:
    """What a lab could leave on the real host: links, netns files, mounts, processes."""

    def lines(argv: list[str]) -> list[str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        return sorted(done.stdout.splitlines())

    # Only what a lab can make: other tests on this host (docker cells, a size-limited tmpfs,
    # another worker's world) mount and link concurrently, and are not this test's business.
    # The lab's veths are named sa-lab*; its namespaces would show as nsfs or /run/netns
    # mounts; its resolver files are bind mounts over /etc/resolv.conf and /etc/hosts.
    links = [ln.split(":")[1].strip().split("@")[0] for ln in lines(["ip", "-o", "link", "show"])]
    mounts = [
        ln
        for ln in lines(["findmnt", "-rn", "-o", "TARGET,SOURCE,FSTYPE"])
        if ln.split(" ")[0] in {"/etc/resolv.conf", "/etc/hosts"}
        or ln.startswith(("/run/netns", "/var/run/netns"))
        or (" nsfs" in ln and not ln.startswith("/run/docker/"))  # each container has one
        or "sandbox-attest" in ln
    ]
    processes = [
        ln for ln in lines(["ps", "-eo", "args"]) if "lab_driver" in ln or "lab-internet" in ln
    ]
    return {
        "links": sorted(link for link in links if link.startswith("sa-") or "lab" in link),
        "netns": lines(["ip", "netns", "list"]),
        "mounts": mounts,
        "processes": processes,
    }


@needs_lab
class TestLab:
    def test_enters_namespaces_of_its_own_with_the_resolver(self) -> None:
        """The host side and the internet side are new namespaces; resolv.conf names the DNS."""
        facts = scenario("enter")
        assert facts["kind"] == "lab"
        assert facts["real_netns"] == current_netns()
        assert len({facts["real_netns"], facts["host_netns"], facts["internet_netns"]}) == 3
        assert ORIGIN_ADDRESS in facts["addresses"]
        assert "nameserver 198.19.0.53" in facts["resolv_conf"]

    def test_leaves_nothing_behind(self) -> None:
        """After a lab and a world in it: no link, netns, mount or process left on the host."""
        before = host_state()
        scenario("enter")
        scenario("loopback-answer")
        assert host_state() == before
        assert f"# {disguise.STEM}: local resolver" not in Path("/etc/resolv.conf").read_text()

    def test_curl_and_pip_resolve_fixture_names_through_the_system_resolver(self) -> None:
        """Under bubblewrap on the host side, getaddrinfo, curl and pip find the fixture hosts."""
        got = scenario("resolver")
        assert got["getent"].split()[:2] == [ORIGIN_ADDRESS, "allowed.test"]
        assert got["curl_exit"] == 0, got["curl_out"]
        assert got["curl_out"].startswith("ok nlabresolver0001")
        assert got["pip_exit"] == 0, got["pip_err"]
        assert any(name.endswith(".whl") for name in got["downloaded"])
        assert {"allowed", "index", "files"} <= set(got["origin_hosts"])
        assert {"allowed.test", "index.test", "files.test"} <= set(got["dns_names"])

    def test_proxy_refuses_a_fixture_name_answered_with_loopback_without_a_rule(self) -> None:
        """In the lab no carve-out exists: allowed.test pointed at 127.0.0.1 is a 403."""
        got = scenario("loopback-answer")
        assert got["before"] == [200, ""]
        status, reason = got["after"]
        assert status == 403
        assert "127.0.0.1 is loopback" in reason


class TestGuard:
    def test_a_send_to_a_lab_address_from_the_real_host_is_refused(self) -> None:
        """This process is in the real host's namespace: the guard refuses, loopback passes."""
        refused = r"refusing to send to lab address 198\.19\.0\.10"
        with pytest.raises(OutsideLabError, match=refused):
            check_destination(ORIGIN_ADDRESS)
        with pytest.raises(OutsideLabError):
            check_destination("[2001:db8:1::10]")
        check_destination("127.0.0.1")  # loopback is always ours
        check_destination("allowed.test")  # a name is resolved first, then checked

    @pytest.fixture
    def lab_answering_dns(self) -> Iterator[DnsFixture]:
        """A loopback DNS fixture that answers a name with a lab address."""
        dns = DnsFixture(records={"inside.test": ORIGIN_ADDRESS})
        dns.start()
        yield dns
        dns.stop()

    def test_the_proxy_outside_the_lab_never_dials_a_lab_address(
        self, tmp_path: Path, lab_answering_dns: DnsFixture
    ) -> None:
        """A proxy started outside the lab refuses the lab address with the guard's reason."""
        config = ProxyConfig(
            rules=(Rule(host="inside.test", ports=(443,)),),
            dns=(lab_answering_dns.host, lab_answering_dns.port),
            unix_socket=None,
            tcp=True,
            decision_log=tmp_path / "decisions.jsonl",
            remote_networks=(INTERNET_NET,),
        )
        with start_proxy(config) as proxy:
            assert proxy.port is not None
            with socket.create_connection(("127.0.0.1", proxy.port), 5) as sock:
                token = base64.b64encode(f"{PROXY_USER}:{proxy.secret}".encode())
                sock.sendall(
                    b"CONNECT inside.test:443 HTTP/1.1\r\nHost: inside.test:443\r\n"
                    b"Proxy-Authorization: Basic " + token + b"\r\n\r\n"
                )
                head = sock.recv(4096).decode("latin-1")
        assert head.split()[1] == "403", head
        assert "refusing to send to lab address 198.19.0.10" in head


def test_lab_refused_to_a_non_root_harness_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """As an ordinary user the lab is refused, and the reason names root and sudo."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, why = lab_possible()
    assert not ok
    assert "uid 1000" in why
    assert "sudo" in why


@pytest.mark.skipif(not lab_supported()[0], reason=lab_supported()[1])
def test_threads_stop_this_process_entering_but_not_a_new_run() -> None:
    """A thread here (a fixture's server) keeps this process out, by name; a subprocess may go."""
    stop = threading.Event()
    server = threading.Thread(target=stop.wait, name="a-fixture-server", daemon=True)
    server.start()
    try:
        ok, why = lab_possible()
        assert not ok
        assert "other threads are running" in why
        assert "a-fixture-server" in why
        # What a caller that starts `sandbox-attest run --world lab` in a subprocess asks.
        assert lab_supported() == (True, "")
    finally:
        stop.set()
        server.join(5.0)
