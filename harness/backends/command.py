"""The command-wrapper backend: attest any third-party sandbox CLI described by a spec file.

The spec (see `harness.backends.spec`) says how to find the wrapper, the argv around the
payload, the files it needs per cell, how egress reaches the fixture world and what it claims
to enforce. This module turns one `ProbeRequest` into that command line and runs it the way
real wrappers demand:

* a fresh working directory per cell (some wrappers fail at random when parallel runs share
  one), holding the files rendered for that cell;
* the wrapper in its own session, the whole group SIGKILLed at the deadline (some wrappers exit
  0 on SIGTERM, and a timeout is recorded by us, never inferred from their exit status);
* after every run, a sweep for anything the run started that is still alive, including
  children that left the process group with setsid(): every process of the run carries a
  per-run tag in its environment, and whatever still carries it afterwards is killed and named
  in the run's notes. The sweep is best effort, not a boundary: a process that both leaves the
  group and drops the tag (`setsid env -i CMD`, or any exec with a fresh environment) is
  invisible to it and survives the run, as is one whose /proc environ we may not read (a
  setuid wrapper's children). Only the wrapper's own confinement (a pid namespace that dies
  with it, such as bwrap's --die-with-parent) removes those.

The wrapper's exit status is never the probe's: the runner reads the start marker and the JSON
line, and a wrapper that refuses to start is an ERROR with its stderr.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from harness.backends.base import (
    SHIM_PORT,
    Availability,
    EgressMode,
    Identity,
    ProbeRequest,
    ProbeRun,
    shim_path,
)
from harness.backends.none import platform_string
from harness.backends.process import run_process
from harness.backends.spec import (
    ALLOWED_ROLES,
    HOST_ROLES,
    AddressBy,
    CommandSpec,
    RenderContext,
    SpecEgress,
    json_list,
    load_spec,
    sample_context,
    shell_join,
)
from harness.errors import BackendError
from harness.host_os import current_platform
from harness.paths import matrix_dir
from harness.payload import interpreter_paths
from harness.provenance import executable_facts
from harness.trust import PayloadUser, give, payload_user

# Every process of one run carries this variable (value: a per-run random tag), so that the
# sweep after the run finds children that left the wrapper's process group.
RUN_TAG_VAR: Final = "SANDBOX_ATTEST_RUN_TAG"
# How long the final sweep keeps killing tagged processes (a forking daemon may respawn).
SWEEP_SECONDS: Final = 3.0
DETECT_TIMEOUT_S: Final = 30.0
EGRESS_MODES: Final[dict[SpecEgress, EgressMode]] = {
    "harness-unix": "shim",
    "harness-tcp": "direct-tcp",
    "own": "own",
}
PROXY_VARS: Final = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
# Run under the wrapper at availability time: the network namespace the payload would get.
NETNS_PROBE: Final = "import os; print('netns=' + os.readlink('/proc/self/ns/net'))"


def expects_private_netns(spec: CommandSpec) -> bool:
    """Whether the declared policy can only hold in a network namespace of the payload's own.

    network = "none" needs one; so does "proxy" through the in-sandbox shim (harness-unix),
    whose loopback port would otherwise be the host's. With harness-tcp or the wrapper's own
    proxy the payload shares the host's loopback by design, so equal namespaces prove nothing
    there: the network probes judge those wrappers instead.
    """
    return spec.policy.network == "none" or (
        spec.policy.network == "proxy" and spec.egress == "harness-unix"
    )


def specs_dir() -> Path:
    """Where named specs live: `matrix/backends/<name>.toml`."""
    return matrix_dir() / "backends"


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries `RUN_TAG_VAR=tag` (unreadable ones are skipped)."""
    needle = f"{RUN_TAG_VAR}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone already, or not ours to read
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _describe(pid: int) -> str:
    try:
        cmd = (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode("utf-8", "replace")
        )
    except OSError:
        cmd = "?"
    return f"{pid} ({cmd.strip()[:120]})"


class CommandBackend:
    """A third-party sandbox CLI driven by a spec file."""

    def __init__(self, spec: CommandSpec) -> None:
        """Wrap a validated spec (see `from_path`)."""
        self.spec = spec
        self.name = spec.name
        self.egress_mode: EgressMode = EGRESS_MODES[spec.egress]
        # The runner puts this in the task: "literal" makes payloads dial 127.0.0.1:PORT.
        self.address_by: AddressBy = spec.address_by

    @classmethod
    def from_path(cls, path: Path) -> CommandBackend:
        """Load the spec at `path` (ConfigError naming the file, key and fix if invalid)."""
        return cls(load_spec(path))

    # -- who the wrapper runs as ---------------------------------------------------------

    def user(self, request: ProbeRequest | None = None) -> PayloadUser | None:
        """The user the wrapper runs as: the spec's `[run] user`, else the run's payload user.

        Args:
            request: the cell's request, whose `user` is the run's payload user; without
                one (availability), the default payload user.

        Returns:
            None where the harness cannot switch uid, or where the spec says "root" (with
            its reason, recorded in the identity as `runs_as`).

        Raises:
            ConfigError: the spec names an account that does not exist or is root by uid.
        """
        if self.spec.run_user == "root":
            return None
        if self.spec.run_user:
            return payload_user(self.spec.run_user)
        return request.user if request is not None else payload_user()

    def _user_kwargs(self) -> dict[str, Any]:
        user = self.user()
        return user.popen_kwargs() if user is not None else {}

    def runs_as(self) -> str:
        """Who the wrapper runs as, in words, for the identity."""
        if self.spec.run_user == "root":
            return f"root, as {self.spec.source} asks: {self.spec.run_user_reason}"
        user = self.user()
        if user is None:
            return f"the harness's own uid {os.geteuid()}: it cannot switch users here"
        return f"{user.name} (uid {user.uid})"

    # -- availability ------------------------------------------------------------------

    def availability(self) -> Availability:
        """Find the wrapper's executables, run its check, and say who it is."""
        spec = self.spec
        fix = spec.install or f"install it, or fix [detect] executables in {spec.source}"
        here = current_platform()
        if here not in spec.platforms:
            return _unavailable(
                f"{spec.name} is declared for {list(spec.platforms)} "
                f"in {spec.source}; this machine is {here}",
            )
        for exe in spec.executables:
            if shutil.which(exe) is None:
                return _unavailable(
                    f"{exe} not found on PATH (needed by the "
                    f"{spec.name} spec {spec.source}); {fix}",
                )
        version = "unknown"
        if spec.version_argv:
            result = self._detect(spec.version_argv)
            if isinstance(result, subprocess.CompletedProcess):
                version = _first_line(result.stdout) or _first_line(result.stderr) or version
        failure = self._check()
        if failure:
            return _unavailable(failure)
        confinement = "none (the declared policy needs no private network namespace)"
        if expects_private_netns(spec):
            failure = self._netns_check()
            if failure:
                return _unavailable(failure)
            confinement = "private network namespace"
        # [detect] check stays optional (the test specs of hole wrappers and daemonizing ones
        # have none). Without it and without the netns check, AVAILABLE rests on PATH alone:
        # the identity and the recorded reason say so instead of implying a check ran.
        weak = ""
        if not spec.check_argv and not expects_private_netns(spec):
            weak = (
                f"available means only that {', '.join(spec.executables)} is on PATH: "
                f"{spec.source} has no [detect] check, and network = "
                f'"{spec.policy.network}" with egress = "{spec.egress}" needs no private '
                "network namespace to test; add a [detect] check that fails where the "
                "wrapper cannot confine"
            )
        identity = Identity(
            name=spec.name,
            version=version,
            platform=platform_string(),
            policy=spec.policy,
            profile={
                "kind": "command",
                "spec": json.loads(json.dumps(spec.raw, sort_keys=True, default=str)),
                "egress": self.egress_mode,
                "address_by": self.address_by,
                "check": shell_join(list(spec.check_argv)) if spec.check_argv else "none",
                "confinement_check": confinement,
            },
            executables=self.executables(),
            spec_sha256=hashlib.sha256(spec.source.read_bytes()).hexdigest(),
            runs_as=self.runs_as(),
        )
        return Availability(ok=True, reason=weak, identity=identity)

    def executables(self) -> dict[str, Any]:
        """Every program a cell of this spec starts: the wrapper(s), argv[0], the interpreter."""
        path = self._base_env().get("PATH", os.defpath)
        names = [*self.spec.executables]
        first = self.spec.argv[0] if self.spec.argv else None
        if isinstance(first, str) and "{" not in first and first not in names:
            names.append(first)
        facts = {name: executable_facts(name, path) for name in names}
        facts["{python}"] = executable_facts(sys.executable, path)
        return facts

    def _check(self) -> str:
        """Run [detect] check if the spec has one; '' if it passed, else the reason."""
        spec = self.spec
        if not spec.check_argv:
            return ""
        result = self._detect(spec.check_argv)
        if isinstance(result, str):
            said = result
        elif result.returncode != 0:
            output = (result.stderr.strip() or result.stdout.strip())[-400:]
            said = f"exit {result.returncode}: {output or 'no output'}"
        else:
            return ""
        return (
            f"{spec.name} is installed but cannot confine here: "
            f"`{shell_join(list(spec.check_argv))}` failed ({said}); check the "
            f"wrapper works on this machine, or fix [detect] check in {spec.source}"
        )

    def _netns_check(self) -> str:
        """Run a one-liner under the spec's own [run] argv; '' if it saw a private netns.

        Returns the UNAVAILABLE reason otherwise. A wrapper's exit status does not show it
        confined anything: firejail inside a container detects "an existing sandbox" and runs
        the program unsandboxed, exit 0, with the warning hidden by --quiet. So the wrapper
        must show it behaviourally, with the argv the cells will use: one extra process.
        """
        spec = self.spec
        try:
            host_ns = str(Path("/proc/self/ns/net").readlink())
        except OSError as exc:
            return (
                f"{spec.name}: cannot read the harness's own network namespace ({exc}), so "
                "cannot show the wrapper confines; run the harness on Linux with /proc mounted"
            )
        with tempfile.TemporaryDirectory(prefix="sandbox-attest-check-") as tmp:
            ctx, run_dir = self._check_context(Path(tmp))
            self.render_files(ctx, run_dir)
            give(Path(tmp), self.user(), recursive=True)
            argv = ctx.render_argv(spec)
            env = self._base_env()
            for name, template in spec.env_set.items():
                env[name] = ctx.render(template, f"{spec.source}: [env] set.{name}")
            try:
                result = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    timeout=DETECT_TIMEOUT_S,
                    check=False,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=run_dir,
                    start_new_session=True,
                    **self._user_kwargs(),
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return _no_test_command(spec, f"{type(exc).__name__}: {exc}")
        seen = _netns_line(result.stdout)
        if not seen:
            output = (result.stderr.strip() or result.stdout.strip())[-400:]
            return _no_test_command(spec, f"exit {result.returncode}: {output or 'no output'}")
        if seen == host_ns:
            return (
                f"{spec.name} ran a test command in the harness's own network namespace "
                f"({host_ns}) although {spec.source} declares network = "
                f'"{spec.policy.network}" with egress = "{spec.egress}": the wrapper fell back '
                "to running it unconfined (firejail does so inside a container or another "
                "sandbox, and --quiet hides its warning); run the harness where the wrapper "
                "can create namespaces, or fix [run] argv"
            )
        return ""

    def _check_context(self, root: Path) -> tuple[RenderContext, Path]:
        """A render context for the confinement check: real paths under `root`, sample rest."""
        spec = self.spec
        workspace, run_dir, socket = root / "workspace", root / "run", root / "proxy.sock"
        workspace.mkdir()
        run_dir.mkdir()
        socket.touch()  # wrappers bind it in; nothing connects during the check
        payload = [sys.executable, "-c", NETNS_PROBE]
        sample = sample_context()
        read_only = [str(p) for p in interpreter_paths()]
        lists = sample.lists | {"read_only": read_only}
        scalars = sample.scalars | {
            "workspace": str(workspace),
            "run_dir": str(run_dir),
            "cell_id": f"{spec.name}-availability",
            "python": sys.executable,
            "probe_argv": shell_join(payload),
            "payload_shell": shell_join(payload),
            "proxy_socket": str(socket),
            "shim": str(shim_path()),
            "world_dir": str(root),
            "read_only_json": json_list(read_only),
            "read_only_csv": ",".join(read_only),
        }
        base = RenderContext(scalars, lists, payload)
        scalars["proxy_socket_inside"] = base.render(
            spec.proxy_socket_inside, f"{spec.source}: [run] proxy_socket_inside"
        )
        scalars["shim_inside"] = base.render(spec.shim_inside, f"{spec.source}: [run] shim_inside")
        return RenderContext(scalars, lists, payload), run_dir

    def _detect(self, argv: tuple[str, ...]) -> subprocess.CompletedProcess[str] | str:
        # The wrapper is third-party code under test: even its --version runs as the user its
        # cells run as, never as the harness's (root's) own.
        try:
            return subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=DETECT_TIMEOUT_S,
                check=False,
                stdin=subprocess.DEVNULL,
                env=self._base_env(),
                start_new_session=True,
                cwd="/",
                **self._user_kwargs(),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{type(exc).__name__}: {exc}"

    # -- rendering ---------------------------------------------------------------------

    def context(self, request: ProbeRequest, run_dir: Path) -> RenderContext:
        """Every placeholder's value for one cell."""
        world = request.world
        if world is None:
            raise BackendError(
                f"the {self.name} command backend renders fixture addresses "
                "and needs ProbeRequest.world; run it through the CellRunner"
            )
        proxy = urlsplit(world.proxy.url)
        scalars: dict[str, str] = {
            "workspace": str(request.workspace),
            "run_dir": str(run_dir),
            "cell_id": request.cell_id,
            "python": request.argv[0],
            "probe_argv": shell_join(list(request.argv)),
            "proxy_url": world.proxy.url,
            "proxy_host": proxy.hostname or "127.0.0.1",
            "proxy_port": str(world.proxy.port),
            "proxy_user": unquote(proxy.username or ""),
            "proxy_secret": unquote(proxy.password or ""),
            "proxy_socket": world.proxy.socket,
            "shim": str(shim_path()),
            "shim_port": str(SHIM_PORT),
            "ca_bundle": world.ca_bundle,
            "dns_host": world.dns.host,
            "dns_port": str(world.dns.port),
            "world_dir": world.run_dir,
        }
        for role in HOST_ROLES:
            host = world.hosts[role]
            scalars |= {
                f"{role}_host": host.name,
                f"{role}_ip": host.address,
                f"{role}_https_port": str(host.https_port),
                f"{role}_http_port": str(host.http_port),
            }
        denied_roles = [r for r in HOST_ROLES if r not in ALLOWED_ROLES]
        lists: dict[str, list[str]] = {
            "read_only": [str(p) for p in request.read_only],
            "allowed_hosts": [world.hosts[r].name for r in ALLOWED_ROLES],
            "allowed_addresses": _addresses(world.hosts, ALLOWED_ROLES),
            "denied_hosts": [world.hosts[r].name for r in denied_roles],
            "denied_addresses": _addresses(world.hosts, denied_roles),
        }
        for name, values in lists.items():
            scalars[f"{name}_json"] = json_list(values)
            scalars[f"{name}_csv"] = ",".join(values)
        base = RenderContext(scalars, lists, [])
        scalars["proxy_socket_inside"] = base.render(
            self.spec.proxy_socket_inside, f"{self.spec.source}: [run] proxy_socket_inside"
        )
        scalars["shim_inside"] = base.render(
            self.spec.shim_inside, f"{self.spec.source}: [run] shim_inside"
        )
        payload = list(request.argv)
        if self.spec.egress == "harness-unix" and request.egress is not None:
            # The shim listens before it starts the payload, so the payload never races it; it
            # runs under the payload's own interpreter, which the wrapper must expose anyway.
            payload = [
                payload[0],
                scalars["shim_inside"],
                "--unix",
                scalars["proxy_socket_inside"],
                "--port",
                str(SHIM_PORT),
                "--",
                *payload,
            ]
        scalars["payload_shell"] = shell_join(payload)
        return RenderContext(scalars, lists, payload)

    def _base_env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8"}
        for name in self.spec.env_host:
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def build_env(self, request: ProbeRequest, ctx: RenderContext, tag: str) -> dict[str, str]:
        """The wrapper's environment: declared names only, never the harness's own."""
        env = {k: request.env[k] for k in self.spec.env_pass if k in request.env}
        if self.spec.egress == "harness-tcp":
            # The route itself: the payload may take its proxy from the environment.
            env |= {k: request.env[k] for k in PROXY_VARS if k in request.env}
        for name in self.spec.env_host:
            if name in os.environ:
                env[name] = os.environ[name]
        for name, template in self.spec.env_set.items():
            env[name] = ctx.render(template, f"{self.spec.source}: [env] set.{name}")
        env[RUN_TAG_VAR] = tag
        return env

    def prepare(self, request: ProbeRequest) -> tuple[list[str], dict[str, str], Path, str]:
        """Make the cell's run dir, render its files; return (argv, env, run_dir, tag)."""
        run_dir = request.cell_dir / f"run-{self.name}"
        run_dir.mkdir(parents=True)  # fresh per cell: an existing one is a harness bug
        ctx = self.context(request, run_dir)
        self.render_files(ctx, run_dir)
        # The wrapper runs as the payload user: its cwd and the files rendered for it are its.
        give(run_dir, self.user(request), recursive=True)
        tag = secrets.token_hex(12)
        return ctx.render_argv(self.spec), self.build_env(request, ctx, tag), run_dir, tag

    def render_files(self, ctx: RenderContext, run_dir: Path) -> None:
        """Write the spec's [[file]] templates into `run_dir`."""
        for i, entry in enumerate(self.spec.files):
            where = f"{self.spec.source}: [[file]] #{i + 1}"
            target = run_dir / ctx.render(entry.path, f"{where}.path")
            if not target.resolve().is_relative_to(run_dir.resolve()):
                raise BackendError(f"{where}: path renders to {target}, outside the run dir")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(ctx.render(entry.template, f"{where}.template"), encoding="utf-8")
            target.chmod(entry.mode)

    # -- run ---------------------------------------------------------------------------

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run the payload under the wrapper; kill its group at the deadline, then sweep."""
        argv, env, run_dir, tag = self.prepare(request)
        # The watcher must run *during* the run: a leftover that holds our stdout/stderr pipes
        # open would otherwise keep the output readers (and so the run) from ever finishing.
        watcher = LeftoverWatcher(tag)
        watcher.start()
        try:
            run = run_process(
                request.cell_id, argv, env, run_dir, request.timeout, user=self.user(request)
            )
        finally:
            watcher.finish()
        if watcher.killed:
            run.notes.append(
                f"killed {len(watcher.killed)} process(es) the run left behind: "
                + "; ".join(watcher.killed.values())
            )
        if watcher.surviving:
            run.notes.append("STILL ALIVE after the sweep: " + "; ".join(watcher.surviving))
        return run


class LeftoverWatcher(threading.Thread):
    """Kills what a run leaves behind as soon as the wrapper itself has exited.

    The wrapper is the only tagged process whose parent is this process (the tag appears at
    exec, so there is no window where a forked harness child carries it). Once no tagged
    process is our child, the wrapper is gone (or a zombie awaiting reaping, whose environ
    reads empty), and everything still tagged is a leftover: killed at once, whatever session
    or process group it moved to. Found by the tag only: a process that drops it (`setsid env
    -i ...`) escapes the watcher, as the module docstring says.
    """

    POLL_S: Final = 0.05

    def __init__(self, tag: str) -> None:
        """Watch the processes carrying `tag`."""
        super().__init__(name=f"leftovers-{tag[:6]}", daemon=True)
        self.tag = tag
        self.killed: dict[int, str] = {}
        self.surviving: list[str] = []
        self._done = threading.Event()
        self._enabled = Path("/proc/self/stat").exists()  # no procfs (macOS): group kill only

    def run(self) -> None:
        """Poll until `finish`; kill leftovers whenever the wrapper is no longer running."""
        while self._enabled and not self._done.wait(self.POLL_S):
            pids = [p for p in tagged_pids(self.tag) if p != os.getpid()]
            if pids and not any(_ppid(p) == os.getpid() for p in pids):
                self._kill(pids)

    def finish(self) -> None:
        """Stop watching, then sweep until nothing tagged is left (or give up and say so)."""
        self._done.set()
        self.join()
        if not self._enabled:
            return
        deadline = time.monotonic() + SWEEP_SECONDS
        while pids := [p for p in tagged_pids(self.tag) if p != os.getpid()]:
            if time.monotonic() > deadline:
                self.surviving = [_describe(p) for p in pids]
                return
            self._kill(pids)
            time.sleep(self.POLL_S)

    def _kill(self, pids: list[int]) -> None:
        for pid in pids:
            self.killed.setdefault(pid, _describe(pid))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _netns_line(stdout: str) -> str:
    """The namespace NETNS_PROBE printed ('' if it printed none)."""
    for line in stdout.splitlines():
        if line.startswith("netns="):
            return line.removeprefix("netns=").strip()
    return ""


def _no_test_command(spec: CommandSpec, said: str) -> str:
    return (
        f"{spec.name} did not run a test command under its [run] argv ({said}); "
        f"check the wrapper works on this machine, or fix [run] argv in {spec.source}"
    )


def _unavailable(reason: str) -> Availability:
    return Availability(ok=False, reason=reason, identity=None)


def _addresses(hosts: dict[str, Any], roles: list[str] | tuple[str, ...]) -> list[str]:
    out = []
    for role in roles:
        host = hosts[role]
        out += [f"{host.address}:{host.https_port}", f"{host.address}:{host.http_port}"]
    return out


def resolve_spec(name_or_path: str) -> Path | None:
    """`X` -> matrix/backends/X.toml, or a path to a .toml file; None unless that file exists."""
    if looks_like_path(name_or_path):
        candidate = Path(name_or_path)
        return candidate if candidate.is_file() else None
    named = specs_dir() / f"{name_or_path}.toml"
    return named if named.is_file() else None


def looks_like_path(name_or_path: str) -> bool:
    """A backend given as a spec file's path rather than a name."""
    return name_or_path.endswith(".toml") or os.sep in name_or_path


def available_specs() -> list[str]:
    """Names of the spec files in matrix/backends/ (what `--backend NAME` can find)."""
    return sorted(p.stem for p in specs_dir().glob("*.toml"))
