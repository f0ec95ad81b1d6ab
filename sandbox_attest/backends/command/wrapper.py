"""What every use of a spec'd command wrapper shares, a cell's run and the availability check.

Who the wrapper runs as, the one PATH that finds it (and that it runs with), the programs it
starts, its working directory, its environment and the files rendered for it. `CommandBackend`
(backend.py) runs cells with these; `check.py` runs the test command with the same ones, so
that what AVAILABLE saw is what the cells get.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.backends.command.env import harness_env
from sandbox_attest.backends.command.spec import SECRET_ENV, CommandSpec, RenderContext, SpecEgress
from sandbox_attest.errors import BackendError
from sandbox_attest.host import login_session
from sandbox_attest.host.interpreter import run_interpreter
from sandbox_attest.host.provenance import executable_facts
from sandbox_attest.host.trust import PayloadUser, payload_user
from sandbox_attest.payload import payload_env

if TYPE_CHECKING:
    from sandbox_attest.backends.base import EgressMode, ProbeRequest

EGRESS_MODES: Final[dict[SpecEgress, EgressMode]] = {
    "harness-unix": "shim",
    "harness-tcp": "direct-tcp",
    "own": "own",
}


class SpecWrapper:
    """A third-party sandbox CLI as its spec describes it, before any cell runs."""

    def __init__(self, spec: CommandSpec) -> None:
        """Wrap a validated spec (see `from_path`)."""
        self.spec = spec
        self.name = spec.name
        self.egress_mode: EgressMode = EGRESS_MODES[spec.egress]

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

    def user_kwargs(self) -> dict[str, Any]:
        """Popen arguments that start a process as `user()` (none where it is None)."""
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

    def which(self, name: str) -> str | None:
        """Where `name` (a `[detect] executables` template) is on `run_path`, if anywhere."""
        rendered = self.spec.render_static(name, f"{self.spec.source}: [detect] executables")
        return shutil.which(rendered, path=self.run_path())

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

    def cwd(self, ctx: RenderContext) -> Path:
        """The wrapper's working directory (`[run] cwd`, `{run_dir}` by default)."""
        cwd = Path(ctx.render(self.spec.cwd, f"{self.spec.source}: [run] cwd"))
        if not cwd.is_dir():
            raise BackendError(
                f"{self.spec.source}: [run] cwd renders to {cwd}, which is not a directory; "
                "use {run_dir}, {workspace} or another directory that exists"
            )
        return cwd

    def static_argv(self, argv: tuple[str, ...]) -> list[str]:
        """A `[detect]` argv, its templates filled with the static placeholders."""
        where = f"{self.spec.source}: [detect]"
        return [self.spec.render_static(a, where) for a in argv]

    def wrapper_env(
        self,
        payload: dict[str, str],
        ctx: RenderContext,
        canaries: dict[str, str],
    ) -> dict[str, str]:
        """The wrapper's environment: an agent's, as env.py's docstring lists it.

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
        # An agent started from a login has its session's variables (host/login_session.py).
        session = login_session.current_env()
        env = harness_env() | session | canaries | declared | {"PATH": self.run_path()}
        for name, template in spec.env_set.items():
            env[name] = ctx.render(template, f"{spec.source}: [env] set.{name}")
        for name, wrapper_template in spec.env_wrapper.items():
            if wrapper_template is not None:
                env[name] = ctx.render(wrapper_template, f"{spec.source}: [env] wrapper.{name}")
            elif name in os.environ:
                env[name] = os.environ[name]
        return env

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
