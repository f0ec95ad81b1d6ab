"""Readers for the keys and tables of a backend spec, one each, in the words of the TOML file.

Every mistake is a `ConfigError` that reads `<file>: <key>: <what is wrong; the fix>`
(`spec_error`), and a value in a message is shown as TOML writes it (`describe_value`), never as
Python would. `[claims]` has its own module (`spec_claims`); `spec_load` puts the pieces together.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any, Final, cast

from sandbox_attest.backends.command.spec import (
    BUILTIN_BACKENDS,
    LIST_NAMES,
    PAYLOAD,
    PAYLOAD_RULE,
    PAYLOAD_SHELL,
    PLACEHOLDER_RE,
    SCALARS,
    SECRET_ENV,
    STATIC_SCALARS,
    ArgvItem,
    FileSpec,
)
from sandbox_attest.errors import ConfigError

NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

TOP_KEYS: Final = {"backend", "detect", "run", "env", "file", "claims", "lists", "policy"}
CLAIM_KEYS: Final = {
    "kernel",
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
}
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
    "claims": CLAIM_KEYS,
    # The old name of [claims], read for one release (spec_claims.claims_table).
    "policy": CLAIM_KEYS,
}
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
# A reason is a sentence a reviewer can weigh, not a placeholder word.
MIN_REASON_WORDS: Final = 3


def spec_error(source: Path, key: str, message: str) -> ConfigError:
    """Every spec error reads `<file>: <key>: <what is wrong; the fix>`."""
    return ConfigError(f"{source}: {key}: {message}")


def missing_key_error(source: Path, key: str, example: str, note: str = "") -> ConfigError:
    """`key` is absent: say which line to add (`key` is "[section] name")."""
    section, _, leaf = key.rpartition(" ")
    return spec_error(source, key, f"is missing; add {leaf} = {example} under {section}{note}")


def describe_value(value: object) -> str:
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


def read_str(source: Path, key: str, value: object) -> str:
    """`key` as a string (any string, the empty one included)."""
    if not isinstance(value, str):
        raise spec_error(source, key, f"must be a string, got {describe_value(value)}")
    return value


def read_str_list(source: Path, key: str, value: object, *, required: bool) -> tuple[str, ...]:
    """`key` as a list of non-empty strings; absent is `()` unless `required`."""
    if value is None and not required:
        return ()
    if value is None:
        raise missing_key_error(source, key, '["..."]')
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise spec_error(
            source, key, f"must be a list of non-empty strings, got {describe_value(value)}"
        )
    if required and not value:
        raise spec_error(source, key, "must not be empty")
    return tuple(cast("list[str]", value))


def read_choice(source: Path, key: str, value: object, allowed: tuple[str, ...]) -> str:
    """`key` as one of `allowed`; absent is an error naming the first of them."""
    if value is None:
        raise missing_key_error(source, key, f'"{allowed[0]}"', f" (one of {', '.join(allowed)})")
    if value not in allowed:
        raise spec_error(source, key, f"is {describe_value(value)}; choose one of {list(allowed)}")
    return str(value)


def read_section(source: Path, data: dict[str, Any], name: str) -> dict[str, Any]:
    """The table `[name]` (empty if absent), with no key `SECTION_KEYS` does not name."""
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise spec_error(source, f"[{name}]", "must be a table")
    unknown = sorted(set(table) - SECTION_KEYS[name])
    if unknown:
        raise spec_error(
            source,
            f"[{name}]",
            f"unknown key(s) {unknown}; allowed keys are {sorted(SECTION_KEYS[name])}",
        )
    return cast("dict[str, Any]", table)


def read_argv(source: Path, value: object, list_names: tuple[str, ...]) -> tuple[ArgvItem, ...]:
    """`[run] argv`: templates and `{each, args}` tables, with `PAYLOAD_RULE` kept."""
    if value is None:
        raise missing_key_error(source, "[run] argv", '["wrapper", "--its-flags", "{payload}"]')
    if not isinstance(value, list) or not value:
        raise spec_error(
            source,
            "[run] argv",
            'must be a non-empty list (the wrapper command line around "{payload}")',
        )
    items: list[ArgvItem] = []
    for i, element in enumerate(value):
        key = f"[run] argv[{i}]"
        if isinstance(element, str):
            if PAYLOAD in element and element != PAYLOAD:
                raise spec_error(
                    source,
                    key,
                    "{payload} expands to several arguments and must be a "
                    "whole argv element; inside a string use {payload_shell}",
                )
            items.append(element)
        elif isinstance(element, dict):
            unknown = sorted(set(element) - EACH_KEYS)
            if unknown or "each" not in element or "args" not in element:
                raise spec_error(
                    source,
                    key,
                    "a table element needs exactly 'each' (one of "
                    f"{list(list_names)}) and 'args' (strings using {{item}})",
                )
            list_name = read_choice(source, f"{key}.each", element["each"], list_names)
            args = read_str_list(source, f"{key}.args", element["args"], required=True)
            items.append((list_name, args))
        else:
            raise spec_error(
                source,
                key,
                f"must be a string or an {{each, args}} table, got {describe_value(element)}",
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
        raise spec_error(source, "[run] argv", f"{PAYLOAD_RULE} ({found})")
    first = items[0]
    if not isinstance(first, str) or any(
        m.group(1) not in STATIC_SCALARS for m in PLACEHOLDER_RE.finditer(first) if m.group(1)
    ):
        raise spec_error(
            source,
            "[run] argv[0]",
            "must be the wrapper's executable: a name found on [run] path, or a path that "
            "uses no placeholder but {spec_dir} or {harness_home}",
        )
    return tuple(items)


def read_lists(source: Path, value: object) -> dict[str, tuple[str, ...]]:
    """`[lists]`: NAME = ["template", "{list}", ...], each a new list built in order."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise spec_error(source, "[lists]", 'must be a table of NAME = ["..."] arrays')
    taken = {*LIST_NAMES, *SCALARS, "payload", "item"}
    lists: dict[str, tuple[str, ...]] = {}
    for name, elements in value.items():
        key = f"[lists] {name}"
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name in taken:
            raise spec_error(
                source,
                key,
                "a list name must be a new lower-case identifier (not a built-in list or "
                "placeholder); rename it",
            )
        lists[name] = read_str_list(source, key, elements, required=False)
        for element in lists[name]:
            whole = PLACEHOLDER_RE.fullmatch(element)
            if whole is not None and whole.group(1) in (*LIST_NAMES, *lists):
                continue  # a splice of a list defined before it
            if whole is not None and whole.group(1) in (name, *value):
                raise spec_error(
                    source,
                    key,
                    f"{element} splices a list defined after it (or itself); define "
                    f"{whole.group(1)} first",
                )
        taken.add(name)
    return lists


def read_files(source: Path, value: object) -> tuple[FileSpec, ...]:
    """`[[file]]` blocks: each a path inside the run dir, a template and a mode."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise spec_error(source, "[[file]]", "must be an array of tables ([[file]] blocks)")
    files = []
    for i, entry in enumerate(value):
        key = f"[[file]] #{i + 1}"
        if not isinstance(entry, dict):
            raise spec_error(source, key, "must be a table")
        unknown = sorted(set(entry) - FILE_KEYS)
        if unknown:
            raise spec_error(
                source, key, f"unknown key(s) {unknown}; allowed keys are {sorted(FILE_KEYS)}"
            )
        path, template = entry.get("path"), entry.get("template")
        if not isinstance(path, str) or not isinstance(template, str) or not path:
            raise spec_error(
                source,
                key,
                "needs 'path' (relative to the run dir) and 'template' "
                "(the file's text), both strings",
            )
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts:
            raise spec_error(
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
        raise spec_error(
            source,
            key,
            f'{describe_value(raw)} is not a file mode; write it as an octal string like "0600"',
        )
    return mode


def read_env(source: Path, table: dict[str, Any]) -> tuple[dict[str, str], dict[str, str | None]]:
    """`[env] set` (the wrapper's, the payload may see them) and `[env] wrapper` (its alone)."""
    setting = table.get("set", {})
    if not isinstance(setting, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in setting.items()
    ):
        raise spec_error(source, "[env] set", 'must be a table of NAME = "template" strings')
    raw = table.get("wrapper", {})
    wrapper: dict[str, str | None]
    if isinstance(raw, list):
        names = read_str_list(source, "[env] wrapper", raw, required=False)
        for name in names:
            if SECRET_ENV.search(name):
                raise spec_error(
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
        raise spec_error(
            source,
            "[env] wrapper",
            "must be a list of names from the harness's environment, or a table [env.wrapper] "
            'NAME = "template"',
        )
    both = sorted(set(setting) & set(wrapper))
    if both:
        raise spec_error(
            source,
            "[env] wrapper",
            f"{both} are in [env] set too; a variable is either the payload's to see (set) "
            "or the wrapper's alone (wrapper)",
        )
    return cast("dict[str, str]", setting), wrapper


def read_name(path: Path, name: object) -> str:
    """`[backend] name`: the matrix row and the cell ids, never a built-in's name."""
    if name is None:
        raise missing_key_error(
            path, "[backend] name", '"my-wrapper"', " (the matrix row, cell ids)"
        )
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise spec_error(
            path,
            "[backend] name",
            f"{describe_value(name)} must be a lower-case name "
            "(letters, digits, '-', '_'): it becomes the matrix row and the cell ids",
        )
    if name in BUILTIN_BACKENDS:
        raise spec_error(
            path,
            "[backend] name",
            f"{name!r} is a built-in backend; rename it (e.g. {name}-wrapper): the built-in "
            "would run in its place",
        )
    return name


def read_run_user(path: Path, run: dict[str, Any]) -> tuple[str, str]:
    """`[run] user` and its reason; "root" must say why, in words a reviewer reads."""
    user = read_str(path, "[run] user", run.get("user", ""))
    reason = read_str(path, "[run] user_reason", run.get("user_reason", ""))
    if user == "root" and len(reason.split()) < MIN_REASON_WORDS:
        raise spec_error(
            path,
            "[run] user_reason",
            'is required with user = "root": say why the wrapper must run as root (it goes '
            "into the signed identity), or drop [run] user to run it as the payload user",
        )
    if reason and not user:
        raise spec_error(
            path, "[run] user_reason", "is only read with [run] user; add user or drop it"
        )
    return user, reason
