"""What the harness hands every payload: the interpreter it runs on and the only env it sees.

Both the runner (which builds each `ProbeRequest`) and the backends that must grant the
interpreter's paths (command wrappers) or check the declared environment (`env_inheritance`)
read them here. This module imports nothing of ours, so every layer can.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["interpreter_paths", "payload_env"]


def interpreter_paths() -> list[Path]:
    """The interpreter by its lexical and its resolved location, deduplicated.

    A venv's `bin/python` is a symlink into the base installation: the sandbox needs the venv
    (lexical path, pyvenv.cfg, site-packages with pip) and the base prefix it resolves into.
    Paths under /usr are left out because every backend binds /usr already.
    """
    exe = Path(sys.executable)
    candidates = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        exe.parent,
        exe.resolve().parent,
        Path(sys.base_prefix).resolve(),
    }
    kept = sorted(p for p in candidates if not p.is_relative_to("/usr"))
    return [p for p in kept if not any(p != q and p.is_relative_to(q) for q in kept)]


def payload_env(proxy_url: str | None, home: Path) -> dict[str, str]:
    """The only environment a payload sees: a minimal PATH/HOME/LANG and the proxy."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # the probe dir is read-only inside the sandbox
        "PYTHONUNBUFFERED": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if proxy_url:
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[key] = proxy_url
    return env
