"""The environment probe, host side: what of the harness's environment reaches the payload.

`env_inheritance` plants canaries in the harness's own environment (names a real agent's
secrets would have, values only this cell knows) and an inheritable descriptor, then reads
what the payload saw against what the harness declares as the payload's environment
(`sandbox_attest.payload.payload_env`). A canary or a host descriptor inside is an escape.

Descriptors are judged by the identity of the object they hold, not by their link text
(issue 26): a sandbox that keeps what its launcher inherited (bwrap hands on whatever it
inherits) gives the payload the host's `/` or the user's home as fd 7 or 8, whatever its
mounts hide. The host reads every descriptor of every judged process at the rendezvous
(sandbox_attest/run/fdview.py: st_dev, st_ino, type; for a directory the identities above
it) and `judge_descriptors` compares them with what the host stats itself:

1. an object on a filesystem the host does not mount (the sandbox's own tmpfs, proc,
   pipes, sockets, anonymous inodes) is the sandbox's own;
2. a directory on a host filesystem is within the claims only if it, or a directory above
   it in the payload's tree, is the workspace or an item of the read-only set the runner
   hands every backend (staged inputs with the shim, the interpreter, the CA bundle);
3. a regular file there is within them only if it is such an item, or the directory that
   holds it at its link's path in the payload's view (the same object there), or one above
   that, is; a file not at its path there was opened elsewhere and handed on;
4. anything else on a host filesystem is a hole named by descriptor, target and fix,
   whether or not the payload used it; a descriptor the host could not identify makes the
   cell undecided, never PASS. Pipes and sockets the harness holds are `_host_fds`';
   devices are dev_access's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

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
    home_of,
    host_processes,
)
from sandbox_attest.claims import claims_of
from sandbox_attest.errors import HarnessError
from sandbox_attest.host import disguise
from sandbox_attest.host.interpreter import payload_interpreter
from sandbox_attest.payload import INPUT_DIR, payload_env
from sandbox_attest.verdict import Assessment, Escape, Expectation

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

ENV_PREFIX: Final = disguise.ENV_CANARY_PREFIX
# Variables the interpreter or the sandbox sets by itself, whatever it was given: bwrap's
# --chdir and shells set PWD (and OLDPWD, SHLVL, _); Python's PEP 538 locale coercion sets
# LC_CTYPE=C.UTF-8 when no locale is declared, in the harness's own environment too, so an equal
# value there is a coincidence, not a leak. They are reported, never counted as an escape.
ENV_PLUMBING: Final = ("PWD", "OLDPWD", "SHLVL", "_", "LC_CTYPE")
# Values a sandbox sets itself, whatever the harness has, by name: an equal value in the
# harness's environment proves nothing was inherited, so it is reported, never counted. Only
# these public, fixed values are excused, never a name alone: the same name carrying a value
# no engine produces by itself (TERM=xterm-kitty, a token) still counts, and the planted
# canaries (random, this cell's alone) are what prove wholesale inheritance. Sources:
# - TERM=xterm: docker sets it with -t (moby container.CreateDaemonEnvironment); podman sets
#   it always (containers.conf's default `env`).
# - HOSTNAME (see `engine_default`): docker sets the container's hostname, which is the host's
#   own under --network host or --uts host; uname(2) shows it to the payload anyway.
ENGINE_DEFAULTS: Final[dict[str, tuple[str, ...]]] = {"TERM": ("xterm",)}
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


def engine_default(name: str, value: str) -> bool:
    """Whether `name=value` is what a sandbox may set by itself (`ENGINE_DEFAULTS`)."""
    if value in ENGINE_DEFAULTS.get(name, ()):
        return True
    return name == "HOSTNAME" and value == socket.gethostname()


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


FIX: Final = (
    "fix: close every descriptor above 2 before the sandbox starts the payload: bwrap (and "
    "most launchers) hand on whatever they inherit, so start the sandbox with close_fds=True "
    "(Python's default) or close them in the launcher (`exec 7<&-`), and pass only the "
    "--*-fd descriptors the sandbox is told to read"
)
# The object types judged here; devices are dev_access's, pipes and sockets `_host_fds`'.
JUDGED_TYPES: Final = ("dir", "reg")
# At most this many mount points are stat'ed for the host's filesystems.
MAX_MOUNTS: Final = 4096
_STDIO: Final = 2


Identity = tuple[int, int]


@dataclass(frozen=True)
class HostObjects:
    """What the host's own stats say, to hold a payload's descriptors against.

    Attributes:
        devices: st_dev of every filesystem in the host's view (None: unread, off Linux).
        allowed: identity -> host path of each object the claims let the payload hold.
        names: identity -> (what a notable host object is, its host path).
    """

    devices: frozenset[int] | None
    allowed: dict[Identity, str] = field(default_factory=dict)
    names: dict[Identity, tuple[str, str]] = field(default_factory=dict)


def _identity(path: Path) -> Identity | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _unescape(field_text: str) -> str:
    """A mountinfo path field: spaces, tabs, newlines and backslashes come octal-escaped."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field_text = field_text.replace(code, char)
    return field_text


def host_devices(mountinfo: Path = Path("/proc/self/mountinfo")) -> frozenset[int] | None:
    """The st_dev of every filesystem in the harness's own view, or None where unreadable.

    Both the device mountinfo names and what lstat of each mount point says (btrfs hands
    out a device per subvolume that mountinfo does not name), and the devices of the top
    directories and homes (a subvolume that is no mount point).
    """
    try:
        lines = mountinfo.read_text(errors="replace").splitlines()
    except OSError:
        return None
    devices: set[int] = set()
    points = []
    for line in lines[:MAX_MOUNTS]:
        fields = line.split()
        if len(fields) > 4 and ":" in fields[2]:  # id parent maj:min root point
            major, _, minor = fields[2].partition(":")
            if major.isdigit() and minor.isdigit():
                devices.add(os.makedev(int(major), int(minor)))
            points.append(Path(_unescape(fields[4])))
    tops = [Path("/"), *_children(Path("/")), *_children(Path("/home"))]
    for point in [*points, *tops]:
        with contextlib.suppress(OSError):
            # lstat: a mount point's own root, without triggering an automount below it.
            devices.add(point.lstat().st_dev)
    return frozenset(devices)


def _children(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def host_objects(
    allowed: Iterable[Path], named: Mapping[str, Path], devices: frozenset[int] | None
) -> HostObjects:
    """The host's side of the comparison: identities of what is allowed and what is notable.

    Args:
        allowed: host paths the claims let the payload hold (workspace, read-only set).
        named: a description for each notable host path ("the host's /": Path("/")).
        devices: `host_devices()`.
    """
    allowed_ids: dict[Identity, str] = {}
    for path in allowed:
        ident = _identity(path)
        if ident is not None:
            allowed_ids.setdefault(ident, str(path))
    names: dict[Identity, tuple[str, str]] = {}
    for what, path in named.items():
        ident = _identity(path)
        if ident is not None:
            names.setdefault(ident, (what, str(path)))
    return HostObjects(devices, allowed_ids, names)


@dataclass(frozen=True)
class Finding:
    """One descriptor of the payload on a host object outside the claims (or unidentified)."""

    fd: str
    link: str
    what: str
    pids: tuple[str, ...]

    def phrase(self) -> str:
        """`fd 7 -> / (the host's /: a host directory outside ...) in host pids 12, 13`."""
        pids = "pids " if len(self.pids) > 1 else "pid "
        return f"fd {self.fd} -> {self.link} ({self.what}) in host {pids}{', '.join(self.pids)}"


def _within(entry: Mapping[str, Any], host: HostObjects) -> bool | None:
    """Whether the object is one the claims allow; None: the host cannot tell.

    Within: the object, or a directory above it in the payload's tree (`up`: climbed from a
    directory, or from the directory holding a file at its link's path), is allowed.
    """
    ident = (int(entry["dev"]), int(entry["ino"]))
    chain = [(int(i[0]), int(i[1])) for i in entry.get("up") or [] if len(i) == 2]
    if ident in host.allowed or any(i in host.allowed for i in chain):
        return True
    if entry.get("top"):
        return False
    if entry.get("type") == "reg" and not chain:
        # Not at its link's path in the payload's view: opened elsewhere and handed on (a
        # host file outside the claims), unless it is deleted, which leaves nothing to place.
        return None if str(entry.get("link") or "").endswith(" (deleted)") else False
    return None


def _what(entry: Mapping[str, Any], host: HostObjects) -> str:
    ident = (int(entry["dev"]), int(entry["ino"]))
    kind = "directory" if entry.get("type") == "dir" else "file"
    outside = f"a host {kind} outside the workspace and the read-only set"
    named = host.names.get(ident)
    if named is None:
        return outside
    what, path = named
    # The link text is a name in the view of whoever opened it; the host path is added
    # where the two differ (a directory bound elsewhere, another mount namespace).
    return f"{what}: {outside}" if path == entry.get("link") else f"{what} {path}: {outside}"


def judge_descriptors(
    processes: Sequence[Mapping[str, Any]], host: HostObjects
) -> tuple[list[Finding], list[Finding]]:
    """(holes, unidentified): the payload's descriptors 3+ on host objects outside the claims.

    `processes` are the host's readings of the judged processes (`catalog.spec.host_processes`),
    each with `fd_ids` (sandbox_attest/run/fdview.py). The same descriptor number on the same
    object in several processes (the shim and the payload) is one finding naming every pid.
    """
    holes: dict[tuple[str, str, str], list[str]] = {}
    unknown: dict[tuple[str, str, str], list[str]] = {}
    for process in processes:
        if process.get("unread"):
            continue  # no reading at all: the assessor's other checks say so
        pid = str(process.get("pid", "?"))
        for fd, entry in _judged_entries(process):
            verdict = _verdict(entry, host)
            if verdict is None:
                continue
            target, (what, hole) = str(entry.get("link") or "?"), verdict
            (holes if hole else unknown).setdefault((fd, target, what), []).append(pid)
    return _findings(holes), _findings(unknown)


def _judged_entries(process: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The descriptors 3+ of one reading; a reading without identities is one unknown entry."""
    ids = process.get("fd_ids")
    fds = process.get("fds") or {}
    if not isinstance(ids, dict):
        extra = [n for n in fds if not n.isdigit() or int(n) > _STDIO]
        why = "the host read no identities of its descriptors"
        return [("*", {"link": ", ".join(extra), "unread": why})] if extra else []
    entries = [(n, e) for n, e in ids.items() if n.isdigit() and int(n) > _STDIO]
    # A process gone while the host listed its table (it exited) holds nothing any more;
    # any other refusal leaves its descriptors unknown.
    if "error" in fds and fds["error"] != os.strerror(errno.ENOENT):
        entries.append(("*", {"link": "?", "unread": f"descriptor table: {fds['error']}"}))
    return sorted(entries, key=lambda item: int(item[0]) if item[0].isdigit() else -1)


def _verdict(entry: Mapping[str, Any], host: HostObjects) -> tuple[str, bool] | None:
    """(what, is a hole) for one descriptor; None where it is no host object to judge."""
    if entry.get("unread"):
        return f"the host could not identify it: {entry['unread']}", False
    if entry.get("type") not in JUDGED_TYPES:
        return None
    if host.devices is None:
        return "the host could not read its own filesystems to compare", False
    if int(entry.get("dev", -1)) not in host.devices:
        return None  # a filesystem the host does not mount: the sandbox's own
    within = _within(entry, host)
    if within is None:
        why = entry.get("why") or "its climb stopped short of the top"
        return f"a host directory the host could not place: {why}", False
    return None if within else (_what(entry, host), True)


def _findings(found: Mapping[tuple[str, str, str], list[str]]) -> list[Finding]:
    return [
        Finding(fd, link, what, tuple(dict.fromkeys(pids)))
        for (fd, link, what), pids in found.items()
    ]


@dataclass(frozen=True)
class _VariableHits:
    """Which variables of the host's reached the payload (names), by where they came from."""

    canary: list[str]  # planted in the harness's own environment
    planted: list[str]  # planted in a command wrapper's environment
    host: list[str]  # the harness's own, undeclared
    wrapper_only: set[str]  # a wrapper's own variables, ignored
    passthrough: str  # why none of them is judged ("" when they are)
    # equal to the harness's, but a value the sandbox sets itself (`engine_default`)
    engine: list[str] = field(default_factory=list)

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
        if self.engine:
            reasons.append(
                "not counted: equal to the harness's, but values the sandbox sets itself "
                f"(an engine's default), which prove no inheritance: {', '.join(self.engine)}"
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
    equal = [
        n
        for n, h in seen_env.items()
        if n not in declared
        and n not in ENV_PLUMBING
        and n not in hashes
        and n not in planted
        and n not in wrapper_only
        and n in os.environ
        and salted_hash(salt, os.environ[n]) == h
    ]
    engine = sorted(n for n in equal if engine_default(n, os.environ[n]))
    host = sorted(n for n in equal if n not in engine)
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
    return _VariableHits(canary, planted_hits, host, wrapper_only, "", engine)


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
    cannot_tell: str,
    extras: str,
    reasons: list[str],
) -> Escape:
    """The escape once the host's own objects were looked for inside; adds its reason.

    `cannot_tell` names what the host could not compare (descriptors it could not identify,
    targets it could not read), `extras` what the sandbox added itself.
    """
    escape: Escape
    if seen:
        escape = "escaped"
    elif cannot_tell:
        # Nothing shows such a descriptor is the sandbox's own: fail closed, never PASS.
        escape = "undecided"
        reasons.append(cannot_tell)
    elif observed == "refused":
        escape = "refused"
        reasons.append("only the declared environment and fds 0-2 inside")
    elif observed == "error":
        escape = "undecided"
        reasons.append(f"the payload could not look: {attempts_summary(escapes)}")
    else:
        # What it found is none of the host's: variables or fds the sandbox itself added.
        escape = "contained"
        reasons.append(
            "extras the sandbox added itself, none held by the harness and none on a host "
            f"directory or file outside the claims: {extras}"
        )
    return escape


def _cannot_tell(
    fd_targets: dict[str, Any], now_held: set[str] | None, unidentified: list[Finding]
) -> str:
    """What of the payload's descriptors the host could not compare with its own, or ""."""
    parts = []
    if unidentified:
        parts.append(
            "descriptors the host could not identify, so nothing shows they are the "
            f"sandbox's own: {'; '.join(f.phrase() for f in unidentified)}"
        )
    if fd_targets and (now_held is None or None in fd_targets.values()):
        # Without both sides' targets nothing shows an extra fd is the sandbox's own.
        parts.append(
            f"extra fds that cannot be compared with the harness's: {_fd_list(fd_targets)}"
        )
    return "; ".join(parts)


def host_side(ctx: CellContext) -> HostObjects:
    """The host's own objects for `judge_descriptors`: what the claims allow, what is notable.

    Allowed: the cell's workspace and the read-only set the runner hands every backend (the
    staged inputs with the shim, the payload interpreter, the CA bundle). Named: the host's
    `/`, the payload user's and the harness user's homes, the harness's scratch directories.
    """
    allowed = [ctx.workspace, ctx.cell_dir / INPUT_DIR]
    with contextlib.suppress(HarnessError):
        allowed += payload_interpreter(ctx.user).bind_paths()
    with contextlib.suppress(HarnessError, AttributeError, TypeError):
        allowed.append(Path(ctx.world.info.ca_bundle))
    named = {
        "the host's /": Path("/"),
        "the payload user's home": home_of(ctx),
        "the harness user's home": Path.home(),
        "this cell's scratch dir": ctx.cell_dir,
        "the directory holding the workspace": ctx.workspace.parent,
        "the harness's scratch dir": ctx.cell_dir.parent,
    }
    return host_objects(allowed, named, host_devices())


def _descriptor_reasons(
    fd_hits: list[str], host_fds: list[str], held_objects: list[Finding]
) -> list[str]:
    """The verdict's phrases for the host's descriptors and objects open in the payload."""
    reasons = []
    if fd_hits:
        reasons.append(f"the host's canary pipe is open in the payload as fd {', '.join(fd_hits)}")
    if host_fds:
        reasons.append(
            f"descriptors the harness holds are open in the payload: {', '.join(host_fds)}"
        )
    if held_objects:
        reasons.append(
            "the sandbox hands the payload descriptors on the host's own objects, outside "
            f"what it claims to show: {'; '.join(f.phrase() for f in held_objects)}; {FIX}"
        )
    return reasons


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
        if any(judge_descriptors(processes, host_side(ctx))):
            return []  # a held host object, or a descriptor the host could not identify
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
        # Every judged process's descriptors by the identity of what they hold: the host's
        # own directories and files outside the claims, whether or not the payload used them.
        held_objects, unidentified = judge_descriptors(host_processes(ctx), host_side(ctx))
        reasons += _descriptor_reasons(fd_hits, host_fds, held_objects)
        found = (canary_hits, host_hits, planted_hits, fd_hits, host_fds, host_seen, held_objects)
        seen = any(found)
        names = (by_what.get("env-undeclared") or {}).get("names", [])
        # Under a passthrough claim the variables are the wrapper's, as claimed (its
        # `hits.reasons()` said so): only the descriptors are left to account for.
        added = "" if hits.passthrough else f"variables {', '.join(map(str, names)) or 'none'}; "
        escape = _escape_of(
            seen,
            observed,
            escapes,
            _cannot_tell(fd_targets, now_held, unidentified),
            f"{added}fds {_fd_list(fd_targets)}",
            reasons,
        )
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
                "engine_defaults": hits.engine,
                "fd_hits": fd_hits,
                "host_fds": host_fds,
                "held_host_objects": [f.phrase() for f in held_objects],
                "unidentified_fds": [f.phrase() for f in unidentified],
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
