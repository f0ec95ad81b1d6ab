"""The command-wrapper backend: specs, process hygiene, and live verdicts of real wrappers.

Live tests drive the real CellRunner against a real running world (copying
tests/integration/test_verdicts_live.py): real bwrap, real firejail, real proxy, DNS and TLS.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import sandbox_attest.backends
from sandbox_attest.backends import create_backend, register_spec
from sandbox_attest.backends.base import Backend, EgressRoute, ProbeRequest
from sandbox_attest.backends.bubblewrap import BubblewrapBackend
from sandbox_attest.backends.command.backend import CommandBackend
from sandbox_attest.backends.command.env import AGENT_CANARIES, WRAPPER_ENV_FILE
from sandbox_attest.backends.command.leftovers import RUN_TAG_VAR, tagged_pids
from sandbox_attest.backends.command.spec_load import load_spec, resolve_spec
from sandbox_attest.backends.none import NoneBackend
from sandbox_attest.errors import ConfigError
from sandbox_attest.host import login_session
from sandbox_attest.paths import matrix_dir
from sandbox_attest.run.matrix import Cell, ProbeRow
from sandbox_attest.run.runner import CellRunner
from sandbox_attest.world.core import World, start_world

SPECS = Path(__file__).parent.parent / "data" / "specs"
LIVE_SPECS = matrix_dir() / "backends"
CORE = (
    "net_denied_host",
    "net_direct_egress",
    "dns_resolution",
    "ipc_unix_socket_escape",
    "fs_write_outside",
    "net_transfer_18mib",
    "pkg_pip_install",
)
TIMEOUTS = {"net_transfer_18mib": 120.0, "pkg_pip_install": 180.0}
# What firejail (0.9.72, matrix/backends/firejail.toml) earned on Debian 12 as root. Filesystem
# unix sockets stay reachable: firejail has no socket isolation unless each path is blacklisted.
# /dev/shm is the host's: without --private-dev, --read-only=/ leaves it writable, and since
# fs_write_outside plants a canary there (issue 14 item 3) that write is seen from the host.
FIREJAIL_VERDICTS = dict.fromkeys(CORE, "PASS") | {
    "ipc_unix_socket_escape": "FAIL",
    "fs_write_outside": "FAIL",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One real running world for the module."""
    started = start_world(tmp_path_factory.mktemp("world"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def runner(world: World, tmp_path_factory: pytest.TempPathFactory) -> CellRunner:
    """A runner whose control leg has run every core probe once (later legs judge by it)."""
    none = NoneBackend()
    run = CellRunner(
        world=world,
        scratch=tmp_path_factory.mktemp("cells"),
        backends={"none": none},
        availability={"none": none.availability()},
        platform="linux",
    )
    for probe in CORE:
        entry = run.run_cell(cell("none", probe))
        assert entry["verdict"] == "PASS", verdict(entry)
    return run


def cell(backend: str, probe: str, timeout: float | None = None) -> Cell:
    """A matrix cell."""
    return Cell(backend, ProbeRow(probe, timeout or TIMEOUTS.get(probe, 60.0)), None)


def verdict(entry: Mapping[str, Any]) -> str:
    """The verdict, with the reason shown when an assertion fails."""
    return f"{entry['verdict']}: {entry['reason']}"


def add(runner: CellRunner, backend: Backend) -> str:
    """Make `backend` runnable by `runner`; fail (never skip) with the reason if it cannot run.

    ./run test installs every wrapper the live tests use, so an unavailable one is a broken
    install step that must show up red.
    """
    avail = backend.availability()
    if not avail.ok:
        pytest.fail(f"{backend.name} UNAVAILABLE here: {avail.reason}")
    runner.backends[backend.name] = backend
    runner.availability[backend.name] = avail
    return backend.name


def verdicts(runner: CellRunner, name: str, probes: tuple[str, ...]) -> dict[str, str]:
    """Run `probes` in backend `name`; probe id -> verdict (reasons kept for failures)."""
    out = {}
    for probe in probes:
        entry = runner.run_cell(cell(name, probe))
        out[probe] = entry["verdict"]
        if entry["verdict"] != "PASS":
            print(f"{name}-{probe}: {verdict(entry)}")
    return out


class TestSpecValidation:
    @pytest.mark.parametrize(
        ("spec", "needle"),
        [
            ("broken_bad_toml.toml", "not valid TOML"),
            ("broken_bad_name.toml", "[backend] name"),
            ("broken_unknown_key.toml", "[run]: unknown key(s) ['argvs']"),
            ("broken_missing_payload.toml", 'must contain the element "{payload}"'),
            ("broken_payload_inside_string.toml", "use {payload_shell}"),
            ("broken_unknown_placeholder.toml", "unknown placeholder {workdir}"),
            ("broken_bad_egress.toml", "[run] egress: is 'socks5'"),
            ("broken_each_unknown_list.toml", "argv[1].each: is 'read_write'"),
            ("broken_missing_policy_network.toml", "[claims] network: is missing"),
            ("broken_policy_unknown_mode.toml", "[claims] network: is 'sealed'"),
            ("broken_file_outside_run_dir.toml", "must stay inside the per-cell run dir"),
            ("broken_env_passes_secret.toml", "is never taken from the harness's environment"),
            (
                "broken_address_by_removed.toml",
                (
                    "[run] address_by: was removed: fixture names now resolve to lab "
                    "addresses through the system resolver"
                ),
            ),
            ("broken_env_pass_removed.toml", "[env] pass: was removed: it was the harness"),
        ],
    )
    def test_broken_spec_names_file_key_and_fix(self, spec: str, needle: str) -> None:
        """Every broken spec is a ConfigError naming its file and the offending key."""
        with pytest.raises(ConfigError) as info:
            load_spec(SPECS / spec)
        assert str(SPECS / spec) in str(info.value)
        assert needle in str(info.value)

    @pytest.mark.parametrize(
        ("old", "new", "needle"),
        [
            ('name = "env-claims-none"\n', "", '[backend] name: is missing; add name = "'),
            ('egress = "harness-tcp"\n', "", '[run] egress: is missing; add egress = "'),
            ('"env-claims-none"', "true", "[backend] name: the boolean true must be"),
            ('"harness-tcp"', "false", "[run] egress: is the boolean false; choose one of"),
            ('"{payload}"]', '"{payload}", 7]', "argv[2]: must be a string or an"),
            ('"{payload}"]', '"{workspac}", "{payload}"]', "did you mean {workspace}?"),
        ],
    )
    def test_bad_values_are_named_in_toml_terms(
        self, tmp_path: Path, old: str, new: str, needle: str
    ) -> None:
        """Missing keys say what to add; values show as TOML, never Python's None/True."""
        spec = write_spec(tmp_path, "bad", UNCONFINING_ENV.replace(old, new))
        with pytest.raises(ConfigError) as info:
            load_spec(spec)
        message = str(info.value)
        assert message.startswith(f"{spec}: [")  # always <file>: <key>: <what and fix>
        assert needle in message
        assert not {"None", "True", "False"} & set(message.replace(":", " ").split())
        assert len(message) < 300, message  # a hint, not the whole placeholder table

    def test_directory_as_spec_is_a_one_line_error(self, tmp_path: Path) -> None:
        """A directory given as the spec is a ConfigError, not an IsADirectoryError."""
        with pytest.raises(ConfigError, match="cannot read the backend spec"):
            load_spec(tmp_path)

    @pytest.mark.parametrize("name", ["firejail", "bwrap-generic"])
    def test_live_specs_load_by_name(self, name: str) -> None:
        """create_backend resolves a non-built-in name to matrix/backends/<name>.toml."""
        backend = create_backend(name)
        assert isinstance(backend, CommandBackend)
        assert backend.spec.source == LIVE_SPECS / f"{name}.toml"
        assert backend.egress_mode == "shim"

    @pytest.mark.parametrize(
        ("name", "egress", "environment"),
        [("srt", "own", "passthrough"), ("codex", "direct-tcp", "passthrough")],
    )
    def test_real_sandbox_specs_load_with_their_claims(
        self, name: str, egress: str, environment: str
    ) -> None:
        """The shipped srt and Codex specs load, find their wrapper on [run] path, and claim."""
        backend = create_backend(name)
        assert isinstance(backend, CommandBackend)
        assert backend.egress_mode == egress
        assert backend.run_path().startswith("/opt/sandbox-attest/npm/node_modules/.bin:")
        assert backend.spec.claims.environment == environment
        assert backend.spec.claims.syscalls == "filtered"

    def test_spec_path_and_registered_name(self) -> None:
        """A spec path loads as is; a registered spec is then creatable by its name."""
        path = SPECS / "hole_env_shared_net.toml"
        assert create_backend(str(path)).name == "env-shared-net"
        assert register_spec(path) == "env-shared-net"
        backend = create_backend("env-shared-net")
        assert isinstance(backend, CommandBackend)
        assert backend.egress_mode == "own"

    @pytest.mark.parametrize("name", ["none", "bubblewrap", "docker", "seatbelt", "appcontainer"])
    def test_builtin_name_is_rejected(self, tmp_path: Path, name: str) -> None:
        """A spec named like a built-in would be ignored (the built-in runs): refuse it."""
        spec = write_spec(tmp_path, name, UNCONFINING_ENV.replace("env-claims-none", name))
        with pytest.raises(ConfigError, match="is a built-in backend; rename it") as info:
            load_spec(spec)
        assert f"{spec}: [backend] name" in str(info.value)

    def test_two_spec_files_under_one_name_is_an_error(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Registering a second file under a registered name fails; the same file again is fine."""
        monkeypatch.setattr(sandbox_attest.backends, "_REGISTERED_SPECS", {})
        first = write_spec(tmp_path, "first", UNCONFINING_ENV)
        second = write_spec(tmp_path, "second", UNCONFINING_ENV)
        assert register_spec(first) == "env-claims-none"
        assert register_spec(first) == "env-claims-none"
        with pytest.raises(ConfigError, match="is already the name of the spec") as info:
            register_spec(second)
        assert str(first) in str(info.value)
        assert str(second) in str(info.value)

    def test_unknown_name_says_where_specs_go(self) -> None:
        """An unknown backend name points at matrix/backends/ and --backend-spec."""
        with pytest.raises(ConfigError, match="--backend-spec FILE"):
            create_backend("no-such-sandbox")

    def test_unknown_name_lists_the_specs_there_are(self) -> None:
        """A typo'd name shows the spec names it could have meant (plain pytest mode too)."""
        with pytest.raises(ConfigError) as info:
            create_backend("fierjail")
        assert "firejail" in str(info.value)
        assert "bwrap-generic" in str(info.value)

    def test_missing_spec_path_is_not_found(self, tmp_path: Path) -> None:
        """A path to no file resolves to nothing, so name checks catch it before any run."""
        missing = tmp_path / "nope.toml"
        assert resolve_spec(str(missing)) is None
        with pytest.raises(ConfigError, match=f"backend spec {missing} not found"):
            create_backend(str(missing))


class TestAvailability:
    def test_missing_executable_is_unavailable_with_fix(self) -> None:
        """A spec whose wrapper is not installed is UNAVAILABLE and names the install."""
        avail = CommandBackend.from_path(SPECS / "missing_wrapper.toml").availability()
        assert not avail.ok
        assert "sandbox-attest-no-such-wrapper not found on the payload's PATH" in avail.reason
        assert "apt-get install sandbox-attest-no-such-wrapper" in avail.reason

    def test_failing_check_is_unavailable_with_its_stderr(self) -> None:
        """A wrapper that cannot confine here is UNAVAILABLE with its own words."""
        avail = CommandBackend.from_path(SPECS / "check_fails.toml").availability()
        assert not avail.ok
        assert "cannot create user namespace: Operation not permitted" in avail.reason

    def test_identity_carries_version_policy_and_spec_digest(self) -> None:
        """The identity has the wrapper's version, its declared claims and a spec digest."""
        backend = create_backend("bwrap-generic")
        avail = backend.availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.version.startswith("bubblewrap ")
        assert avail.identity.claims.as_dict() == {
            "network": "proxy",
            "filesystem": "workspace",
            "ipc": "isolated",
            "limits": {"fsize_mib": 16, "nofile": 256},
        }
        assert avail.identity.profile_digest.startswith("sha256:")


def write_spec(tmp_path: Path, name: str, body: str) -> Path:
    """A spec file in `tmp_path` (tests/data/specs holds the shared ones)."""
    path = tmp_path / f"{name}.toml"
    path.write_text(body)
    return path


UNCONFINING_ENV = """
[backend]
name = "env-claims-none"
[detect]
executables = ["env"]
check = ["env", "true"]
[run]
egress = "harness-tcp"
argv = ["env", "{payload}"]
[claims]
network = "none"
filesystem = "open"
ipc = "open"
"""


class TestAvailabilityByBehaviour:
    @pytest.mark.parametrize(
        ("egress", "network"), [("harness-tcp", "none"), ("harness-unix", "proxy")]
    )
    def test_wrapper_that_does_not_confine_is_available_with_the_fact(
        self, tmp_path: Path, egress: str, network: str
    ) -> None:
        """A wrapper that runs its test command unconfined is AVAILABLE; the fact is recorded.

        This is firejail's fallback inside a container (`env` stands in for it): the probes
        judge it (net_direct_egress FAILs a shared network namespace), not availability.
        """
        body = UNCONFINING_ENV.replace('"harness-tcp"', f'"{egress}"').replace(
            'network = "none"', f'network = "{network}"'
        )
        avail = CommandBackend.from_path(write_spec(tmp_path, "x", body)).availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        facts = avail.identity.profile["test_command"]
        assert facts["started"] is True
        assert facts["network_namespace"] == "the harness's own"
        assert facts["unconfined"] is True
        assert "ran its test command with no confinement at all" in avail.reason

    def test_wrapper_that_cannot_run_the_test_command_is_unavailable(self, tmp_path: Path) -> None:
        """A wrapper that exits without running the test command is UNAVAILABLE, with why."""
        body = UNCONFINING_ENV.replace(
            'argv = ["env", "{payload}"]',
            'argv = ["sh", "-c", "echo no namespaces for you >&2", "sh", "{payload}"]',
        ).replace('executables = ["env"]', 'executables = ["sh"]')
        avail = CommandBackend.from_path(write_spec(tmp_path, "x", body)).availability()
        assert not avail.ok
        assert "did not run a test command" in avail.reason
        assert "no namespaces for you" in avail.reason

    @pytest.mark.parametrize("name", ["firejail", "bwrap-generic"])
    def test_real_wrappers_show_a_private_netns(self, name: str) -> None:
        """Firejail and bwrap-generic confine here, and the identity records what was seen."""
        avail = create_backend(name).availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        facts = avail.identity.profile["test_command"]
        assert facts["network_namespace"] == "private"
        assert facts["no_new_privs"] == "1"
        assert facts["unconfined"] is False
        assert avail.reason == ""

    def test_no_check_still_runs_the_test_command(self) -> None:
        """Without a [detect] check the identity says so, and the test command still ran."""
        avail = CommandBackend.from_path(SPECS / "hole_env_shared_net.toml").availability()
        assert avail.ok
        assert avail.identity is not None
        assert avail.identity.profile["check"] == "none"
        assert avail.identity.profile["test_command"]["started"] is True

    def test_checked_wrapper_has_no_caveat(self) -> None:
        """A confining wrapper carries its check and an empty reason."""
        avail = create_backend("firejail").availability()
        assert avail.ok, avail.reason
        assert avail.reason == ""
        assert avail.identity is not None
        assert avail.identity.profile["check"].startswith("firejail --quiet")

    def test_lingering_wrapper_does_not_hold_availability(self) -> None:
        """A wrapper that waits on a daemon after its test command is swept within seconds."""
        avail = CommandBackend.from_path(SPECS / "daemonizing_wrapper.toml").availability()
        assert avail.ok, avail.reason
        assert avail.identity is not None
        assert avail.identity.profile["test_command"]["started"] is True

    def test_shared_netns_claiming_none_is_available_and_fails(self, runner: CellRunner) -> None:
        """A wrapper sharing the harness's netns while claiming no network FAILs net_direct_egress.

        It is AVAILABLE (it runs commands here); the probe's host reading of the payload
        finds the harness's network namespace.
        """
        name = add(runner, CommandBackend.from_path(SPECS / "hole_shared_net_claims_none.toml"))
        facts = runner.availability[name].identity.profile["test_command"]  # type: ignore[union-attr]
        assert facts["network_namespace"] == "the harness's own"
        entry = runner.run_cell(cell(name, "net_direct_egress"))
        assert verdict(entry).startswith("FAIL:")
        assert "network namespace" in entry["reason"]


class TestProcessHygiene:
    def request(self, world: World, tmp_path: Path, timeout: float) -> ProbeRequest:
        """A request whose payload prints the start marker and then hangs."""
        workspace = tmp_path / "workspace"
        workspace.mkdir(parents=True)
        hang = "print('SANDBOX-ATTEST-START x', flush=True); import time; time.sleep(120)"
        return ProbeRequest(
            cell_id="daemonizing-hang",
            argv=(sys.executable, "-c", hang),
            env={
                "PATH": os.environ["PATH"],
                "HOME": str(workspace),
                "LANG": "C.UTF-8",
                "SANDBOX_ATTEST_SIGNING_KEY": "must-not-leak",
            },
            workspace=workspace,
            read_only=(),
            timeout=timeout,
            cell_dir=tmp_path / "cell",
            egress=EgressRoute(Path(world.info.proxy.socket), world.info.proxy.url),
            world=world.info,
        )

    def test_daemonized_helper_does_not_survive_timeout(self, world: World, tmp_path: Path) -> None:
        """A wrapper that setsid()s a helper and exits 0 on SIGTERM leaves nothing running."""
        backend = CommandBackend.from_path(SPECS / "daemonizing_wrapper.toml")
        request = self.request(world, tmp_path, timeout=3)
        run = backend.run(request)
        assert run.timed_out
        assert run.started
        daemon = int((request.cell_dir / "run-daemonizing" / "daemon.pid").read_text())
        # The helper left the wrapper's process group, so only the tag sweep could find it.
        assert any("sleep 300" in note and str(daemon) in note for note in run.notes), run.notes
        assert not any("STILL ALIVE" in note for note in run.notes)
        status = Path(f"/proc/{daemon}/status")
        assert not status.exists() or "\nState:\tZ" in status.read_text()

    def test_dropping_session_and_environment_does_not_evade_the_sweep(
        self, world: World, tmp_path: Path
    ) -> None:
        """`setsid env -i` leaves the session and environment, not the cell's group: killed."""
        spec = write_spec(
            tmp_path,
            "evader",
            """
[backend]
name = "evader"
[detect]
executables = ["sh", "setsid", "env"]
[run]
egress = "harness-tcp"
argv = ["sh", "{run_dir}/evade.sh", "{payload}"]
[[file]]
path = "evade.sh"
template = '''
setsid env -i sh -c 'echo $$ > evader.pid; exec sleep 60' &
while [ ! -s evader.pid ]; do sleep 0.05; done
exec "$@"
'''
[claims]
network = "open"
filesystem = "open"
ipc = "open"
""",
        )
        request = self.request(world, tmp_path, timeout=2)
        run = CommandBackend.from_path(spec).run(request)
        pid = int((request.cell_dir / "run-evader" / "evader.pid").read_text())
        try:
            assert run.started
            killed = [n for n in run.notes if n.startswith("killed") and str(pid) in n]
            assert killed, run.notes
            status = Path(f"/proc/{pid}/status")
            assert not status.exists() or "\nState:\tZ" in status.read_text()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def test_wrapper_env_is_an_agents(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The wrapper gets the harness's env minus secrets and proxies, canaries, the payload's."""
        monkeypatch.setenv("AGENT_EDITOR", "vi")
        real_token = "a-real-ci-token"  # noqa: S105  (a stand-in for a CI runner's own token)
        monkeypatch.setenv("GITHUB_TOKEN", real_token)
        monkeypatch.setenv("https_proxy", "http://proxy.example.invalid:3128")
        backend = CommandBackend.from_path(SPECS / "daemonizing_wrapper.toml")
        request = self.request(world, tmp_path, timeout=3)
        argv, env, cwd, tag = backend.prepare(request)
        record = json.loads((request.cell_dir / WRAPPER_ENV_FILE).read_text())
        assert (request.cell_dir / WRAPPER_ENV_FILE).stat().st_mode & 0o777 == 0o600
        assert set(record["canaries"]) == set(AGENT_CANARIES)
        assert {k: env[k] for k in AGENT_CANARIES} == record["canaries"]
        assert env["GITHUB_TOKEN"] != real_token
        assert "https_proxy" not in env
        assert env["AGENT_EDITOR"] == "vi"
        assert "SANDBOX_ATTEST_SIGNING_KEY" not in env
        assert env["HOME"] == str(request.workspace)
        assert env["PATH"] == backend.run_path()
        # Nothing tells the wrapper it is under test: leftovers are found by the cell's group.
        assert RUN_TAG_VAR not in env
        assert tag not in json.dumps(env)
        assert argv[:2] == ["sh", str(cwd / "wrapper.sh")]
        assert (cwd / "wrapper.sh").stat().st_mode & 0o777 == 0o700
        assert str(cwd) in (cwd / "wrapper.sh").read_text()
        assert tagged_pids(tag) == []

    def test_wrapper_env_has_the_login_session(
        self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """While the payload user's session is open, the wrapper gets its variables."""
        session = {"XDG_RUNTIME_DIR": "/run/user/994", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1"}
        monkeypatch.setattr(login_session, "current_env", lambda: session)
        backend = CommandBackend.from_path(SPECS / "daemonizing_wrapper.toml")
        env = backend.prepare(self.request(world, tmp_path, timeout=3))[1]
        assert {k: env[k] for k in session} == session

    def test_canaries_are_fresh_per_cell(self, world: World, tmp_path: Path) -> None:
        """Two cells of one backend get different canary values."""
        backend = CommandBackend.from_path(SPECS / "daemonizing_wrapper.toml")
        first = backend.prepare(self.request(world, tmp_path / "a", timeout=3))[1]
        second = backend.prepare(self.request(world, tmp_path / "b", timeout=3))[1]
        assert first["AWS_SECRET_ACCESS_KEY"] != second["AWS_SECRET_ACCESS_KEY"]

    def test_wrapper_refusing_to_start_is_error_with_stderr(self, runner: CellRunner) -> None:
        """A wrapper that exits 0 without starting the payload is ERROR with its stderr."""
        name = add(runner, CommandBackend.from_path(SPECS / "refuses_to_start.toml"))
        entry = runner.run_cell(cell(name, "net_direct_egress"))
        assert verdict(entry).startswith("ERROR: the sandbox did not start the payload")
        assert "cannot mount /proc: Permission denied" in entry["reason"]
        assert entry["run"]["exit_code"] == 0


class TestLiveWrappers:
    def test_bwrap_generic_earns_the_native_verdicts(self, runner: CellRunner) -> None:
        """Bwrap through the generic spec earns the native backend's verdict on every probe."""
        generic = add(runner, create_backend("bwrap-generic"))
        native = add(runner, BubblewrapBackend())
        through_spec = verdicts(runner, generic, CORE)
        assert through_spec == verdicts(runner, native, CORE)
        assert set(through_spec.values()) == {"PASS"}

    def test_firejail_verdicts_as_recorded(self, runner: CellRunner) -> None:
        """Firejail earns the recorded verdicts: host unix sockets stay reachable (FAIL)."""
        name = add(runner, create_backend("firejail"))
        assert verdicts(runner, name, CORE) == FIREJAIL_VERDICTS


class TestHoles:
    @pytest.mark.parametrize("probe", ["net_direct_egress", "dns_resolution"])
    def test_firejail_sharing_the_network_fails(self, runner: CellRunner, probe: str) -> None:
        """Firejail without --net=none FAILs the probes that reach the host network directly."""
        name = add(runner, CommandBackend.from_path(SPECS / "hole_firejail_shared_net.toml"))
        entry = runner.run_cell(cell(name, probe))
        assert verdict(entry).startswith("FAIL: escape observed by the host")

    def test_own_proxy_wrapper_sharing_the_network(self, runner: CellRunner) -> None:
        """Its proxy (from the env, NO_PROXY ignored) denies; its shared network FAILs both.

        The proxy's 403 is no PASS: the host saw the payload in the harness's network
        namespace, so the denied host is reachable around the proxy (issue 27). The cell
        still says its proxy's lookups went unwitnessed outside the lab (issue 26).
        """
        name = add(runner, CommandBackend.from_path(SPECS / "hole_env_shared_net.toml"))
        denied = runner.run_cell(cell(name, "net_denied_host"))
        assert verdict(denied).startswith("FAIL: escape observed by the host"), verdict(denied)
        assert "ran in the harness's network namespace" in denied["reason"]
        assert "the proxy's lookups were not witnessed" in denied["reason"]
        direct = runner.run_cell(cell(name, "net_direct_egress"))
        assert verdict(direct).startswith("FAIL: escape observed by the host")


class TestOwnProxyAllowlist:
    def spec(self, tmp_path: Path) -> Path:
        """A wrapper with its own proxy whose allowlist file is rendered per cell."""
        path = tmp_path / "own-allowlist.toml"
        path.write_text("""
[backend]
name = "own-allowlist"
[detect]
executables = ["env"]
[run]
egress = "own"
argv = ["env", "HTTPS_PROXY=http://127.0.0.1:9", "NO_PROXY=127.0.0.1", "{payload}"]
[lists]
allow = ["{allowed_host_ports}", "extra.test:443"]
[[file]]
path = "allowlist.json"
template = '{"allow": {allowed_addresses_json}, "names": {allow_json}, "deny": {denied_hosts_json}}'
[claims]
network = "proxy"
filesystem = "open"
ipc = "open"
""")
        return path

    def test_allowlist_rendered_from_the_worlds_lists(self, world: World, tmp_path: Path) -> None:
        """The allowlist names the allowed hosts with their ports, a spec's own entry appended."""
        backend = CommandBackend.from_path(self.spec(tmp_path))
        workspace = tmp_path / "ws"
        workspace.mkdir()
        request = ProbeRequest(
            cell_id="own-allowlist-x",
            argv=(sys.executable, "probe.py", "task.json"),
            env={},
            workspace=workspace,
            read_only=(),
            egress=None,
            timeout=5,
            cell_dir=tmp_path / "cell",
            world=world.info,
        )
        argv, env, run_dir, _ = backend.prepare(request)
        allow = json.loads((run_dir / "allowlist.json").read_text())
        hosts = world.info.hosts
        assert f"{hosts['allowed'].address}:{hosts['allowed'].https_port}" in allow["allow"]
        assert not any(str(hosts["denied"].https_port) in a for a in allow["allow"])
        assert f"{hosts['allowed'].name}:{hosts['allowed'].https_port}" in allow["names"]
        assert allow["names"][-1] == "extra.test:443"
        assert allow["deny"] == [hosts["denied"].name]
        assert argv[-3:] == [sys.executable, "probe.py", "task.json"]
        assert "HTTPS_PROXY" not in env
