"""A backend spec's `[claims]`: the claims its wrapper is judged against, and their sources.

README "Claims" has the table of claims. `claims_table` finds the table (the old name
`[claims]` is still read for one release, with a deprecation message naming the fix),
`read_claims` turns it into a `DeclaredClaims`
(old specs keep their meaning: every new claim defaults to what the old keys always meant), and
`claim_sources` says for each claim which line of the file, which other key, or which default
it comes from.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final, cast, get_args

from sandbox_attest.backends.base import DeclaredClaims, FilesystemMode, IpcMode, NetworkMode
from sandbox_attest.backends.command.spec_fields import (
    describe_value,
    read_choice,
    read_section,
    read_str_list,
    spec_error,
)
from sandbox_attest.claims import (
    KERNEL_OWN,
    RUNS_AS_RE,
    RUNS_AS_WORDS,
    EnvironmentMode,
    KernelMode,
    NetworkCut,
    ReadsMode,
    SyscallsMode,
    WritesMode,
)

if TYPE_CHECKING:
    from sandbox_attest.backends.command.spec import CommandSpec

# The resource limits a spec may claim ([claims] limits = {fsize_mib = 16, nofile = 256}); the
# resource_limits probe holds the wrapper to them.
LIMIT_NAMES: Final = frozenset({"fsize_mib", "nofile", "forks", "memory_mib"})
# The table's old name, read for one release: a spec that still says [policy] gets a
# deprecation message on stderr, and one that has both tables is refused.
LEGACY_TABLE: Final = "policy"
CLAIMS_HEADERS: Final = frozenset({"[claims]", f"[{LEGACY_TABLE}]"})
RENAME_FIX: Final = f"rename [{LEGACY_TABLE}] to [claims]"
# Spec files already told (a run loads a spec more than once): one message per file.
_TOLD: set[Path] = set()


@dataclass(frozen=True)
class OwnKernelClaims(DeclaredClaims):
    """The claims of a sandbox with a kernel of its own (`kernel = "own"`).

    The host cannot see such a payload's processes (gVisor's Sentry runs them, or a microVM's
    guest kernel), so the host's rendezvous happens through the workspace alone and every
    verdict rests on the effects outside the sandbox (`sandbox_attest.claims.Claims.own_kernel`).
    A spec without the key keeps building a plain `DeclaredClaims`, so every existing spec's
    claims, and the identity they sign, stay what they were.
    """

    kernel: KernelMode = KERNEL_OWN


def claims_table(source: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The spec's `[claims]` table, or its old `[policy]` (with a deprecation message).

    Raises:
        ConfigError: the spec has both tables (naming the fix), or the table is malformed.
    """
    if LEGACY_TABLE not in data:
        return read_section(source, data, "claims")
    if "claims" in data:
        raise spec_error(
            source,
            f"[{LEGACY_TABLE}]",
            f"and [claims] are both present; {RENAME_FIX} by moving its keys into [claims]",
        )
    if source not in _TOLD:
        _TOLD.add(source)
        print(
            f"{source}: [{LEGACY_TABLE}] is deprecated and will stop being read in the next "
            f"release; {RENAME_FIX}",
            file=sys.stderr,
        )
    return read_section(source, data, LEGACY_TABLE)


def read_claims(source: Path, table: dict[str, Any]) -> DeclaredClaims:
    """`[claims]`: the claims a wrapper is judged against (README "Claims" has the table).

    `filesystem` is the old shorthand for reads and writes together; a `reads` or `writes`
    key beside it overrides that half, and with both of them it may be left out. Every other
    new claim has the default the old keys always meant, so no old spec changes meaning.
    """
    _require_core_claims(source, table)
    network = read_choice(source, "[claims] network", table["network"], get_args(NetworkMode))
    filesystem = read_choice(
        source,
        "[claims] filesystem",
        table.get("filesystem", "workspace"),
        get_args(FilesystemMode),
    )
    ipc = read_choice(source, "[claims] ipc", table["ipc"], get_args(IpcMode))
    limits = _limits(source, table)
    reads, read_deny = _path_claim(source, "reads", table.get("reads", filesystem), "deny")
    writes, write_allow = _path_claim(source, "writes", table.get("writes", filesystem), "allow")
    cut = table.get("network_cut")
    if cut is not None and network == "open":
        raise spec_error(
            source,
            "[claims] network_cut",
            'says how a network claim is enforced, and network = "open" claims none; drop '
            'network_cut or claim network = "none" or "proxy"',
        )
    kernel = read_choice(
        source, "[claims] kernel", table.get("kernel", "shared"), get_args(KernelMode)
    )
    made = OwnKernelClaims if kernel == KERNEL_OWN else DeclaredClaims
    return made(
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
            read_choice(
                source,
                "[claims] environment",
                table.get("environment", "scrubbed"),
                get_args(EnvironmentMode),
            ),
        ),
        syscalls=cast(
            "SyscallsMode",
            read_choice(
                source,
                "[claims] syscalls",
                table.get("syscalls", "filtered" if ipc == "isolated" else "open"),
                get_args(SyscallsMode),
            ),
        ),
        network_cut=None
        if network == "open"
        else cast(
            "NetworkCut",
            read_choice(source, "[claims] network_cut", cut or "namespace", get_args(NetworkCut)),
        ),
        runs_as=_runs_as(source, table.get("runs_as", "")),
        implied=_implied(table, network, filesystem, ipc),
    )


def _require_core_claims(source: Path, table: dict[str, Any]) -> None:
    """network, filesystem (or reads and writes both) and ipc: the claims every spec makes."""
    has_fs = "filesystem" in table or {"reads", "writes"} <= set(table)
    for key in ("network", "filesystem", "ipc"):
        if key not in table and (key != "filesystem" or not has_fs):
            raise spec_error(
                source,
                f"[claims] {key}",
                f"is missing; add {key} = ... under [claims]: a wrapper is judged against "
                "its own claim, so declare network, filesystem (or reads and writes) and ipc",
            )


def _limits(source: Path, table: dict[str, Any]) -> dict[str, int]:
    """`limits`: resource limits from `LIMIT_NAMES`, each a positive integer."""
    limits = table.get("limits", {})
    if not isinstance(limits, dict) or not all(
        name in LIMIT_NAMES and isinstance(value, int) and value > 0
        for name, value in limits.items()
    ):
        raise spec_error(
            source,
            "[claims] limits",
            f"must map names from {sorted(LIMIT_NAMES)} to positive integers "
            "(e.g. limits = {fsize_mib = 16, nofile = 256})",
        )
    return cast("dict[str, int]", limits)


def _implied(
    table: dict[str, Any], network: str, filesystem: str, ipc: str
) -> tuple[tuple[str, str], ...]:
    """The claims this `[claims]` leaves to an old key, each with the key it follows from."""
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
    lines = _claims_lines(spec.source)
    implied = dict(spec.claims.implied)
    defaults = {
        "environment": 'default ("scrubbed": the payload sees only declared variables)',
        "runs_as": "default (no claim on the payload's uid)",
        "protected": "default (none)",
        "kernel": 'default ("shared": the payload is a host process the host reads in /proc)',
    }
    out: dict[str, str] = {}
    for name in (
        "network", "network_cut", "reads", "writes", "ipc", "environment", "syscalls",
        "protected", "runs_as", "limits", "kernel",
    ):  # fmt: skip
        if name in lines:
            out[name] = f"{spec.source}:{lines[name]}"
        elif name in implied:
            out[name] = f"implied by {implied[name]}"
        elif name in defaults:
            out[name] = defaults[name]
    return out


def _claims_lines(path: Path) -> dict[str, int]:
    """The line of each key written under `[claims]` in the spec file (1-based)."""
    lines: dict[str, int] = {}
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped.split("#")[0].strip() in CLAIMS_HEADERS
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
            raise spec_error(
                source,
                f"[claims] {key}",
                f"a table takes the one key {listed!r}, got {sorted(value)}; write {example}",
            )
        paths = read_str_list(source, f"[claims] {key}.{listed}", value[listed], required=True)
        bad = [p for p in paths if not (p.startswith(("/", "~/")) or p == "~")]
        if not paths or bad:
            raise spec_error(
                source,
                f"[claims] {key}.{listed}",
                f"needs absolute paths or paths under the payload user's ~ ({bad or 'none given'}"
                " are not); write " + example,
            )
        return listed, paths
    if value not in ("open", "workspace"):
        raise spec_error(
            source,
            f"[claims] {key}",
            f'is {describe_value(value)}; choose "open", "workspace" or a table: {example}',
        )
    return str(value), ()


def _protected(source: Path, value: object) -> tuple[str, ...]:
    """`protected`: workspace-relative paths the payload must not change even there."""
    paths = read_str_list(source, "[claims] protected", value, required=False)
    for path in paths:
        pure = PurePosixPath(path)
        if not path or pure.is_absolute() or ".." in pure.parts:
            raise spec_error(
                source,
                "[claims] protected",
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
    raise spec_error(
        source,
        "[claims] runs_as",
        f'is {describe_value(value)}; write "non-root", "payload-user" (the harness\'s payload '
        "user), a user name, or a uid number",
    )
