#!/usr/bin/env python3
"""A wrapper that only looks: what it can see of its own start and its ancestors, then exec.

tests/integration/test_what_a_wrapper_sees.py names it in a spec. Before it runs its payload
(unconfined: it is no sandbox) it writes one JSON file into $SEEN_DIR: its argv, its whole
environment, its cwd, and for every ancestor up to pid 1 and every other child of its parent
(the harness's proxy and signer among them) the pid, cmdline words and comm it could read
(or the errno name). A wrapper that confines only when it detects a test would look
exactly here. Stdlib only.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import Any


def read(path: str, binary: bool = False) -> tuple[Any, str]:
    try:
        with open(path, "rb" if binary else "r") as fh:
            return fh.read(), ""
    except OSError as exc:
        return None, errno.errorcode.get(exc.errno or 0, str(exc.errno))


def parent_of(pid: int) -> int | None:
    text, _ = read("/proc/%d/stat" % pid)
    if text is None:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])


def ancestors() -> list[dict[str, Any]]:
    chain: list[dict[str, Any]] = []
    pid: int | None = os.getppid()
    while pid and pid > 0 and len(chain) < 64:
        cmdline, why = read("/proc/%d/cmdline" % pid, binary=True)
        comm, _ = read("/proc/%d/comm" % pid)
        words = [w.decode("utf-8", "replace") for w in (cmdline or b"").split(b"\0") if w]
        chain.append({"pid": pid, "cmdline": words, "comm": (comm or "").strip(), "unread": why})
        if pid == 1:
            break
        pid = parent_of(pid)
    return chain


def siblings() -> list[dict[str, Any]]:
    """Every other child of our parent (the harness): its proxy, its signer, other cells."""
    found: list[dict[str, Any]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        if parent_of(int(entry)) != os.getppid():
            continue
        cmdline, why = read("/proc/%s/cmdline" % entry, binary=True)
        comm, _ = read("/proc/%s/comm" % entry)
        words = [w.decode("utf-8", "replace") for w in (cmdline or b"").split(b"\0") if w]
        found.append({"pid": int(entry), "cmdline": words, "comm": (comm or "").strip(), "unread": why})
    return found


def main() -> None:
    seen = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "argv": sys.argv,
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "ancestors": ancestors(),
        "siblings": siblings(),
    }
    target = os.path.join(os.environ["SEEN_DIR"], "seen-%d.json" % os.getpid())
    with open(target, "w") as fh:
        json.dump(seen, fh)
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
