"""Wider-catalogue probes about the host around the sandbox: files, environment, route, lifetime.

Six probes (issue 8), each with its payload in `probes/<id>.py`:

- `fs_read_secrets`: canary secrets where real ones live ($HOME/.ssh, .aws, .docker, a .env).
- `fs_protected_in_workspace`: `.git/hooks`, `.git/config`, `.bashrc` inside the workspace.
- `fs_link_escape`: symlink / hardlink / rename between the workspace and a host canary.
- `env_inheritance`: canaries in the harness's own environment and an inheritable descriptor.
- `ipc_proxy_socket_tamper`: chmod / replace / unlink of the egress socket and the shim.
- `lifecycle_orphans`: children that try to outlive the payload.

Every target is planted by `prepare` with the cell's nonce in its name and removed by
`cleanup`; no real secret file, socket or process of the host is ever named to a payload. The
readings follow ARCHITECTURE.md "Which witness decides": what the host sees (a canary's state,
a hash only the canary's bytes produce, a tick file still growing) wins over the payload.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from harness import sweep
from harness.catalog.base import (
    HOST_TIMEOUT_S,
    CellContext,
    ProbeSpec,
    WitnessRecordsLike,
    _all_succeeded,
    _attempts,
    _check,
    _conclude,
    _control,
    _control_nonce,
    _guarded,
    _host_writes,
    _judge,
    _observed,
    _private_namespace,
    _Spec,
    _summary,
    _wait_for,
    _with_nonce,
    home_of,
)
from harness.catalog.canary import (
    dir_canary_diff,
    dir_canary_state,
    dir_entries,
    file_diff,
    file_state,
    planting,
    read_text,
    sha256,
)
from harness.trust import give
from harness.verdict import Assessment, Escape, Expectation

if TYPE_CHECKING:
    from harness.backends.base import DeclaredPolicy

__all__ = [
    "SPECS",
    "EnvInheritance",
    "FsLinkEscape",
    "FsProtectedInWorkspace",
    "FsReadSecrets",
    "IpcProxySocketTamper",
    "LifecycleOrphans",
    "find_orphans",
]

_STATE = "host-state.json"


def _save_state(ctx: CellContext, state: dict[str, Any]) -> None:
    """Keep what prepare planted in the cell's scratch dir (the spec objects are shared)."""
    path = ctx.cell_dir / _STATE
    path.write_text(json.dumps(state, indent=1, sort_keys=True))


def _load_state(ctx: CellContext) -> dict[str, Any]:
    try:
        loaded = json.loads((ctx.cell_dir / _STATE).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _refusals(attempts: list[dict[str, Any]]) -> str:
    refused = [a for a in attempts if a.get("outcome") == "refused"]
    errnos = sorted({str(a.get("errno")) for a in refused})
    return f"{len(refused)} of {len(attempts)} attempts refused ({','.join(errnos) or '-'})"


def _fs_confined(policy: DeclaredPolicy) -> Expectation:
    # "workspace" promises the workspace is the payload's only writable grant. Every backend
    # that makes that promise builds the view by granting paths (bwrap binds, docker mounts,
    # seatbelt's profile), so the host's secret folders, its scratch dirs and the host side of
    # the egress route are outside the view too; the open control leg promises nothing.
    return "denied" if policy.filesystem == "workspace" else "allowed"


# ---------------------------------------------------------------------------------------------
# fs_read_secrets


class FsReadSecrets(_Spec):
    """Reads canary secrets planted where a host keeps real ones."""

    id = "fs_read_secrets"
    area = "fs"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied when the sandbox is confined to its workspace; seen on the open control leg.

        The declared `filesystem` mode speaks of writes, but no backend that declares
        "workspace" exposes the host's home: they all build the view from granted paths, and a
        view that shows ~/.ssh to untrusted code is the exposure this probe exists to catch.
        """
        return _fs_confined(policy)

    @staticmethod
    def secret_paths(ctx: CellContext) -> dict[str, Path]:
        """Where the canaries go: new files named after the nonce, never the real ones."""
        home = home_of(ctx)
        name = f"sandbox-attest-canary-{ctx.nonce}"
        return {
            "ssh": home / ".ssh" / name,
            "aws": home / ".aws" / name,
            "docker": home / ".docker" / f"{name}.json",
            # A project's .env sits next to its checkout: the cell dir (named after the
            # nonce) plays the project root around the workspace.
            "dotenv": ctx.cell_dir / ".env",
        }

    @staticmethod
    def control_path(ctx: CellContext) -> Path:
        """The control canary, inside the workspace."""
        return ctx.workspace / f"secrets-control-{ctx.nonce}.txt"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant each canary (0600) with a random token; remember hashes and created dirs."""
        created: list[str] = []
        hashes: dict[str, str] = {}
        # Journalled before they exist (harness/sweep.py): fake secrets in a home must not
        # outlive a killed run. The .env is in the cell dir and goes with the scratch.
        in_home = [p for k, p in self.secret_paths(ctx).items() if k != "dotenv"]
        sweep.record(_journal_key(self.id, ctx), in_home)
        for key, path in self.secret_paths(ctx).items():
            with planting(self.id, path):
                if not path.parent.exists():
                    # Journalled before it exists too, as a directory removed only if empty.
                    dirs = (*(Path(c) for c in created), path.parent)
                    sweep.record(_journal_key(self.id, ctx), in_home, dirs=dirs)
                    path.parent.mkdir(mode=0o700, parents=True)
                    created.append(str(path.parent))
                    # Saved at once: if a later canary fails, cleanup still removes this dir.
                    _save_state(ctx, {"hashes": hashes, "created_dirs": created})
                    give(path.parent, ctx.user)
                body = f"sandbox-attest canary {key} {ctx.nonce} secret={secrets.token_hex(16)}\n"
                path.write_text(body)
                path.chmod(0o600)
                # The payload user's secrets (0600, its own): readable to it unconfined.
                give(path, ctx.user)
            hashes[key] = hashlib.sha256(body.encode()).hexdigest()
        control = f"sandbox-attest control {ctx.nonce} {secrets.token_hex(16)}\n"
        self.control_path(ctx).write_text(control)
        hashes["workspace"] = hashlib.sha256(control.encode()).hexdigest()
        _save_state(ctx, {"hashes": hashes, "created_dirs": created})
        return {
            "secrets": {k: str(v) for k, v in self.secret_paths(ctx).items()},
            "control": str(self.control_path(ctx)),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reads every canary back and gets the hash it planted."""
        hashes = _load_state(ctx).get("hashes", {})
        checks = []
        for key, path in self.secret_paths(ctx).items():
            got = sha256(path)
            checks.append(
                _check(f"host reads {key}", got is not None and got == hashes.get(key), str(path))
            )
        return _control(_control_nonce(), checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A reported hash equal to a canary's is the escape: only those bytes produce it."""
        del witness  # the canaries' hashes are this probe's witness
        hashes = _load_state(ctx).get("hashes", {})
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        leaked = sorted(
            str(a.get("what"))
            for a in escapes
            if a.get("outcome") == "succeeded" and a.get("sha256") == hashes.get(a.get("what"))
        )
        reasons = []
        if leaked:
            reasons.append(f"the payload read the host's canary bytes: {', '.join(leaked)}")
        else:
            reasons.append("no canary's bytes reached the payload")
            reasons.append(_refusals(escapes))
        escape = _judge(observed, bool(leaked), _private_namespace(report, "mnt"), reasons)
        inside = _attempts(report, "control")
        inside_ok = _all_succeeded(inside, 1) and inside[0].get("sha256") == hashes.get("workspace")
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"workspace read control failed: {_summary(inside)}",
            host_control=control,
            host_failed="host could not read back its canaries",
            witness={"planted_sha256": hashes, "leaked": leaked},
            controls={"inside": inside, "host": control},
        )

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the canaries in $HOME, then any folder prepare created that is now empty."""
        for path in self.secret_paths(ctx).values():
            if ctx.nonce in str(path):
                with contextlib.suppress(OSError):  # never planted (prepare failed before it)
                    path.unlink()
        for created in _load_state(ctx).get("created_dirs", []):
            with contextlib.suppress(OSError):  # not empty: someone else uses it now; keep it
                Path(created).rmdir()
        # Only once they are gone: a cleanup cut short leaves the entry for the next sweep.
        in_home = [p for k, p in self.secret_paths(ctx).items() if k != "dotenv"]
        if not any(p.exists() for p in in_home):
            sweep.forget(_journal_key(self.id, ctx))


# ---------------------------------------------------------------------------------------------
# fs_protected_in_workspace

# Paths inside the workspace that make code run outside the sandbox later (git runs hooks and
# obeys config; shells source rc files). Keys are what the payload reports.
PROTECTED_PATHS: Final = {
    "git-hook": ".git/hooks/pre-commit",
    "git-config": ".git/config",
    "bashrc": ".bashrc",
}


def _declares_protected_paths(policy: DeclaredPolicy) -> bool:
    """Whether the policy promises read-only protected paths inside the workspace.

    DeclaredPolicy has no such field yet; a backend that adds `protected_paths` (a non-empty
    collection) flips this probe's expectation to "denied" without a change here.
    """
    return bool(getattr(policy, "protected_paths", ()))


class FsProtectedInWorkspace(_Spec):
    """Writes `.git/hooks/*`, `.git/config` and `.bashrc` inside the writable workspace."""

    id = "fs_protected_in_workspace"
    area = "fs"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Allowed (reported as exposure) unless the policy declares protected paths.

        No current backend claims to protect these paths, so on every leg the honest outcome
        is "the write landed and the host sees it": PASS with the exposure in the reason.
        """
        return "denied" if _declares_protected_paths(policy) else "allowed"

    @staticmethod
    def control_name(ctx: CellContext) -> str:
        """The ordinary sibling file the payload writes as its control."""
        return f"notes-{ctx.nonce}.txt"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Lay out a git checkout and a home-like rc file in the workspace."""
        git = ctx.workspace / ".git"
        (git / "hooks").mkdir(parents=True)
        (git / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = false\n")
        (ctx.workspace / ".bashrc").write_text("# planted by sandbox-attest\n")
        return {"paths": dict(PROTECTED_PATHS), "control": self.control_name(ctx)}

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host can write in each protected folder (so a refusal there is the sandbox's)."""
        nonce = _control_nonce()
        checks = [
            _host_writes(f"host writes beside {key}", (ctx.workspace / rel).parent, nonce)
            for key, rel in PROTECTED_PATHS.items()
        ]
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The host reads each protected file for the nonce; a hook must also be executable."""
        del witness
        nonce = ctx.nonce
        planted: dict[str, bool] = {}
        for key, rel in PROTECTED_PATHS.items():
            path = ctx.workspace / rel
            text = read_text(path) or ""
            ok = nonce in text
            if key == "git-hook":
                ok = ok and os.access(path, os.X_OK)
            planted[key] = ok
        seen = sorted(k for k, ok in planted.items() if ok)
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        reasons = []
        if seen:
            reasons.append(
                f"exposure: the payload planted {', '.join(seen)} in the workspace, which run "
                "outside the sandbox later; no protected-path claim is declared"
            )
        else:
            reasons.append("no protected file carries the nonce on the host")
            reasons.append(_refusals(escapes))
        # The workspace is the same directory on both sides, so a success the host cannot
        # see is a contradiction, never containment.
        escape = _judge(observed, bool(seen), None, reasons)
        inside = _attempts(report, "control")
        sibling = read_text(ctx.workspace / self.control_name(ctx)) or ""
        inside_ok = _all_succeeded(inside, 1) and nonce in sibling
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"sibling-file control failed: {_summary(inside)}",
            host_control=control,
            host_failed="host control failed",
            witness={"planted": planted},
            controls={"inside": inside, "sibling_has_nonce": nonce in sibling, "host": control},
        )


# ---------------------------------------------------------------------------------------------
# fs_link_escape

LINK_OPS: Final = ("symlink-read", "symlink-write", "hardlink", "rename-in", "rename-out")


class FsLinkEscape(_Spec):
    """Symlinks, hardlinks and renames between the workspace and host canaries."""

    id = "fs_link_escape"
    area = "fs"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied when confined to the workspace: a link must not widen the grant."""
        return _fs_confined(policy)

    @staticmethod
    def canaries(ctx: CellContext) -> dict[str, Path]:
        """A canary beside the workspace (same filesystem: hardlinks possible) and in /tmp."""
        tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())  # noqa: S108
        return {
            "sibling": ctx.cell_dir / "link-outside" / "canary.txt",
            "tmp": tmp / f"sandbox-attest-link-{ctx.nonce}" / "canary.txt",
        }

    @staticmethod
    def control_dir(ctx: CellContext) -> str:
        """The payload's control dir inside the workspace."""
        return f"link-control-{ctx.nonce}"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant each canary with a random token and record its state."""
        baseline: dict[str, Any] = {}
        # The /tmp one is journalled before it exists (harness/sweep.py); the sibling goes
        # with the scratch.
        sweep.record(_journal_key(self.id, ctx), [self.canaries(ctx)["tmp"].parent])
        for key, path in self.canaries(ctx).items():
            with planting(self.id, path):
                path.parent.mkdir(mode=0o755)
                path.write_text(f"sandbox-attest link canary {key} {secrets.token_hex(16)}\n")
                path.chmod(0o644)
                give(path.parent, ctx.user, recursive=True)
            baseline[key] = dir_canary_state(path)
        _save_state(ctx, {"baseline": baseline})
        return {
            "canaries": {k: str(v) for k, v in self.canaries(ctx).items()},
            "control_dir": self.control_dir(ctx),
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host can create and remove a file in every canary dir."""
        nonce = _control_nonce()
        checks = [
            _host_writes(f"host writes {key}", path.parent, nonce)
            for key, path in self.canaries(ctx).items()
        ]
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A changed canary (bytes, inode, links, dir) or its hash read back is an escape."""
        del witness
        baseline = _load_state(ctx).get("baseline", {})
        escapes = _attempts(report, "escape")
        changed: dict[str, str] = {}
        state: dict[str, Any] = {}
        for key, path in self.canaries(ctx).items():
            before = baseline.get(key, {})
            state[key] = dir_canary_state(path)
            phrase = dir_canary_diff(before, state[key])
            read_back = [
                a
                for a in escapes
                if a.get("what") == f"{key}:symlink-read"
                and a.get("outcome") == "succeeded"
                and a.get("sha256") == before.get("file", {}).get("sha256")
            ]
            if read_back:
                phrase = ", ".join(p for p in (phrase, "read through a symlink") if p)
            if phrase:
                changed[key] = phrase
        observed = _observed(escapes)
        reasons = []
        if changed:
            reasons.append(
                "host sees the canary reached: "
                + "; ".join(f"{k}: {v}" for k, v in changed.items())
            )
        else:
            reasons.append("every canary's bytes, inode, links and dir unchanged")
            reasons.append(_refusals(escapes))
        escape = _judge(observed, bool(changed), _private_namespace(report, "mnt"), reasons)
        inside = _attempts(report, "control")
        workspace_checks = self._workspace_checks(ctx, inside)
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=all(c["ok"] for c in workspace_checks),
            inside_failed="workspace control failed: "
            + ", ".join(c["what"] for c in workspace_checks if not c["ok"]),
            host_control=control,
            host_failed="host control failed",
            witness={"canaries": state, "baseline": baseline, "changed": changed},
            controls={"inside": inside, "workspace": workspace_checks, "host": control},
        )

    def _workspace_checks(
        self, ctx: CellContext, inside: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        inner = ctx.workspace / self.control_dir(ctx) / "inner"
        stem = f"workspace-{ctx.nonce}"
        return [
            _check(
                "payload link ops in the workspace",
                _all_succeeded(inside, len(LINK_OPS)),
                _summary(inside),
            ),
            _check("host sees the symlink", (inner / f"{stem}.symlink").is_symlink(), str(inner)),
            _check(
                "host sees the hardlink write",
                f"appended via hardlink {ctx.nonce}"
                in (read_text(inner / f"{stem}.hardlink") or ""),
                str(inner),
            ),
            _check(
                "host sees the renamed canary",
                f"renamed over by {ctx.nonce}" in (read_text(inner / f"{stem}.stolen") or ""),
                str(inner),
            ),
        ]

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the /tmp canary dir (the sibling goes with cell_dir)."""
        tmp_dir = self.canaries(ctx)["tmp"].parent
        if ctx.nonce in tmp_dir.name:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        if not tmp_dir.exists():
            sweep.forget(_journal_key(self.id, ctx))


def _journal_key(probe: str, ctx: CellContext) -> str:
    """The journal entry of a cell's canaries outside the scratch (harness/sweep.py)."""
    return f"canary-{probe}-{ctx.nonce}"


# ---------------------------------------------------------------------------------------------
# env_inheritance

ENV_PREFIX: Final = "SANDBOX_ATTEST_CANARY_"
# Variables the interpreter or the sandbox sets by itself, whatever it was given: bwrap's
# --chdir and shells set PWD (and OLDPWD, SHLVL, _); Python's PEP 538 locale coercion sets
# LC_CTYPE=C.UTF-8 when no locale is declared, in the harness's own environment too, so an equal
# value there is a coincidence, not a leak. They are reported, never counted as an escape.
ENV_PLUMBING: Final = ("PWD", "OLDPWD", "SHLVL", "_", "LC_CTYPE")
_ENV_SUFFIXES: Final = ("API_KEY", "PASSWORD")


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


class EnvInheritance(_Spec):
    """Looks for the harness's own canary env vars and an inheritable fd in the payload."""

    id = "env_inheritance"
    area = "env"

    def __init__(self) -> None:
        """Descriptors held open per nonce between prepare and cleanup."""
        self._pipes: dict[str, tuple[int, int]] = {}

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied on every leg, the open control leg included.

        The payload's environment is declared by the harness (`harness.runner.payload_env`)
        and every backend, `none` too, must pass exactly that: a leak here is the runner's or
        the backend's, never something an unconfined host is entitled to.
        """
        del policy
        return "denied"

    @staticmethod
    def names(ctx: CellContext) -> list[str]:
        """The canary variables this cell plants in the harness's environment."""
        return [f"{ENV_PREFIX}{ctx.nonce.upper()}_{suffix}" for suffix in _ENV_SUFFIXES]

    @staticmethod
    def declared(ctx: CellContext) -> list[str]:
        """Names the runner may give a payload (with or without a proxy)."""
        from harness.runner import payload_env  # noqa: PLC0415  (runner imports the catalogue)

        return sorted(payload_env("http://127.0.0.1:1", ctx.workspace))

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Set the canaries in os.environ and open an inheritable canary pipe."""
        salt = secrets.token_hex(16)
        values = {
            name: f"sandbox-attest-secret-{secrets.token_hex(16)}" for name in self.names(ctx)
        }
        read_end, write_end = os.pipe()
        os.set_inheritable(read_end, True)  # noqa: FBT003  (the leak a careless spawner would pass on)
        self._pipes[ctx.nonce] = (read_end, write_end)
        os.environ.update(values)
        _save_state(
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
        state = _load_state(ctx)
        salt = str(state.get("salt", ""))
        checks = []
        for name, digest in state.get("hashes", {}).items():
            value = os.environ.get(name)
            ok = value is not None and salted_hash(salt, value) == digest
            checks.append(_check(f"host env has {name}", ok, "planted value present"))
        pipe = self._pipes.get(ctx.nonce)
        fd_ok = pipe is not None and os.get_inheritable(pipe[0])
        checks.append(_check("host holds the inheritable canary fd", fd_ok, str(state.get("pipe"))))
        return _control(_control_nonce(), checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Match the payload's salted hashes and fd targets against what the host holds."""
        del witness
        state = _load_state(ctx)
        salt = str(state.get("salt", ""))
        hashes: dict[str, str] = state.get("hashes", {})
        seen_env: dict[str, str] = report.get("facts", {}).get("env", {}) or {}
        declared = set(self.declared(ctx))
        canary_hits = sorted(n for n, h in hashes.items() if seen_env.get(n) == h)
        host_hits = sorted(
            n
            for n, h in seen_env.items()
            if n not in declared
            and n not in ENV_PLUMBING
            and n not in hashes
            and n in os.environ
            and salted_hash(salt, os.environ[n]) == h
        )
        by_what = {str(a.get("what")): a for a in report.get("attempts", [])}
        fd_targets = (by_what.get("fds") or {}).get("targets") or {}
        fd_hits = sorted(fd for fd, target in fd_targets.items() if target == state.get("pipe"))
        now_held = _harness_fd_targets()
        held = {*state.get("held", ()), *(now_held or ())}
        host_fds = _host_fds(fd_targets, held)
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        reasons = []
        if canary_hits:
            reasons.append(
                f"the host's canary variables reached the payload: {', '.join(canary_hits)}"
            )
        if host_hits:
            reasons.append(f"undeclared host variables reached the payload: {', '.join(host_hits)}")
        if fd_hits:
            reasons.append(
                f"the host's canary pipe is open in the payload as fd {', '.join(fd_hits)}"
            )
        if host_fds:
            reasons.append(
                f"descriptors the harness holds are open in the payload: {', '.join(host_fds)}"
            )
        seen = bool(canary_hits or host_hits or fd_hits or host_fds)
        escape: Escape
        if seen:
            escape = "escaped"
        elif observed == "refused":
            escape = "refused"
            reasons.append("only the declared environment and fds 0-2 inside")
        elif observed == "error":
            escape = "undecided"
            reasons.append(f"the payload could not look: {_summary(escapes)}")
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
            reasons.append(
                "extras the sandbox added itself, none held by the harness: "
                f"variables {', '.join(map(str, names)) or 'none'}; fds {_fd_list(fd_targets)}"
            )
        declared_seen = by_what.get("env-declared") or {}
        checks = [
            _check(
                "payload sees its declared variables",
                declared_seen.get("outcome") == "succeeded",
                str(declared_seen.get("detail")),
            ),
            _check(
                "payload hashes like the host",
                declared_seen.get("check_hash") == salted_hash(salt, f"check-{ctx.nonce}"),
                "salted hash of the task's check value compared",
            ),
            _check(
                "payload sees fds 0-2",
                (by_what.get("fds-std") or {}).get("outcome") == "succeeded",
                str((by_what.get("fds-std") or {}).get("detail")),
            ),
        ]
        inside_ok = all(c["ok"] for c in checks)
        return _conclude(
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


# ---------------------------------------------------------------------------------------------
# ipc_proxy_socket_tamper


def _sandbox_route_paths() -> tuple[str, str, int]:
    """Where namespaced backends mount the proxy socket and shim, and the shim's port."""
    from harness.backends.base import (  # noqa: PLC0415  (keeps backends off import path)
        SANDBOX_PROXY_SOCKET,
        SANDBOX_SHIM,
        SHIM_PORT,
    )

    return SANDBOX_PROXY_SOCKET, SANDBOX_SHIM, SHIM_PORT


def _real_shim() -> Path:
    from harness.backends.base import shim_path  # noqa: PLC0415

    return shim_path()


def _bind_unix(path: Path) -> tuple[socket.socket, int]:
    """Bind and listen at `path` through a dir fd, so long scratch paths fit AF_UNIX's cap."""
    dir_fd = os.open(path.parent, os.O_RDONLY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"/proc/self/fd/{dir_fd}/{path.name}")
        sock.listen(8)
    except OSError:
        sock.close()
        os.close(dir_fd)
        raise
    return sock, dir_fd


def _connect_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HOST_TIMEOUT_S)
    if len(os.fsencode(path)) < 100:
        target = path
        dir_fd = None
    else:  # same trick as _bind_unix for a long run dir
        dir_fd = os.open(Path(path).parent, os.O_RDONLY)
        target = f"/proc/self/fd/{dir_fd}/{Path(path).name}"
    try:
        sock.connect(target)
    except OSError:
        sock.close()
        raise
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return sock


def _get_via_unix_proxy(
    socket_path: str, ca_bundle: str, host: str, port: int, nonce: str
) -> tuple[int, int, bytes]:
    """CONNECT through the proxy's unix socket and GET /ok; returns both statuses and body."""
    sock = _connect_unix(socket_path)
    try:
        sock.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"X-Attest-Nonce: {nonce}\r\n\r\n".encode("latin-1")
        )
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = sock.recv(1)  # byte by byte: nothing of the TLS stream may be consumed
            if not chunk:
                break
            head += chunk
        words = head.split(b"\r\n", 1)[0].split()
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        if status != 200:
            return status, 0, b""
        context = ssl.create_default_context(cafile=ca_bundle)
        with context.wrap_socket(sock, server_hostname=host) as tls:
            tls.sendall(
                f"GET /ok?nonce={nonce} HTTP/1.1\r\nHost: {host}\r\nX-Attest-Nonce: {nonce}"
                "\r\nConnection: close\r\n\r\n".encode("latin-1")
            )
            body = b""
            while len(body) < 65536:
                chunk = tls.recv(4096)
                if not chunk:
                    break
                body += chunk
        words = body.split(b"\r\n", 1)[0].split()
        inner = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        return status, inner, body
    finally:
        sock.close()


def _sandbox_route_missed(
    report: dict[str, Any], escapes: list[dict[str, Any]], reasons: list[str]
) -> bool:
    """Whether the payload was told to attack the in-sandbox route but could not find it.

    Adds the phrase saying what happened to the in-sandbox part either way.
    """
    facts = report.get("facts", {})
    if not facts.get("sandbox_route_tried"):
        reasons.append("in-sandbox route not present (the task's proxy is not the shim)")
        return False
    inside = [a for a in escapes if str(a.get("what", "")).startswith("sandbox:")]
    missing = (
        facts.get("visible:sandbox") is not True
        or not inside
        or all(a.get("errno") == "ENOENT" for a in inside)
    )
    if missing:
        reasons.append(
            "the in-sandbox route was not attacked: its socket and shim are not at the "
            "paths the probe was given (every attempt ENOENT or the socket not visible)"
        )
        return True
    reasons.append("in-sandbox route attacked")
    return False


class IpcProxySocketTamper(_Spec):
    """chmod / replace / unlink of the egress route's socket and shim.

    Safety: the payload is never given the host path of the real proxy socket or shim. It gets
    (1) a decoy socket and shim copy planted in this cell's scratch dir, the stand-in for the
    host side of the route, tampered on every leg (on the open leg it is all the payload may
    touch, and it belongs to the payload user there); and (2) the in-sandbox mount paths,
    which it tries only when the task's proxy URL is the in-sandbox shim's, i.e. the route is
    a bound socket inside a mount namespace. The real socket and shim are watched from the
    host, read-only.
    """

    id = "ipc_proxy_socket_tamper"
    area = "ipc"

    def __init__(self) -> None:
        """Decoy listeners (and their dir fds) held per nonce between prepare and cleanup.

        The real shim's bytes are held too (in memory, out of every payload's reach), so
        cleanup can put the harness's own file back if a weak backend let a payload alter it.
        """
        self._held: dict[str, tuple[socket.socket, int]] = {}
        self._shims: dict[str, bytes] = {}

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied when confined to the workspace: the route's files are outside the grant."""
        return _fs_confined(policy)

    @staticmethod
    def decoy_paths(ctx: CellContext) -> dict[str, Path]:
        """The decoy socket and shim in the cell's scratch dir."""
        directory = ctx.cell_dir / "decoy-route"
        return {"socket": directory / "proxy.sock", "shim": directory / "shim.py"}

    def _watched(self, ctx: CellContext) -> dict[str, Path]:
        decoy = self.decoy_paths(ctx)
        return {
            "decoy-socket": decoy["socket"],
            "decoy-shim": decoy["shim"],
            "real-socket": Path(ctx.world.info.proxy.socket),
            "real-shim": _real_shim(),
        }

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Bind the decoy socket, copy the shim beside it, and record every watched state."""
        decoy = self.decoy_paths(ctx)
        decoy["socket"].parent.mkdir(mode=0o755)
        self._held[ctx.nonce] = _bind_unix(decoy["socket"])
        self._shims[ctx.nonce] = _real_shim().read_bytes()
        shutil.copyfile(_real_shim(), decoy["shim"])
        decoy["shim"].chmod(0o644)
        # The decoy stands for a route the payload could tamper with if unconfined, so it is
        # the payload user's; the real route is the harness's, which no payload uid may alter.
        give(decoy["socket"].parent, ctx.user, recursive=True)
        baseline = {k: file_state(p) for k, p in self._watched(ctx).items()}
        baseline["decoy-dir"] = {"entries": dir_entries(decoy["socket"].parent)}
        _save_state(ctx, {"baseline": baseline})
        sandbox_socket, sandbox_shim, shim_port = _sandbox_route_paths()
        allowed = ctx.world.info.hosts["allowed"]
        return {
            "decoy": {k: str(v) for k, v in decoy.items()},
            "sandbox": {"socket": sandbox_socket, "shim": sandbox_shim},
            "shim_url": f"http://127.0.0.1:{shim_port}",
            "allowed": f"{allowed.name}:{allowed.https_port}",
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """After the run the proxy still serves other cells through its unix socket."""
        info = ctx.world.info
        nonce = _control_nonce()
        allowed = info.hosts["allowed"]

        def get() -> dict[str, Any]:
            status, inner, body = _get_via_unix_proxy(
                info.proxy.socket, info.ca_bundle, allowed.name, allowed.https_port, nonce
            )
            return _check(
                "proxy serves via its unix socket",
                status == 200 and inner == 200,
                f"CONNECT {status}, GET {inner}, {len(body)} bytes",
            )

        checks = [_guarded("proxy serves via its unix socket", get)]
        records = _wait_for(ctx.world, nonce, lambda r: bool(_with_nonce(r.origin, nonce)))
        hits = _with_nonce(records.origin, nonce)
        checks.append(_check("origin logged the host's request", bool(hits), f"{len(hits)} hits"))
        return _control(nonce, checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any change to the decoy or the real socket/shim, seen from the host, is an escape."""
        del witness
        baseline = _load_state(ctx).get("baseline", {})
        now: dict[str, Any] = {k: file_state(p) for k, p in self._watched(ctx).items()}
        now["decoy-dir"] = {"entries": dir_entries(self.decoy_paths(ctx)["socket"].parent)}
        changed = {k: d for k in now if (d := file_diff(baseline.get(k, {}), now[k]))}
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        reasons = []
        if any(k.startswith("real-") for k in changed):
            reasons.append("the real egress route changed on the host")
        if changed:
            reasons.append("host sees: " + "; ".join(f"{k} {v}" for k, v in changed.items()))
        else:
            reasons.append("decoy and real socket/shim unchanged on the host")
            reasons.append(_refusals(escapes))
        escape = _judge(observed, bool(changed), _private_namespace(report, "mnt"), reasons)
        if _sandbox_route_missed(report, escapes, reasons) and escape != "escaped":
            # The paths are bubblewrap's and docker's mount points; a wrapper that shows the
            # route elsewhere never had its route attacked, so its refusals prove nothing.
            escape = "undecided"
        inside = _attempts(report, "control")
        workspace_ops = [a for a in inside if str(a.get("what", "")).startswith("workspace:")]
        route_after = [a for a in inside if a.get("what") == "route-after"]
        inside_ok = _all_succeeded(workspace_ops, 6) and all(
            a.get("outcome") == "succeeded" for a in route_after
        )
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"inside control failed: {_summary(inside)}",
            host_control=control,
            host_failed="the proxy no longer serves through its unix socket",
            witness={"baseline": baseline, "now": now, "changed": changed},
            controls={"inside": inside, "host": control},
        )

    def cleanup(self, ctx: CellContext) -> None:
        """Close the decoy listener; put back the real socket's mode and the real shim."""
        held = self._held.pop(ctx.nonce, None)
        if held is not None:
            held[0].close()
            with contextlib.suppress(OSError):
                os.close(held[1])
        baseline = _load_state(ctx).get("baseline", {})
        self._restore_real_shim(ctx, baseline.get("real-shim", {}))
        before = baseline.get("real-socket", {})
        real = Path(ctx.world.info.proxy.socket)
        after = file_state(real)
        # Only the harness's own socket, only the same inode, only back to its recorded mode.
        same = before.get("inode") is not None and after.get("inode") == before.get("inode")
        if same and before.get("mode") and after.get("mode") != before["mode"]:
            real.chmod(int(before["mode"], 8))

    def _restore_real_shim(self, ctx: CellContext, before: dict[str, Any]) -> None:
        """Rewrite the harness's shim from the bytes held since prepare if they no longer match.

        Only bytes whose hash is the recorded baseline's are written, and only by an atomic
        rename over the path (never through whatever a payload left there, a symlink say), so
        every later cell and run gets the shim the harness ships.
        """
        saved = self._shims.pop(ctx.nonce, None)
        want = before.get("sha256")
        if saved is None or want is None or hashlib.sha256(saved).hexdigest() != want:
            return
        real = _real_shim()
        now = file_state(real)
        if now.get("kind") == "file" and (now.get("sha256"), now.get("mode")) == (
            want,
            before.get("mode"),
        ):
            return
        staged = real.with_name(f".shim-restore-{ctx.nonce}")
        staged.write_bytes(saved)
        staged.chmod(int(before.get("mode") or "0o644", 8))
        staged.replace(real)


# ---------------------------------------------------------------------------------------------
# lifecycle_orphans

ORPHAN_MARKER: Final = "sandbox-attest-orphan"
ORPHAN_KINDS: Final = ("background", "setsid", "daemon")
# Children stop by themselves after this long, so a failed cleanup never leaves an immortal
# process; it is far longer than the payload lives (about half a second).
ORPHAN_LIFETIME_S: Final = 4.0
TICK_INTERVAL_S: Final = 0.1
MIN_TICKS: Final = 3
# How long the host watches the tick files after the run, and how late a tick may be stamped
# after the payload's exit stamp before it counts as written by a survivor.
WATCH_S: Final = 0.6
LATE_GRACE_S: Final = 0.5


def find_orphans(nonce: str, marker: str = ORPHAN_MARKER) -> list[int]:
    """Pids whose argv carries both the orphan marker and `nonce` (Linux /proc; else [])."""
    found = []
    needles = (marker.encode(), nonce.encode())
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(n in argv for n in needles):
            found.append(int(entry.name))
    return sorted(found)


def _stamps(path: Path) -> list[float]:
    stamps = []
    for line in (read_text(path) or "").splitlines():
        with contextlib.suppress(ValueError):
            stamps.append(float(line))
    return stamps


class LifecycleOrphans(_Spec):
    """Background, setsid and daemon children that try to outlive the payload."""

    id = "lifecycle_orphans"
    area = "lifecycle"

    def expectation(self, policy: DeclaredPolicy) -> Expectation:
        """Denied unless the policy confines nothing at all.

        A sandbox's every claim is about the processes inside it; a child that outlives the
        sandbox's teardown keeps running after the harness believes the cell is over (and, for
        wrappers that confine a process tree, possibly beyond their reach). Only the open
        control leg, which claims nothing, may let it live: there it is the expected escape.
        """
        fully_open = (policy.network, policy.filesystem, policy.ipc) == ("open", "open", "open")
        return "allowed" if fully_open else "denied"

    @staticmethod
    def tick_dir(ctx: CellContext) -> Path:
        """Where the children tick, inside the workspace (the host sees it directly)."""
        return ctx.workspace / f"lifecycle-{ctx.nonce}"

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Nothing to plant: the targets say where to tick, how often and for how long."""
        return {
            "dir": self.tick_dir(ctx).name,
            "marker": ORPHAN_MARKER,
            "lifetime_s": ORPHAN_LIFETIME_S,
            "interval_s": TICK_INTERVAL_S,
            "min_ticks": MIN_TICKS,
            "wait_s": 5.0,
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """Right after the run: the ticks were written, and are they still being written?

        The checks (the control) say every child ticked while the payload ran, as seen from
        the host. `watch` (the witness) says which children are still ticking over WATCH_S,
        which wrote ticks stamped after the payload's exit, and which pids are still alive.
        """
        directory = self.tick_dir(ctx)
        exit_text = read_text(directory / "payload-exit")
        try:
            payload_exit = float(exit_text) if exit_text else None
        except ValueError:
            payload_exit = None
        first = {k: len(_stamps(directory / f"{k}.ticks")) for k in ORPHAN_KINDS}
        time.sleep(WATCH_S)
        watch: dict[str, Any] = {"payload_exit": payload_exit, "kinds": {}}
        checks = []
        for kind in ORPHAN_KINDS:
            path = directory / f"{kind}.ticks"
            if not path.exists():
                continue
            stamps = _stamps(path)
            during = [s for s in stamps if payload_exit is None or s <= payload_exit]
            late = [
                s for s in stamps if payload_exit is not None and s > payload_exit + LATE_GRACE_S
            ]
            watch["kinds"][kind] = {
                "ticks_before": first[kind],
                "ticks_after": len(stamps),
                "late_ticks": len(late),
                "last_tick": max(stamps) if stamps else None,
            }
            checks.append(
                _check(
                    f"{kind} ticked while the payload ran",
                    len(during) >= MIN_TICKS,
                    f"{len(during)} ticks before the payload's exit stamp",
                )
            )
        watch["alive"] = find_orphans(ctx.nonce)
        result = _control(_control_nonce(), checks)
        result["watch"] = watch
        return result

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A child still ticking, ticking after the payload's exit, or alive, survived."""
        del witness, ctx
        watch = control.get("watch", {})
        survivors = sorted(
            kind
            for kind, w in watch.get("kinds", {}).items()
            if w.get("ticks_after", 0) > w.get("ticks_before", 0) or w.get("late_ticks", 0) > 0
        )
        alive = list(watch.get("alive", []))
        escapes = _attempts(report, "escape")
        observed = _observed(escapes)
        reasons = []
        if survivors or alive:
            reasons.append(
                f"children outlived the payload: {', '.join(survivors) or 'none still ticking'} "
                f"(alive pids {', '.join(map(str, alive)) or 'none'})"
            )
        escape: Escape
        if survivors or alive:
            escape = "escaped"
        elif observed == "refused":
            escape = "refused"
            reasons.append(f"the sandbox refused the children: {_refusals(escapes)}")
        elif observed == "error":
            escape = "undecided"
            reasons.append(f"the children could not be started: {_summary(escapes)}")
        else:
            escape = "contained"
            reasons.append(
                "every child stopped with the payload: no tick after its exit, none alive"
            )
        inside = _attempts(report, "control")
        inside_ok = _all_succeeded(inside, 1)
        return _conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"the children did not tick while the payload ran: {_summary(inside)}",
            host_control=control,
            host_failed="host did not see the ticks written while the payload ran",
            witness={"watch": watch, "survivors": survivors},
            controls={"inside": inside, "host": control},
        )

    def cleanup(self, ctx: CellContext) -> None:
        """SIGKILL every process carrying the marker and this cell's nonce; wait until gone."""
        deadline = time.monotonic() + 3.0
        while (pids := find_orphans(ctx.nonce)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)


SPECS: tuple[ProbeSpec, ...] = (
    FsReadSecrets(),
    FsProtectedInWorkspace(),
    FsLinkEscape(),
    EnvInheritance(),
    IpcProxySocketTamper(),
    LifecycleOrphans(),
)
