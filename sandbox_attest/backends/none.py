"""The control leg: the payload as a plain child process, confined by nothing.

It exists to prove the probes work. On an open host every escape a probe attempts must
succeed and be seen by the host witness; a probe that cannot see it here is broken, and its
PASS verdicts on real sandboxes in the same run are downgraded (see sandbox_attest.run.runner).
"""

from __future__ import annotations

import platform

from sandbox_attest import __version__
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

# The control leg claims nothing (so every escape must show here); only the environment is
# the harness's own declaration, which every backend, this one too, passes exactly.
CLAIMS = DeclaredClaims(
    network="open",
    filesystem="open",
    ipc="open",
    reads="open",
    writes="open",
    environment="scrubbed",
    syscalls="open",
)


def platform_string() -> str:
    """The OS, kernel and machine, as recorded in every identity."""
    return f"{platform.system()} {platform.release()} {platform.machine()}"


class NoneBackend:
    """Runs the payload unconfined (declared network/filesystem/ipc: open)."""

    name = "none"
    egress_mode: EgressMode = "direct-tcp"

    def availability(self) -> Availability:
        """Always available: it needs nothing but a process."""
        identity = Identity(
            name=self.name,
            version=__version__,
            platform=platform_string(),
            claims=CLAIMS,
            profile={"confinement": "none", "egress": self.egress_mode},
            executables=program_facts(),
            runs_as=payload_runs_as(),
        )
        return Availability(ok=True, reason="", identity=identity)

    def run(self, request: ProbeRequest) -> ProbeRun:
        """Run the payload as a child in its own session, in the workspace."""
        return run_process(
            request.cell_id,
            list(request.argv),
            dict(request.env),
            request.workspace,
            request.timeout,
            user=request.user,
        )
