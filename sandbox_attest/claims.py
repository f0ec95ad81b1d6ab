"""The claim vocabulary: what a backend may promise, and how a verdict words it.

A backend declares its claims (`sandbox_attest.backends.base.DeclaredClaims`, a spec's `[claims]`);
each probe judges against exactly those. This module sits below both the backends and the
catalogue, so the two share one vocabulary without importing each other: the backends build
a `DeclaredClaims` from these types, and the catalogue reads any claims through `claims_of`.

Two rules follow from ARCHITECTURE.md ("Claims"):

1. A FAIL names the claim it broke. `Claims.phrase(name)` gives the words ("claims reads
   limited to the workspace") that an assessor puts before what it saw.
2. A claim the backend does not make is NOT_APPLICABLE for a probe that tests only that
   claim, never FAIL. `unclaimed(probe, claims)` gives the reason, or None. The control leg
   (a backend that claims nothing at all) is the exception: it must show every escape.

It does not check a claim against the sandbox: the probes do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, Final, Literal

# reads: "open" the payload may read the whole host; "workspace" nothing outside the
# workspace and the granted read-only paths; "deny" everything but `read_deny`.
ReadsMode = Literal["open", "workspace", "deny"]
# writes: "open"; "workspace" the workspace alone; "allow" the workspace and `write_allow`.
WritesMode = Literal["open", "workspace", "allow"]
EnvironmentMode = Literal["scrubbed", "passthrough"]
SyscallsMode = Literal["filtered", "open"]
# kernel: "shared" the payload runs on the host's kernel, as a host process the host reads in
# /proc; "own" a kernel of its own (gVisor's Sentry, a microVM's guest): the host cannot see
# the payload's processes, and every verdict rests on the effects outside the sandbox.
KernelMode = Literal["shared", "own"]
KERNEL_OWN: Final = "own"
# How a network claim other than "open" is enforced (see sandbox_attest/backends/base.py).
NetworkCut = Literal["namespace", "seccomp", "proxy-only"]
# Cuts under which the payload shares the harness's network namespace by design: sharing it
# is then no escape, and the refused connects (with silent witnesses) decide.
SHARED_NETNS_CUTS: Final = ("seccomp", "proxy-only")
# The words `runs_as` takes besides a user name or a uid.
RUNS_AS_WORDS: Final = ("non-root", "payload-user")
RUNS_AS_RE: Final = re.compile(r"[a-z_][a-z0-9_-]{0,31}|\d+")


@dataclass(frozen=True)
class Claims:
    """Every claim of one backend, as the probes read them. Get one from `claims_of`.

    Attributes:
        network: "open" | "proxy" | "none".
        network_cut: how a network claim is enforced; "" with network "open".
        reads: "open" | "workspace" | "deny" (with `read_deny`).
        read_deny: the paths that must be unreadable ("~/.ssh": the payload user's home).
        writes: "open" | "workspace" | "allow" (with `write_allow`).
        write_allow: paths writable besides the workspace.
        protected: workspace-relative paths the payload must not change.
        environment: "scrubbed" | "passthrough".
        syscalls: "filtered" | "open".
        ipc: "open" | "isolated".
        runs_as: "" (no claim), "non-root", "payload-user", a user name or a uid.
        kernel: "shared" (the host's kernel runs the payload) | "own" (the host cannot see
            the payload's processes; see `own_kernel`).
    """

    network: str
    network_cut: str
    reads: str
    read_deny: tuple[str, ...]
    writes: str
    write_allow: tuple[str, ...]
    protected: tuple[str, ...]
    environment: str
    syscalls: str
    ipc: str
    runs_as: str
    kernel: str = "shared"
    # (claim, the key it follows from) for each claim the backend did not write itself.
    implied: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def implied_by(self, name: str) -> str:
        """The key claim `name` follows from (`ipc = "isolated"`), or "" when written."""
        return dict(self.implied).get(name, "")

    @property
    def own_kernel(self) -> bool:
        """Whether the payload runs on a kernel of its own, out of the host's /proc view."""
        return self.kernel == KERNEL_OWN

    @property
    def nothing(self) -> bool:
        """The control leg's claim: nothing confined, so every escape must be seen."""
        return (
            self.network == "open"
            and self.reads == "open"
            and self.writes == "open"
            and self.ipc == "open"
            and self.syscalls == "open"
            and not self.protected
        )

    def as_dict(self) -> dict[str, Any]:
        """Every claim in the TOML form of a spec's `[claims]` (what identities carry)."""
        data: dict[str, Any] = {
            "network": self.network,
            "reads": {"deny": list(self.read_deny)} if self.reads == "deny" else self.reads,
            "writes": {"allow": list(self.write_allow)} if self.writes == "allow" else self.writes,
            "ipc": self.ipc,
            "environment": self.environment,
            "syscalls": self.syscalls,
        }
        if self.network_cut:
            data["network_cut"] = self.network_cut
        if self.protected:
            data["protected"] = list(self.protected)
        if self.runs_as:
            data["runs_as"] = self.runs_as
        if self.own_kernel:
            # Only when claimed: every older identity keeps its bytes (shared is the default).
            data["kernel"] = self.kernel
        return data

    def words(self) -> dict[str, str]:
        """Each claim as one word, as a release policy's `claims` requirement names it."""
        return {
            "network": self.network,
            "network_cut": self.network_cut,
            "reads": self.reads,
            "writes": self.writes,
            "ipc": self.ipc,
            "environment": self.environment,
            "syscalls": self.syscalls,
            "runs_as": self.runs_as,
            "kernel": self.kernel,
        }

    def phrase(self, name: str) -> str:
        """The claim `name` in the words a FAIL starts with ("claims reads limited to ...").

        A claim the backend never wrote says what it follows from ("claims a filtered syscall
        surface (implied by ipc = "isolated")"), so a vendor sees which line to change.
        """
        words = self._phrase(name)
        cause = self.implied_by(name)
        return f"{words} (implied by {cause})" if cause else words

    def _phrase(self, name: str) -> str:  # noqa: PLR0911  (one sentence per claim)
        if name == "reads":
            if self.reads == "deny":
                return f"claims {', '.join(self.read_deny)} unreadable (reads deny-list)"
            return "claims reads limited to the workspace"
        if name == "writes":
            if self.writes == "allow":
                return f"claims writes limited to the workspace and {', '.join(self.write_allow)}"
            return "claims writes limited to the workspace"
        if name == "protected":
            return f"claims {', '.join(self.protected)} protected inside the workspace"
        if name == "environment":
            return "claims a scrubbed environment"
        if name == "syscalls":
            return "claims a filtered syscall surface"
        if name == "network":
            cut = f" cut by {self.network_cut}" if self.network_cut else ""
            return f'claims network = "{self.network}"{cut}'
        if name in ("runs_as", "kernel"):
            return f'claims {name} = "{getattr(self, name)}"'
        return f"claims {name}"

    def read_denied(self, path: Path, home: Path) -> bool:
        """Whether the reads claim says `path` (a host path outside the workspace) is unreadable."""
        if self.reads == "workspace":
            return True
        if self.reads == "deny":
            return any(_under(path, expand(entry, home)) for entry in self.read_deny)
        return False

    def write_denied(self, path: Path, home: Path) -> bool:
        """Whether the writes claim says `path` (outside the workspace) is not writable."""
        if self.writes == "workspace":
            return True
        if self.writes == "allow":
            return not any(_under(path, expand(entry, home)) for entry in self.write_allow)
        return False

    def protects(self, relative: str) -> bool:
        """Whether `relative` (inside the workspace) is at or under a protected path."""
        rel = PurePosixPath(relative)
        return any(
            rel == PurePosixPath(p) or PurePosixPath(p) in rel.parents for p in self.protected
        )


def expand(entry: str, home: Path) -> Path:
    """A claim's path with `~` as the payload user's home (where its secrets would be)."""
    if entry == "~" or entry.startswith("~/"):
        return home / entry[2:] if entry != "~" else home
    return Path(entry)


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def claims_of(declared: object) -> Claims:
    """The claims of any claims-shaped object (a `DeclaredClaims`, or an older stand-in).

    A claim the object does not carry takes the meaning the three old keys always had:
    `filesystem = "workspace"` is reads and writes limited to the workspace, `ipc =
    "isolated"` a filtered syscall surface, a network claim a namespace of its own.
    """
    if isinstance(declared, dict):
        return _claims_of_dict(declared)
    network = str(getattr(declared, "network", "open"))
    filesystem = str(getattr(declared, "filesystem", "open"))
    ipc = str(getattr(declared, "ipc", "open"))
    implied = dict(getattr(declared, "implied", ()) or ())
    # The old keys' meanings, filled here for a stand-in that left the newer claims out.
    for claim, cause in (
        ("reads", f'filesystem = "{filesystem}"'),
        ("writes", f'filesystem = "{filesystem}"'),
        ("syscalls", f'ipc = "{ipc}"'),
    ):
        if not getattr(declared, claim, None):
            implied.setdefault(claim, cause)
    cut = getattr(declared, "network_cut", None) or ("namespace" if network != "open" else "")
    return Claims(
        network=network,
        network_cut=str(cut) if network != "open" else "",
        reads=str(getattr(declared, "reads", None) or filesystem),
        read_deny=tuple(getattr(declared, "read_deny", ())),
        writes=str(getattr(declared, "writes", None) or filesystem),
        write_allow=tuple(getattr(declared, "write_allow", ())),
        protected=tuple(getattr(declared, "protected", ())),
        environment=str(getattr(declared, "environment", "scrubbed")),
        syscalls=str(
            getattr(declared, "syscalls", None) or ("filtered" if ipc == "isolated" else "open")
        ),
        ipc=ipc,
        runs_as=str(getattr(declared, "runs_as", "")),
        kernel=str(getattr(declared, "kernel", None) or "shared"),
        implied=tuple(sorted(implied.items())),
    )


def _claims_of_dict(data: dict[str, Any]) -> Claims:
    """`claims_of` for JSON data: an identity's `claims` (or, from older evidence, `policy`)."""
    reads, writes = data.get("reads"), data.get("writes")
    return claims_of(
        SimpleNamespace(
            network=data.get("network", "open"),
            filesystem=data.get("filesystem", "open"),
            ipc=data.get("ipc", "open"),
            network_cut=data.get("network_cut"),
            reads="deny" if isinstance(reads, dict) else reads,
            read_deny=tuple(reads.get("deny", ())) if isinstance(reads, dict) else (),
            writes="allow" if isinstance(writes, dict) else writes,
            write_allow=tuple(writes.get("allow", ())) if isinstance(writes, dict) else (),
            protected=tuple(data.get("protected", ())),
            environment=data.get("environment", "scrubbed"),
            syscalls=data.get("syscalls"),
            runs_as=data.get("runs_as", ""),
            kernel=data.get("kernel", "shared"),
        )
    )


def unclaimed(probe: str, claims: Claims) -> str | None:
    """Why `probe` is NOT_APPLICABLE to a backend with these claims, or None.

    Only for a probe that tests one claim alone, and never on the control leg (it claims
    nothing, and must show every escape). A probe that tests several claims judges the parts
    the backend claims and says which parts it left unjudged.
    """
    if claims.nothing:
        return None
    if probe == "fs_read_secrets" and claims.reads == "open":
        return "the backend claims open reads; fs_read_secrets tests only the reads claim"
    if probe == "fs_link_escape" and claims.reads == "open" and claims.writes == "open":
        return "the backend claims open reads and writes; fs_link_escape tests only those"
    if probe == "fs_protected_in_workspace" and not claims.protected:
        return "the backend claims no protected paths inside the workspace"
    # issue 28 adds the syscall surface's other doors, judged under the same claim alone
    syscall_probes = {"proc_syscall_surface", "proc_syscall_surface_extended", "proc_new_mount_api"}
    if probe in syscall_probes and claims.syscalls == "open":
        return "the backend claims an open syscall surface"
    return _writes_unclaimed(probe, claims) or _own_kernel_unjudged(probe, claims)


def _writes_unclaimed(probe: str, claims: Claims) -> str | None:
    """proc_kernel_tunables under open writes: its control files are writes the backend allows."""
    if probe == "proc_kernel_tunables" and claims.writes == "open":
        return "the backend claims open writes; proc_kernel_tunables tests only the writes claim"
    return None


def _own_kernel_unjudged(probe: str, claims: Claims) -> str | None:
    """Why a probe only a host view of the payload's process could judge has nothing here.

    Under `kernel = "own"` the payload's syscalls, environment and descriptors belong to the
    sandbox's kernel, out of the host's /proc: "the handler answered" is that kernel's
    handler, not the host's, and no witness outside the sandbox sees which host calls that
    kernel makes for it, nor what the payload's environment holds.
    """
    if not claims.own_kernel:
        return None
    syscall_probes = {"proc_syscall_surface", "proc_syscall_surface_extended", "proc_new_mount_api"}
    if probe in syscall_probes:
        return (
            'the backend claims kernel = "own": the sandbox\'s own kernel answers the '
            "payload's syscalls, so a handler that answered is not the host kernel's, and no "
            "host reading shows which host calls that kernel makes on the payload's behalf"
        )
    if probe == "dev_access":
        return (
            'the backend claims kernel = "own": the device nodes the payload opens are its own '
            "kernel's (gVisor implements /dev/fuse and /dev/net/tun itself), so a device number "
            "names no host device, and the host cannot read the payload's view to map it"
        )
    if probe == "env_inheritance":
        return (
            'the backend claims kernel = "own": the payload\'s environment and descriptors are '
            "its own kernel's, out of the host's /proc, and no witness outside the sandbox "
            "sees them; only the payload's report could say, and it crossed the wrapper"
        )
    return None
