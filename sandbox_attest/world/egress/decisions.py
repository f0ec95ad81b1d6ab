"""The egress proxy's decision log: one JSON line per client, the host-side witness.

Each client's line is filled in as its request moves along (`DecisionRecord`) and written once,
whatever way the client ended; deny lines before the answer, so the witness never lags the
refusal it records. The host reads the lines back with `ProxyProcess.decisions()`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


@dataclass
class DecisionRecord:
    """The decision line for one client, filled in as the request moves along."""

    client: str
    method: str | None = None
    host: str | None = None
    port: int | None = None
    target: str | None = None
    decision: str = "deny"
    status: int | None = None
    reason: str = ""
    nonce: str | None = None
    address: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0

    def as_json(self) -> dict[str, object]:
        """The line as a JSON object, stamped with the time it is written."""
        return {
            "time": time.time(),
            "client": self.client,
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "target": self.target,
            "decision": self.decision,
            "status": self.status,
            "reason": self.reason,
            "nonce": self.nonce,
            "address": self.address,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }


class DecisionLog:
    """Append-only JSON lines; the secret is redacted from every line, whatever carried it."""

    def __init__(self, path: Path, secret: str) -> None:
        """Open `path` for appending; `secret` is redacted from every line."""
        self._handle = path.open("a", encoding="utf-8")
        self._secret = secret
        self._lock = threading.Lock()

    def write(self, record: DecisionRecord) -> None:
        """Append `record` as one line and flush it (thread-safe)."""
        line = json.dumps(record.as_json(), sort_keys=True)
        # token_urlsafe has no JSON-escaped characters, so the secret appears verbatim if at
        # all: in a target, a host, a nonce, a reason quoting any of them.
        line = line.replace(self._secret, "[redacted]")
        with self._lock:
            self._handle.write(line + "\n")
            self._handle.flush()

    def close(self) -> None:
        """Close the log; no line is written after."""
        with self._lock:
            self._handle.close()
