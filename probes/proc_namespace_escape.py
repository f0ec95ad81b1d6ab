"""Probe proc_namespace_escape: join another process's namespaces, or gain mount power.

Every attempt runs in a forked child, so a namespace change never touches the probe itself.
Nothing here may change the host even when the probe runs unconfined, as root where a backend
runs it so (the control leg runs it unconfined), which decides the design:

  * setns is safe anywhere: it only moves the calling child into an existing namespace.
    The anchor (targets["anchor_pid"], used only after its cmdline shows targets["marker"])
    is a host process of the payload's own user, in user, mount and network namespaces that
    user owns: the namespaces an unprivileged user can join when nothing confines it. The
    child joins the anchor's user namespace first (rights over its other namespaces), then:
      setns-mnt   join the anchor's mount namespace; then create
                  ``<targets["canary_dir"]>/<nonce>.setns-mnt``, a path that exists only in
                  the host's mount tree: the host sees the file appear
      setns-net   join the anchor's network namespace; then connect to the anchor's own
                  loopback listener (targets["listener"]) and send
                  ``nonce=<nonce> via=setns-net``: only the anchor can hear it
  * mount, remount and pivot_root are never made in the namespace the probe started in. A
    child first unshares a new mount namespace (``inner:unshare-mnt``, or with a new user
    namespace, ``inner:unshare-userns``), then makes every mount private (MS_REC|MS_PRIVATE)
    and re-reads /proc/self/mountinfo to confirm "/" is no longer shared. Only then:
      remount-rw:<how>   clear read-only on the task file's directory (read-only bound in
                         a sandbox) with MS_REMOUNT|MS_BIND, which changes that one mount's
                         flags in this private namespace and never a filesystem's; if it
                         works, create ``<nonce>.remount`` there: the directory is the host's,
                         so the host sees it
      inner:mount-tmpfs:<how>, inner:pivot-root:<how>   a tmpfs in the workspace, and
                         pivot_root into it: private to the child's namespace, gone with it
    If unsharing fails, or "/" is still shared after MS_PRIVATE, no mount call is made. A new
    mount namespace as root would otherwise propagate mounts back to the host's peer group.
The ``inner:`` attempts never reach the host. Success means the payload can run privileged
mount code in a namespace of its own (kernel attack surface), which is reported, not judged
as an escape.
Controls: the probe reads its own namespace ids and a forked child reports back.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import ctypes
import errno
import json
import os
import platform
import select
import signal
import socket
import sys

PROBE = "proc_namespace_escape"
START_MARKER = "SANDBOX-ATTEST-START"
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REMOUNT = 32
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
CHILD_TIMEOUT_S = 10.0


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {
        "what": what,
        "role": role,
        "outcome": outcome,
        "errno": err,
        "status": status,
        "detail": detail,
    }


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_void_p,
    ]
    lib.syscall.restype = ctypes.c_long
    return lib


def call(what, role, result, detail):
    """An attempt from a libc return value (0 = success, -1 = errno)."""
    if result == 0:
        return attempt(what, role, "succeeded", None, None, detail)
    code = ctypes.get_errno()
    name = errno.errorcode.get(code, str(code))
    return attempt(what, role, "refused", name, None, "%s: %s" % (detail, os.strerror(code)))


def in_child(fn):
    """Run fn(attempts) in a forked child; the attempts it appends come back as JSON."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        result = []
        try:
            fn(result)
        except Exception as exc:  # keep what was done before the failure
            result.append(attempt("child", "escape", "error", errno_name(exc), None, repr(exc)))
        data = json.dumps(result).encode()
        while data:
            data = data[os.write(wfd, data) :]
        os._exit(0)
    os.close(wfd)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([rfd], [], [], CHILD_TIMEOUT_S)
            if not ready:
                os.kill(pid, signal.SIGKILL)  # our own forked child, stuck
                break
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
        os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks).decode())
    except ValueError:
        return [attempt("child", "escape", "error", None, None, "the child sent no report")]


def ns_id(kind, pid="self"):
    try:
        return os.readlink("/proc/%s/ns/%s" % (pid, kind))
    except OSError:
        return None


def verified(pid, marker):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return marker.encode() in fh.read().split(b"\0")
    except OSError:
        return False


def setns_into(kind, flag, pid, marker, after):
    def child(out):
        what = "setns-" + kind
        if not verified(pid, marker):
            out.append(
                attempt(
                    what,
                    "escape",
                    "refused",
                    "ENOENT",
                    None,
                    "the anchor (pid %d with the marker) is not visible" % pid,
                )
            )
            return
        lib = libc()
        fds = {}
        try:
            for name in ("user", kind):
                fds[name] = os.open("/proc/%d/ns/%s" % (pid, name), os.O_RDONLY)
        except OSError as exc:
            out.append(attempt(what, "escape", "refused", errno_name(exc), None, repr(exc)))
            for fd in fds.values():
                os.close(fd)
            return
        try:
            # The anchor's namespaces belong to its user namespace: joining that one first
            # gives the rights over them that its owner has (nothing, if we are not its owner).
            if ns_id("user", pid) != ns_id("user"):
                joined = call(
                    what,
                    "escape",
                    lib.setns(fds["user"], CLONE_NEWUSER),
                    "setns(/proc/%d/ns/user)" % pid,
                )
                if joined["outcome"] != "succeeded":
                    out.append(joined)
                    return
            result = call(
                what, "escape", lib.setns(fds[kind], flag), "setns(/proc/%d/ns/%s)" % (pid, kind)
            )
        finally:
            for fd in fds.values():
                os.close(fd)
        out.append(result)
        if result["outcome"] == "succeeded":
            result["detail"] += "; now in %s; %s" % (ns_id(kind), after())

    return in_child(child)


def root_is_shared():
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 6 and fields[4] == "/":
                optional = fields[6 : fields.index("-")]
                if any(f.startswith("shared:") for f in optional):
                    return True
    return False


def mount_attempts(out, lib, how, task_dir, target, nonce):
    """In a fresh private mount namespace only: remount-rw, tmpfs, pivot_root."""
    done = call(
        "inner:make-private:" + how,
        "escape",
        lib.mount(None, b"/", None, MS_REC | MS_PRIVATE, None),
        "mount --make-rprivate /",
    )
    out.append(done)
    if done["outcome"] != "succeeded" or root_is_shared():
        out.append(
            attempt(
                "inner:abort:" + how,
                "escape",
                "refused",
                None,
                None,
                "mounts could not be made private: no mount call is made",
            )
        )
        return
    remount = call(
        "remount-rw:" + how,
        "escape",
        lib.mount(None, task_dir.encode(), None, MS_REMOUNT | MS_BIND, None),
        "remount %s read-write (bind flags only)" % task_dir,
    )
    out.append(remount)
    if remount["outcome"] == "succeeded":
        try:
            with open(os.path.join(task_dir, nonce + ".remount"), "x") as fh:
                fh.write(nonce + "\n")
            remount["detail"] += "; wrote %s.remount" % nonce
        except OSError as exc:
            remount["detail"] += "; but the write failed: %r" % exc
    # The target dir was made before unsharing: in a new user namespace with no uid map,
    # creating files fails with EOVERFLOW.
    tmpfs = call(
        "inner:mount-tmpfs:" + how,
        "escape",
        lib.mount(b"kiln-scratch", target.encode(), b"tmpfs", 0, None),
        "mount tmpfs on %s" % target,
    )
    out.append(tmpfs)
    nr = PIVOT_ROOT.get(platform.machine())
    if tmpfs["outcome"] == "succeeded" and nr is not None:
        # pivot_root(".", ".") stacks the old root on the new one: no put_old dir to create.
        os.chdir(target)
        ctypes.set_errno(0)
        result = lib.syscall(ctypes.c_long(nr), b".", b".")
        out.append(
            call(
                "inner:pivot-root:" + how,
                "escape",
                0 if result == 0 else -1,
                "pivot_root(%s)" % target,
            )
        )


def unshare_then_mount(flags, how, task_dir, workspace, nonce):
    target = os.path.join(workspace, "ns-" + how)
    os.makedirs(target, exist_ok=True)

    def child(out):
        lib = libc()
        before = ns_id("mnt")
        first = call("inner:unshare-" + how, "escape", lib.unshare(flags), "unshare(0x%x)" % flags)
        out.append(first)
        if first["outcome"] != "succeeded":
            return
        after = ns_id("mnt")
        first["detail"] += "; mnt %s -> %s" % (before, after)
        if after is None or after == before:
            out.append(
                attempt(
                    "inner:abort:" + how,
                    "escape",
                    "refused",
                    None,
                    None,
                    "mount namespace did not change: no mount call is made",
                )
            )
            return
        mount_attempts(out, lib, how, task_dir, target, nonce)

    return in_child(child)


def run(task, out, task_path):
    targets = task["targets"]
    nonce = task["nonce"]
    pid = int(targets["anchor_pid"])
    marker = targets["marker"]
    facts = out["facts"]
    for kind in ("mnt", "net", "user", "pid"):
        facts[kind + "ns"] = ns_id(kind)
    ok = all(facts[k + "ns"] for k in ("mnt", "net", "user"))
    out["attempts"].append(
        attempt(
            "read-own-ns",
            "control",
            "succeeded" if ok else "error",
            None,
            None,
            "mnt/net/user ids read: %s" % ok,
        )
    )
    out["attempts"].extend(
        in_child(
            lambda got: got.append(
                attempt("fork-child", "control", "succeeded", None, None, "pid %d" % os.getpid())
            )
        )
    )

    def write_canary():
        path = os.path.join(targets["canary_dir"], nonce + ".setns-mnt")
        try:
            with open(path, "x") as fh:
                fh.write(nonce + "\n")
            return "created " + path
        except OSError as exc:
            return "could not create %s: %r" % (path, exc)

    def reach_listener():
        host, _, port = targets["listener"].rpartition(":")
        try:
            with socket.create_connection((host, int(port)), 3) as sock:
                sock.sendall(("nonce=%s via=setns-net\n" % nonce).encode())
            return "connected to " + targets["listener"]
        except OSError as exc:
            return "listener not reached: %r" % exc

    out["attempts"].extend(setns_into("mnt", CLONE_NEWNS, pid, marker, write_canary))
    out["attempts"].extend(setns_into("net", CLONE_NEWNET, pid, marker, reach_listener))
    task_dir = os.path.dirname(os.path.abspath(task_path))
    workspace = task["workspace"]
    out["attempts"].extend(unshare_then_mount(CLONE_NEWNS, "mnt", task_dir, workspace, nonce))
    out["attempts"].extend(
        unshare_then_mount(CLONE_NEWUSER | CLONE_NEWNS, "userns", task_dir, workspace, nonce)
    )


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
        run(task, out, argv[1])
    except Exception as exc:
        out["attempts"].append(
            attempt("probe", "escape", "error", errno_name(exc), None, repr(exc))
        )
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
