"""The environment a command wrapper starts with: an agent's, never one scrubbed for it.

The wrapper gets the harness's own variables minus anything secret-looking (`spec.SECRET_ENV`)
and minus its proxy settings (they would route a wrapper's own proxy out of the world),
plus the payload user's login session variables while one is open (XDG_RUNTIME_DIR,
SSH_AUTH_SOCK: sandbox_attest/host/login_session.py), plus canary credentials planted per
cell with random values (`AGENT_CANARIES`), plus the payload's own variables, `[env] set` and
`[env] wrapper`. What the sandbox lets through to the
payload is `env_inheritance`'s to judge; the planted values and the wrapper-only names are
written to the cell dir (`WRAPPER_ENV_FILE`, harness-only) for it.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.backends.command.spec import SECRET_ENV

if TYPE_CHECKING:
    from pathlib import Path

PROXY_VARS: Final = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
# The harness's own proxy settings never reach a wrapper: a wrapper with its own proxy chains
# to one it finds in its environment (srt takes HTTPS_PROXY as its parent proxy), which would
# send the sandbox's traffic somewhere outside the world.
HARNESS_PROXY_VARS: Final = frozenset(
    {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy", "grpc_proxy"}
)
# Credentials an agent's environment typically holds, planted with fresh random values in every
# cell (`{token}` is replaced). A sandbox that scrubs the environment drops every one; the
# proxy variables carry a password, and point at the discard port on loopback, so one that is
# used anyway sends nothing anywhere. None of them is a variable a wrapper itself interprets.
AGENT_CANARIES: Final[dict[str, str]] = {
    # Shaped like real credentials, never named for the harness: a wrapper reads its own
    # environment, and a value that says "canary" tells it it is under test (issue 23).
    "AWS_ACCESS_KEY_ID": "AKIA{token}",
    "AWS_SECRET_ACCESS_KEY": "wJalr{token}",
    "GITHUB_TOKEN": "ghp_{token}",
    "DATABASE_PASSWORD": "pw-{token}",
    "npm_config_https_proxy": "http://agent:pw-{token}@127.0.0.1:9",
    "PIP_PROXY": "http://agent:pw-{token}@127.0.0.1:9",
}
# Written into the cell dir (the harness's, never bound into a sandbox) by `prepare`: the
# canaries planted for this cell and the names meant for the wrapper alone, for env_inheritance.
WRAPPER_ENV_FILE: Final = "wrapper-env.json"


def harness_env() -> dict[str, str]:
    """The harness's own environment as an agent's wrapper would get it, minus its secrets.

    Nothing secret is meant to be in it (the signing key never is: host/trust.py), but a
    CI runner's own GITHUB_TOKEN or a developer's AWS key might be: every secret-looking name,
    every `SANDBOX_ATTEST_*` and the harness's proxy settings are dropped. So is every
    `PYTEST_*`: the matrix runs under pytest in this process, and its PYTEST_CURRENT_TEST names
    the cell (`matrix.toml::firejail-fs_read_secrets`), telling a wrapper it is under test and
    what is being tried (issue 23).
    """
    return {
        k: v
        for k, v in os.environ.items()
        if not SECRET_ENV.search(k)
        and k.lower() not in HARNESS_PROXY_VARS
        and not k.startswith("PYTEST_")
    }


def plant_canaries() -> dict[str, str]:
    """Fresh canary credentials for one wrapper start (`AGENT_CANARIES`, random values)."""
    token = secrets.token_hex(12)
    return {name: value.replace("{token}", token) for name, value in AGENT_CANARIES.items()}


def wrapper_env_record(cell_dir: Path) -> dict[str, Any]:
    """What `prepare` planted for a cell: {"canaries": {NAME: value}, "wrapper_only": [...]}.

    Empty for a cell that no command wrapper ran (a built-in backend, the control leg).
    """
    try:
        data = json.loads((cell_dir / WRAPPER_ENV_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
