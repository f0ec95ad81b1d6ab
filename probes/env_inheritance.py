"""Probe env_inheritance: look in the payload's own environment and fds for what the host holds.

The host planted canary secrets in ITS OWN environment (names starting with
targets["prefix"]) and holds an inheritable canary descriptor; a runner or sandbox that
forwards the host's environment or leaks descriptors hands them to the payload. Nothing is
read from outside the process: the probe only looks at what it was given.
Escape attempts:
  env-canary      a variable named ``<prefix>...`` is present
  env-undeclared  variables beyond targets["declared"] are present, other than the plumbing
                  the interpreter or the sandbox sets itself (targets["plumbing"]: PWD from a
                  chdir, LC_CTYPE from PEP 538 locale coercion...); those are still reported
                  in facts, where the host matches every value against its own
  fds             descriptors beyond 0-2 are open (each with its /proc/self/fd target)
Values never leave the process: each is reported as a salted sha256 (targets["salt"]), so the
host can match its own values without the evidence carrying them.
Controls: declared variables are seen, the salted hash of targets["check"] is what the host
computes (so a miss is not a hashing mismatch), and fds 0-2 are open: the probe demonstrably
can read its environment and its descriptor table.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import hashlib
import hmac
import json
import os
import sys

PROBE = "env_inheritance"
START_MARKER = "SANDBOX-ATTEST-START"
FD_SCAN_LIMIT = 1024  # where /proc/self/fd is missing (macOS), fstat this many numbers


def attempt(what, role, outcome, err=None, status=None, detail="", **extra):
    out = {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
           "detail": detail}
    out.update(extra)
    return out


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def salted(salt, value):
    return hmac.new(salt.encode(), value.encode("utf-8", "surrogateescape"),
                    hashlib.sha256).hexdigest()[:32]


def open_fds():
    """Every open descriptor number with what it points at (None where unknown)."""
    found = {}
    try:
        listed = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        listed = list(range(FD_SCAN_LIMIT))
    # listdir's own directory descriptor appears in the listing but is closed by now:
    # keep only numbers that still answer fstat.
    for fd in sorted(listed):
        try:
            os.fstat(fd)
        except OSError:
            continue
        try:
            found[fd] = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            found[fd] = None
    return found


def run(task, out):
    targets = task["targets"]
    salt = targets["salt"]
    prefix = targets["prefix"]
    declared = set(targets["declared"])
    env = {name: salted(salt, value) for name, value in os.environ.items()}
    out["facts"]["env"] = env
    present = sorted(n for n in env if n in declared)
    out["attempts"].append(attempt(
        "env-declared", "control", "succeeded" if present else "error", None, None,
        ("declared and present: " + ",".join(present)) if present else "no declared variable",
        check_hash=salted(salt, targets["check"])))
    canaries = sorted(n for n in env if n.startswith(prefix))
    out["attempts"].append(attempt(
        "env-canary", "escape", "succeeded" if canaries else "refused", None, None,
        ("found " + ",".join(canaries)) if canaries else "no %s* variable" % prefix,
        names=canaries))
    extra = sorted(n for n in env if n not in declared and n not in targets["plumbing"])
    out["attempts"].append(attempt(
        "env-undeclared", "escape", "succeeded" if extra else "refused", None, None,
        ("undeclared: " + ",".join(extra[:50])) if extra else "only declared variables",
        names=extra))
    try:
        fds = open_fds()
    except Exception as exc:
        out["attempts"].append(attempt("fds-std", "control", "error", errno_name(exc), None,
                                       repr(exc)))
        out["attempts"].append(attempt("fds", "escape", "error", errno_name(exc), None,
                                       repr(exc)))
        return
    out["facts"]["fds"] = {str(fd): target for fd, target in fds.items()}
    std = [fd for fd in (0, 1, 2) if fd in fds]
    out["attempts"].append(attempt(
        "fds-std", "control", "succeeded" if len(std) == 3 else "error", None, None,
        "open: %s" % std))
    beyond = {str(fd): target for fd, target in fds.items() if fd > 2}
    out["attempts"].append(attempt(
        "fds", "escape", "succeeded" if beyond else "refused", None, None,
        ("open beyond 0-2: %s" % beyond) if beyond else "only 0-2 open", targets=beyond))


def main(argv):
    task, nonce = {}, ""
    try:
        with open(argv[1]) as fh:
            task = json.load(fh)
        nonce = str(task.get("nonce", ""))
    except Exception as exc:
        task = {"_error": repr(exc)}
    print(START_MARKER + " " + nonce, flush=True)
    out = {"probe": PROBE, "nonce": nonce, "attempts": [], "facts": {}}
    try:
        if "_error" in task:
            raise RuntimeError("cannot read the task: " + task["_error"])
        run(task, out)
    except Exception as exc:
        out["attempts"].append(attempt("probe", "escape", "error", errno_name(exc), None, repr(exc)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
