"""Command-wrapper backend specs: load, validate and render `matrix/backends/<name>.toml`.

A spec describes a third-party sandbox CLI (firejail, bwrap, a vendor's wrapper) closely
enough that the harness can attest it without a line of Python: how to find it, the argv to
wrap around the payload, the files it needs per cell, how egress reaches the fixture world,
which environment passes in, and the policy it claims. Every mistake is a `ConfigError` that
names the file, the key and the fix, raised at load time (a spec is rendered once against a
sample context while loading, so an unknown placeholder never waits for a live run).

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
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final, Literal, cast, get_args

from sandbox_attest.backends.base import DeclaredPolicy, FilesystemMode, IpcMode, NetworkMode
from sandbox_attest.claims import (
    RUNS_AS_RE,
    RUNS_AS_WORDS,
    EnvironmentMode,
    NetworkCut,
    ReadsMode,
    SyscallsMode,
    WritesMode,
)
from sandbox_attest.errors import ConfigError

if TYPE_CHECKING:
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
    "world_dir": "the fixture world's directory (sockets, CA bundle, logs)",
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
# wrapper gets planted canaries under such names instead (sandbox_attest/backends/command.py).
SECRET_ENV: Final = re.compile(
    r"^SANDBOX_ATTEST_|KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE
)
# Backends implemented in Python: `create_backend` resolves these names before any spec, so a
# spec with one of them would be silently ignored and the built-in would run in its place.
BUILTIN_BACKENDS: Final = ("none", "bubblewrap", "docker", "seatbelt", "appcontainer")
NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# `{name}` is a placeholder; `{{name}}` is the literal text `{name}`; every other brace is
# literal, so JSON and profile templates (`{"a": {"b": 1}}`) need no escaping at all.
PLACEHOLDER_RE: Final = re.compile(r"\{\{[a-z_][a-z0-9_]*\}\}|\{([a-z_][a-z0-9_]*)\}")

TOP_KEYS: Final = {"backend", "detect", "run", "env", "file", "policy", "lists"}
SECTION_KEYS: Final[dict[str, set[str]]] = {
    "backend": {"name", "description", "platforms"},
    "detect": {"executables", "version", "check", "install"},
    "run": {
        "argv",
        "egress",
        "path",
        "cwd",
        "proxy_socket_inside",
        "shim_inside",
        "user",
        "user_reason",
    },
    "env": {"set", "wrapper"},
    "policy": {
        "network",
        "filesystem",
        "ipc",
        "limits",
        "reads",
        "writes",
        "protected",
        "environment",
        "syscalls",
        "network_cut",
        "runs_as",
    },
}
# The resource limits a spec may claim ([policy] limits = {fsize_mib = 16, nofile = 256}); the
# resource_limits probe holds the wrapper to them.
LIMIT_NAMES: Final = frozenset({"fsize_mib", "nofile", "forks", "memory_mib"})
# Keys that were removed, and the fix: a spec that still has one fails naming it.
REMOVED_KEYS: Final[dict[tuple[str, str], str]] = {
    ("run", "address_by"): "was removed: fixture names now resolve to lab addresses through "
    "the system resolver (sandbox_attest/world/lab.py); delete the key",
    ("env", "pass"): "was removed: it was the harness scrubbing the environment on the "
    "sandbox's behalf. The wrapper now gets an agent's environment (the harness's variables "
    "minus its secrets, planted canary credentials, the payload's own variables) and "
    "env_inheritance judges what the sandbox lets through; delete the key",
    ("env", "host"): "was removed: the wrapper now gets the harness's environment (minus "
    "anything secret-looking) by itself; delete the key, or list the names in [env] wrapper "
    "if they are for the wrapper alone",
}
FILE_KEYS: Final = {"path", "template", "mode"}
EACH_KEYS: Final = {"each", "args"}

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
    policy: DeclaredPolicy
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
                "in sandbox_attest/backends/spec.py"
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


def _fail(source: Path, key: str, message: str) -> ConfigError:
    """Every spec error reads `<file>: <key>: <what is wrong; the fix>`."""
    return ConfigError(f"{source}: {key}: {message}")


def _missing(source: Path, key: str, example: str, note: str = "") -> ConfigError:
    """`key` is absent: say which line to add (`key` is "[section] name")."""
    section, _, leaf = key.rpartition(" ")
    return _fail(source, key, f"is missing; add {leaf} = {example} under {section}{note}")


def _shown(value: object) -> str:
    """A value as its TOML type and text, never Python's (`True`, `None`, `{...}`)."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return repr(value)  # 'text' is also a TOML literal string
    if isinstance(value, list):
        return f"the array {json.dumps(value, default=str)}"
    if isinstance(value, dict):
        return "a table"
    return f"the date/time {value}"  # the only TOML type left


def _str(source: Path, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise _fail(source, key, f"must be a string, got {_shown(value)}")
    return value


def _str_list(source: Path, key: str, value: object, *, required: bool) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if value is None:
        raise _missing(source, key, '["..."]')
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(source, key, f"must be a list of non-empty strings, got {_shown(value)}")
    if required and not value:
        raise _fail(source, key, "must not be empty")
    return tuple(cast("list[str]", value))


def _choice(source: Path, key: str, value: object, allowed: tuple[str, ...]) -> str:
    if value is None:
        raise _missing(source, key, f'"{allowed[0]}"', f" (one of {', '.join(allowed)})")
    if value not in allowed:
        raise _fail(source, key, f"is {_shown(value)}; choose one of {list(allowed)}")
    return str(value)


def _section(source: Path, data: dict[str, Any], name: str) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise _fail(source, f"[{name}]", "must be a table")
    unknown = sorted(set(table) - SECTION_KEYS[name])
    if unknown:
        raise _fail(
            source,
            f"[{name}]",
            f"unknown key(s) {unknown}; allowed keys are {sorted(SECTION_KEYS[name])}",
        )
    return cast("dict[str, Any]", table)


def _argv(source: Path, value: object, list_names: tuple[str, ...]) -> tuple[ArgvItem, ...]:
    if value is None:
        raise _missing(source, "[run] argv", '["wrapper", "--its-flags", "{payload}"]')
    if not isinstance(value, list) or not value:
        raise _fail(
            source,
            "[run] argv",
            'must be a non-empty list (the wrapper command line around "{payload}")',
        )
    items: list[ArgvItem] = []
    for i, element in enumerate(value):
        key = f"[run] argv[{i}]"
        if isinstance(element, str):
            if PAYLOAD in element and element != PAYLOAD:
                raise _fail(
                    source,
                    key,
                    "{payload} expands to several arguments and must be a "
                    "whole argv element; inside a string use {payload_shell}",
                )
            items.append(element)
        elif isinstance(element, dict):
            unknown = sorted(set(element) - EACH_KEYS)
            if unknown or "each" not in element or "args" not in element:
                raise _fail(
                    source,
                    key,
                    "a table element needs exactly 'each' (one of "
                    f"{list(list_names)}) and 'args' (strings using {{item}})",
                )
            list_name = _choice(source, f"{key}.each", element["each"], list_names)
            args = _str_list(source, f"{key}.args", element["args"], required=True)
            items.append((list_name, args))
        else:
            raise _fail(
                source, key, f"must be a string or an {{each, args}} table, got {_shown(element)}"
            )
    # `{payload_shell}` is the same command as `{payload}`, quoted for a shell string: the
    # probe runs once per cell, so the two together (or either twice) would start it twice.
    shells = sum(
        arg.count(PAYLOAD_SHELL)
        for item in items
        for arg in ((item,) if isinstance(item, str) else item[1])
    )
    placed = items.count(PAYLOAD) + shells
    if placed != 1:
        found = f"found {items.count(PAYLOAD)} {PAYLOAD} and {shells} {PAYLOAD_SHELL}"
        raise _fail(source, "[run] argv", f"{PAYLOAD_RULE} ({found})")
    first = items[0]
    if not isinstance(first, str) or any(
        m.group(1) not in STATIC_SCALARS for m in PLACEHOLDER_RE.finditer(first) if m.group(1)
    ):
        raise _fail(
            source,
            "[run] argv[0]",
            "must be the wrapper's executable: a name found on [run] path, or a path that "
            "uses no placeholder but {spec_dir} or {harness_home}",
        )
    return tuple(items)


def _lists(source: Path, value: object) -> dict[str, tuple[str, ...]]:
    """`[lists]`: NAME = ["template", "{list}", ...], each a new list built in order."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(source, "[lists]", 'must be a table of NAME = ["..."] arrays')
    taken = {*LIST_NAMES, *SCALARS, "payload", "item"}
    lists: dict[str, tuple[str, ...]] = {}
    for name, elements in value.items():
        key = f"[lists] {name}"
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name in taken:
            raise _fail(
                source,
                key,
                "a list name must be a new lower-case identifier (not a built-in list or "
                "placeholder); rename it",
            )
        lists[name] = _str_list(source, key, elements, required=False)
        for element in lists[name]:
            whole = PLACEHOLDER_RE.fullmatch(element)
            if whole is not None and whole.group(1) in (*LIST_NAMES, *lists):
                continue  # a splice of a list defined before it
            if whole is not None and whole.group(1) in (name, *value):
                raise _fail(
                    source,
                    key,
                    f"{element} splices a list defined after it (or itself); define "
                    f"{whole.group(1)} first",
                )
        taken.add(name)
    return lists


def _files(source: Path, value: object) -> tuple[FileSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(source, "[[file]]", "must be an array of tables ([[file]] blocks)")
    files = []
    for i, entry in enumerate(value):
        key = f"[[file]] #{i + 1}"
        if not isinstance(entry, dict):
            raise _fail(source, key, "must be a table")
        unknown = sorted(set(entry) - FILE_KEYS)
        if unknown:
            raise _fail(
                source, key, f"unknown key(s) {unknown}; allowed keys are {sorted(FILE_KEYS)}"
            )
        path, template = entry.get("path"), entry.get("template")
        if not isinstance(path, str) or not isinstance(template, str) or not path:
            raise _fail(
                source,
                key,
                "needs 'path' (relative to the run dir) and 'template' "
                "(the file's text), both strings",
            )
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts:
            raise _fail(
                source,
                f"{key}.path",
                f"{path!r} must stay inside the per-cell run "
                "dir: write a relative path without '..' and point the wrapper at "
                "{run_dir}/<path>",
            )
        files.append(FileSpec(path, template, _mode(source, f"{key}.mode", entry)))
    return tuple(files)


def _mode(source: Path, key: str, entry: dict[str, Any]) -> int:
    raw = entry.get("mode", "0644")
    try:
        mode = int(raw, 8) if isinstance(raw, str) else -1
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise _fail(
            source,
            key,
            f'{_shown(raw)} is not a file mode; write it as an octal string like "0600"',
        )
    return mode


def _env(source: Path, table: dict[str, Any]) -> tuple[dict[str, str], dict[str, str | None]]:
    """`[env] set` (the wrapper's, the payload may see them) and `[env] wrapper` (its alone)."""
    setting = table.get("set", {})
    if not isinstance(setting, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in setting.items()
    ):
        raise _fail(source, "[env] set", 'must be a table of NAME = "template" strings')
    raw = table.get("wrapper", {})
    wrapper: dict[str, str | None]
    if isinstance(raw, list):
        names = _str_list(source, "[env] wrapper", raw, required=False)
        for name in names:
            if SECRET_ENV.search(name):
                raise _fail(
                    source,
                    "[env] wrapper",
                    f"{name!r} looks like a harness secret or a credential and is never "
                    "taken from the harness's environment; set it as [env.wrapper] "
                    f'{name} = "value" if the wrapper needs one',
                )
        wrapper = dict.fromkeys(names)
    elif isinstance(raw, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        wrapper = dict(cast("dict[str, str]", raw))
    else:
        raise _fail(
            source,
            "[env] wrapper",
            "must be a list of names from the harness's environment, or a table [env.wrapper] "
            'NAME = "template"',
        )
    both = sorted(set(setting) & set(wrapper))
    if both:
        raise _fail(
            source,
            "[env] wrapper",
            f"{both} are in [env] set too; a variable is either the payload's to see (set) "
            "or the wrapper's alone (wrapper)",
        )
    return cast("dict[str, str]", setting), wrapper


def _policy(source: Path, table: dict[str, Any]) -> DeclaredPolicy:
    """`[policy]`: the claims a wrapper is judged against (README "Claims" has the table).

    `filesystem` is the old shorthand for reads and writes together; a `reads` or `writes`
    key beside it overrides that half, and with both of them it may be left out. Every other
    new claim has the default the old keys always meant, so no old spec changes meaning.
    """
    has_fs = "filesystem" in table or {"reads", "writes"} <= set(table)
    for key in ("network", "filesystem", "ipc"):
        if key not in table and (key != "filesystem" or not has_fs):
            raise _fail(
                source,
                f"[policy] {key}",
                f"is missing; add {key} = ... under [policy]: a wrapper is judged against "
                "its own claim, so declare network, filesystem (or reads and writes) and ipc",
            )
    network = _choice(source, "[policy] network", table["network"], get_args(NetworkMode))
    filesystem = _choice(
        source,
        "[policy] filesystem",
        table.get("filesystem", "workspace"),
        get_args(FilesystemMode),
    )
    ipc = _choice(source, "[policy] ipc", table["ipc"], get_args(IpcMode))
    limits = table.get("limits", {})
    if not isinstance(limits, dict) or not all(
        name in LIMIT_NAMES and isinstance(value, int) and value > 0
        for name, value in limits.items()
    ):
        raise _fail(
            source,
            "[policy] limits",
            f"must map names from {sorted(LIMIT_NAMES)} to positive integers "
            "(e.g. limits = {fsize_mib = 16, nofile = 256})",
        )
    reads, read_deny = _path_claim(source, "reads", table.get("reads", filesystem), "deny")
    writes, write_allow = _path_claim(source, "writes", table.get("writes", filesystem), "allow")
    cut = table.get("network_cut")
    if cut is not None and network == "open":
        raise _fail(
            source,
            "[policy] network_cut",
            'says how a network claim is enforced, and network = "open" claims none; drop '
            'network_cut or claim network = "none" or "proxy"',
        )
    return DeclaredPolicy(
        cast("NetworkMode", network),
        # What the old shorthand means for the probes that read it: writes confined or not.
        "open" if writes == "open" else "workspace",
        cast("IpcMode", ipc),
        limits=tuple(sorted(limits.items())),
        reads=cast("ReadsMode", reads),
        read_deny=read_deny,
        writes=cast("WritesMode", writes),
        write_allow=write_allow,
        protected=_protected(source, table.get("protected", [])),
        environment=cast(
            "EnvironmentMode",
            _choice(
                source,
                "[policy] environment",
                table.get("environment", "scrubbed"),
                get_args(EnvironmentMode),
            ),
        ),
        syscalls=cast(
            "SyscallsMode",
            _choice(
                source,
                "[policy] syscalls",
                table.get("syscalls", "filtered" if ipc == "isolated" else "open"),
                get_args(SyscallsMode),
            ),
        ),
        network_cut=None
        if network == "open"
        else cast(
            "NetworkCut",
            _choice(source, "[policy] network_cut", cut or "namespace", get_args(NetworkCut)),
        ),
        runs_as=_runs_as(source, table.get("runs_as", "")),
        implied=_implied(table, network, filesystem, ipc),
    )


def _implied(
    table: dict[str, Any], network: str, filesystem: str, ipc: str
) -> tuple[tuple[str, str], ...]:
    """The claims this `[policy]` leaves to an old key, each with the key it follows from."""
    implied = {
        "reads": f'filesystem = "{filesystem}"',
        "writes": f'filesystem = "{filesystem}"',
        "syscalls": f'ipc = "{ipc}"',
    }
    if network != "open":
        implied["network_cut"] = f'network = "{network}"'
    return tuple(sorted((k, v) for k, v in implied.items() if k not in table))


def claim_sources(spec: CommandSpec) -> dict[str, str]:
    """Where each claim of `spec` comes from: its line, the key it follows from, or a default.

    Returns:
        claim name (as in `Claims.as_dict`) -> "FILE:LINE" for a written key, "implied by
        ipc = "isolated"" for one that follows from another, "default (...)" otherwise.
    """
    lines = _policy_lines(spec.source)
    implied = dict(spec.policy.implied)
    defaults = {
        "environment": 'default ("scrubbed": the payload sees only declared variables)',
        "runs_as": "default (no claim on the payload's uid)",
        "protected": "default (none)",
    }
    out: dict[str, str] = {}
    for name in (
        "network", "network_cut", "reads", "writes", "ipc", "environment", "syscalls",
        "protected", "runs_as", "limits",
    ):  # fmt: skip
        if name in lines:
            out[name] = f"{spec.source}:{lines[name]}"
        elif name in implied:
            out[name] = f"implied by {implied[name]}"
        elif name in defaults:
            out[name] = defaults[name]
    return out


def _policy_lines(path: Path) -> dict[str, int]:
    """The line of each key written under `[policy]` in the spec file (1-based)."""
    lines: dict[str, int] = {}
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped.split("#")[0].strip() == "[policy]"
            continue
        key = re.match(r"([A-Za-z_][A-Za-z0-9_-]*)\s*=", stripped)
        if inside and key is not None:
            lines.setdefault(key.group(1), number)
    return lines


def _path_claim(source: Path, key: str, value: object, listed: str) -> tuple[str, tuple[str, ...]]:
    """`reads`/`writes`: "open", "workspace", or a `{deny|allow = [paths]}` table."""
    example = f'{key} = {{ {listed} = ["~/.ssh", "/etc/shadow"] }}'
    if isinstance(value, dict):
        if set(value) != {listed}:
            raise _fail(
                source,
                f"[policy] {key}",
                f"a table takes the one key {listed!r}, got {sorted(value)}; write {example}",
            )
        paths = _str_list(source, f"[policy] {key}.{listed}", value[listed], required=True)
        bad = [p for p in paths if not (p.startswith(("/", "~/")) or p == "~")]
        if not paths or bad:
            raise _fail(
                source,
                f"[policy] {key}.{listed}",
                f"needs absolute paths or paths under the payload user's ~ ({bad or 'none given'}"
                " are not); write " + example,
            )
        return listed, paths
    if value not in ("open", "workspace"):
        raise _fail(
            source,
            f"[policy] {key}",
            f'is {_shown(value)}; choose "open", "workspace" or a table: {example}',
        )
    return str(value), ()


def _protected(source: Path, value: object) -> tuple[str, ...]:
    """`protected`: workspace-relative paths the payload must not change even there."""
    paths = _str_list(source, "[policy] protected", value, required=False)
    for path in paths:
        pure = PurePosixPath(path)
        if not path or pure.is_absolute() or ".." in pure.parts:
            raise _fail(
                source,
                "[policy] protected",
                f"{path!r} must be a path relative to the workspace without '..' "
                '(e.g. protected = [".bashrc", ".git/hooks"])',
            )
    return paths


def _runs_as(source: Path, value: object) -> str:
    """`runs_as`: "non-root", "payload-user", a user name, or a uid (digits or a number)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and (value in ("", *RUNS_AS_WORDS) or RUNS_AS_RE.fullmatch(value)):
        return value
    raise _fail(
        source,
        "[policy] runs_as",
        f'is {_shown(value)}; write "non-root", "payload-user" (the harness\'s payload user), '
        "a user name, or a uid number",
    )


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


def _read(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{path}: backend spec not found; pass an existing file to "
            "--backend-spec, or put <name>.toml in matrix/backends/"
        ) from exc
    except OSError as exc:  # a directory, no permission...: one line, never a traceback
        raise ConfigError(
            f"{path}: cannot read the backend spec ({exc.strerror or exc}); pass a readable "
            ".toml file to --backend-spec"
        ) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax there") from exc
    return data


def _name(path: Path, name: object) -> str:
    if name is None:
        raise _missing(path, "[backend] name", '"my-wrapper"', " (the matrix row, cell ids)")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _fail(
            path,
            "[backend] name",
            f"{_shown(name)} must be a lower-case name "
            "(letters, digits, '-', '_'): it becomes the matrix row and the cell ids",
        )
    if name in BUILTIN_BACKENDS:
        raise _fail(
            path,
            "[backend] name",
            f"{name!r} is a built-in backend; rename it (e.g. {name}-wrapper): the built-in "
            "would run in its place",
        )
    return name


def load_spec(path: Path) -> CommandSpec:
    """Read and validate a backend spec.

    Args:
        path: the TOML file.

    Returns:
        The validated spec.

    Raises:
        ConfigError: naming the file, the key and the fix, for any mistake.
    """
    data = _read(path)
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise _fail(path, "top level", f"unknown key(s) {unknown}; allowed are {sorted(TOP_KEYS)}")
    backend = _section(path, data, "backend")
    name = _name(path, backend.get("name"))
    platforms = _str_list(
        path, "[backend] platforms", backend.get("platforms", ["linux"]), required=True
    )
    bad = sorted(set(platforms) - {"linux", "darwin", "windows"})
    if bad:
        raise _fail(path, "[backend] platforms", f"unknown {bad}; use linux, darwin, windows")
    for (section, key), fix in REMOVED_KEYS.items():
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            raise _fail(path, f"[{section}] {key}", fix)
    detect = _section(path, data, "detect")
    run = _section(path, data, "run")
    egress = _choice(path, "[run] egress", run.get("egress"), get_args(SpecEgress))
    inside: dict[str, str] = {}
    for key, default in (
        ("proxy_socket_inside", "{proxy_socket}"),
        ("shim_inside", "{shim}"),
        ("cwd", "{run_dir}"),
    ):
        value = run.get(key, default)
        if not isinstance(value, str) or not value:
            raise _fail(
                path, f"[run] {key}", f"must be a non-empty path string, got {_shown(value)}"
            )
        inside[key] = value
    env_set, env_wrapper = _env(path, _section(path, data, "env"))
    run_user, run_user_reason = _run_user(path, run)
    lists = _lists(path, data.get("lists"))
    spec = CommandSpec(
        source=path,
        name=name,
        description=_str(path, "[backend] description", backend.get("description", "")),
        platforms=platforms,
        executables=_str_list(
            path, "[detect] executables", detect.get("executables"), required=True
        ),
        version_argv=_str_list(path, "[detect] version", detect.get("version"), required=False),
        check_argv=_str_list(path, "[detect] check", detect.get("check"), required=False),
        install=_str(path, "[detect] install", detect.get("install", "")),
        argv=_argv(path, run.get("argv"), (*LIST_NAMES, *lists)),
        egress=cast("SpecEgress", egress),
        proxy_socket_inside=inside["proxy_socket_inside"],
        shim_inside=inside["shim_inside"],
        env_set=env_set,
        files=_files(path, data.get("file")),
        policy=_policy(path, _section(path, data, "policy")),
        raw=data,
        run_user=run_user,
        run_user_reason=run_user_reason,
        path=_str(path, "[run] path", run.get("path", "")),
        cwd=inside["cwd"],
        env_wrapper=env_wrapper,
        lists=lists,
    )
    _dry_render(spec)
    return spec


# A reason is a sentence a reviewer can weigh, not a placeholder word.
MIN_REASON_WORDS: Final = 3


def _run_user(path: Path, run: dict[str, Any]) -> tuple[str, str]:
    """`[run] user` and its reason; "root" must say why, in words a reviewer reads."""
    user = _str(path, "[run] user", run.get("user", ""))
    reason = _str(path, "[run] user_reason", run.get("user_reason", ""))
    if user == "root" and len(reason.split()) < MIN_REASON_WORDS:
        raise _fail(
            path,
            "[run] user_reason",
            'is required with user = "root": say why the wrapper must run as root (it goes '
            "into the signed identity), or drop [run] user to run it as the payload user",
        )
    if reason and not user:
        raise _fail(path, "[run] user_reason", "is only read with [run] user; add user or drop it")
    return user, reason


def _dry_render(spec: CommandSpec) -> None:
    """Render every template once against the sample context: unknown names fail now."""
    src = spec.source
    # What is used before any cell may name only the static placeholders.
    spec.render_static(spec.path, f"{src}: [run] path (only {{spec_dir}} and {{harness_home}})")
    for key, argv in (
        ("executables", spec.executables),
        ("version", spec.version_argv),
        ("check", spec.check_argv),
    ):
        for i, element in enumerate(argv):
            spec.render_static(
                element, f"{src}: [detect] {key}[{i}] (only {{spec_dir}} and {{harness_home}})"
            )
    ctx = sample_context().with_spec_lists(spec)
    ctx.render_argv(spec)
    ctx.render(spec.proxy_socket_inside, f"{src}: [run] proxy_socket_inside")
    ctx.render(spec.shim_inside, f"{src}: [run] shim_inside")
    ctx.render(spec.cwd, f"{src}: [run] cwd")
    for name, value in spec.env_set.items():
        ctx.render(value, f"{src}: [env] set.{name}")
    for name, template in spec.env_wrapper.items():
        if template is not None:
            ctx.render(template, f"{src}: [env] wrapper.{name}")
    for i, entry in enumerate(spec.files):
        ctx.render(entry.path, f"{spec.source}: [[file]] #{i + 1}.path")
        ctx.render(entry.template, f"{spec.source}: [[file]] #{i + 1}.template")


def shell_join(argv: list[str]) -> str:
    """Argv as one POSIX shell string (for wrappers that take a command string)."""
    return shlex.join(argv)


def json_list(values: list[str]) -> str:
    """A list as compact JSON (for settings-file templates)."""
    return json.dumps(values)
