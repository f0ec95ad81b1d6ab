"""Command-wrapper backend specs: what `matrix/backends/<name>.toml` holds and how it renders.

A spec describes a third-party sandbox CLI (firejail, bwrap, a vendor's wrapper) closely
enough that the harness can attest it without a line of Python: how to find it, the argv to
wrap around the payload, the files it needs per cell, how egress reaches the world,
which environment passes in, and the claims it makes. This module holds the validated spec
(`CommandSpec`) and the values its placeholders take (`RenderContext`); `spec_load` reads and
checks a file into one (with `spec_fields` and `spec_claims`).

Placeholders are `{name}`, lower-case identifiers only, so the braces of a JSON or profile
template need no escaping; `{{name}}` gives the literal text `{name}`. An argv element that
is exactly `{payload}` expands to several arguments (the probe argv, wrapped in the shim for
`harness-unix`); an argv element that is a table
`{each = "read_only", args = ["--ro-bind", "{item}", "{item}"]}` repeats `args` per item.

Lists are joined in one way only, a `[lists]` table: `deny_read = ["/root", "{read_only}"]`
defines a new list whose element `{read_only}` (a whole element naming a list) splices that
list in, every other element being a template. A spec's own list is then a list like the
built-in ones: `{deny_read_json}`, `{deny_read_csv}` and `each = "deny_read"`.

One PATH finds every program: `[detect] executables`, `version`, `check` and `[run] argv[0]`
are looked up on `[run] path` (default: the payload's PATH), which is also the PATH the
wrapper runs with. `{spec_dir}` and `{harness_home}` are known before any cell, so they may be
used there too.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from sandbox_attest.errors import ConfigError

if TYPE_CHECKING:
    from sandbox_attest.backends.base import DeclaredClaims
    from sandbox_attest.host.trust import PayloadUser

SpecEgress = Literal["harness-unix", "harness-tcp", "own"]

PAYLOAD: Final = "{payload}"
PAYLOAD_SHELL: Final = "{payload_shell}"
# The one rule for where the probe command goes, said the same way wherever it is broken.
PAYLOAD_RULE: Final = (
    'must contain the element "{payload}" (it expands to several arguments) or '
    "{payload_shell} inside one string (the same command, shell-quoted): exactly one of "
    "the two, once, since the probe runs once per cell"
)
# Lists an argv table can iterate over with `each`.
LIST_NAMES: Final = (
    "read_only",
    "payload_env",
    "allowed_hosts",
    "allowed_host_ports",
    "allowed_domains",
    "allowed_addresses",
    "denied_hosts",
    "denied_addresses",
)
# Scalar placeholders and what they hold (the README's table is written from this).
SCALARS: Final[dict[str, str]] = {
    "workspace": "the cell's workspace, the only writable grant",
    "run_dir": "a fresh per-cell directory: the wrapper's cwd, rendered files live here",
    "cell_id": "`<backend>-<probe>`",
    "python": "the payload's interpreter (first element of the probe argv)",
    "probe_argv": "the probe argv as one shell-quoted string (no shim)",
    "payload_shell": "the `{payload}` expansion as one shell-quoted string",
    "proxy_url": "the harness proxy's TCP URL with its secret as userinfo",
    "proxy_host": "the harness proxy's TCP address (127.0.0.1)",
    "proxy_port": "the harness proxy's TCP port",
    "proxy_user": "the user name of the proxy's Basic auth",
    "proxy_secret": "the per-start proxy secret (password of the Basic auth)",
    "proxy_socket": "host path of the harness proxy's unix socket",
    "proxy_socket_inside": "where the payload sees the socket ([run] proxy_socket_inside)",
    "shim": "host path of the stdlib shim script",
    "shim_inside": "where the payload sees the shim ([run] shim_inside)",
    "shim_port": "the loopback port the shim listens on inside",
    "ca_bundle": "the run's CA bundle (PEM)",
    "dns_host": "the DNS fixture's address",
    "dns_port": "the DNS fixture's port",
    "world_dir": "the world's directory (sockets, CA bundle, logs)",
    "spec_dir": "the directory of the spec file itself (absolute)",
    "harness_home": "the home directory of the user the harness runs as",
    # A root-run engine (`docker run --user ...`) must start the payload as the payload user
    # without hard-coding its ids, which differ per machine (`useradd --system` picks them).
    "payload_uid": "the payload user's numeric uid (the harness's own where it cannot switch)",
    "payload_gid": "the payload user's numeric primary gid (likewise)",
    "wrapper_home": "the home directory of the user the wrapper runs as (the payload user's)",
}
# The placeholders known before any cell runs: `[detect]`, `[run] path` and argv[0] may use
# them (and only them), since the wrapper is looked up before a cell exists.
STATIC_SCALARS: Final = ("spec_dir", "harness_home")
HOST_ROLES: Final = ("allowed", "denied", "index", "files")
# The roles the harness proxy admits: the same set the world's allowlist is built from.
ALLOWED_ROLES: Final = ("allowed", "index", "files")
for _role in HOST_ROLES:
    SCALARS[f"{_role}_host"] = f"the {_role} fixture host's name"
    SCALARS[f"{_role}_ip"] = f"the address the DNS fixture gives the {_role} host"
    SCALARS[f"{_role}_https_port"] = f"the {_role} host's HTTPS port"
    SCALARS[f"{_role}_http_port"] = f"the {_role} host's HTTP port"
for _list in LIST_NAMES:
    SCALARS[f"{_list}_json"] = f"`{_list}` as a JSON array"
    SCALARS[f"{_list}_csv"] = f"`{_list}` joined with commas"

# Environment names the harness never hands on from its own environment: its own variables
# and anything that looks like a credential (a CI runner's real GITHUB_TOKEN among them). The
# wrapper gets planted canaries under such names instead (sandbox_attest/backends/command/env.py).
SECRET_ENV: Final = re.compile(
    r"^SANDBOX_ATTEST_|KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE
)
# Backends implemented in Python: `create_backend` resolves these names before any spec, so a
# spec with one of them would be silently ignored and the built-in would run in its place.
BUILTIN_BACKENDS: Final = ("none", "bubblewrap", "docker", "seatbelt", "appcontainer")
# `{name}` is a placeholder; `{{name}}` is the literal text `{name}`; every other brace is
# literal, so JSON and profile templates (`{"a": {"b": 1}}`) need no escaping at all.
PLACEHOLDER_RE: Final = re.compile(r"\{\{[a-z_][a-z0-9_]*\}\}|\{([a-z_][a-z0-9_]*)\}")

ArgvItem = str | tuple[str, tuple[str, ...]]  # a template, or (list name, args per item)


@dataclass(frozen=True)
class FileSpec:
    """A file rendered per cell into the run dir (a wrapper's settings or profile)."""

    path: str  # relative to {run_dir}; may itself hold placeholders
    template: str
    mode: int = 0o644


@dataclass(frozen=True)
class CommandSpec:
    """A validated backend spec. Build it with `load_spec`."""

    source: Path
    name: str
    description: str
    platforms: tuple[str, ...]
    executables: tuple[str, ...]
    version_argv: tuple[str, ...]
    check_argv: tuple[str, ...]
    install: str
    argv: tuple[ArgvItem, ...]
    egress: SpecEgress
    proxy_socket_inside: str
    shim_inside: str
    env_set: dict[str, str]
    files: tuple[FileSpec, ...]
    claims: DeclaredClaims
    raw: dict[str, Any] = field(repr=False)
    # Who the wrapper runs as where the harness is root: "" for the harness's payload user
    # (the default), an account name, or "root" with `run_user_reason` (it goes into the
    # identity, so a reader sees why the trust domains were not separated for this backend).
    run_user: str = ""
    run_user_reason: str = ""
    # `[run] path`: the one PATH that finds the wrapper (detect, check, argv[0]) and that the
    # wrapper runs with; "" for the payload's PATH. A template over STATIC_SCALARS.
    path: str = ""
    # `[run] cwd`: the wrapper's working directory, a template ("{run_dir}" by default).
    cwd: str = "{run_dir}"
    # `[env] wrapper`: variables for the wrapper alone (its own config, e.g. CODEX_HOME). A
    # name with a template sets it; a name with None takes it from the harness's environment.
    # env_inheritance ignores exactly these names in the payload.
    env_wrapper: dict[str, str | None] = field(default_factory=dict)
    # `[lists]`: the spec's own lists, each element a template or a whole `{list}` to splice.
    lists: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def static_scalars(self) -> dict[str, str]:
        """The placeholders known before any cell: {spec_dir} and {harness_home}."""
        return {
            "spec_dir": str(self.source.resolve().parent),
            "harness_home": str(Path.home()),
        }

    def render_static(self, template: str, where: str) -> str:
        """Fill a template that may use only `STATIC_SCALARS` (detect, path, argv[0])."""
        return RenderContext(self.static_scalars(), {}, []).render(template, where)


@dataclass(frozen=True)
class RenderContext:
    """The values one cell's placeholders take."""

    scalars: dict[str, str]
    lists: dict[str, list[str]]
    payload: list[str]

    def render(self, template: str, where: str, extra: dict[str, str] | None = None) -> str:
        """Fill `template`'s placeholders.

        Raises:
            ConfigError: for a placeholder this context does not know (`where` names it).
        """
        values = self.scalars if extra is None else self.scalars | extra

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:  # `{{name}}`: the literal `{name}`
                return match.group(0)[1:-1]
            if name in values:
                return values[name]
            if name == "payload":
                raise ConfigError(
                    f"{where}: {{payload}} expands to several arguments and must "
                    "be a whole argv element; inside a string use {payload_shell}"
                )
            # The nearest names, not all ~60: a typo's fix is usually one of them.
            close = difflib.get_close_matches(name, sorted({*values, "payload"}), n=3)
            hint = (
                "did you mean " + " or ".join(f"{{{c}}}" for c in close) + "?"
                if close
                else "the placeholders are listed in README.md (Templates) and as SCALARS "
                "in sandbox_attest/backends/command/spec.py"
            )
            raise ConfigError(
                f"{where}: unknown placeholder {{{name}}}; {hint} "
                "(write {{name}} for a literal {name})"
            )

        return PLACEHOLDER_RE.sub(sub, template)

    def with_spec_lists(self, spec: CommandSpec) -> RenderContext:
        """This context plus the spec's `[lists]`, as lists and as `_json`/`_csv` scalars.

        Raises:
            ConfigError: for an unknown placeholder in a list element.
        """
        scalars, lists = dict(self.scalars), dict(self.lists)
        for name, elements in spec.lists.items():
            values: list[str] = []
            for i, element in enumerate(elements):
                whole = PLACEHOLDER_RE.fullmatch(element)
                if whole is not None and whole.group(1) in lists:
                    values += lists[whole.group(1)]
                else:
                    values.append(
                        RenderContext(scalars, lists, self.payload).render(
                            element, f"{spec.source}: [lists] {name}[{i}]"
                        )
                    )
            lists[name] = values
            scalars[f"{name}_json"] = json_list(values)
            scalars[f"{name}_csv"] = ",".join(values)
        return RenderContext(scalars, lists, self.payload)

    def render_argv(self, spec: CommandSpec) -> list[str]:
        """The wrapper's full host argv for this cell."""
        argv: list[str] = []
        for i, item in enumerate(spec.argv):
            where = f"{spec.source}: [run] argv[{i}]"
            if isinstance(item, str):
                if item == PAYLOAD:
                    argv += self.payload
                else:
                    argv.append(self.render(item, where))
                continue
            list_name, args = item
            for value in self.lists[list_name]:
                argv += [self.render(a, where, {"item": value}) for a in args]
        return argv


def payload_ids(user: PayloadUser | None) -> dict[str, str]:
    """`{payload_uid}` and `{payload_gid}` for the run's payload user.

    Args:
        user: the run's payload user (not a spec's `[run] user`: a root-run engine is told
            whom to start the payload as); None where the harness cannot switch users, and
            then the payload runs under the harness's own ids, which these name.
    """
    uid, gid = (user.uid, user.gid) if user is not None else (os.geteuid(), os.getegid())
    return {"payload_uid": str(uid), "payload_gid": str(gid)}


def sample_context() -> RenderContext:
    """A context with every placeholder set, for validating a spec before any run."""
    scalars = {name: f"<{name}>" for name in SCALARS}
    lists = {name: [f"<{name}>"] for name in LIST_NAMES}
    for name, values in lists.items():  # valid JSON, as a settings template expects
        scalars[f"{name}_json"] = json_list(values)
        scalars[f"{name}_csv"] = ",".join(values)
    return RenderContext(scalars, lists, ["<python>", "<probe>", "<task>"])


def shell_join(argv: list[str]) -> str:
    """Argv as one POSIX shell string (for wrappers that take a command string)."""
    return shlex.join(argv)


def json_list(values: list[str]) -> str:
    """A list as compact JSON (for settings-file templates)."""
    return json.dumps(values)
