"""`python -m sandbox_attest.backends.docker`: the backend's availability as JSON."""

from __future__ import annotations

import json
import sys

from sandbox_attest.backends.docker.backend import DockerBackend


def main() -> int:
    """Print the backend's availability as JSON (a quick check: `python -m ...docker`)."""
    with DockerBackend() as backend:
        avail = backend.availability()
        print(json.dumps({"ok": avail.ok, "reason": avail.reason,
                          "identity": avail.identity.as_dict() if avail.identity else None},
                         indent=2))  # fmt: skip
    return 0 if avail.ok else 1


if __name__ == "__main__":
    sys.exit(main())
