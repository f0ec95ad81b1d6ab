"""Seatbelt: the generated SBPL profile, path resolution, escaping and availability.

Nothing here can run sandbox-exec, so the profile is checked exactly against golden files
(regenerate with UPDATE_GOLDEN=1 after reviewing the diff) and the process plumbing runs
through a stand-in `sandbox-exec` script that records its argv and runs the payload.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path, PurePosixPath

import pytest

from sandbox_attest.backends import create_backend
from sandbox_attest.backends.base import START_MARKER, Backend, EgressRoute, ProbeRequest
from sandbox_attest.backends.seatbelt import (
    HOME_SECRETS,
    SeatbeltBackend,
    SeatbeltPolicy,
    proxy_port_of,
    render_profile,
    sbpl_string,
)
from sandbox_attest.errors import ConfigError

GOLDEN = Path(__file__).parent / "golden"
# macOS keeps these top-level names as symlinks into /private.
MAC_LINKS = {"/tmp": "/private/tmp", "/var": "/private/var", "/etc": "/private/etc"}


def mac_resolve(path: Path) -> Path:
    """Model macOS's /private symlinks on any host (lexically, like the kernel would)."""
    posix = PurePosixPath(path)
    for link, target in MAC_LINKS.items():
        if posix == PurePosixPath(link) or PurePosixPath(link) in posix.parents:
            return Path(target) / posix.relative_to(link)
    return path


def check_golden(name: str, text: str) -> None:
    """Compare with tests/backends/golden/<name>; UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text


class TestProfileGolden:
    """Golden profiles for representative policies."""

    def test_proxy_leg_with_tmpdir_workspace(self) -> None:
        """A $TMPDIR workspace under /var/folders is written as its /private resolution."""
        policy = SeatbeltPolicy(
            workspace=Path("/var/folders/xy/abc123/T/sa-run/ws"),
            proxy_port=54321,
            deny_read=(Path("/Users/ci/.ssh"), Path("/tmp/sa-canaries/secret.txt")),
        )
        text = render_profile(policy, mac_resolve)
        check_golden("seatbelt_proxy.sb", text)
        assert '(subpath "/private/var/folders/xy/abc123/T/sa-run/ws")' in text
        assert '(subpath "/tmp/sa-canaries/secret.txt")' in text  # the lexical form is denied too

    def test_no_network_and_canary_inside_workspace(self) -> None:
        """No proxy means no network grant; ancestors of an in-workspace canary can't be renamed."""
        policy = SeatbeltPolicy(
            workspace=Path('/tmp/we"ird\\ws'),
            proxy_port=None,
            deny_read=(Path('/tmp/we"ird\\ws/.git/hooks/secret'),),
        )
        text = render_profile(policy, mac_resolve)
        check_golden("seatbelt_no_network.sb", text)
        assert "network-outbound (remote tcp" not in text
        assert '(literal "/private/tmp/we\\"ird\\\\ws/.git/hooks")' in text

    def test_denials_follow_the_grants_they_narrow(self) -> None:
        """SBPL's last match wins, so every deny comes after the broad allow it narrows."""
        text = render_profile(SeatbeltPolicy(Path("/ws"), 8080, (Path("/ws/c"),)), mac_resolve)
        lines = text.splitlines()
        assert lines[:2] == ["(version 1)", "(deny default)"]
        assert lines.index("(allow file-read*)") < lines.index(
            '(deny file-read* file-write* (subpath "/ws/c"))'
        )
        assert lines[-1] == "(deny network-outbound (remote unix-socket))"
        assert '(allow network-outbound (remote tcp "localhost:8080"))' in lines

    def test_never_a_local_ip_filter_nor_unix_socket_grant(self) -> None:
        """No `local ip` outbound filter (it allows everything) and no unix-socket allow."""
        text = render_profile(SeatbeltPolicy(Path("/ws"), 1, ()), mac_resolve)
        assert "local ip" not in text
        allows = [ln for ln in text.splitlines() if ln.startswith("(allow")]
        assert not [ln for ln in allows if "unix" in ln or "mach-lookup" in ln]
        assert [ln for ln in allows if "network" in ln] == [
            '(allow network-outbound (remote tcp "localhost:1"))'
        ]


class TestEscaping:
    """SBPL string quoting and refusals."""

    @pytest.mark.parametrize(
        ("raw", "quoted"),
        [
            ("/a b", '"/a b"'),
            ('/a"b', '"/a\\"b"'),
            ("/a\\b", '"/a\\\\b"'),
            ('/\\"', '"/\\\\\\""'),
            ("/é", '"/é"'),
        ],
        ids=["space", "quote", "backslash", "backslash-quote", "non-ascii"],
    )
    def test_quotes_and_backslashes(self, raw: str, quoted: str) -> None:
        """Quotes and backslashes are escaped; other characters pass through."""
        assert sbpl_string(raw) == quoted

    @pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\t", "\x7f"])
    def test_control_characters_refused_naming_the_path(self, char: str) -> None:
        """A control character is a ConfigError that names the offending path."""
        with pytest.raises(ConfigError, match="contains the control character") as info:
            render_profile(SeatbeltPolicy(Path(f"/ws{char}x"), None), mac_resolve)
        assert repr(f"/ws{char}x") in str(info.value)

    def test_relative_path_refused(self) -> None:
        """A relative workspace is refused: seatbelt only matches absolute paths."""
        with pytest.raises(ConfigError, match="is relative"):
            render_profile(SeatbeltPolicy(Path("ws"), None), mac_resolve)

    @pytest.mark.parametrize("port", [0, 65536])
    def test_bad_port_refused(self, port: int) -> None:
        """A port outside 1..65535 is refused."""
        with pytest.raises(ConfigError, match="not a TCP port"):
            render_profile(SeatbeltPolicy(Path("/ws"), port), mac_resolve)


class TestResolution:
    """Path and proxy URL resolution."""

    def test_default_resolver_follows_real_symlinks(self, tmp_path: Path) -> None:
        """With the default resolver a symlinked workspace is written as its target."""
        target = tmp_path / "real"
        target.mkdir()
        (tmp_path / "link").symlink_to(target)
        text = render_profile(SeatbeltPolicy(tmp_path / "link", None))
        assert f"(allow file-write* (subpath {sbpl_string(target.resolve())}))" in text
        assert str(tmp_path / "link") not in text

    @pytest.mark.parametrize(
        ("url", "port"),
        [("http://sandbox-attest:s3cret@127.0.0.1:4242", 4242), ("http://localhost:1", 1)],
    )
    def test_proxy_port_of_loopback_url(self, url: str, port: int) -> None:
        """The port is taken from a loopback proxy URL."""
        assert proxy_port_of(url) == port

    @pytest.mark.parametrize("url", ["http://proxy.test:3128", "http://127.0.0.1"])
    def test_proxy_port_of_refuses_non_loopback_or_portless(self, url: str) -> None:
        """A non-loopback or port-less proxy URL is a ConfigError."""
        with pytest.raises(ConfigError):
            proxy_port_of(url)


def make_request(tmp_path: Path, egress: EgressRoute | None) -> ProbeRequest:
    """A request for a tiny payload that prints the start marker and its env as JSON."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    code = (
        f"import json,os;print({START_MARKER!r}+' n1');"
        "print(json.dumps({k: os.environ.get(k) for k in ('TMPDIR', 'HTTP_PROXY')}))"
    )
    return ProbeRequest(
        cell_id="seatbelt-net_denied_host",
        argv=(sys.executable, "-c", code),
        env={"HTTP_PROXY": "http://sandbox-attest:s@127.0.0.1:4242"} if egress else {},
        workspace=workspace,
        read_only=(),
        egress=egress,
        timeout=20,
        cell_dir=tmp_path / "cell",
    )


class TestBackend:
    """The backend object: protocol, availability, argv and run plumbing."""

    def test_satisfies_the_backend_protocol(self) -> None:
        """SeatbeltBackend is a Backend with direct-tcp egress."""
        backend = SeatbeltBackend(home=Path("/Users/ci"))
        assert isinstance(backend, Backend)
        assert backend.egress_mode == "direct-tcp"

    def test_created_backend_denies_home_secret_folders_only(self, tmp_path: Path) -> None:
        """As the module docstring says: create_backend passes no canaries, only $HOME's folders.

        A canary planted elsewhere (the cell dir's `.env`) is not in the profile's denials;
        fs_read_secrets' verdict judges it, this profile does not hide it.
        """
        backend = create_backend("seatbelt")
        assert isinstance(backend, SeatbeltBackend)
        denied = backend.policy_for(make_request(tmp_path, None)).deny_read
        assert denied == tuple(Path.home() / rel for rel in HOME_SECRETS)

    def test_unavailable_off_macos(self) -> None:
        """Off macOS availability is False and the reason names the fix."""
        avail = SeatbeltBackend(system="linux").availability()
        assert not avail.ok
        assert "only on macOS" in avail.reason
        assert "macOS runner" in avail.reason
        assert avail.identity is None

    def test_unavailable_without_sandbox_exec(self, tmp_path: Path) -> None:
        """On macOS without sandbox-exec the reason names the missing path."""
        missing = tmp_path / "sandbox-exec"
        avail = SeatbeltBackend(system="darwin", sandbox_exec=missing).availability()
        assert not avail.ok
        assert str(missing) in avail.reason

    def test_identity_digest_is_stable(self, tmp_path: Path) -> None:
        """The identity's profile is a placeholder template, so its digest is run-independent."""
        fake = tmp_path / "sandbox-exec"
        fake.write_text("")
        one = SeatbeltBackend(system="darwin", sandbox_exec=fake).availability()
        two = SeatbeltBackend(system="darwin", sandbox_exec=fake).availability()
        assert one.ok
        assert one.identity is not None
        assert two.identity is not None
        assert one.identity.profile_digest == two.identity.profile_digest
        assert one.identity.claims.as_dict() == {
            "network": "proxy",
            "filesystem": "workspace",
            "ipc": "isolated",
        }

    def test_command_puts_profile_after_dash_p(self, tmp_path: Path) -> None:
        """The argv is sandbox-exec -p PROFILE followed by the payload argv unchanged."""
        request = make_request(
            tmp_path, EgressRoute(tmp_path / "p.sock", "http://u:s@127.0.0.1:4242")
        )
        backend = SeatbeltBackend(home=Path("/Users/ci"), resolve=mac_resolve)
        argv, profile = backend.command(request)
        assert argv[:3] == ["/usr/bin/sandbox-exec", "-p", profile]
        assert tuple(argv[3:]) == request.argv
        assert '"localhost:4242"' in profile
        assert '(subpath "/Users/ci/.ssh")' in profile

    def test_run_through_a_stand_in_sandbox_exec(self, tmp_path: Path) -> None:
        """run() hands sandbox-exec the profile and payload, and records the profile."""
        record = tmp_path / "argv.json"
        fake = tmp_path / "sandbox-exec"
        fake.write_text(
            f"#!{sys.executable}\n"
            "import json, os, sys\n"
            f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
            "os.execv(sys.argv[3], sys.argv[3:])\n"
        )
        fake.chmod(0o755)
        request = make_request(
            tmp_path, EgressRoute(tmp_path / "p.sock", "http://u:s@127.0.0.1:4242")
        )
        run = SeatbeltBackend(sandbox_exec=fake, home=tmp_path).run(request)
        assert run.started, run.stderr
        assert run.exit_code == 0
        seen = json.loads(record.read_text())
        profile = (request.cell_dir / "seatbelt.sb").read_text()
        assert seen[:2] == ["-p", profile]
        env = json.loads(run.stdout.splitlines()[1])
        assert env == {
            "TMPDIR": str(request.workspace),
            "HTTP_PROXY": "http://sandbox-attest:s@127.0.0.1:4242",
        }
