"""Probe proc_kernel_tunables: the host's kernel tunables and control files, from inside.

Escape attempts:
  cgroup-mkdir        mkdir targets["cgroup_name"] in targets["cgroup_dir"]: a v2 cgroup the
                      harness made on the host and handed to the payload user (the one place
                      in the host's cgroup hierarchy that user may change unconfined); the host
                      looks for the nonce-named group in its own cgroupfs
  cgroup-procs-open   open(O_WRONLY) the root cgroup's cgroup.procs as the payload sees it
  release-agent-open  open(O_WRONLY) a cgroup v1 release_agent, where one is in view
  core-pattern-open   open(O_WRONLY) /proc/sys/kernel/core_pattern
  sysrq-trigger-open  open(O_WRONLY) /proc/sysrq-trigger
  sysctl-open         open(O_WRONLY) /proc/sys/kernel/printk_ratelimit (a harmless tunable)
Safety: the opens write nothing: each descriptor is closed right after open(2) answered, so
no tunable changes, no sysrq command runs (only a written character does that), no process
moves between cgroups and no release agent is set. The only thing made is one empty cgroup
named for the nonce inside the harness's own group, which the host removes.
Each attempt's detail says whether the file is in view (readable); the errno is the answer.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import glob
import json
import os
import sys

PROBE = "proc_kernel_tunables"
START_MARKER = "SANDBOX-ATTEST-START"
ROOT_PROCS = ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs")
CORE_PATTERN = "/proc/sys/kernel/core_pattern"
SYSRQ = "/proc/sysrq-trigger"
SYSCTL = "/proc/sys/kernel/printk_ratelimit"


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def open_for_write(what, path):
    """open(2) `path` write-only and close it at once: nothing is ever written."""
    if path is None:
        return attempt(what, "escape", "refused", "ENOENT", None, "no such file in view")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None,
                       "%s (in view: %s)" % (path, os.path.exists(path)))
    os.close(fd)
    return attempt(what, "escape", "succeeded", None, None,
                   "%s opened for writing (closed, nothing written)" % path)


def first(paths):
    return next((p for p in paths if os.path.exists(p)), None)


def cgroup_mkdir(targets):
    path = os.path.join(targets["cgroup_dir"], targets["cgroup_name"])
    try:
        os.mkdir(path, 0o755)
    except OSError as exc:
        return attempt("cgroup-mkdir", "escape", "refused", errno_name(exc), None,
                       "%s (parent in view: %s)" % (path, os.path.isdir(targets["cgroup_dir"])))
    return attempt("cgroup-mkdir", "escape", "succeeded", None, None, path)


def run(task, out):
    targets = task["targets"]
    facts = out["facts"]
    for kind in ("mnt", "cgroup", "user"):
        try:
            facts[kind + "ns"] = os.readlink("/proc/self/ns/" + kind)
        except OSError:
            facts[kind + "ns"] = None
    facts["uid"] = os.geteuid()
    add = out["attempts"].append
    add(cgroup_mkdir(targets))
    add(open_for_write("cgroup-procs-open", first(ROOT_PROCS)))
    add(open_for_write("release-agent-open",
                       first(sorted(glob.glob("/sys/fs/cgroup/*/release_agent")))))
    add(open_for_write("core-pattern-open", CORE_PATTERN))
    add(open_for_write("sysrq-trigger-open", SYSRQ))
    add(open_for_write("sysctl-open", SYSCTL))


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
        out["attempts"].append(attempt("probe", "escape", "error", errno_name(exc), None,
                                       repr(exc)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
