"""A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe` (no network).

Chromium reads requests on fd 3 and writes replies on fd 4, each a JSON object ending in a
NUL byte. A pipe instead of a debugging port means nothing listens anywhere, not even on
loopback. Enough to open a page, evaluate script, click and take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import time
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from pathlib import Path


class Browser:
    """One headless Chromium driven over the pipe; use as a context manager."""

    def __init__(self, chromium: str, profile: Path, *, loopback: bool = False) -> None:
        """Start chromium with every network feature off and a blank page.

        Args:
            chromium: the browser binary.
            profile: a fresh profile directory.
            loopback: let 127.0.0.1 through (a local report server); nothing else resolves.
        """
        rules = "MAP * ~NOTFOUND" + (", EXCLUDE 127.0.0.1" if loopback else "")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium expects the pipe ends exactly on fds 3 and 4: moved there in the child.
        self._proc = subprocess.Popen(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--host-resolver-rules={rules}",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            preexec_fn=lambda: (os.dup2(to_chrome_r, 3), os.dup2(from_chrome_w, 4)),  # noqa: PLW1509
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def __enter__(self) -> Self:
        """Attach to the page target so page commands can be sent."""
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        attached = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        self.session = attached["sessionId"]
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the browser and its pipes."""
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            self.call("Browser.close", session=False)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)

    def call(self, method: str, *, session: bool = True, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply (events seen meanwhile are kept)."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)
        raise TimeoutError(f"no reply to {method} within 60 s")

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the debugging pipe")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(raw)
        return parsed

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return reply["result"].get("value")

    def open(self, url: str, settle: float = 1.0) -> None:
        """Navigate to `url` and give it `settle` seconds to load."""
        self.call("Page.enable")
        self.call("Network.enable")
        self.call("Page.navigate", url=url)
        time.sleep(settle)

    def screenshot(self, path: Path, width: int = 1400, height: int = 1000) -> None:
        """Save the viewport as a PNG."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def requested_urls(self) -> list[str]:
        """Every URL the page asked the network stack for since `open`."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]
