"""The macOS seatbelt backend: `sandbox-exec -p PROFILE` with a profile generated per cell.

The profile is SBPL (the Scheme dialect of Apple's sandbox): `(deny default)`, then only what
a Python payload needs. Reads are broad (an interpreter reads half the system) except the
usual secret folders under $HOME (`HOME_SECRETS`: .ssh, .aws, .docker, ...) and any path given
as `deny_read`. `create_backend` gives none, since canaries are planted per cell after the
backend exists: a canary outside those folders (fs_read_secrets' `.env` in the cell dir) is
readable here, and the probe's verdict, not this profile, says so. Writes go only to the
workspace; the only network grant is an outbound TCP connect to the proxy's loopback port,
whose secret rides in the proxy URL's userinfo (`ProbeRequest.egress.tcp_url`). There is no
unix-socket grant at all, so DNS through mDNSResponder's socket and host daemons are
unreachable.

Seatbelt matches the *resolved* vnode path, never the spelling the payload used: `/tmp`, `/var`
and `/etc` are symlinks into `/private`, and `$TMPDIR` lives under `/var/folders`. Every path
therefore goes through a `resolve` callable before it is written into the profile; tests pass
one that models macOS's symlinks so the golden files are exact on Linux.

What this module does not do: it never runs anything without `sandbox-exec`, and it does not
pretend to confine mach services beyond the default deny (no `mach-lookup` grant is emitted).
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from sandbox_attest.backends.base import (
    Availability,
    DeclaredClaims,
    EgressMode,
    Identity,
    ProbeRequest,
    ProbeRun,
    payload_runs_as,
    program_facts,
)
from sandbox_attest.backends.process import run_process
from sandbox_attest.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

SANDBOX_EXEC: Final = Path("/usr/bin/sandbox-exec")
# The profile denies by default: reads and writes of the granted paths only, outbound only
# to the proxy's loopback port (no namespace on macOS: "proxy-only").
CLAIMS: Final = DeclaredClaims(
    network="proxy",
    filesystem="workspace",
    ipc="isolated",
    reads="workspace",
    writes="workspace",
    environment="scrubbed",
    network_cut="proxy-only",
)
# Secrets a host commonly keeps under $HOME; always denied on top of the harness's canaries.
HOME_SECRETS: Final = (".ssh", ".aws", ".gnupg", ".docker", ".netrc", ".config/gh")


def _default_resolve(path: Path) -> Path:
    """Resolve symlinks the way the kernel will (non-strict: a path may not exist yet)."""
    return path.resolve(strict=False)


@dataclass(frozen=True)
class SeatbeltPolicy:
    """The inputs of one profile: everything that varies between cells.

    Attributes:
        workspace: the only writable directory.
        proxy_port: the loopback TCP port of the egress proxy; `None` means no network.
        deny_read: files or directories the payload must not read (host canaries, $HOME
            secrets); they are also unwritable and their ancestors inside the workspace
            cannot be renamed, so a rename cannot move them out from under the rule.
    """

    workspace: Path
    proxy_port: int | None
    deny_read: tuple[Path, ...] = ()


def sbpl_string(path: PurePosixPath | Path | str) -> str:
    """Quote one path as an SBPL string literal.

    SBPL strings are Scheme strings: a backslash and a double quote must be escaped. Control
    characters are refused rather than escaped, because TinyScheme's handling of them is
    undocumented and a newline would let a path end the rule early.

    Raises:
        ConfigError: the path holds a control character.
    """
    text = str(path)
    for char in text:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            raise ConfigError(
                f"seatbelt: path {text!r} contains the control character {char!r}, which a "
                "profile cannot express safely; rename the path or choose another workspace"
            )
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _absolute(path: Path, what: str) -> Path:
    if not path.is_absolute():
        raise ConfigError(
            f"seatbelt: {what} {str(path)!r} is relative; seatbelt matches absolute "
            "resolved paths only, so pass an absolute path"
        )
    return path


def _resolved_forms(path: Path, resolve: Callable[[Path], Path]) -> list[Path]:
    """The resolved path first, then the lexical spelling when it differs (for denials)."""
    lexical = _absolute(path, "path")
    resolved = _absolute(resolve(lexical), "resolved path")
    return [resolved] if resolved == lexical else [resolved, lexical]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def render_profile(
    policy: SeatbeltPolicy, resolve: Callable[[Path], Path] = _default_resolve
) -> str:
    """Render the SBPL profile for one cell.

    Rules are ordered on purpose: in SBPL the last matching rule wins, so every denial comes
    after the broad grant it narrows.

    Args:
        policy: the workspace, proxy port and read denials.
        resolve: maps a path to the path the kernel will see (symlinks followed).

    Returns:
        The profile text, ending with a newline.

    Raises:
        ConfigError: a path is relative or holds a control character, or the port is invalid.
    """
    workspace = _absolute(resolve(_absolute(policy.workspace, "workspace")), "workspace")
    if workspace == Path("/"):
        raise ConfigError("seatbelt: the workspace resolves to '/'; pass a dedicated directory")
    lines = [
        "(version 1)",
        "(deny default)",
        ";; processes: the payload may run and fork, and signal only its own sandbox",
        "(allow process-exec)",
        "(allow process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow process-info* (target same-sandbox))",
        "(allow sysctl-read)",
        ";; reads are broad: an interpreter reads much of the system",
        "(allow file-read*)",
        ";; writes: the workspace only (resolved: /tmp, /var, /etc live under /private)",
        f"(allow file-write* (subpath {sbpl_string(workspace)}))",
        '(allow file-write-data (literal "/dev/null"))',
    ]
    denied: list[Path] = []
    for path in policy.deny_read:
        for form in _resolved_forms(path, resolve):
            if form not in denied:
                denied.append(form)
    if denied:
        lines.append(";; host secrets and canaries: neither readable nor writable")
        lines.extend(
            f"(deny file-read* file-write* (subpath {sbpl_string(path)}))" for path in denied
        )
        # A rename of an ancestor would move a denied path to a name no rule covers, so the
        # ancestors that sit inside the writable workspace may not be renamed or unlinked.
        guarded: list[Path] = []
        for path in denied:
            guarded.extend(
                parent
                for parent in path.parents
                if _inside(parent, workspace) and parent not in guarded
            )
        if guarded:
            lines.append(";; ancestors of denied paths inside the workspace: no rename")
            lines.extend(
                f"(deny file-write-unlink file-write-create (literal {sbpl_string(path)}))"
                for path in sorted(guarded, key=lambda p: (len(p.parts), str(p)))
            )
    lines.append(
        ";; network: only the proxy's loopback port, by remote address (a local filter allows all)"
    )
    if policy.proxy_port is not None:
        if not 0 < policy.proxy_port < 65536:
            raise ConfigError(
                f"seatbelt: proxy port {policy.proxy_port} is not a TCP port; check the "
                "egress route's tcp_url"
            )
        lines.append(f'(allow network-outbound (remote tcp "localhost:{policy.proxy_port}"))')
    # Explicit even though `(deny default)` covers it: a unix-socket connect would reach
    # mDNSResponder (a DNS leak) or a host daemon, and this line must survive future edits.
    lines.append("(deny network-outbound (remote unix-socket))")
    return "\n".join(lines) + "\n"


def proxy_port_of(tcp_url: str) -> int:
    """The loopback port of the proxy's TCP URL.

    Raises:
        ConfigError: the URL is not loopback or has no port.
    """
    parts = urlsplit(tcp_url)
    if parts.hostname not in {"127.0.0.1", "localhost", "::1"}:
        raise ConfigError(
            f"seatbelt: proxy URL host {parts.hostname!r} is not loopback; the profile only "
            "grants localhost, so start the proxy on 127.0.0.1"
        )
    if parts.port is None:
        raise ConfigError(
            "seatbelt: the proxy URL has no port; pass http://user:secret@127.0.0.1:PORT"
        )
    return parts.port


def build_env(request: ProbeRequest) -> dict[str, str]:
    """The payload's environment: the declared env, with TMPDIR inside the workspace.

    The proxy variables come from the runner (egress mode "direct-tcp": the proxy's own TCP
    URL with the secret as userinfo); nothing else is added.
    """
    env = dict(request.env)
    # $TMPDIR would otherwise point under /var/folders, which the profile makes unwritable.
    env.setdefault("TMPDIR", str(request.workspace))
    return env


class SeatbeltBackend:
    """Runs probes under `sandbox-exec` with a generated deny-default profile."""

    name = "seatbelt"
    egress_mode: EgressMode = "direct-tcp"

    def __init__(
        self,
        *,
        deny_read: tuple[Path, ...] = (),
        resolve: Callable[[Path], Path] = _default_resolve,
        sandbox_exec: Path = SANDBOX_EXEC,
        system: str = sys.platform,
        home: Path | None = None,
    ) -> None:
        """Configure the backend.

        Args:
            deny_read: host-planted canaries the payload must not read, on top of $HOME's
                usual secret folders.
            resolve: path resolution (tests model macOS's /private symlinks with it).
            sandbox_exec: where sandbox-exec lives.
            system: `sys.platform` of this host (injectable for the availability check).
            home: the home whose secret folders are denied (default: the user's).
        """
        self._resolve = resolve
        self._sandbox_exec = sandbox_exec
        self._system = system
        home = Path.home() if home is None else home
        self._deny_read = tuple(deny_read) + tuple(home / rel for rel in HOME_SECRETS)

    def policy_for(self, request: ProbeRequest) -> SeatbeltPolicy:
        """The profile inputs for one request."""
        port = None if request.egress is None else proxy_port_of(request.egress.tcp_url)
        return SeatbeltPolicy(request.workspace, port, self._deny_read)

    def availability(self) -> Availability:
        """Seatbelt needs macOS and /usr/bin/sandbox-exec."""
        if self._system != "darwin":
            return Availability(
                ok=False,
                reason=f"seatbelt exists only on macOS (this is {self._system}); run the "
                "seatbelt leg on a macOS runner",
                identity=None,
            )
        if not self._sandbox_exec.exists():
            return Availability(
                ok=False,
                reason=f"{self._sandbox_exec} is missing; seatbelt needs Apple's sandbox-exec "
                "(present on every stock macOS); check the runner image",
                identity=None,
            )
        template = render_profile(
            SeatbeltPolicy(Path("/WORKSPACE"), 1, (Path("/CANARY"),)), resolve=lambda p: p
        )
        identity = Identity(
            name=self.name,
            version=f"macOS {platform.mac_ver()[0] or 'unknown'}",
            platform=f"{platform.system()} {platform.release()} {platform.machine()}",
            claims=CLAIMS,
            profile={"sandbox_exec": str(self._sandbox_exec), "sbpl_template": template},
            executables=program_facts(str(self._sandbox_exec)),
            # No uid separation on macOS yet: the statement's trust domains say so.
            runs_as=payload_runs_as(),
        )
        return Availability(ok=True, reason="", identity=identity)

    def command(self, request: ProbeRequest) -> tuple[list[str], str]:
        """The host argv and the profile for one request (pure; nothing runs)."""
        profile = render_profile(self.policy_for(request), self._resolve)
        return [str(self._sandbox_exec), "-p", profile, *request.argv], profile

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run one probe under sandbox-exec; never unconfined."""
        argv, profile = self.command(request)
        request.cell_dir.mkdir(parents=True, exist_ok=True)
        # Kept beside the cell's logs so a reviewer can read the exact profile that ran.
        (request.cell_dir / "seatbelt.sb").write_text(profile, encoding="utf-8")
        run = run_process(
            request.cell_id, argv, build_env(request), request.workspace, request.timeout
        )
        run.notes.append(f"profile written to {request.cell_dir / 'seatbelt.sb'}")
        return run
