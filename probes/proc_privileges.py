"""Probe proc_privileges: what privilege the payload holds, or could gain by exec.

Reads /proc/self/status (CapEff, CapPrm, CapBnd, CapAmb, NoNewPrivs, Seccomp), the uid/gid
maps and the ids, and looks at well-known setuid-root binaries without running any of them:
their mode and owner, whether their mount is nosuid, and NoNewPrivs decide whether an exec
could elevate. Escape attempts (nothing is changed, only read):
  effective-capabilities  succeeded when CapEff is not zero (privilege held right now)
  setuid-elevation        succeeded when NoNewPrivs is 0 and a setuid-root binary sits on a
                          mount without nosuid and the bounding set is not empty (an exec
                          would gain privilege)
  writable-root-path      succeeded when a root-owned path that decides what root runs
                          (/etc, /usr/bin, cron and sudoers dirs, ...) passes access(W_OK)
                          for the payload's own uid: a write there is privilege later. Only
                          access(2) is asked; nothing is written
Control: /proc/self/status is readable and carries every field read (the reading works).
The host runs this same file unsandboxed as its control, so both sides read the same way.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import stat
import sys

PROBE = "proc_privileges"
START_MARKER = "SANDBOX-ATTEST-START"
FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
SETUID_CANDIDATES = ("/usr/bin/su", "/usr/bin/sudo", "/usr/bin/passwd", "/usr/bin/mount",
                     "/usr/bin/newgrp", "/usr/bin/chsh", "/usr/bin/gpasswd", "/usr/bin/pkexec",
                     "/bin/su", "/bin/mount")

# Root-owned paths whose write access is root's power: what root executes, loads or trusts.
ROOT_PATHS = ("/etc", "/etc/passwd", "/etc/shadow", "/etc/sudoers", "/etc/sudoers.d",
              "/etc/cron.d", "/etc/ld.so.preload", "/etc/profile.d", "/etc/systemd/system",
              "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/local/bin", "/usr/local/sbin",
              "/root", "/var/spool/cron", "/bin", "/sbin", "/lib")


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def status_fields():
    values = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in FIELDS:
                values[key] = value.strip()
    return values


def read_map(name):
    try:
        with open("/proc/self/" + name) as fh:
            return [" ".join(line.split()) for line in fh if line.strip()]
    except OSError as exc:
        return ["unreadable: %s" % errno_name(exc)]


def setuid_binaries():
    """Visible setuid-root binaries and whether their mount honours setuid."""
    seen, found = set(), []
    for path in SETUID_CANDIDATES:
        try:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            info = os.stat(real)
        except OSError:
            continue
        if info.st_mode & stat.S_ISUID and info.st_uid == 0:
            nosuid = bool(os.statvfs(real).f_flag & os.ST_NOSUID)
            found.append({"path": real, "mode": oct(stat.S_IMODE(info.st_mode)),
                          "nosuid_mount": nosuid})
    return found


def writable_root_paths():
    """Root-owned paths from ROOT_PATHS that access(2) says this uid may write."""
    found = []
    for path in ROOT_PATHS:
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_uid == 0 and not stat.S_ISLNK(info.st_mode) and os.access(path, os.W_OK):
            found.append(path)
    return found


def run(task, out):
    facts = out["facts"]
    try:
        fields = status_fields()
    except OSError as exc:
        out["attempts"].append(attempt("read-status", "control", "error", errno_name(exc), None,
                                       repr(exc)))
        return
    missing = [f for f in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs") if f not in fields]
    out["attempts"].append(attempt("read-status", "control",
                                   "error" if missing else "succeeded", None, None,
                                   "missing: %s" % ",".join(missing) if missing else
                                   "all fields read"))
    if missing:
        return
    facts["status"] = fields
    facts["uid_map"] = read_map("uid_map")
    facts["gid_map"] = read_map("gid_map")
    facts["ids"] = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid()}
    for kind in ("user", "mnt"):
        try:
            facts[kind + "ns"] = os.readlink("/proc/self/ns/" + kind)
        except OSError:
            facts[kind + "ns"] = None
    cap_eff = int(fields["CapEff"], 16)
    cap_bnd = int(fields["CapBnd"], 16)
    if cap_eff:
        out["attempts"].append(attempt("effective-capabilities", "escape", "succeeded", None,
                                       None, "CapEff=%s" % fields["CapEff"]))
    else:
        out["attempts"].append(attempt("effective-capabilities", "escape", "refused", "EPERM",
                                       None, "CapEff=0 CapPrm=%s" % fields["CapPrm"]))
    binaries = setuid_binaries()
    facts["setuid_binaries"] = binaries
    usable = [b["path"] for b in binaries if not b["nosuid_mount"]]
    no_new_privs = fields["NoNewPrivs"] == "1"
    if no_new_privs:
        out["attempts"].append(attempt("setuid-elevation", "escape", "refused", "EPERM", None,
                                       "NoNewPrivs=1: exec cannot gain privilege (%d setuid "
                                       "binaries visible)" % len(binaries)))
    elif not usable:
        out["attempts"].append(attempt("setuid-elevation", "escape", "refused", "ENOENT", None,
                                       "no setuid-root binary on a suid mount is visible"))
    elif not cap_bnd:
        out["attempts"].append(attempt("setuid-elevation", "escape", "refused", "EPERM", None,
                                       "bounding set empty: setuid-root gains no capability"))
    else:
        out["attempts"].append(attempt("setuid-elevation", "escape", "succeeded", None, None,
                                       "NoNewPrivs=0, CapBnd=%s, setuid root: %s"
                                       % (fields["CapBnd"], ",".join(usable))))
    writable = writable_root_paths()
    facts["writable_root_paths"] = writable
    if writable:
        out["attempts"].append(attempt("writable-root-path", "escape", "succeeded", None, None,
                                       "uid %d may write root-owned %s"
                                       % (os.getuid(), ", ".join(writable))))
    else:
        # access(2) answers yes or no per path (EACCES, EROFS...): no single errno to name.
        out["attempts"].append(attempt("writable-root-path", "escape", "refused", None, None,
                                       "access(W_OK) refused for every root-owned path of %d "
                                       "to uid %d" % (len(ROOT_PATHS), os.getuid())))


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
