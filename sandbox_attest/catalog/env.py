"""The environment probe, host side: what of the harness's environment reaches the payload.

`env_inheritance` plants canaries in the harness's own environment (names a real agent's
secrets would have, values only this cell knows) and an inheritable descriptor, then reads
what the payload saw against what the harness declares as the payload's environment
(`sandbox_attest.payload.payload_env`). A canary or a host descriptor inside is an escape.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    host_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.judging import conclude
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    host_processes,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.host import disguise
from sandbox_attest.payload import payload_env
from sandbox_attest.verdict import Assessment, Escape, Expectation

ENV_PREFIX: Final = disguise.ENV_CANARY_PREFIX
# Variables the interpreter or the sandbox sets by itself, whatever it was given: bwrap's
# --chdir and shells set PWD (and OLDPWD, SHLVL, _); Python's PEP 538 locale coercion sets
# LC_CTYPE=C.UTF-8 when no locale is declared, in the harness's own environment too, so an equal
# value there is a coincidence, not a leak. They are reported, never counted as an escape.
ENV_PLUMBING: Final = ("PWD", "OLDPWD", "SHLVL", "_", "LC_CTYPE")
_ENV_SUFFIXES: Final = ("API_KEY", "PASSWORD")
# Where a command wrapper's backend records, per cell, the canary credentials it planted in the
# wrapper's own environment and the names meant for the wrapper alone (`[env] wrapper`). The
# same name as sandbox_attest.backends.command.WRAPPER_ENV_FILE (a test pins the two together); read
# from the cell dir so the catalogue needs nothing from the backends.
WRAPPER_ENV_FILE: Final = "wrapper-env.json"


def _wrapper_record(ctx: CellContext) -> tuple[dict[str, str], set[str]]:
    """(planted canaries, wrapper-only names) of a command wrapper's cell; empty otherwise."""
    try:
        data = json.loads((ctx.cell_dir / WRAPPER_ENV_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, set()
    if not isinstance(data, dict):
        return {}, set()
    canaries = data.get("canaries")
    planted = {str(k): str(v) for k, v in canaries.items()} if isinstance(canaries, dict) else {}
    return planted, {str(n) for n in data.get("wrapper_only") or ()}


def salted_hash(salt: str, value: str) -> str:
    """The payload's salted digest of one value (HMAC-SHA256, 32 hex chars)."""
    raw = value.encode("utf-8", "surrogateescape")
    return hmac.new(salt.encode(), raw, hashlib.sha256).hexdigest()[:32]


def _pipe_label(fd: int) -> str:
    """What /proc/self/fd/N says for a pipe end, the same in any process holding it."""
    return f"pipe:[{os.fstat(fd).st_ino}]"


# Devices every process may open for itself: one of these at fd 3+ is the sandbox's own, even
# when the harness holds the same device open. Any other harness-held target is the host's.
SHARED_DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def _harness_fd_targets() -> set[str] | None:
    """What the harness process holds open (/proc/self/fd targets), or None off Linux.

    Pipe and socket targets carry their inode (`socket:[123]`), unique on the kernel across
    namespaces, so the same label in the payload is the same object, not a lookalike.
    """
    try:
        entries = list(Path("/proc/self/fd").iterdir())
    except OSError:
        return None
    held = set()
    for entry in entries:
        with contextlib.suppress(OSError):  # the listing's own descriptor is closed by now
            held.add(str(entry.readlink()))
    return held


def _host_fds(fd_targets: dict[str, Any], held: set[str]) -> list[str]:
    """The payload's fds (3+) that point at an object the harness holds, as "fd target"."""
    return sorted(
        f"{fd} {target}"
        for fd, target in fd_targets.items()
        if target in held and target not in SHARED_DEVICES
    )


def _fd_list(fd_targets: dict[str, Any]) -> str:
    return ", ".join(f"{fd} {target}" for fd, target in sorted(fd_targets.items())) or "none"


@dataclass(frozen=True)
class _VariableHits:
    """Which variables of the host's reached the payload (names), by where they came from."""

    canary: list[str]  # planted in the harness's own environment
    planted: list[str]  # planted in a command wrapper's environment
    host: list[str]  # the harness's own, undeclared
    wrapper_only: set[str]  # a wrapper's own variables, ignored
    passthrough: str  # why none of them is judged ("" when they are)

    def reasons(self) -> list[str]:
        """What reached the payload, in words, most serious first."""
        reasons = [self.passthrough] if self.passthrough else []
        if self.planted:
            reasons.append(
                "claims a scrubbed environment; the credentials planted in the wrapper's "
                f"environment reached the payload: {', '.join(self.planted)}"
            )
        if self.canary:
            reasons.append(
                "claims a scrubbed environment; the host's canary variables reached the "
                f"payload: {', '.join(self.canary)}"
            )
        if self.host:
            reasons.append(
                "claims a scrubbed environment; undeclared host variables reached the payload: "
                + ", ".join(self.host)
            )
        return reasons


def _variable_hits(
    ctx: CellContext,
    salt: str,
    hashes: dict[str, str],
    seen_env: dict[str, str],
    declared: set[str],
) -> _VariableHits:
    """Match the payload's salted variables against every canary and the host's own."""
    canary = sorted(n for n, h in hashes.items() if seen_env.get(n) == h)
    # A command wrapper starts with an agent's environment: the credentials planted in it
    # must not reach the payload under any name; the wrapper's own variables are ignored.
    planted, wrapper_only = _wrapper_record(ctx)
    seen_values = set(seen_env.values())
    planted_hits = sorted(n for n, v in planted.items() if salted_hash(salt, v) in seen_values)
    host = sorted(
        n
        for n, h in seen_env.items()
        if n not in declared
        and n not in ENV_PLUMBING
        and n not in hashes
        and n not in planted
        and n not in wrapper_only
        and n in os.environ
        and salted_hash(salt, os.environ[n]) == h
    )
    # A backend that claims `environment = "passthrough"` (srt, Codex) makes no scrub claim:
    # that part is NOT_APPLICABLE, so what reached the payload of the environment is reported,
    # never judged; the descriptors still are. Every other backend is held to a scrubbed one.
    if claims_of(ctx.claims).environment == "passthrough" and (canary or planted_hits or host):
        why = (
            "claims environment passthrough, so the scrub part is NOT_APPLICABLE: the "
            "variables that reached the payload are not judged (planted credentials "
            f"{', '.join(planted_hits) or 'none'}, host variables {len(host) + len(canary)})"
        )
        return _VariableHits([], [], [], wrapper_only, why)
    return _VariableHits(canary, planted_hits, host, wrapper_only, "")


def _host_view_hits(ctx: CellContext, canaries: list[str]) -> list[str]:
    """The canary variables and the canary pipe the host saw in the payload, as reasons."""
    pipe = load_state(ctx).get("pipe")
    found = []
    for process in host_processes(ctx):
        pid = process.get("pid", "?")
        names = sorted(set(canaries) & set(process.get("env_names") or []))
        if names:
            found.append(
                f"the host sees the canary variables in the payload's environ (host pid {pid}): "
                f"{', '.join(names)}"
            )
        fds = sorted(
            str(fd) for fd, target in (process.get("fds") or {}).items() if pipe and target == pipe
        )
        if fds:
            found.append(
                f"the host sees the canary pipe open in the payload (host pid {pid}) as fd "
                f"{', '.join(fds)}"
            )
    return found


def _escape_of(
    seen: bool,
    observed: str,
    escapes: list[dict[str, Any]],
    fd_targets: dict[str, Any],
    now_held: set[str] | None,
    hits: _VariableHits,
    by_what: dict[str, dict[str, Any]],
    reasons: list[str],
) -> Escape:
    """The escape once the host's own objects were looked for inside; adds its reason."""
    escape: Escape
    if seen:
        escape = "escaped"
    elif observed == "refused":
        escape = "refused"
        reasons.append("only the declared environment and fds 0-2 inside")
    elif observed == "error":
        escape = "undecided"
        reasons.append(f"the payload could not look: {attempts_summary(escapes)}")
    elif fd_targets and (now_held is None or None in fd_targets.values()):
        # Without both sides' targets nothing shows an extra fd is the sandbox's own.
        escape = "undecided"
        reasons.append(
            f"extra fds that cannot be compared with the harness's: {_fd_list(fd_targets)}"
        )
    else:
        # What it found is none of the host's: variables or fds the sandbox itself added.
        escape = "contained"
        names = (by_what.get("env-undeclared") or {}).get("names", [])
        # Under a passthrough claim the variables are the wrapper's, as claimed (its
        # `hits.reasons()` said so): only the descriptors are left to account for.
        added = "" if hits.passthrough else f"variables {', '.join(map(str, names)) or 'none'}; "
        reasons.append(
            "extras the sandbox added itself, none held by the harness: "
            f"{added}fds {_fd_list(fd_targets)}"
        )
    return escape


def _inside_checks(
    by_what: dict[str, dict[str, Any]], salt: str, nonce: str
) -> list[dict[str, Any]]:
    """The in-sandbox controls: declared variables seen, hashed like the host, fds 0-2 open."""
    declared_seen = by_what.get("env-declared") or {}
    return [
        host_check(
            "payload sees its declared variables",
            declared_seen.get("outcome") == "succeeded",
            str(declared_seen.get("detail")),
        ),
        host_check(
            "payload hashes like the host",
            declared_seen.get("check_hash") == salted_hash(salt, f"check-{nonce}"),
            "salted hash of the task's check value compared",
        ),
        host_check(
            "payload sees fds 0-2",
            (by_what.get("fds-std") or {}).get("outcome") == "succeeded",
            str((by_what.get("fds-std") or {}).get("detail")),
        ),
    ]


class EnvInheritance(SpecBase):
    """Looks for the harness's own canary env vars and an inheritable fd in the payload."""

    id = "env_inheritance"
    area = "env"

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host's own read of the payload's environ and descriptors, where it made one."""
        del report
        processes = host_processes(ctx)
        # Every judged process of the cell must have been read: one whose environ the host
        # could not read (sandbox_attest/run/hostview.py `unread`) backs nothing.
        if not processes or any(p.get("unread") for p in processes):
            return []
        if _host_view_hits(ctx, self.names(ctx)):
            return []
        return ["host view: environment names", "host view: open descriptors"]

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The declared-env and std-fd controls, the two env escapes and the fd escape."""
        del task
        return AttemptTable(
            required=attempts_of("env-declared", "env-canary", "env-undeclared", "fds-std", "fds")
        )

    def __init__(self) -> None:
        """Descriptors held open per nonce between prepare and cleanup."""
        self._pipes: dict[str, tuple[int, int]] = {}

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied on every leg, the open control leg included.

        The payload's environment is declared by the harness (`sandbox_attest.payload.payload_env`)
        and every backend, `none` too, must pass exactly that: a leak here is the runner's or
        the backend's, never something an unconfined host is entitled to.
        """
        del declared
        return "denied"

    @staticmethod
    def names(ctx: CellContext) -> list[str]:
        """The canary variables this cell plants in the harness's environment."""
        return [f"{ENV_PREFIX}{ctx.nonce.upper()}_{suffix}" for suffix in _ENV_SUFFIXES]

    @staticmethod
    def declared(ctx: CellContext) -> list[str]:
        """Names the runner may give a payload (with or without a proxy)."""
        return sorted(payload_env("http://127.0.0.1:1", ctx.workspace))

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Set the canaries in os.environ and open an inheritable canary pipe."""
        salt = secrets.token_hex(16)
        values = {
            name: f"{disguise.SECRET_PREFIX}{secrets.token_hex(16)}" for name in self.names(ctx)
        }
        read_end, write_end = os.pipe()
        os.set_inheritable(read_end, True)  # noqa: FBT003  (the leak a careless spawner would pass on)
        self._pipes[ctx.nonce] = (read_end, write_end)
        os.environ.update(values)
        save_state(
            ctx,
            {
                "salt": salt,
                "hashes": {n: salted_hash(salt, v) for n, v in values.items()},
                "pipe": _pipe_label(read_end),
                # What the harness holds as it hands the cell to the backend; assess adds
                # what it holds then (the world's sockets live on, the runner's pipes do not).
                "held": sorted(_harness_fd_targets() or ()),
            },
        )
        return {
            "prefix": ENV_PREFIX,
            "salt": salt,
            "declared": self.declared(ctx),
            "check": f"check-{ctx.nonce}",
            "plumbing": list(ENV_PLUMBING),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The canaries are in the host's environment and its canary fd is open, inheritable."""
        state = load_state(ctx)
        salt = str(state.get("salt", ""))
        checks = []
        for name, digest in state.get("hashes", {}).items():
            value = os.environ.get(name)
            ok = value is not None and salted_hash(salt, value) == digest
            checks.append(host_check(f"host env has {name}", ok, "planted value present"))
        pipe = self._pipes.get(ctx.nonce)
        fd_ok = pipe is not None and os.get_inheritable(pipe[0])
        checks.append(
            host_check("host holds the inheritable canary fd", fd_ok, str(state.get("pipe")))
        )
        return control_record(new_control_nonce(), checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Match the payload's salted hashes and fd targets against what the host holds."""
        del witness
        state = load_state(ctx)
        salt = str(state.get("salt", ""))
        hashes: dict[str, str] = state.get("hashes", {})
        seen_env: dict[str, str] = report.get("facts", {}).get("env", {}) or {}
        declared = set(self.declared(ctx))
        hits = _variable_hits(ctx, salt, hashes, seen_env, declared)
        canary_hits, planted_hits, host_hits = hits.canary, hits.planted, hits.host
        by_what = {str(a.get("what")): a for a in report.get("attempts", [])}
        fd_targets = (by_what.get("fds") or {}).get("targets") or {}
        fd_hits = sorted(fd for fd, target in fd_targets.items() if target == state.get("pipe"))
        now_held = _harness_fd_targets()
        held = {*state.get("held", ()), *(now_held or ())}
        host_fds = _host_fds(fd_targets, held)
        escapes = attempts_by_role(report, "escape")
        observed = observed_outcome(escapes)
        reasons = hits.reasons()
        # What the host read of the payload from /proc no wrapper can rewrite.
        host_seen = [] if hits.passthrough else _host_view_hits(ctx, self.names(ctx))
        reasons.extend(host_seen)
        if fd_hits:
            reasons.append(
                f"the host's canary pipe is open in the payload as fd {', '.join(fd_hits)}"
            )
        if host_fds:
            reasons.append(
                f"descriptors the harness holds are open in the payload: {', '.join(host_fds)}"
            )
        seen = bool(canary_hits or host_hits or planted_hits or fd_hits or host_fds or host_seen)
        escape = _escape_of(seen, observed, escapes, fd_targets, now_held, hits, by_what, reasons)
        checks = _inside_checks(by_what, salt, ctx.nonce)
        inside_ok = all(c["ok"] for c in checks)
        return conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed="inside control failed: "
            + ", ".join(c["what"] for c in checks if not c["ok"]),
            host_control=control,
            host_failed="host control failed: the canaries were not in place",
            witness={
                "canary_hits": canary_hits,
                "planted_hits": planted_hits,
                "wrapper_only": sorted(hits.wrapper_only),
                "host_env_hits": host_hits,
                "fd_hits": fd_hits,
                "host_fds": host_fds,
                "payload_env_names": sorted(seen_env),
            },
            controls={"inside": checks, "host": control},
        )

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the canaries from os.environ and close the canary pipe."""
        for name in self.names(ctx):
            os.environ.pop(name, None)
        for fd in self._pipes.pop(ctx.nonce, ()):
            with contextlib.suppress(OSError):
                os.close(fd)
