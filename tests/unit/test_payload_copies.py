"""The payloads' copies of the host's constants are the host's values.

Each payload in probes/ is one stdlib-only file the sandbox runs alone, so the few constants it
shares with the host (the start marker, the canary names, the rendezvous prefixes, ioctl
numbers) are copied into it on purpose (ARCHITECTURE.md, "Probe contract"). A copy that drifts
makes a payload and its judge disagree without an error: this test is where they must agree.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

PROBES_DIR = Path(__file__).resolve().parents[2] / "probes"

# A payload's module-level name -> the host module and attribute it copies.
COPIES: dict[str, tuple[str, str]] = {
    "START_MARKER": ("sandbox_attest.backends.base", "START_MARKER"),
    "HOST_ROOT_MOUNTS": ("sandbox_attest.catalog.fs.write_outside", "HOST_ROOT_MOUNTS"),
    "CANARY_FILE": ("sandbox_attest.host.disguise", "CANARY_FILE"),
    "READY_PREFIX": ("sandbox_attest.host.disguise", "READY_PREFIX"),
    "GO_PREFIX": ("sandbox_attest.host.disguise", "GO_PREFIX"),
    "SECRET_VAR": ("sandbox_attest.host.disguise", "ANCHOR_SECRET_VAR"),
    "PROXY_FROM_ENV": ("sandbox_attest.backends.base", "PROXY_FROM_ENV"),
    "MAILBOX_LEN": ("sandbox_attest.catalog.crossproc", "MAILBOX_LEN"),
    "NEVER_OPEN": ("sandbox_attest.catalog.dev", "NEVER_OPEN"),
    "FAMILY_DOMAINS": ("sandbox_attest.catalog.proc.syscall_surface", "FAMILY_DOMAINS"),
    "AT_FDCWD": ("sandbox_attest.catalog.handles", "AT_FDCWD"),
    "MAX_HANDLE_SZ": ("sandbox_attest.catalog.handles", "MAX_HANDLE_SZ"),
    "TIOCSTI": ("sandbox_attest.backends.seccomp", "TIOCSTI"),
    "TIOCLINUX": ("sandbox_attest.backends.seccomp", "TIOCLINUX"),
    "MAX_HEAD": ("sandbox_attest.world.egress.wire", "MAX_HEAD"),
}


def payload_constants() -> list[tuple[str, str, Any]]:
    """(payload file, name, value) for every copied name a payload assigns at module level."""
    found: list[tuple[str, str, Any]] = []
    for path in sorted(PROBES_DIR.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.Assign):
                continue
            names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id in COPIES]
            found.extend((path.name, name, ast.literal_eval(node.value)) for name in names)
    return found


@pytest.mark.parametrize(("payload", "name", "value"), payload_constants())
def test_a_payload_copy_is_the_hosts_value(payload: str, name: str, value: Any) -> None:
    """The copy in the payload equals the host's constant it stands for."""
    module, attribute = COPIES[name]
    host = getattr(importlib.import_module(module), attribute)
    assert value == host, (
        f"probes/{payload}: {name} = {value!r}, but {module}.{attribute} = {host!r}"
    )


def test_every_listed_copy_is_still_made() -> None:
    """Each name in COPIES is copied by at least one payload: the list holds no dead entries."""
    assert set(COPIES) - {name for _, name, _ in payload_constants()} == set()
