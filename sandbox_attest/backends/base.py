"""The Backend protocol and the request/result objects every backend speaks.

A backend turns one `ProbeRequest` into one `ProbeRun`. It never judges: the verdict is made
above it from the run, the host witnesses and the control leg. It never falls back to running
unsandboxed: if it cannot confine, it raises `BackendUnavailable` (before a run) or returns a
run with `started=False` and the reason (during one).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol, runtime_checkable

from sandbox_attest.claims import (
    EnvironmentMode,
    NetworkCut,
    ReadsMode,
    SyscallsMode,
    WritesMode,
    claims_of,
)
from sandbox_attest.errors import ConfigError
from sandbox_attest.host import disguise
from sandbox_attest.host.interpreter import run_interpreter
from sandbox_attest.host.provenance import executable_facts
from sandbox_attest.host.trust import PayloadUser, payload_user
from sandbox_attest.paths import payload_copy
from sandbox_attest.world.info import WorldInfo

# What a backend claims to enforce, so a verdict judges it against its own claim (the types
# of the newer claims live in sandbox_attest/claims.py, which the catalogue reads them through).
#   network: "open"   nothing confines the network (the control leg)
#            "proxy"  the only route out is an egress proxy with an allowlist
#            "none"   no network at all
#   filesystem: "open" | "workspace" (the old shorthand: "workspace" is reads = "workspace"
#            and writes = "workspace", "open" is both open)
#   ipc: "open" | "isolated" (no host unix/abstract sockets, no host processes)
#   reads: "open"      the payload may read the whole host (srt, Codex)
#          "workspace" nothing outside the workspace and the granted read-only paths
#          "deny"      everything but `read_deny` (the paths that must be unreadable)
#   writes: "open" | "workspace" | "allow" (the workspace and `write_allow` only)
#   environment: "scrubbed" (only the declared variables reach the payload) | "passthrough"
#   syscalls: "filtered" (a seccomp-style filter closes the kernel's riskiest doors) | "open"
#   network_cut: how a network claim other than "open" is enforced:
#          "namespace"  the payload has a network namespace of its own (bwrap, docker)
#          "seccomp"    it shares the harness's namespace; a syscall filter refuses the
#                       connects (Codex's seccomp-only mode)
#          "proxy-only" it shares the host network, and a profile lets it reach only the
#                       proxy: seatbelt and AppContainer work this way
#   runs_as: who the payload runs as on the host: "" (no claim), "non-root", "payload-user"
#          (the harness's payload user, host/trust.py), a user name, or a uid as digits
NetworkMode = Literal["open", "proxy", "none"]
FilesystemMode = Literal["open", "workspace"]
IpcMode = Literal["open", "isolated"]

# The first line a probe prints. A run without it never started inside the sandbox, whatever
# the exit code says: wrappers exit 0 on failures often enough that nothing else is trusted.
START_MARKER = "SANDBOX-ATTEST-START"

# Where the in-sandbox shim listens when a backend routes egress through the proxy's unix
# socket. Any port works inside a private network namespace; a fixed one keeps the task file and
# the profile digest stable across cells.
SHIM_PORT = 3128
# Inside namespaced sandboxes (bubblewrap, docker) the proxy socket and the shim always sit
# here, so the argv (and its digest) does not depend on where this run's scratch dir is.
SANDBOX_RUN_DIR: Final = disguise.SANDBOX_RUN_DIR
SANDBOX_PROXY_SOCKET: Final = f"{SANDBOX_RUN_DIR}/proxy.sock"
SANDBOX_SHIM: Final = f"{SANDBOX_RUN_DIR}/shim.py"


@dataclass(frozen=True)
class InsidePaths:
    """Where the payload sees the egress route's socket and shim, inside its sandbox.

    A backend that routes egress through the proxy's unix socket says where it puts them
    (`inside_paths`), so a probe that attacks the route attacks the one this backend really
    built, never a fixed path that only bubblewrap and docker use.
    """

    proxy_socket: str
    shim: str


# Where bubblewrap and docker mount them (and what a backend without a say gets).
NAMESPACED_INSIDE_PATHS: Final = InsidePaths(SANDBOX_PROXY_SOCKET, SANDBOX_SHIM)


def inside_paths_of(backend: object, world: WorldInfo, cell_dir: Path) -> InsidePaths | None:
    """The inside paths `backend` uses for one cell; None: it has no harness route inside.

    A backend with its own proxy (egress "own") has none. One that does not say (the control
    leg, seatbelt, AppContainer: their payload reaches the proxy over TCP, no shim inside)
    gets the namespaced backends' paths, which its payload then never needs.
    """
    if getattr(backend, "egress_mode", "") == "own":
        return None
    method = getattr(backend, "inside_paths", None)
    if method is None:
        return NAMESPACED_INSIDE_PATHS
    paths: InsidePaths | None = method(world, cell_dir)
    return paths


def shim_path() -> Path:
    """The stdlib-only shim script that bridges loopback to the proxy socket inside.

    The run's readable copy where the installed one is out of the payload user's reach
    (sandbox_attest/run/reach.py).
    """
    copy = payload_copy()
    if copy is not None:
        return copy / "shim.py"
    return Path(__file__).resolve().parent.parent / "world" / "egress" / "shim.py"


# How the payload inside reaches the proxy:
#   "shim":       the backend makes the proxy's unix socket visible inside and runs the shim, so
#                 the payload's proxy is http://127.0.0.1:SHIM_PORT (namespaced sandboxes).
#   "direct-tcp": the payload shares the host loopback and uses the proxy's TCP URL with the
#                 secret as userinfo (the control leg, seatbelt).
#   "own":        the sandbox brings its own proxy and sets HTTP(S)_PROXY inside itself; the
#                 task says `"proxy_url": "from-env"` and the harness sets no proxy variable.
EgressMode = Literal["shim", "direct-tcp", "own"]
# The task's proxy_url when the payload must take its proxy from its own environment.
PROXY_FROM_ENV = "from-env"


@dataclass(frozen=True)
class DeclaredClaims:
    """The confinement a backend promises; verdicts hold it to exactly this.

    Build it with the three old keys alone (`network`, `filesystem`, `ipc`) and every newer
    claim takes the meaning those keys always had: `filesystem = "workspace"` is reads and
    writes limited to the workspace, `ipc = "isolated"` a filtered syscall surface, a network
    claim other than "open" a namespace of its own. Pass a newer claim to say more (or less).
    `__post_init__` fills the derived claims in, so after construction none is None. It does
    not check that the sandbox keeps its promise: the probes do.
    """

    network: NetworkMode
    filesystem: FilesystemMode
    ipc: IpcMode
    # Resource limits the backend applies, as (name, value) pairs: "fsize_mib", "nofile",
    # "forks", "memory_mib". Empty: the backend claims none (resource_limits is INCONCLUSIVE).
    limits: tuple[tuple[str, int], ...] = ()
    reads: ReadsMode | None = None  # None: from `filesystem`
    read_deny: tuple[str, ...] = ()  # with reads = "deny": what must be unreadable ("~/.ssh")
    writes: WritesMode | None = None  # None: from `filesystem`
    write_allow: tuple[str, ...] = ()  # with writes = "allow": writable besides the workspace
    # Workspace-relative paths the payload must not change even inside its workspace.
    protected: tuple[str, ...] = ()
    environment: EnvironmentMode = "scrubbed"
    syscalls: SyscallsMode | None = None  # None: "filtered" where ipc is isolated
    network_cut: NetworkCut | None = None  # None: "namespace" where the network is claimed
    runs_as: str = ""
    # Claims that follow from another key rather than being written, as (claim, the key it
    # follows from): a FAIL must not say a vendor wrote what only their `ipc` implied.
    implied: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        """Fill the derived claims from the old keys (frozen, hence object.__setattr__).

        Raises:
            ValueError: a claim that cannot be judged as written (a list mode without its
                list, a list without its mode, a network cut with no network claim).
        """
        if (self.reads == "deny") != bool(self.read_deny):
            msg = 'reads = "deny" needs read_deny (what must be unreadable), and read_deny needs it'
            raise ValueError(msg)
        if (self.writes == "allow") != bool(self.write_allow):
            msg = (
                'writes = "allow" needs write_allow (what else is writable), and the list needs it'
            )
            raise ValueError(msg)
        if self.network_cut is not None and self.network == "open":
            msg = 'network_cut says how a network claim is enforced; network = "open" claims none'
            raise ValueError(msg)
        implied = dict(self.implied)
        if self.reads is None:
            object.__setattr__(self, "reads", self.filesystem)
            implied.setdefault("reads", f'filesystem = "{self.filesystem}"')
        if self.writes is None:
            object.__setattr__(self, "writes", self.filesystem)
            implied.setdefault("writes", f'filesystem = "{self.filesystem}"')
        if self.syscalls is None:
            object.__setattr__(self, "syscalls", "filtered" if self.ipc == "isolated" else "open")
            implied.setdefault("syscalls", f'ipc = "{self.ipc}"')
        if self.network_cut is None and self.network != "open":
            object.__setattr__(self, "network_cut", "namespace")
            implied.setdefault("network_cut", f'network = "{self.network}"')
        object.__setattr__(self, "implied", tuple(sorted(implied.items())))

    @property
    def claims_nothing(self) -> bool:
        """Whether this is the control leg's claim: nothing at all is confined.

        Only such a backend is expected to show every escape; any other backend is judged
        NOT_APPLICABLE by a probe whose only claim it does not make.
        """
        return claims_of(self).nothing

    def claims(self) -> dict[str, Any]:
        """Every claim in the TOML form of a spec's `[claims]`, for `verify` and policies."""
        return claims_of(self).as_dict()

    def as_dict(self) -> dict[str, Any]:
        """The old three keys (and the limits) as plain JSON data; `claims()` has the rest.

        Kept in its old shape so an identity's `policy` means what it always meant; the
        identity carries every claim beside it, under `claims`.
        """
        data: dict[str, Any] = {
            "network": self.network,
            "filesystem": self.filesystem,
            "ipc": self.ipc,
        }
        if self.limits:
            data["limits"] = dict(self.limits)
        return data


@dataclass(frozen=True)
class EgressRoute:
    """How the sandboxed payload reaches the egress proxy.

    `unix_socket` is the host path of the proxy's socket (bound read-only into namespaced
    sandboxes, where an in-sandbox shim re-exposes it on loopback); `tcp_url` is the loopback
    TCP URL with the secret as userinfo, for backends that share the host's loopback.
    """

    unix_socket: Path
    tcp_url: str


@dataclass(frozen=True)
class ProbeRequest:
    """One probe to run in one backend: everything the backend needs, nothing it may infer.

    Attributes:
        cell_id: `<backend>-<probe>`, stable across runs.
        argv: the payload command as it runs inside (interpreter, probe script, task file).
        env: the scrubbed environment the payload may see (only declared variables).
        workspace: the only writable path the payload is granted.
        read_only: host paths the payload needs to read (probe dir, task file, CA bundle,
            interpreter prefixes); a backend binds them at the same path.
        egress: the route to the proxy; `None` means no proxy at all.
        timeout: seconds before the whole process tree is killed.
    """

    cell_id: str
    argv: tuple[str, ...]
    env: dict[str, str]
    workspace: Path
    read_only: tuple[Path, ...]
    egress: EgressRoute | None
    timeout: float
    cell_dir: Path  # host-only scratch for this cell (logs, rendered files); never bound whole
    # The world's public description (with the proxy secret), for backends that render
    # per-cell files or argv placeholders from it (command wrappers). Others ignore it.
    world: WorldInfo | None = None
    # The unprivileged user every sandboxed command runs as (host/trust.py); None where
    # the harness cannot separate trust domains, and the command then runs as the harness's user.
    user: PayloadUser | None = None
    # The egress shim as staged for this cell, under a neutral name beside the payload
    # (sandbox_attest/payload.py): a command wrapper sees its path in the payload's argv, and
    # the installed one's (`.../sandbox_attest/world/egress/shim.py`) names the harness. None: the
    # installed `shim_path()` (built-in backends mount it at a fixed inside path anyway).
    shim: Path | None = None


@dataclass
class ProbeRun:
    """What a backend observed from outside while a probe ran. Judged elsewhere."""

    cell_id: str
    started: bool  # the start marker was seen on stdout
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    argv: list[str]  # the exact host argv that ran (the sandbox command line)
    helper_stderr: str = ""  # shim / launcher diagnostics, surfaced in the verdict
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Identity:
    """Who ran the probes: recorded in evidence and in the attestation's configuration."""

    name: str
    version: str
    platform: str  # e.g. "Linux 6.1.0-18-amd64 x86_64"
    claims: DeclaredClaims
    profile: dict[str, Any]  # the argv template / profile / options that define confinement
    # What was run, not what the spec says: each executable the backend starts, resolved on
    # the PATH it runs with, by sha256 (with a script's interpreter). A spec path that first
    # named an honest wrapper and later a leaky one gives two identities.
    executables: dict[str, Any] = field(default_factory=dict)
    spec_sha256: str = ""  # the spec file's bytes (command wrappers), "" for built-ins
    # Who the backend's commands run as: the payload user, or why not (root with a reason).
    runs_as: str = ""

    @property
    def profile_digest(self) -> str:
        """sha256 of the canonical JSON of the confinement profile."""
        canonical = json.dumps(self.profile, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

    def as_dict(self) -> dict[str, Any]:
        """Identity as plain JSON data (with the profile digest)."""
        return {
            "name": self.name,
            "version": self.version,
            "platform": self.platform,
            "policy": self.claims.as_dict(),
            # Every claim the backend makes, in a spec's TOML form: what each verdict was
            # judged against, what a release policy's `claims` require, what `verify` shows.
            "claims": self.claims.claims(),
            "profile": self.profile,
            "profile_digest": self.profile_digest,
            "executables": self.executables,
            "spec_sha256": self.spec_sha256,
            "runs_as": self.runs_as,
        }


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here; when it cannot, `reason` names the fix."""

    ok: bool
    reason: str
    identity: Identity | None


def program_facts(*programs: str) -> dict[str, Any]:
    """Identity `executables` for programs a built-in backend starts, and the interpreter.

    Each is resolved on the harness's PATH (where the backend finds it), followed through
    symlinks and hashed; `{python}` is the interpreter every payload runs with, which is the
    harness's own only where the payload user can run it (sandbox_attest/host/interpreter.py).
    """
    path = os.environ.get("PATH", os.defpath)
    facts = {program: executable_facts(program, path) for program in programs}
    try:
        facts["{python}"] = executable_facts(run_interpreter().path, path)
    except ConfigError as exc:
        # No interpreter the payload user can run: the run's preflight stops on this same
        # error before any cell; the identity names it rather than a program never run.
        facts["{python}"] = {"argv0": "{python}", "error": exc.diagnostics()}
    return facts


def payload_runs_as() -> str:
    """Who a built-in backend's sandboxed commands run as, in words, for the identity."""
    user = payload_user()
    if user is not None:
        return f"{user.name} (uid {user.uid})"
    uid = os.geteuid() if hasattr(os, "geteuid") else "?"
    return f"the harness's own uid {uid}: it cannot switch users here"


@runtime_checkable
class Backend(Protocol):
    """A sandbox the harness can run probes in."""

    name: str
    egress_mode: EgressMode

    def availability(self) -> Availability:
        """Check this machine can run the backend, and say who it is."""
        ...

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run one probe confined; never unconfined. Kill the whole tree on timeout."""
        ...
