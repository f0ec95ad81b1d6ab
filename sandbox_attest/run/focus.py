"""`run --probe NAME`: a vendor's loop, a few cells without a matrix or policy to write.

From the matrix a run would use, it derives one that keeps only the named probes (and their
platform rows and [[exclude]] entries as written), and a policy that requires exactly those
probes to PASS on the chosen backends and on the control leg. A cell the shipped policy
excludes (with its written reason) stays excluded, so `--probe lifecycle_orphans` does not
start requiring what the release deliberately does not. Both files are written to a private
temporary directory that the caller removes: pytest collects the matrix from a file, and the
signer reads the policy's bytes.

It does not make the focused run a release: the report says which policy it was judged by
(a name starting "focus"), and `verify` against the release policy still wants every cell.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from sandbox_attest.errors import ConfigError

# The derived policy's name: `verify` and the report show it, so nobody mistakes a focused
# run for one judged by the release policy.
FOCUS_POLICY_NAME: Final = "focus"


def focused_inputs(
    matrix: Path,
    policy: Path,
    probes: list[str],
    backends: list[str],
    platform: str,
    into: Path,
) -> tuple[Path, Path]:
    """Write the matrix and policy of a run of `probes` on `backends` (and the control leg).

    Args:
        matrix: the matrix the run would otherwise use (its probe rows and exclusions).
        policy: the policy the run would otherwise use (only its [[exclude]] entries are kept).
        probes: the probe ids asked for, in order; each must be a probe of `matrix`.
        backends: the chosen backend names (from --backend and the specs of --backend-spec).
        platform: this machine's platform ("linux", "darwin", "windows").
        into: an existing private directory the two files are written to.

    Returns:
        The paths of the derived matrix and policy.

    Raises:
        ConfigError: a probe that the matrix does not have (naming the known ones), or no
            backend chosen (naming the flags that choose one).
    """
    data = _read(matrix)
    wanted = _asked_probes(data, matrix, probes, backends)
    control = _focus_matrix(data, wanted, backends, platform)
    not_applicable = {(str(r.get("backend")), str(r.get("probe"))) for r in data["exclude"]}
    excludes = [
        ex
        for ex in _read(policy).get("exclude", [])
        if isinstance(ex, dict)
        and ex.get("platform") in ("*", platform)
        and (ex.get("probe") == "*" or ex.get("probe") in wanted)
    ]
    requires: list[dict[str, Any]] = []
    for backend in dict.fromkeys([control, *backends]):
        required = [
            p
            for p in wanted
            if not _excluded(excludes, platform, backend, p) and (backend, p) not in not_applicable
        ]
        if required:
            requires.append({"platform": platform, "backend": backend, "probes": required})
    if not requires:
        raise ConfigError(
            f"--probe {', '.join(wanted)}: {policy} excludes every cell asked for on "
            f"{platform} (its [[exclude]] says why); choose another probe or backend"
        )
    # Only exclusions that name no required probe: a "*" one would contradict a requirement.
    kept = [
        ex
        for ex in excludes
        if ex.get("probe") != "*"
        and not any(
            ex.get("probe") in req["probes"] and ex.get("backend") in ("*", req["backend"])
            for req in requires
        )
    ]
    return _write_focused(into, matrix, policy, wanted, data, requires, kept)


def _asked_probes(
    data: dict[str, Any], matrix: Path, probes: list[str], backends: list[str]
) -> list[str]:
    """The probes asked for, each once, in order.

    Raises:
        ConfigError: a probe the matrix does not have, or no backend chosen.
    """
    rows = [row for row in data.get("probe", []) if isinstance(row, dict)]
    known = [str(row.get("id")) for row in rows]
    unknown = [p for p in probes if p not in known]
    if unknown:
        raise ConfigError(
            f"--probe {unknown[0]}: not a probe of {matrix}; its probes: {', '.join(known)} "
            "(sandbox-attest explain PROBE says what each one attempts)"
        )
    if not backends:
        raise ConfigError(
            "--probe runs the named probes on the backends you name, and none was named: add "
            "--backend NAME or --backend-spec FILE (the control leg runs beside it by itself)"
        )
    return list(dict.fromkeys(probes))


def _focus_matrix(
    data: dict[str, Any], wanted: list[str], backends: list[str], platform: str
) -> str:
    """Keep in the matrix `data` only the probes wanted and the legs that run; its control leg.

    Raises:
        ConfigError: a wanted probe that does not run on `platform`.
    """
    rows = [row for row in data.get("probe", []) if isinstance(row, dict)]
    data["probe"] = [row for row in rows if row.get("id") in wanted]
    control = str(data.get("matrix", {}).get("control", "none"))
    # Only the legs that run: a spec's row is added from its file by the run itself.
    data["backend"] = [
        row
        for row in data.get("backend", [])
        if isinstance(row, dict) and row.get("name") in (control, *backends)
    ]
    legs = {str(row.get("name")) for row in data["backend"]}
    data["exclude"] = [
        row
        for row in data.get("exclude", [])
        if isinstance(row, dict) and row.get("probe") in wanted and row.get("backend") in legs
    ]
    # A cell the matrix itself makes NOT_APPLICABLE (another platform, an [[exclude]]) is
    # never required: it would fail the derived gate for a reason the vendor did not cause.
    for row in data["probe"]:
        platforms = row.get("platforms", ["linux", "darwin", "windows"])
        if platform not in platforms:
            raise ConfigError(
                f"--probe {row.get('id')}: it does not run on {platform} "
                f"({row.get('reason') or 'the matrix limits it to ' + ', '.join(platforms)})"
            )
    return control


def _write_focused(
    into: Path,
    matrix: Path,
    policy: Path,
    wanted: list[str],
    data: dict[str, Any],
    requires: list[dict[str, Any]],
    kept: list[dict[str, Any]],
) -> tuple[Path, Path]:
    """Write the derived matrix and policy into `into`; their paths."""
    out_matrix = into / "matrix.toml"
    out_policy = into / "policy.toml"
    out_matrix.write_text(
        f"# Derived by `sandbox-attest run --probe` from {matrix}: only {', '.join(wanted)}.\n"
        + dumps(data),
        encoding="utf-8",
    )
    policy_data = {
        "policy": {"name": FOCUS_POLICY_NAME, "version": 2},
        "require": requires,
        **({"exclude": kept} if kept else {}),
    }
    out_policy.write_text(
        f"# Derived by `sandbox-attest run --probe`: {', '.join(wanted)} must PASS on "
        f"{', '.join(r['backend'] for r in requires)}; exclusions kept from {policy}.\n"
        + dumps(policy_data),
        encoding="utf-8",
    )
    return out_matrix, out_policy


@contextmanager
def focused(
    probes: list[str], matrix: Path, policy: Path, backends: list[str], specs: list[str]
) -> Iterator[tuple[Path, Path]]:
    """The matrix and policy a run uses: derived ones with `--probe`, else those given.

    The derived files live in a private temporary directory for the length of the run.

    Raises:
        ConfigError: as `focused_inputs`, or a spec file that does not load.
    """
    if not probes:
        yield matrix, policy
        return
    import tempfile  # noqa: PLC0415

    from sandbox_attest.backends.command.spec_load import load_spec  # noqa: PLC0415
    from sandbox_attest.host.platform import current_platform  # noqa: PLC0415

    chosen = [*backends, *(load_spec(Path(spec)).name for spec in specs)]
    # mkdtemp makes it 0700: nothing but the harness reads or swaps the files it judges by.
    with tempfile.TemporaryDirectory(prefix="sandbox-attest-focus-") as tmp:
        yield focused_inputs(matrix, policy, probes, chosen, current_platform(), Path(tmp))


def _excluded(excludes: list[dict[str, Any]], platform: str, backend: str, probe: str) -> bool:
    return any(
        ex.get("platform") in ("*", platform)
        and ex.get("backend") in ("*", backend)
        and ex.get("probe") in ("*", probe)
        for ex in excludes
    )


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror}; pass another with its flag"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax there") from exc


def dumps(data: dict[str, Any]) -> str:
    """`data` (tables, arrays of tables, and plain values) as TOML that tomllib reads back.

    Strings are written as JSON strings, which are valid TOML basic strings: every escape
    json.dumps writes (quote, backslash, control characters, u-escapes) is also TOML's.
    """
    lines: list[str] = []
    plain = {k: v for k, v in data.items() if not isinstance(v, dict | list) or _inline(v)}
    lines += [f"{k} = {_value(v)}" for k, v in plain.items()]
    for key, value in data.items():
        if key in plain:
            continue
        if isinstance(value, dict):
            lines += ["", f"[{key}]", *(f"{k} = {_value(v)}" for k, v in value.items())]
        else:
            for table in value:
                lines += ["", f"[[{key}]]", *(f"{k} = {_value(v)}" for k, v in table.items())]
    return "\n".join(lines).lstrip("\n") + "\n"


def _inline(value: object) -> bool:
    """Whether a list is a plain array (not an array of tables)."""
    return isinstance(value, list) and not any(isinstance(v, dict) for v in value)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + "}"
    msg = f"no TOML form for {type(value).__name__}"
    raise TypeError(msg)
