"""Find a backend spec by name or path, and load it: read, validate, render once.

Every mistake is a `ConfigError` that names the file, the key and the fix, raised at load time
(a spec is rendered once against a sample context while loading, so an unknown placeholder
never waits for a live run).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, cast, get_args

from sandbox_attest.backends.command.spec import (
    LIST_NAMES,
    CommandSpec,
    SpecEgress,
    sample_context,
)
from sandbox_attest.backends.command.spec_claims import claims_table, read_claims
from sandbox_attest.backends.command.spec_fields import (
    REMOVED_KEYS,
    TOP_KEYS,
    describe_value,
    read_argv,
    read_choice,
    read_env,
    read_files,
    read_lists,
    read_name,
    read_run_user,
    read_section,
    read_str,
    read_str_list,
    spec_error,
)
from sandbox_attest.errors import ConfigError
from sandbox_attest.paths import matrix_dir


def specs_dir() -> Path:
    """Where named specs live: `matrix/backends/<name>.toml`."""
    return matrix_dir() / "backends"


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
        raise spec_error(
            path, "top level", f"unknown key(s) {unknown}; allowed are {sorted(TOP_KEYS)}"
        )
    backend = read_section(path, data, "backend")
    name = read_name(path, backend.get("name"))
    platforms = read_str_list(
        path, "[backend] platforms", backend.get("platforms", ["linux"]), required=True
    )
    bad = sorted(set(platforms) - {"linux", "darwin", "windows"})
    if bad:
        raise spec_error(path, "[backend] platforms", f"unknown {bad}; use linux, darwin, windows")
    for (section, key), fix in REMOVED_KEYS.items():
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            raise spec_error(path, f"[{section}] {key}", fix)
    detect = read_section(path, data, "detect")
    run = read_section(path, data, "run")
    egress = read_choice(path, "[run] egress", run.get("egress"), get_args(SpecEgress))
    inside = _run_paths(path, run)
    env_set, env_wrapper = read_env(path, read_section(path, data, "env"))
    run_user, run_user_reason = read_run_user(path, run)
    lists = read_lists(path, data.get("lists"))
    spec = CommandSpec(
        source=path,
        name=name,
        description=read_str(path, "[backend] description", backend.get("description", "")),
        platforms=platforms,
        executables=read_str_list(
            path, "[detect] executables", detect.get("executables"), required=True
        ),
        version_argv=read_str_list(path, "[detect] version", detect.get("version"), required=False),
        check_argv=read_str_list(path, "[detect] check", detect.get("check"), required=False),
        install=read_str(path, "[detect] install", detect.get("install", "")),
        argv=read_argv(path, run.get("argv"), (*LIST_NAMES, *lists)),
        egress=cast("SpecEgress", egress),
        proxy_socket_inside=inside["proxy_socket_inside"],
        shim_inside=inside["shim_inside"],
        env_set=env_set,
        files=read_files(path, data.get("file")),
        claims=read_claims(path, claims_table(path, data)),
        raw=data,
        run_user=run_user,
        run_user_reason=run_user_reason,
        path=read_str(path, "[run] path", run.get("path", "")),
        cwd=inside["cwd"],
        env_wrapper=env_wrapper,
        lists=lists,
    )
    _dry_render(spec)
    return spec


def _run_paths(path: Path, run: dict[str, Any]) -> dict[str, str]:
    """`[run] proxy_socket_inside`, `shim_inside` and `cwd`: path templates, never empty."""
    inside: dict[str, str] = {}
    for key, default in (
        ("proxy_socket_inside", "{proxy_socket}"),
        ("shim_inside", "{shim}"),
        ("cwd", "{run_dir}"),
    ):
        value = run.get(key, default)
        if not isinstance(value, str) or not value:
            raise spec_error(
                path,
                f"[run] {key}",
                f"must be a non-empty path string, got {describe_value(value)}",
            )
        inside[key] = value
    return inside


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
