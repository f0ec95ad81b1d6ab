"""The command-wrapper backend: attest any third-party sandbox CLI described by a spec file.

The spec (see `sandbox_attest.backends.spec`) says how to find the wrapper, the argv around the
payload, the files it needs per cell, how egress reaches the fixture world and what it claims
to enforce. This module turns one `ProbeRequest` into that command line and runs it the way
real wrappers demand:

* a fresh working directory per cell (some wrappers fail at random when parallel runs share
  one), holding the files rendered for that cell;
* the wrapper in its own session, the whole group SIGKILLed at the deadline (some wrappers exit
  0 on SIGTERM, and a timeout is recorded by us, never inferred from their exit status);
* after every run, a sweep for anything the run started that is still alive, including
  children that left the process group with setsid() or double-forked away with a fresh
  environment: the wrapper starts inside the cell's group (sandbox_attest/run/cellgroup.py: a
  cgroup the payload user cannot leave, or where none can be made the harness's process
  subtree), and whatever is still in the group once the wrapper has exited is killed and named
  in the run's notes. Nothing in any environment marks the run (a wrapper that could see a run
  tag could confine only when tested). In the subtree fallback the sweep is weaker: a process
  whose parent exits before the harness first sees it is nobody's member and survives.

The wrapper starts with an environment like an agent's, never one the harness scrubbed for
it: the harness's own variables minus anything secret-looking (`spec.SECRET_ENV`) and minus
its proxy settings (they would route a wrapper's own proxy out of the fixture world), plus
canary credentials planted per cell with random values (`AGENT_CANARIES`), plus the payload's
own variables, `[env] set` and `[env] wrapper`. What the sandbox lets through to the payload is
`env_inheritance`'s to judge; the planted values and the wrapper-only names are written to the
cell dir (`WRAPPER_ENV_FILE`, harness-only) for it.

AVAILABLE means the wrapper ran a test command here and that command started: the harness runs
a Python one-liner under the spec's own `[run] argv` and reads back what it saw (namespaces,
seccomp, NoNewPrivs, uid). Those are facts in the identity, not a verdict: a wrapper that
silently fell back to no sandbox at all (firejail inside a container) is AVAILABLE, and its
cells FAIL on their own host readings.

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
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from sandbox_attest.backends.base import (
    SHIM_PORT,
    Availability,
    EgressMode,
    Identity,
    InsidePaths,
    ProbeRequest,
    ProbeRun,
    shim_path,
)
from sandbox_attest.backends.none import platform_string
from sandbox_attest.backends.process import run_process
from sandbox_attest.backends.spec import (
    ALLOWED_ROLES,
    HOST_ROLES,
    LIST_NAMES,
    SECRET_ENV,
    CommandSpec,
    RenderContext,
    SpecEgress,
    json_list,
    load_spec,
    payload_ids,
    sample_context,
    shell_join,
)
from sandbox_attest.errors import BackendError
from sandbox_attest.host import lifetime
from sandbox_attest.host.interpreter import run_interpreter
from sandbox_attest.host.platform import current_platform
from sandbox_attest.host.provenance import executable_facts
from sandbox_attest.host.trust import PayloadUser, give, payload_user
from sandbox_attest.paths import matrix_dir
from sandbox_attest.payload import STAGED_SHIM, payload_env, staged_shim_path
from sandbox_attest.run import cellgroup
from sandbox_attest.run.sweep import record_leftovers
from sandbox_attest.world.core import PRIVATE_NAME_SUFFIX
from sandbox_attest.world.info import WorldInfo

# The variable that once carried a per-run tag into every wrapper's environment, so that the
# sweep found leftovers by it. No environment carries it any more (a wrapper that sees it can
# confine only when tested); leftovers are found through the cell's group. Kept by name so a
# test can show it is absent.
RUN_TAG_VAR: Final = "SANDBOX_ATTEST_RUN_TAG"
# How long the final sweep keeps killing the group's members (a forking daemon may respawn).
SWEEP_SECONDS: Final = 3.0
DETECT_TIMEOUT_S: Final = 30.0
# How much of a leftover's command line names it in the notes (its head and its tail).
DESCRIBE_CHARS: Final = 160
EGRESS_MODES: Final[dict[SpecEgress, EgressMode]] = {
    "harness-unix": "shim",
    "harness-tcp": "direct-tcp",
    "own": "own",
}
PROXY_VARS: Final = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
# The harness's own proxy settings never reach a wrapper: a wrapper with its own proxy chains
# to one it finds in its environment (srt takes HTTPS_PROXY as its parent proxy), which would
# send the sandbox's traffic somewhere outside the fixture world.
HARNESS_PROXY_VARS: Final = frozenset(
    {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy", "grpc_proxy"}
)
# Credentials an agent's environment typically holds, planted with fresh random values in every
# cell (`{token}` is replaced). A sandbox that scrubs the environment drops every one; the
# proxy variables carry a password, and point at the discard port on loopback, so one that is
# used anyway sends nothing anywhere. None of them is a variable a wrapper itself interprets.
AGENT_CANARIES: Final[dict[str, str]] = {
    # Shaped like real credentials, never named for the harness: a wrapper reads its own
    # environment, and a value that says "canary" tells it it is under test (issue 23).
    "AWS_ACCESS_KEY_ID": "AKIA{token}",
    "AWS_SECRET_ACCESS_KEY": "wJalr{token}",
    "GITHUB_TOKEN": "ghp_{token}",
    "DATABASE_PASSWORD": "pw-{token}",
    "npm_config_https_proxy": "http://agent:pw-{token}@127.0.0.1:9",
    "PIP_PROXY": "http://agent:pw-{token}@127.0.0.1:9",
}
# Written into the cell dir (the harness's, never bound into a sandbox) by `prepare`: the
# canaries planted for this cell and the names meant for the wrapper alone, for env_inheritance.
WRAPPER_ENV_FILE: Final = "wrapper-env.json"
# Run under the wrapper at availability time: what confinement the payload would get.
CONFINEMENT_PROBE: Final = (
    "import json, os\n"
    "ns = {}\n"
    "for n in ('net', 'mnt', 'pid', 'user', 'ipc', 'uts'):\n"
    "    try: ns[n] = os.readlink('/proc/self/ns/' + n)\n"
    "    except OSError: ns[n] = None\n"
    "st = {}\n"
    "for line in open('/proc/self/status'):\n"
    "    k, _, v = line.partition(':')\n"
    "    if k in ('Seccomp', 'NoNewPrivs', 'CapEff'): st[k] = v.strip()\n"
    "print('confinement=' + json.dumps({'ns': ns, 'status': st, 'uid': os.getuid()}))\n"
)
CONFINEMENT_LINE: Final = "confinement="


def harness_env() -> dict[str, str]:
    """The harness's own environment as an agent's wrapper would get it, minus its secrets.

    Nothing secret is meant to be in it (the signing key never is: host/trust.py), but a
    CI runner's own GITHUB_TOKEN or a developer's AWS key might be: every secret-looking name,
    every `SANDBOX_ATTEST_*` and the harness's proxy settings are dropped. So is every
    `PYTEST_*`: the matrix runs under pytest in this process, and its PYTEST_CURRENT_TEST names
    the cell (`matrix.toml::firejail-fs_read_secrets`), telling a wrapper it is under test and
    what is being tried (issue 23).
    """
    return {
        k: v
        for k, v in os.environ.items()
        if not SECRET_ENV.search(k)
        and k.lower() not in HARNESS_PROXY_VARS
        and not k.startswith("PYTEST_")
    }


def plant_canaries() -> dict[str, str]:
    """Fresh canary credentials for one wrapper start (`AGENT_CANARIES`, random values)."""
    token = secrets.token_hex(12)
    return {name: value.replace("{token}", token) for name, value in AGENT_CANARIES.items()}


def wrapper_env_record(cell_dir: Path) -> dict[str, Any]:
    """What `prepare` planted for a cell: {"canaries": {NAME: value}, "wrapper_only": [...]}.

    Empty for a cell that no command wrapper ran (a built-in backend, the control leg).
    """
    try:
        data = json.loads((cell_dir / WRAPPER_ENV_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def specs_dir() -> Path:
    """Where named specs live: `matrix/backends/<name>.toml`."""
    return matrix_dir() / "backends"


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries `RUN_TAG_VAR=tag` (unreadable ones are skipped).

    Nothing the harness starts carries one any more; kept to show that (tests).
    """
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
    cmd = " ".join(cmd.split())
    if len(cmd) > DESCRIBE_CHARS:
        # Head and tail: a long `python -c CODE ARGS` names what it is by its last arguments.
        cmd = cmd[: DESCRIBE_CHARS // 2] + " … " + cmd[-DESCRIBE_CHARS // 2 :]
    return f"{pid} ({cmd})"


class CommandBackend:
    """A third-party sandbox CLI driven by a spec file."""

    # `{shim}` is the cell's staged copy (ProbeRequest.shim), wherever a spec shows it inside:
    # the runner watches that copy as the route's shim (sandbox_attest/run/runner.py inside_route).
    runs_staged_shim = True

    def __init__(self, spec: CommandSpec) -> None:
        """Wrap a validated spec (see `from_path`)."""
        self.spec = spec
        self.name = spec.name
        self.egress_mode: EgressMode = EGRESS_MODES[spec.egress]

    @classmethod
    def from_path(cls, path: Path) -> CommandBackend:
        """Load the spec at `path` (ConfigError naming the file, key and fix if invalid)."""
        return cls(load_spec(path))

    def inside_paths(self, world: WorldInfo, cell_dir: Path) -> InsidePaths | None:
        """Where this wrapper shows the payload the route: its spec's `[run] *_inside`.

        Rendered as the cell will render them (`context`): the world's paths, this cell's run
        dir and workspace; the rest of the placeholders take their sample values, which no
        sane inside path names. None under egress "own": no harness route is inside.
        """
        if self.egress_mode == "own":
            return None
        sample = sample_context()
        scalars = sample.scalars | {
            "proxy_socket": world.proxy.socket,
            # The copy the cell stages under a neutral name (`context`), the one really run.
            "shim": str(staged_shim_path(cell_dir)),
            "shim_port": str(SHIM_PORT),
            "world_dir": world.run_dir,
            "ca_bundle": world.ca_bundle,
            "run_dir": str(cell_dir / f"run-{self.name}"),
            "workspace": str(cell_dir / "workspace"),
            **self.spec.static_scalars(),
        }
        ctx = RenderContext(scalars, sample.lists, [])
        src = self.spec.source
        return InsidePaths(
            proxy_socket=ctx.render(
                self.spec.proxy_socket_inside, f"{src}: [run] proxy_socket_inside"
            ),
            shim=ctx.render(self.spec.shim_inside, f"{src}: [run] shim_inside"),
        )

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

    def wrapper_home(self, request: ProbeRequest | None = None) -> Path:
        """The home of the user the wrapper runs as (`{wrapper_home}`): the agent's own."""
        user = self.user(request)
        return user.home if user is not None else Path.home()

    def run_path(self) -> str:
        """The one PATH: where `[detect]` and argv[0] are found, and what the wrapper gets.

        `[run] path` if the spec sets one, else the payload's own PATH, so that a wrapper found
        at detection is the one the cells start (never AVAILABLE, then exit 127 per cell).
        """
        if self.spec.path:
            return self.spec.render_static(self.spec.path, f"{self.spec.source}: [run] path")
        return payload_env(None, Path("/")).get("PATH", os.defpath)

    def _which(self, name: str) -> str | None:
        rendered = self.spec.render_static(name, f"{self.spec.source}: [detect] executables")
        return shutil.which(rendered, path=self.run_path())

    # -- availability ------------------------------------------------------------------

    def availability(self) -> Availability:
        """Find the wrapper on its PATH, run its check, then a test command under its argv.

        AVAILABLE means the test command started under the wrapper and reported what it
        saw; what it saw (a private network namespace or the harness's, seccomp, no new
        privileges) goes into the identity as facts, for the probes to judge.
        """
        spec = self.spec
        path = self.run_path()
        fix = spec.install or f"install it, or fix [detect] executables in {spec.source}"
        here = current_platform()
        if here not in spec.platforms:
            return _unavailable(
                f"{spec.name} is declared for {list(spec.platforms)} "
                f"in {spec.source}; this machine is {here}",
            )
        for exe in spec.executables:
            if self._which(exe) is None:
                where = "[run] path" if spec.path else "the payload's PATH (set [run] path)"
                return _unavailable(
                    f"{exe} not found on {where} {path} (needed by the {spec.name} spec "
                    f"{spec.source}); {fix}",
                )
        # A neutral name: the test command's workspace is the wrapper's to see (issue 23).
        with tempfile.TemporaryDirectory(prefix="agent-check-") as tmp:
            ctx, run_dir, cwd = self._check_context(Path(tmp))
            env = self.wrapper_env(self._check_payload_env(ctx), ctx, {})
            version = "unknown"
            if spec.version_argv:
                result = self._detect(spec.version_argv, env)
                if isinstance(result, subprocess.CompletedProcess):
                    version = _first_line(result.stdout) or _first_line(result.stderr) or version
            failure = self._check(env)
            if failure:
                return _unavailable(failure)
            self.render_files(ctx, run_dir)
            give(Path(tmp), self.user(), recursive=True)
            seen = self._confinement_check(ctx, env, cwd)
        if isinstance(seen, str):
            return _unavailable(seen)
        facts = _confinement_facts(seen)
        note = ""
        if facts["unconfined"]:
            note = (
                f"{spec.name} ran its test command with no confinement at all (the harness's "
                "namespaces, no seccomp filter, no NoNewPrivs), as a wrapper that silently "
                "falls back looks (firejail inside a container, its warning hidden by "
                "--quiet); its cells are judged on that, and each probe of a claim it "
                "cannot keep FAILs"
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
                "path": path,
                "check": shell_join(self._static_argv(spec.check_argv))
                if spec.check_argv
                else "none",
                # Stable facts only (no namespace inode numbers): the digest pins the profile.
                "test_command": facts,
            },
            executables=self.executables(),
            spec_sha256=hashlib.sha256(spec.source.read_bytes()).hexdigest(),
            runs_as=self.runs_as(),
        )
        return Availability(ok=True, reason=note, identity=identity)

    def executables(self) -> dict[str, Any]:
        """Every program a cell of this spec starts: the wrapper(s), argv[0], the interpreter."""
        path = self.run_path()
        where = f"{self.spec.source}: [detect] executables"
        names = [self.spec.render_static(e, where) for e in self.spec.executables]
        first = self.spec.argv[0] if self.spec.argv else None
        if isinstance(first, str):
            first = self.spec.render_static(first, f"{self.spec.source}: [run] argv[0]")
            if first not in names:
                names.append(first)
        facts = {name: executable_facts(name, path) for name in names}
        facts["{python}"] = executable_facts(run_interpreter().path, path)
        return facts

    def _check(self, env: dict[str, str]) -> str:
        """Run [detect] check if the spec has one; '' if it passed, else the reason."""
        spec = self.spec
        if not spec.check_argv:
            return ""
        result = self._detect(spec.check_argv, env)
        if isinstance(result, str):
            said = result
        elif result.returncode != 0:
            output = (result.stderr.strip() or result.stdout.strip())[-400:]
            said = f"exit {result.returncode}: {output or 'no output'}"
        else:
            return ""
        return (
            f"{spec.name} is installed but cannot confine here: "
            f"`{shell_join(self._static_argv(spec.check_argv))}` failed ({said}); check the "
            f"wrapper works on this machine, or fix [detect] check in {spec.source}"
        )

    def _confinement_check(
        self, ctx: RenderContext, env: dict[str, str], cwd: Path
    ) -> dict[str, Any] | str:
        """Run a one-liner under the spec's own [run] argv: what it saw, or why it did not run.

        A wrapper's exit status does not show it started anything, so the one-liner must
        report back, run with the argv the cells will use: one extra process.
        """
        spec = self.spec
        try:
            mine = {n: str(Path(f"/proc/self/ns/{n}").readlink()) for n in NAMESPACES}
        except OSError as exc:
            return (
                f"{spec.name}: cannot read the harness's own namespaces ({exc}), so cannot "
                "compare the wrapper's; run the harness on Linux with /proc mounted"
            )
        said, stdout = self._run_test_command(ctx.render_argv(spec), env, cwd)
        seen = _confinement_line(stdout)
        if seen is None:
            return _no_test_command(spec, said)
        seen["harness_ns"] = mine
        return seen

    def _run_test_command(self, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[str, str]:
        """Run the test command as a cell runs: own session, own group, swept afterwards.

        It returns soon after the one-liner reported: a wrapper that lingers (a helper left
        running, a `wait` on a daemon) gets TEST_GRACE_S to exit, then its process group is
        killed and everything left in its cell group swept, so availability never waits on
        a leftover.

        Returns:
            (what happened in words, the stdout read).
        """
        with cellgroup.open_cell() as group:
            return self._run_test_command_in(group, argv, env, cwd)

    def _run_test_command_in(
        self, group: cellgroup.CellGroup, argv: list[str], env: dict[str, str], cwd: Path
    ) -> tuple[str, str]:
        watcher = LeftoverWatcher(group)
        watcher.start()
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,
                **self._user_kwargs(),
                # In the group, and a killed harness takes the wrapper with it.
                **cellgroup.spawn_kwargs(argv, env),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            cellgroup.spawn_failed()
            watcher.finish()
            return f"{type(exc).__name__}: {exc}", ""
        cellgroup.started(proc.pid)
        readers = [
            threading.Thread(target=_read_all, args=(stream, sink), daemon=True)
            for stream, sink in ((proc.stdout, out), (proc.stderr, err))
        ]
        for reader in readers:
            reader.start()
        start = time.monotonic()
        _wait_for_report(proc, out)
        lingered = proc.poll() is None
        if lingered:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=KILL_WAIT_S)
        watcher.finish()
        for reader in readers:
            reader.join(timeout=2.0)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        stdout = b"".join(out).decode("utf-8", "replace")
        stderr = b"".join(err).decode("utf-8", "replace")
        output = (stderr.strip() or stdout.strip())[-400:] or "no output"
        if lingered:
            return f"killed after {time.monotonic() - start:.0f} s: {output}", stdout
        return f"exit {proc.returncode}: {output}", stdout

    def _check_payload_env(self, ctx: RenderContext) -> dict[str, str]:
        """The payload env the test command gets (as a cell's, with the check's workspace)."""
        proxy = {"harness-tcp": ctx.scalars["proxy_url"]}.get(self.spec.egress)
        return payload_env(proxy, Path(ctx.scalars["workspace"]))

    def _check_context(self, root: Path) -> tuple[RenderContext, Path, Path]:
        """A render context for the test command: real paths under `root`, sample rest.

        Returns:
            (context, run dir, the wrapper's cwd).
        """
        spec = self.spec
        workspace, run_dir, socket = root / "workspace", root / "run", root / "proxy.sock"
        workspace.mkdir()
        run_dir.mkdir()
        socket.touch()  # wrappers bind it in; nothing connects during the check
        # A spec may bind {shim}: a copy under the cells' neutral name (issue 23).
        shim = root / STAGED_SHIM
        shutil.copyfile(shim_path(), shim)
        shim.chmod(0o644)
        # The interpreter every cell's payload gets (sandbox_attest/host/interpreter.py).
        python = run_interpreter()
        payload = [python.path, "-c", CONFINEMENT_PROBE]
        sample = sample_context()
        read_only = [str(p) for p in python.bind_paths()]
        env = [f"{k}={v}" for k, v in payload_env(None, workspace).items()]
        # No fixture world at availability time: the host lists are empty (no network), the
        # value a wrapper's settings file can always take.
        lists = sample.lists | {"read_only": read_only, "payload_env": env}
        lists |= {name: [] for name in LIST_NAMES if name.startswith(("allowed_", "denied_"))}
        hosts = {
            f"{n}_{form}": "[]" if form == "json" else ""
            for n in lists
            if n.startswith(("allowed_", "denied_"))
            for form in ("json", "csv")
        }
        scalars = (
            sample.scalars
            | hosts
            | {
                "workspace": str(workspace),
                "run_dir": str(run_dir),
                "cell_id": f"{spec.name}-availability",
                "python": python.path,
                "probe_argv": shell_join(payload),
                "payload_shell": shell_join(payload),
                "proxy_socket": str(socket),
                "shim": str(shim),
                "world_dir": str(root),
                "read_only_json": json_list(read_only),
                "read_only_csv": ",".join(read_only),
                "payload_env_json": json_list(env),
                "payload_env_csv": ",".join(env),
                "wrapper_home": str(self.wrapper_home()),
                **payload_ids(payload_user()),
                **spec.static_scalars(),
            }
        )
        base = RenderContext(scalars, lists, payload)
        scalars["proxy_socket_inside"] = base.render(
            spec.proxy_socket_inside, f"{spec.source}: [run] proxy_socket_inside"
        )
        scalars["shim_inside"] = base.render(spec.shim_inside, f"{spec.source}: [run] shim_inside")
        ctx = RenderContext(scalars, lists, payload).with_spec_lists(spec)
        return ctx, run_dir, self._cwd(ctx)

    def _cwd(self, ctx: RenderContext) -> Path:
        """The wrapper's working directory (`[run] cwd`, `{run_dir}` by default)."""
        cwd = Path(ctx.render(self.spec.cwd, f"{self.spec.source}: [run] cwd"))
        if not cwd.is_dir():
            raise BackendError(
                f"{self.spec.source}: [run] cwd renders to {cwd}, which is not a directory; "
                "use {run_dir}, {workspace} or another directory that exists"
            )
        return cwd

    def _static_argv(self, argv: tuple[str, ...]) -> list[str]:
        where = f"{self.spec.source}: [detect]"
        return [self.spec.render_static(a, where) for a in argv]

    def _detect(
        self, argv: tuple[str, ...], env: dict[str, str]
    ) -> subprocess.CompletedProcess[str] | str:
        # The wrapper is third-party code under test: even its --version runs as the user its
        # cells run as, never as the harness's (root's) own, and on the PATH its cells use.
        # Its own session, and on timeout its whole group goes: a --version that forks a
        # helper must not leave it running, and a killed harness takes it along.
        try:
            proc = subprocess.Popen(
                self._static_argv(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                cwd="/",
                **self._user_kwargs(),
                **lifetime.popen_kwargs(),
            )
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        try:
            stdout, stderr = proc.communicate(timeout=DETECT_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"{type(exc).__name__}: {exc}"
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

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
            # The cell's staged copy: the installed path names the harness (issue 23).
            "shim": str(request.shim or shim_path()),
            "shim_port": str(SHIM_PORT),
            "ca_bundle": world.ca_bundle,
            "dns_host": world.dns.host,
            "dns_port": str(world.dns.port),
            "world_dir": world.run_dir,
            "wrapper_home": str(self.wrapper_home(request)),
            **payload_ids(request.user),
            **self.spec.static_scalars(),
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
            "payload_env": [f"{k}={v}" for k, v in request.env.items()],
            "allowed_hosts": [world.hosts[r].name for r in ALLOWED_ROLES],
            "allowed_host_ports": _host_ports(world.hosts, ALLOWED_ROLES),
            # The whole allowlist as domain patterns, the suffix rule for the names a probe
            # plants (net_private_address) included: what a wrapper's own proxy must admit.
            "allowed_domains": [
                *_host_ports(world.hosts, ALLOWED_ROLES),
                f"*.{PRIVATE_NAME_SUFFIX}:{world.hosts['allowed'].https_port}",
                f"*.{PRIVATE_NAME_SUFFIX}:{world.hosts['allowed'].http_port}",
            ],
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
        return RenderContext(scalars, lists, payload).with_spec_lists(self.spec)

    def wrapper_env(
        self,
        payload: dict[str, str],
        ctx: RenderContext,
        canaries: dict[str, str],
    ) -> dict[str, str]:
        """The wrapper's environment: an agent's, as the module docstring lists it.

        Nothing in it tells the wrapper it is under test: no run tag (leftovers are found
        through the cell's group), and the harness's own `SANDBOX_ATTEST_*` names are dropped
        with the secrets (`harness_env`).

        Args:
            payload: the payload's own variables (its PATH is replaced by `run_path`).
            ctx: the cell's render context, for `[env] set` and `[env] wrapper` templates.
            canaries: the credentials planted for this cell (`plant_canaries`).
        """
        spec = self.spec
        # The payload's own variables pass whole, but a secret-looking name never does, even
        # there: the harness's signing key must not ride along by a caller's mistake.
        declared = {k: v for k, v in payload.items() if not SECRET_ENV.search(k)}
        env = harness_env() | canaries | declared | {"PATH": self.run_path()}
        for name, template in spec.env_set.items():
            env[name] = ctx.render(template, f"{spec.source}: [env] set.{name}")
        for name, wrapper_template in spec.env_wrapper.items():
            if wrapper_template is not None:
                env[name] = ctx.render(wrapper_template, f"{spec.source}: [env] wrapper.{name}")
            elif name in os.environ:
                env[name] = os.environ[name]
        return env

    def build_env(self, request: ProbeRequest, ctx: RenderContext) -> dict[str, str]:
        """The wrapper's environment for one cell, its canaries recorded in the cell dir."""
        canaries = plant_canaries()
        record = {"canaries": canaries, "wrapper_only": sorted(self.spec.env_wrapper)}
        target = request.cell_dir / WRAPPER_ENV_FILE
        # The harness's alone: the payload user must not read the values it is tested on.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(record, out)
        return self.wrapper_env(dict(request.env), ctx, canaries)

    def prepare(self, request: ProbeRequest) -> tuple[list[str], dict[str, str], Path, str]:
        """Make the cell's run dir, render its files; return (argv, env, cwd, token).

        The token is a per-cell random name (the leftover watcher's thread is named by it);
        it is in no environment.
        """
        run_dir = request.cell_dir / f"run-{self.name}"
        run_dir.mkdir(parents=True)  # fresh per cell: an existing one is a harness bug
        ctx = self.context(request, run_dir)
        self.render_files(ctx, run_dir)
        # The wrapper runs as the payload user: its cwd and the files rendered for it are its.
        give(run_dir, self.user(request), recursive=True)
        tag = secrets.token_hex(12)
        env = self.build_env(request, ctx)
        return ctx.render_argv(self.spec), env, self._cwd(ctx), tag

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
        argv, env, cwd, tag = self.prepare(request)
        # The cell's group: the rendezvous's where the runner opened one (the host reads the
        # same members), else one of its own for this run.
        with cellgroup.open_cell() as group:
            # What the spec says the wrapper runs ([detect] executables: srt's node and bwrap,
            # a helper proxy) is the sandbox's own; a member running one is a supervisor, not
            # the payload (anything that can run Python never is: cellgroup.pin_supervisor).
            for exe in self.spec.executables:
                group.pin_supervisor(
                    self.spec.render_static(exe, f"{self.spec.source}: [detect] executables"),
                    self.run_path(),
                )
            # The watcher must run *during* the run: a leftover that holds our stdout/stderr
            # pipes open would otherwise keep the output readers (and the run) from finishing.
            watcher = LeftoverWatcher(group, tag)
            watcher.start()
            try:
                run = run_process(
                    request.cell_id, argv, env, cwd, request.timeout, user=self.user(request)
                )
            finally:
                watcher.finish()
        # What the sweep had to kill is the sandbox's escape, not its credit: lifecycle_orphans
        # reads it from the cell dir (sandbox_attest/run/sweep.py).
        record_leftovers(request.cell_dir, watcher.killed)
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

    Members of the cell's group (sandbox_attest/run/cellgroup.py) are the wrapper and everything
    it started, wherever they moved: another session or process group, a fresh environment,
    a double fork. Once no wrapper the group started is still running, every member left is
    a leftover: killed once it has outlived the wrapper by GRACE_S, and named.
    """

    POLL_S: Final = 0.05
    # How long a process may take to end on its own once the wrapper is gone. A sandbox's own
    # cleanup is asynchronous (bwrap --die-with-parent SIGKILLs its namespace as it exits, and
    # a killed process still shows, cmdline already empty, while it exits): one the harness
    # killed within that time would be the sandbox's work credited to the harness, and a
    # lifecycle_orphans FAIL that a slower machine makes and a faster one does not.
    GRACE_S: Final = 0.5

    def __init__(self, group: cellgroup.CellGroup, name: str = "") -> None:
        """Watch the members of `group` (`name` only names the thread)."""
        super().__init__(name=f"leftovers-{name[:6]}", daemon=True)
        self.group = group
        self.killed: dict[int, str] = {}
        self.surviving: list[str] = []
        self._done = threading.Event()
        self._enabled = Path("/proc/self/stat").exists()  # no procfs (macOS): group kill only
        self._first_seen: dict[int, float] = {}

    def _wrapper_running(self) -> bool:
        # Before the wrapper started there is nothing to call left behind.
        roots = list(self.group.roots)
        return not roots or any(_running(p) for p in roots)

    def run(self) -> None:
        """Poll until `finish`; kill leftovers whenever the wrapper is no longer running."""
        while self._enabled and not self._done.wait(self.POLL_S):
            # Read every poll, the wrapper running or not: in the subtree fallback a member is
            # remembered only once seen, so a child must be seen before its parent exits.
            members = self.group.pids()
            if not self._wrapper_running():
                pids = [p for p in members if p not in self.group.roots]
                if pids:
                    self._kill_outliving(pids)

    def finish(self) -> None:
        """Stop watching, then sweep until the group is empty (or give up and say so)."""
        self._done.set()
        self.join()
        if not self._enabled:
            return
        deadline = time.monotonic() + SWEEP_SECONDS
        while pids := [p for p in self.group.pids() if p not in self.group.roots or _running(p)]:
            if time.monotonic() > deadline:
                self.surviving = [_describe(p) for p in pids]
                return
            self._kill_outliving(pids)
            time.sleep(self.POLL_S)
        # Wait until each killed one is gone or a zombie, so "killed" means dead on return.
        while dying := [p for p in self.killed if _running(p)]:
            if time.monotonic() > deadline:
                self.surviving = [_describe(p) for p in dying]
                return
            time.sleep(self.POLL_S)

    def _kill_outliving(self, pids: list[int]) -> None:
        """Kill (and record) the leftovers that have outlived the wrapper by GRACE_S."""
        now = time.monotonic()
        ripe = []
        for pid in pids:
            seen = self._first_seen.setdefault(pid, now)
            if now - seen < self.GRACE_S and pid not in self.killed:
                continue
            self.killed.setdefault(pid, _describe(pid))
            ripe.append(pid)
        if ripe:
            self.group.kill(ripe)


def _running(pid: int) -> bool:
    """Whether `pid` still exists and is not a zombie (it may still be exiting)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


NAMESPACES: Final = ("net", "mnt", "pid", "user", "ipc", "uts")
# After the test command reported, how long its wrapper may take to exit by itself.
TEST_GRACE_S: Final = 5.0
KILL_WAIT_S: Final = 10.0


def _wait_for_report(proc: subprocess.Popen[bytes], out: list[bytes]) -> None:
    """Wait for the test command's wrapper to exit: at most TEST_GRACE_S after it reported."""
    start, seen_at = time.monotonic(), None
    while proc.poll() is None and time.monotonic() - start < DETECT_TIMEOUT_S:
        if seen_at is None and CONFINEMENT_LINE.encode() in b"".join(out):
            seen_at = time.monotonic()
        if seen_at is not None and time.monotonic() - seen_at > TEST_GRACE_S:
            return
        time.sleep(0.05)


def _read_all(stream: Any, sink: list[bytes]) -> None:
    """Read a pipe to EOF into `sink` (a daemon thread: a leftover may hold it open)."""
    with contextlib.suppress(OSError, ValueError):
        while chunk := stream.read1(65536):
            sink.append(chunk)


def _confinement_line(stdout: str) -> dict[str, Any] | None:
    """What CONFINEMENT_PROBE printed, or None if it printed nothing readable."""
    for line in stdout.splitlines():
        if line.startswith(CONFINEMENT_LINE):
            with contextlib.suppress(ValueError):
                seen = json.loads(line.removeprefix(CONFINEMENT_LINE))
                if isinstance(seen, dict):
                    return seen
    return None


def _confinement_facts(seen: dict[str, Any]) -> dict[str, Any]:
    """The test command's readings as stable facts for the identity (no inode numbers).

    `unconfined` is the silent fall-back: every namespace the harness's, no seccomp filter,
    no NoNewPrivs. It is a fact, not a verdict: the probes FAIL what that leaves open.
    """
    ns, mine = seen.get("ns") or {}, seen.get("harness_ns") or {}
    status = seen.get("status") or {}
    shared = sorted(n for n in NAMESPACES if ns.get(n) is not None and ns.get(n) == mine.get(n))
    seccomp = str(status.get("Seccomp", "unknown"))
    no_new_privs = str(status.get("NoNewPrivs", "unknown"))
    return {
        "started": True,
        "network_namespace": "the harness's own" if "net" in shared else "private",
        "namespaces_shared_with_harness": shared,
        "seccomp": seccomp,
        "no_new_privs": no_new_privs,
        "uid": seen.get("uid"),
        "unconfined": set(shared) == set(NAMESPACES) and seccomp == "0" and no_new_privs == "0",
    }


def _no_test_command(spec: CommandSpec, said: str) -> str:
    return (
        f"{spec.name} did not run a test command under its [run] argv ({said}); "
        f"check the wrapper works on this machine, or fix [run] argv in {spec.source}"
    )


def _unavailable(reason: str) -> Availability:
    return Availability(ok=False, reason=reason, identity=None)


def _host_ports(hosts: dict[str, Any], roles: list[str] | tuple[str, ...]) -> list[str]:
    """`name:port` for each role's HTTPS and HTTP port: the harness allowlist, by name."""
    out = []
    for role in roles:
        host = hosts[role]
        out += [f"{host.name}:{host.https_port}", f"{host.name}:{host.http_port}"]
    return out


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
