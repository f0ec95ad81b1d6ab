"""The egress proxy as its real subprocess, against real loopback origins, TLS and DNS."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import resource
import select
import signal
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.host.jsonlines import LogLineError
from sandbox_attest.world.egress.config import ProxyConfig
from sandbox_attest.world.egress.proxy import start_proxy
from sandbox_attest.world.egress.rules import Rule
from sandbox_attest.world.egress.wire import DENY_HEADER, MAX_HEAD
from tests.egress.egress_helpers import (
    BLOCK,
    Origin,
    auth_header,
    blob_sha256,
    connect_request,
    exchange,
    fd_count,
    read_all,
    read_head,
    running_shim,
    tcp_client,
    vm_rss_kib,
    wait_for,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox_attest.world.dns import DnsFixture
    from sandbox_attest.world.egress.proxy import ProxyProcess

MakeProxy = "Callable[..., ProxyProcess]"


def _rule(host: str, port: int, **kwargs: object) -> Rule:
    return Rule(host, ports=(port,), allow_private=True, **kwargs)  # type: ignore[arg-type]


def _get(url: str, secret: str | None, host: str | None = None, extra: str = "") -> bytes:
    auth = auth_header(secret) if secret else ""
    host_line = f"Host: {host}\r\n" if host else ""
    return f"GET {url} HTTP/1.1\r\n{host_line}{auth}{extra}\r\n".encode()


class TestConnect:
    def test_allowed_tls_through_tunnel(
        self,
        make_proxy: Callable[..., ProxyProcess],
        make_origin: Callable[..., Origin],
        tls_server_ctx: ssl.SSLContext,
        tls_client_ctx: ssl.SSLContext,
    ) -> None:
        """CONNECT to an allowed host gives 200 and a TLS handshake verified by the test CA."""
        origin = make_origin("tls", tls=tls_server_ctx)
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        target = f"allowed.test:{origin.port}"
        with tcp_client(proxy) as sock:
            sock.sendall(connect_request(target, proxy.secret, "X-Attest-Nonce: n-tls\r\n"))
            status, _, rest = read_head(sock)
            assert status == 200
            assert rest == b""
            with tls_client_ctx.wrap_socket(sock, server_hostname="allowed.test") as tls:
                tls.sendall(
                    b"GET /ok HTTP/1.1\r\nHost: allowed.test\r\nX-Attest-Nonce: n-tls\r\n\r\n"
                )
                body = read_all(tls)
        assert body.endswith(b"ok n-tls")
        assert origin.wait_for_accepts(1) == 1
        assert wait_for(lambda: len(proxy.decisions()) == 1)
        line = proxy.decisions()[0]
        assert line["decision"] == "allow"
        assert line["status"] == 200
        assert line["nonce"] == "n-tls"
        assert line["address"] == "127.0.0.1"
        assert line["method"] == "CONNECT"
        assert isinstance(line["bytes_down"], int)
        assert line["bytes_down"] > 0

    def test_tls_with_wrong_name_fails_verification(
        self,
        make_proxy: Callable[..., ProxyProcess],
        make_origin: Callable[..., Origin],
        tls_server_ctx: ssl.SSLContext,
        tls_client_ctx: ssl.SSLContext,
    ) -> None:
        """Negative control: the CA check is real, a name the cert lacks fails the handshake."""
        origin = make_origin("tls", tls=tls_server_ctx)
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        with tcp_client(proxy) as sock:
            sock.sendall(connect_request(f"allowed.test:{origin.port}", proxy.secret))
            assert read_head(sock)[0] == 200
            with pytest.raises(ssl.SSLCertVerificationError):
                tls_client_ctx.wrap_socket(sock, server_hostname="other.test")

    def test_denied_host_403(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """CONNECT to a host no rule names is 403 with the reason header and body; no dial."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        status, headers, body = exchange(
            proxy, connect_request(f"denied.test:{origin.port}", proxy.secret)
        )
        assert status == 403
        assert headers[DENY_HEADER.lower()] == "no rule matched"
        assert body == f"egress denied to 'denied.test:{origin.port}': no rule matched\n".encode()
        assert origin.settled_accepts() == 0
        assert proxy.decisions()[0]["decision"] == "deny"

    def test_port_not_in_rule_403(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """An allowed host on a port its rule does not list is 403 naming the ports."""
        origin = make_origin("echo")
        other = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        status, headers, _ = exchange(
            proxy, connect_request(f"allowed.test:{other.port}", proxy.secret)
        )
        assert status == 403
        assert headers[DENY_HEADER.lower()].startswith(f"port {other.port} not allowed")
        assert other.settled_accepts() == 0

    def test_bytes_in_connect_segment_forwarded(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Bytes sent in the same segment as the CONNECT head reach the origin after the 200."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        with tcp_client(proxy) as sock:
            sock.sendall(connect_request(f"allowed.test:{origin.port}", proxy.secret) + b"EARLY")
            status, _, rest = read_head(sock)
            sock.shutdown(socket.SHUT_WR)
            echoed = rest + read_all(sock)
        assert status == 200
        assert echoed == b"EARLY"

    def test_one_upstream_accept_per_connect(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Each admitted CONNECT dials once; denied requests dial nothing."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        for i in range(5):
            with tcp_client(proxy) as sock:
                sock.sendall(connect_request(f"allowed.test:{origin.port}", proxy.secret))
                assert read_head(sock)[0] == 200
                sock.sendall(b"x%d" % i)
                sock.shutdown(socket.SHUT_WR)
                assert read_all(sock) == b"x%d" % i
        for target in ("denied.test", "evilallowed.test", "127.1"):
            exchange(proxy, connect_request(f"{target}:{origin.port}", proxy.secret))
        assert origin.settled_accepts() == 5  # and the three denied targets dialed nothing


class TestAuth:
    @pytest.mark.parametrize(
        "auth",
        [
            "",
            "Proxy-Authorization: Basic "
            + base64.b64encode(b"sandbox-attest:wrong").decode()
            + "\r\n",
            "Proxy-Authorization: Basic !!!notbase64\r\n",
            "Proxy-Authorization: Bearer token\r\n",
        ],
        ids=["missing", "wrong-password", "garbage", "bearer"],
    )
    def test_bad_auth_407_before_dns_or_dial(
        self,
        make_proxy: Callable[..., ProxyProcess],
        make_origin: Callable[..., Origin],
        dns: DnsFixture,
        auth: str,
    ) -> None:
        """A bad or missing secret is 407 with zero DNS queries and zero dials."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        url = f"http://allowed.test:{origin.port}/ok"
        for request in (
            f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n{auth}\r\n".encode(),
            f"GET {url} HTTP/1.1\r\nHost: allowed.test:{origin.port}\r\n{auth}\r\n".encode(),
        ):
            status, headers, _ = exchange(proxy, request)
            assert status == 407
            assert "proxy-authenticate" in headers
        assert dns.queries() == []
        assert origin.settled_accepts() == 0

    def test_wrong_user_407(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """The right secret with another user name is still 407."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        token = base64.b64encode(f"root:{proxy.secret}".encode()).decode()
        request = (
            f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n"
            f"Proxy-Authorization: Basic {token}\r\n\r\n"
        ).encode()
        assert exchange(proxy, request)[0] == 407

    def test_unix_socket_needs_no_auth(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Reaching the unix socket is the capability: no Proxy-Authorization needed."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        assert proxy.socket is not None
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(proxy.socket))
            sock.sendall(
                _get(
                    f"http://allowed.test:{origin.port}/c/n-unix/x",
                    None,
                    f"allowed.test:{origin.port}",
                )
            )
            status, _, _ = read_head(sock)
        assert status == 200
        assert wait_for(lambda: len(proxy.decisions()) == 1)
        assert proxy.decisions()[0]["client"] == "unix"
        assert proxy.decisions()[0]["nonce"] == "n-unix"

    def test_secret_never_in_decision_log(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """The secret is absent from the log even when clients put it in odd places."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        s = proxy.secret
        p = origin.port
        token = base64.b64encode(f"sandbox-attest:{s}x".encode()).decode()
        requests = [
            f"CONNECT {s}.test:443 HTTP/1.1\r\n\r\n",
            f"CONNECT allowed.test:{p} HTTP/1.1\r\nX-Attest-Nonce: {s}\r\n\r\n",
            f"GET http://allowed.test:{p}/{s}?nonce={s} HTTP/1.1\r\n\r\n",
            f"GET http://sandbox-attest:{s}@allowed.test:{p}/ HTTP/1.1\r\n\r\n",
            f"GET http://allowed.test:{p}/c/{s}/ HTTP/1.1\r\nProxy-Authorization: {s}\r\n\r\n",
            f"CONNECT allowed.test:{p} HTTP/1.1\r\nProxy-Authorization: Basic {token}\r\n\r\n",
            f"CONNECT allowed.test:{p} HTTP/1.1\r\nProxy-Authorization: Basic {s}\r\n\r\n",
            f"GET http://{s}/ HTTP/1.1\r\n{auth_header(s)}\r\n",
            f"CONNECT a.allowed.test:{p} HTTP/1.1\r\n{auth_header(s)}X-Attest-Nonce: {s}\r\n\r\n",
        ]
        for request in requests:
            exchange(proxy, request.encode())
        assert wait_for(lambda: len(proxy.decisions()) == len(requests))
        text = proxy.decision_log.read_text()
        assert s not in text
        assert "[redacted]" in text
        assert s not in proxy.stderr_path.read_text()


class TestAbsoluteForm:
    def test_allowed_get_strips_proxy_headers(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """An allowed GET reaches the origin without proxy or hop-by-hop headers, forced close."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        host = f"allowed.test:{origin.port}"
        request = _get(
            f"http://{host}/ok?nonce=n-abs",
            proxy.secret,
            host,
            "Proxy-Connection: keep-alive\r\nKeep-Alive: 5\r\nConnection: keep-alive, X-Drop\r\n"
            "X-Drop: 1\r\nX-Attest-Nonce: n-abs\r\n",
        )
        status, headers, body = exchange(proxy, request)
        assert status == 200
        assert body == b"ok n-abs"
        assert DENY_HEADER.lower() not in headers  # the origin's forged header was stripped
        assert headers["connection"] == "close"
        seen = origin.requests[0]["headers"]
        assert isinstance(seen, dict)
        for name in ("proxy-authorization", "proxy-connection", "keep-alive", "x-drop"):
            assert name not in seen
        assert seen["connection"] == "close"
        assert origin.requests[0]["line"] == "GET /ok?nonce=n-abs HTTP/1.1"

    def test_denied_get_403(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """An absolute-form GET to a denied host is 403 and never dialed."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        host = f"denied.test:{origin.port}"
        status, headers, body = exchange(proxy, _get(f"http://{host}/", proxy.secret, host))
        assert status == 403
        assert b"egress denied to 'denied.test:" in body
        assert headers[DENY_HEADER.lower()] == "no rule matched"
        assert origin.settled_accepts() == 0

    def test_host_mismatch_421(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """A target host that differs from Host: is 421; case and dot differences are not."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        url = f"http://allowed.test:{origin.port}/"
        status, _, _ = exchange(proxy, _get(url, proxy.secret, f"denied.test:{origin.port}"))
        assert status == 421
        status, _, _ = exchange(proxy, _get(url, proxy.secret, "allowed.test"))
        assert status == 421  # same name, default port 80 != the target's port
        assert origin.settled_accepts() == 0
        status, _, _ = exchange(proxy, _get(url, proxy.secret, f"ALLOWED.test.:{origin.port}"))
        assert status == 200

    def test_te_and_cl_400(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Transfer-Encoding together with Content-Length is 400 (a smuggling shape)."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        host = f"allowed.test:{origin.port}"
        request = (
            f"POST http://{host}/ HTTP/1.1\r\nHost: {host}\r\n{auth_header(proxy.secret)}"
            "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ).encode()
        status, headers, _ = exchange(proxy, request)
        assert status == 400
        assert "Transfer-Encoding" in headers[DENY_HEADER.lower()]
        assert origin.settled_accepts() == 0

    def test_post_bodies_framed(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Content-Length and chunked bodies arrive whole and nothing past them is forwarded."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        host = f"allowed.test:{origin.port}"
        head = f"POST http://{host}/ HTTP/1.1\r\nHost: {host}\r\n{auth_header(proxy.secret)}"
        status, _, _ = exchange(
            proxy, (head + "Content-Length: 5\r\n\r\nhelloGET /x HTTP/1.1\r\n\r\n").encode()
        )
        assert status == 200
        assert origin.requests[0]["body"] == b"hello"
        assert wait_for(lambda: origin.trailing == [b""])
        chunked = b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"
        request = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked
        status, _, _ = exchange(proxy, request + b"GET /x HTTP/1.1\r\n\r\n")
        assert status == 200
        # The origin reads the exact chunked body (framing kept), and nothing after it.
        assert origin.requests[1]["body"] == chunked
        assert wait_for(lambda: len(origin.trailing) == 2)
        assert origin.trailing[1] == b""

    def test_second_request_on_keepalive_not_forwarded(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """A pipelined second request (even to a denied host) never reaches the first upstream."""
        origin = make_origin("http")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        host = f"allowed.test:{origin.port}"
        first = _get(f"http://{host}/one", proxy.secret, host, "Connection: keep-alive\r\n")
        second = _get(
            f"http://denied.test:{origin.port}/two", proxy.secret, f"denied.test:{origin.port}"
        )
        with tcp_client(proxy) as sock:
            sock.sendall(first + second)
            status, _, _ = read_head(sock)
            rest = read_all(sock)  # the proxy closes after the first response
        assert status == 200
        assert b"HTTP/1.1" not in rest
        assert len(origin.requests) == 1
        assert wait_for(lambda: origin.trailing == [b""])

    def test_https_absolute_form_400(self, make_proxy: Callable[..., ProxyProcess]) -> None:
        """An https:// absolute-form target is 400 naming CONNECT."""
        proxy = make_proxy((Rule("allowed.test"),))
        status, headers, _ = exchange(proxy, _get("https://allowed.test/", proxy.secret))
        assert status == 400
        assert "CONNECT" in headers[DENY_HEADER.lower()]


class TestHostSpellings:
    @pytest.mark.parametrize(
        ("target", "status"),
        [
            ("ALLOWED.TEST:{p}", 200),
            ("allowed.test.:{p}", 200),
            ("a.allowed.test:{p}", 200),
            ("evilallowed.test:{p}", 403),
            ("allowed.test.evil.test:{p}", 403),
            ("127.0.0.1:{p}", 403),
            ("[::1]:{p}", 403),
            ("[::ffff:127.0.0.1]:{p}", 403),
            ("::1:{p}", 400),
            ("127.1:{p}", 400),
            ("0x7f.0.0.1:{p}", 400),
            ("2130706433:{p}", 400),
            ("0177.0.0.1:{p}", 400),
            ("allowed.test@evil.test:{p}", 400),
            ("evil.test@allowed.test:{p}", 400),
            ("allowed.test\\@evil.test:{p}", 400),
            ("allowed.test%00:{p}", 400),
            ("allowed.test\x00:{p}", 400),
            ("allowed.test:{p}x", 400),
            ("allowed.test", 400),
        ],
        ids=repr,
    )
    def test_connect_spellings(
        self,
        make_proxy: Callable[..., ProxyProcess],
        make_origin: Callable[..., Origin],
        target: str,
        status: int,
    ) -> None:
        """Only canonical spellings of an allowed name get through; numeric forms are 400."""
        origin = make_origin("echo")
        proxy = make_proxy(
            (_rule("allowed.test", origin.port), _rule("allowed.test", origin.port, suffix=True))
        )
        t = target.format(p=origin.port)
        got, headers, _ = exchange(proxy, connect_request(t, proxy.secret))
        assert got == status, headers.get(DENY_HEADER.lower())
        assert origin.settled_accepts() == (1 if status == 200 else 0)

    @pytest.mark.parametrize(
        "request_line",
        [
            "CONNECT allowed .test:443 HTTP/1.1",
            "GET http://allowed.test\\evil.test/ HTTP/1.1",
            "GET http://user@allowed.test/ HTTP/1.1",
            "GET http://allowed.test:80@denied.test/ HTTP/1.1",
            "GET http://0x7f000001/ HTTP/1.1",
            "GET /relative HTTP/1.1",
            "GET http://allowed.test/ HTTP/2.0",
        ],
    )
    def test_malformed_requests_400(
        self, make_proxy: Callable[..., ProxyProcess], dns: DnsFixture, request_line: str
    ) -> None:
        """Spaces, backslashes, userinfo, numeric hosts and origin-form targets are 400, no DNS."""
        proxy = make_proxy((Rule("allowed.test", allow_private=True),))
        status, headers, _ = exchange(
            proxy, f"{request_line}\r\n{auth_header(proxy.secret)}\r\n".encode()
        )
        assert status == 400
        assert headers[DENY_HEADER.lower()]
        assert dns.queries() == []


class TestHeadLimits:
    @staticmethod
    def _padded(target: str, secret: str, total: int) -> bytes:
        base = f"CONNECT {target} HTTP/1.1\r\n{auth_header(secret)}X-Pad: "
        pad = total - len(base) - len("\r\n\r\n")
        return (base + "a" * pad + "\r\n\r\n").encode()

    def test_head_64k_minus_1_accepted(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """A head of 64 KiB - 1 bytes is accepted."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        request = self._padded(f"allowed.test:{origin.port}", proxy.secret, MAX_HEAD - 1)
        assert len(request) == MAX_HEAD - 1
        with tcp_client(proxy) as sock:
            sock.sendall(request)
            assert read_head(sock)[0] == 200

    def test_head_64k_plus_1_is_431(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """A head of 64 KiB + 1 bytes is 431 and never dialed."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        request = self._padded(f"allowed.test:{origin.port}", proxy.secret, MAX_HEAD + 1)
        status, headers, _ = exchange(proxy, request)
        assert status == 431
        assert headers[DENY_HEADER.lower()]
        assert origin.settled_accepts() == 0

    def test_slow_drip_hits_head_deadline(self, make_proxy: Callable[..., ProxyProcess]) -> None:
        """A head dripped slower than the head deadline is cut off with 408 mid-drip.

        A byte every 0.1 s keeps any per-read idle limit happy, and the whole head takes
        about 10 s: only a deadline on the whole head answers before the drip ends.
        """
        proxy = make_proxy((Rule("allowed.test"),), head_timeout=0.5)
        head = b"CONNECT allowed.test:443 HTTP/1.1\r\nX-Pad: " + b"a" * 60 + b"\r\n"
        with tcp_client(proxy) as sock:
            sent = 0
            for char in head:
                answered, _, _ = select.select([sock], [], [], 0.1)
                if answered:
                    break
                try:
                    sock.send(bytes([char]))
                except OSError:
                    break
                sent += 1
            status = read_head(sock)[0]
        assert status == 408
        assert sent < len(head), "the proxy waited for the whole drip: no whole-head deadline"

    @pytest.mark.parametrize(
        ("first", "said"),
        [(b"\x05\x01\x00", "0x05 (a SOCKS5 greeting?)"), (b"\x16\x03\x01", "0x16 (TLS?)")],
        ids=["socks5-greeting", "tls-hello"],
    )
    def test_bytes_that_cannot_begin_http_are_refused_at_once(
        self, make_proxy: Callable[..., ProxyProcess], first: bytes, said: str
    ) -> None:
        """A SOCKS greeting or a TLS hello gets 400 naming it, not a wait for the head deadline.

        The deadline is long (30 s) and the client waits at most 10 s: only a refusal on the
        first byte answers in time. An HTTP client's bytes still wait for a whole head (the
        drip above).
        """
        proxy = make_proxy((Rule("allowed.test"),), head_timeout=30)
        with tcp_client(proxy) as sock:
            sock.settimeout(10)
            sock.sendall(first)
            status, headers, _ = read_head(sock)
        assert status == 400
        assert said in headers[DENY_HEADER.lower()]
        assert wait_for(lambda: len(proxy.decisions()) == 1)
        assert proxy.decisions()[0]["status"] == 400


class TestUpstreamFailures:
    def test_dial_timeout_504(
        self, make_proxy: Callable[..., ProxyProcess], dns: DnsFixture
    ) -> None:
        """A loopback listener with a full backlog makes the dial time out: 504."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(3):  # backlog 0 takes one; the rest are SYNs the kernel drops
                filler = socket.socket()
                filler.setblocking(False)  # noqa: FBT003  (stdlib signature)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)
            time.sleep(0.1)
            proxy = make_proxy((_rule("allowed.test", port),), dial_timeout=0.5)
            status, headers, body = exchange(
                proxy, connect_request(f"allowed.test:{port}", proxy.secret)
            )
        finally:
            for filler in fillers:
                filler.close()
            listener.close()
        assert status == 504
        assert "timed out" in headers[DENY_HEADER.lower()]
        assert b"allowed.test" in body

    def test_refused_502(self, make_proxy: Callable[..., ProxyProcess]) -> None:
        """A dial to a closed loopback port is 502."""
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        proxy = make_proxy((_rule("allowed.test", port),))
        status, headers, _ = exchange(proxy, connect_request(f"allowed.test:{port}", proxy.secret))
        assert status == 502
        assert "refused" in headers[DENY_HEADER.lower()].lower()

    def test_nxdomain_502(self, make_proxy: Callable[..., ProxyProcess], dns: DnsFixture) -> None:
        """An allowed name the DNS fixture does not know is 502 naming NXDOMAIN."""
        proxy = make_proxy((_rule("ghost.test", 443),))
        status, headers, _ = exchange(proxy, connect_request("ghost.test:443", proxy.secret))
        assert status == 502
        assert "NXDOMAIN" in headers[DENY_HEADER.lower()]
        assert [q["name"] for q in dns.queries()] == ["ghost.test"]

    def test_loopback_answer_refused_without_allow_private(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """An allowed name resolving to loopback is 403 unless its rule allows private."""
        origin = make_origin("echo")
        proxy = make_proxy((Rule("allowed.test", ports=(origin.port,)),))
        status, headers, _ = exchange(
            proxy, connect_request(f"allowed.test:{origin.port}", proxy.secret)
        )
        assert status == 403
        assert "loopback" in headers[DENY_HEADER.lower()]
        assert origin.settled_accepts() == 0
        assert proxy.decisions()[0]["address"] == "127.0.0.1"

    def test_rebinding_cannot_change_dialed_address(
        self,
        make_proxy: Callable[..., ProxyProcess],
        make_origin: Callable[..., Origin],
        dns: DnsFixture,
    ) -> None:
        """The name is resolved once per client and the vetted address is the one dialed."""
        first = make_origin("echo", host="127.0.0.1")
        second = make_origin("echo", host="127.0.0.2", port=first.port)
        dns.set_answers("rebind.test", ["127.0.0.1", "127.0.0.2"])
        proxy = make_proxy((_rule("rebind.test", first.port),))
        with tcp_client(proxy) as sock:
            sock.sendall(connect_request(f"rebind.test:{first.port}", proxy.secret))
            assert read_head(sock)[0] == 200
            sock.shutdown(socket.SHUT_WR)
            read_all(sock)
        assert [q["name"] for q in dns.queries()] == ["rebind.test"]
        assert (first.wait_for_accepts(1), second.settled_accepts()) == (1, 0)
        assert wait_for(lambda: len(proxy.decisions()) == 1)
        assert proxy.decisions()[0]["address"] == "127.0.0.1"


def _transfer_through_shim(
    proxy: ProxyProcess, origin: Origin, size: int, *shim_args: str
) -> tuple[str, float]:
    """Pull `size` bytes from a source origin via shim + proxy; returns (sha256, seconds)."""
    assert proxy.socket is not None
    with (
        running_shim(proxy.socket, *shim_args) as port,
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        started = time.monotonic()
        sock.sendall(f"CONNECT allowed.test:{origin.port} HTTP/1.1\r\n\r\n".encode())
        status, _, rest = read_head(sock)
        assert status == 200
        digest = hashlib.sha256(rest)
        got = len(rest)
        buf = bytearray(1024 * 1024)
        while n := sock.recv_into(buf):
            digest.update(memoryview(buf)[:n])
            got += n
        assert got == size
        return digest.hexdigest(), time.monotonic() - started


class TestTransfer:
    @pytest.mark.parametrize(
        ("shim_args", "route"),
        [((), "unix-handoff"), (("--relay",), "unix")],
        ids=["handoff", "relay"],
    )
    def test_18mib_byte_exact_through_shim(
        self,
        make_proxy: Callable[..., ProxyProcess],
        make_origin: Callable[..., Origin],
        shim_args: tuple[str, ...],
        route: str,
    ) -> None:
        """18 MiB arrive through shim + proxy with the origin's sha256, handed off or relayed."""
        size = 18 * BLOCK
        origin = make_origin("source", size=size)
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        digest, _ = _transfer_through_shim(proxy, origin, size, *shim_args)
        assert digest == blob_sha256(size)
        assert wait_for(lambda: len(proxy.decisions()) == 1)
        assert proxy.decisions()[0]["bytes_down"] == size
        assert proxy.decisions()[0]["client"] == route

    def test_18mib_echo_both_ways_with_half_close(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """18 MiB up and back through an echo origin; the half-close ends the echo."""
        size = 18 * BLOCK
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        with tcp_client(proxy) as sock:
            sock.sendall(connect_request(f"allowed.test:{origin.port}", proxy.secret))
            assert read_head(sock)[0] == 200

            def send() -> None:
                for i in range(size // BLOCK):
                    sock.sendall(_block(i))
                sock.shutdown(socket.SHUT_WR)

            sender = threading.Thread(target=send)
            sender.start()
            digest = hashlib.sha256()
            got = 0
            while chunk := sock.recv(1 << 20):
                digest.update(chunk)
                got += len(chunk)
            sender.join()
        assert got == size
        assert digest.hexdigest() == blob_sha256(size)

    @pytest.mark.slow
    def test_256mib_byte_exact_through_shim(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """256 MiB arrive through shim + proxy with the origin's sha256."""
        size = 256 * BLOCK
        origin = make_origin("source", size=size)
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        digest, _ = _transfer_through_shim(proxy, origin, size)
        assert digest == blob_sha256(size)


def _block(i: int) -> bytes:
    from tests.egress.egress_helpers import blob_block  # noqa: PLC0415

    return blob_block(i)


class TestResources:
    def test_descriptors_back_to_baseline(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """After 200 aborted and 200 clean connections the proxy holds the same descriptors."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        baseline = fd_count(proxy.pid)
        request = connect_request(f"allowed.test:{origin.port}", proxy.secret)
        for i in range(200):
            sock = tcp_client(proxy)
            if i % 2:
                sock.sendall(request[:10])  # a half-sent head, then gone
            else:
                sock.sendall(request)
                read_head(sock)
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            sock.close()  # RST
        for _ in range(200):
            with tcp_client(proxy) as sock:
                sock.sendall(request + b"ping")
                read_head(sock)
                sock.shutdown(socket.SHUT_WR)
                read_all(sock)
        assert wait_for(lambda: fd_count(proxy.pid) == baseline, timeout=10), (
            fd_count(proxy.pid),
            baseline,
        )

    def test_accept_loop_survives_when_no_thread_can_start(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Out of memory for thread stacks: new clients are dropped, the proxy keeps serving.

        The proxy's address space is capped (RLIMIT_AS, set from outside) just above what it
        maps now. Idle clients each hold a handler thread until glibc's cached stacks run out
        and a new 8 MiB stack cannot be mapped; that client is closed unanswered. Lifting the
        cap must find the accept loop alive.
        """
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        request = connect_request(f"allowed.test:{origin.port}", proxy.secret)
        assert exchange(proxy, request + b"x")[0] == 200  # every lazy import done
        vm_size = next(
            int(line.split()[1]) * 1024
            for line in Path(f"/proc/{proxy.pid}/status").read_text().splitlines()
            if line.startswith("VmSize:")
        )
        unlimited = resource.prlimit(proxy.pid, resource.RLIMIT_AS)
        resource.prlimit(proxy.pid, resource.RLIMIT_AS, (vm_size + 2 * 1024 * 1024, unlimited[1]))
        idle: list[socket.socket] = []
        dropped = False
        try:
            for _ in range(40):
                sock = tcp_client(proxy)
                idle.append(sock)
                sock.settimeout(0.3)
                try:
                    dropped = sock.recv(100) == b""  # closed unanswered
                except TimeoutError:
                    continue  # a handler thread is waiting for this client's head
                break
        finally:
            resource.prlimit(proxy.pid, resource.RLIMIT_AS, unlimited)
            for sock in idle:
                sock.close()
        assert dropped
        assert "cannot start a thread; connection dropped" in proxy.stderr_path.read_text()
        status, _, body = exchange(proxy, request + b"again")
        assert (status, body) == (200, b"again")

    def test_stalled_reader_does_not_grow_rss(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """512 MiB offered to a client that never reads grows the proxy's RSS by < 8 MiB."""
        origin = make_origin("source", size=512 * BLOCK)
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        with tcp_client(proxy) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.sendall(connect_request(f"allowed.test:{origin.port}", proxy.secret))
            assert read_head(sock)[0] == 200
            time.sleep(0.3)
            before = vm_rss_kib(proxy.pid)
            time.sleep(1.5)
            after = vm_rss_kib(proxy.pid)
            offered = origin.offered
        assert after - before < 8 * 1024, (before, after)
        assert offered < 64 * BLOCK  # the origin was held back too: nobody buffered 512 MiB


class TestLifecycle:
    def test_sigterm_removes_socket(self, make_proxy: Callable[..., ProxyProcess]) -> None:
        """SIGTERM stops the proxy cleanly (exit 0) and removes its unix socket."""
        proxy = make_proxy((Rule("allowed.test"),))
        assert proxy.socket is not None
        assert proxy.socket.is_socket()
        os.kill(proxy.pid, signal.SIGTERM)
        assert proxy._popen.wait(timeout=10) == 0
        assert not proxy.socket.exists()

    def test_start_failure_surfaces_stderr(self, tmp_path: Path) -> None:
        """A proxy that cannot bind dies and the FixtureError carries its stderr."""
        config = ProxyConfig(
            rules=(),
            dns=("127.0.0.1", 9),
            unix_socket=tmp_path / "missing-dir" / "p.sock",
            tcp=False,
            decision_log=tmp_path / "log.jsonl",
        )
        with pytest.raises(FixtureError, match="No such file or directory"):
            start_proxy(config)


def _append(path: Path, data: bytes) -> None:
    """Append to the decision log the running proxy child also has open for appending."""
    with path.open("ab") as handle:
        handle.write(data)


class TestDecisionLogReader:
    def test_a_decision_line_written_in_two_halves_is_read_once_whole(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """Half a line in the real decision log reads as absent, then whole after its newline.

        The proxy child writes its lines to the same file; the second half plays the part of
        a line the child has not finished. The old reader raised "Unterminated string" here.
        """
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        status, _, _ = exchange(proxy, connect_request(f"denied.test:{origin.port}", proxy.secret))
        assert status == 403
        [denied] = proxy.decisions()  # deny lines are written before the 403 is sent
        _append(proxy.decision_log, b'{"a": 1, "b": "par')
        assert proxy.decisions() == [denied]
        _append(proxy.decision_log, b'tial"}\n')
        assert proxy.decisions() == [denied, {"a": 1, "b": "partial"}]

    def test_the_childs_next_line_follows_a_completed_half_line(
        self, make_proxy: Callable[..., ProxyProcess], make_origin: Callable[..., Origin]
    ) -> None:
        """After a line is completed, the child's own next decision is read after it."""
        origin = make_origin("echo")
        proxy = make_proxy((_rule("allowed.test", origin.port),))
        _append(proxy.decision_log, b'{"a": 1, "b": "par')
        assert proxy.decisions() == []
        _append(proxy.decision_log, b'tial"}\n')
        exchange(proxy, connect_request(f"denied.test:{origin.port}", proxy.secret))
        entries = proxy.decisions()
        assert [e.get("b") for e in entries] == ["partial", None]
        assert (entries[1]["decision"], entries[1]["status"]) == ("deny", 403)

    def test_a_corrupt_complete_line_names_the_log_and_line(
        self, make_proxy: Callable[..., ProxyProcess]
    ) -> None:
        """A complete decision line that is not JSON raises LogLineError naming file and line."""
        proxy = make_proxy((Rule("allowed.test"),))
        _append(proxy.decision_log, b'{"a": 1}\n{"a": 1, "b": "par\n')
        with pytest.raises(LogLineError, match=re.escape(f"{proxy.decision_log}, line 2: ")):
            proxy.decisions()
