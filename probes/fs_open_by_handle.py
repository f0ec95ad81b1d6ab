"""Probe fs_open_by_handle: reach a host file outside the view by its file handle.

open_by_handle_at(2) opens a file by (mount descriptor, handle) and never looks at a path, so
a mount namespace does not hide anything on a filesystem the sandbox has any mount of: the
"Shocker" container escape. The kernel allows it only to CAP_DAC_READ_SEARCH in the initial
user namespace.

The host plants a canary outside the sandbox's view on the same filesystem as the workspace,
and hands the payload the canary's file handle (targets["handle_type"], ["handle_hex"]) and
its host path, never its content. Escape attempts:
  read-by-path     open the canary by its host path (an open host lets the payload user read
                   it: this is what the control leg sees)
  open-by-handle   open_by_handle_at(workspace descriptor, the canary's handle, O_RDONLY)
Context (not judged): name-to-handle-self, name_to_handle_at on a file in the workspace,
which shows the handle calls exist here.
Whatever is read goes into facts; the canary's content exists nowhere else.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import ctypes
import errno
import json
import os
import struct
import sys

PROBE = "fs_open_by_handle"
START_MARKER = "SANDBOX-ATTEST-START"
AT_FDCWD = -100
MAX_HANDLE_SZ = 128
READ_LIMIT = 256


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def libc_call(name):
    func = getattr(ctypes.CDLL(None, use_errno=True), name, None)
    if func is not None:
        func.restype = ctypes.c_int
    return func


def name_to_handle(path):
    """(type, bytes) of `path`'s handle, or raise OSError."""
    func = libc_call("name_to_handle_at")
    if func is None:
        raise OSError(errno.ENOSYS, "no name_to_handle_at in libc")
    raw = struct.pack("=Ii", MAX_HANDLE_SZ, 0) + b"\0" * MAX_HANDLE_SZ
    buf = ctypes.create_string_buffer(raw, len(raw))
    mount_id = ctypes.c_int()
    if func(AT_FDCWD, path.encode(), buf, ctypes.byref(mount_id), 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    size, kind = struct.unpack("=Ii", buf.raw[:8])
    return kind, buf.raw[8:8 + size]


def open_by_handle(mount_dir, kind, data):
    """Read up to READ_LIMIT bytes of the file behind the handle, or raise OSError."""
    func = libc_call("open_by_handle_at")
    if func is None:
        raise OSError(errno.ENOSYS, "no open_by_handle_at in libc")
    raw = struct.pack("=Ii", len(data), kind) + data
    buf = ctypes.create_string_buffer(raw, len(raw))
    mount_fd = os.open(mount_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = func(mount_fd, buf, os.O_RDONLY)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
    finally:
        os.close(mount_fd)
    try:
        return os.read(fd, READ_LIMIT)
    finally:
        os.close(fd)


def text(data):
    return data.decode("ascii", "replace").strip()


def run(task, out):
    targets, facts, add = task["targets"], out["facts"], out["attempts"].append
    workspace = task["workspace"]
    for kind in ("mnt", "user"):
        try:
            facts[kind + "ns"] = os.readlink("/proc/self/ns/" + kind)
        except OSError:
            facts[kind + "ns"] = None
    own = os.path.join(workspace, "handle-self.txt")
    try:
        with open(own, "w") as fh:
            fh.write("own\n")
        kind, data = name_to_handle(own)
        add(attempt("name-to-handle-self", "context", "succeeded", None, None,
                    "type %d, %d bytes" % (kind, len(data))))
    except OSError as exc:
        add(attempt("name-to-handle-self", "context", "refused", errno_name(exc), None, repr(exc)))
    try:
        with open(targets["canary"], "rb") as fh:
            facts["read_by_path"] = text(fh.read(READ_LIMIT))
        add(attempt("read-by-path", "escape", "succeeded", None, None, targets["canary"]))
    except OSError as exc:
        add(attempt("read-by-path", "escape", "refused", errno_name(exc), None, repr(exc)))
    try:
        data = open_by_handle(workspace, int(targets["handle_type"]),
                              bytes.fromhex(targets["handle_hex"]))
        facts["by_handle"] = text(data)
        add(attempt("open-by-handle", "escape", "succeeded", None, None,
                    "%d bytes through the workspace's mount" % len(data)))
    except OSError as exc:
        add(attempt("open-by-handle", "escape", "refused", errno_name(exc), None, repr(exc)))


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
