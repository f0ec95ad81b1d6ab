"""Probe proc_cross_process: read, write and signal a harness-made process outside the sandbox.

The host starts one "target" process per cell, as the payload user and outside any sandbox.
Its argv carries targets["marker"]; it holds a secret in memory that exists nowhere else (not
in the task: only its address and length, targets["secret_addr"]/["secret_len"]), two
mailbox buffers it watches, and it logs every SIGUSR1 it receives with the sender's pid on a
pipe only the harness reads. Escape attempts, each on that process only:
  vm-readv      process_vm_readv of the secret (the bytes read go into facts)
  vm-writev     process_vm_writev of "v:<nonce>" into mailbox 1
  mem-read      pread of /proc/<pid>/mem at the secret
  mem-write     pwrite of "m:<nonce>" into mailbox 2 through /proc/<pid>/mem
  signal-usr1   kill(pid, SIGUSR1): a real signal, which the target blocks and logs
Where the target is: the pid whose /proc/<pid>/cmdline carries the marker; where this /proc
shows no such process (a sandbox may filter /proc or mount its own), the host pid it was
given, targets["target_pid"] (facts "attempted_pid"): in the host's pid namespace that is the
target whatever /proc shows, and the host judges an unlisted target only there. "verified":
the target's memory at targets["tag_addr"] holds the marker (read like the secret).
Safety: the given pid is never this process or its parent. Inside a pid namespace of its own
the host's pid number may be another process of the sandbox: reads there are harmless (the
host compares what came back with the secret), the two mailbox writes land only where the
payload may already write (the same ptrace access check), and the one act that could end a
process, SIGUSR1, goes only to a verified target: unverified, it is kill(pid, 0), which
delivers nothing. Writes go only to the addresses the target published.
Controls: this process finds itself the same way, and delivers SIGUSR1 to itself.
Context (not judged): process_vm_readv and /proc/self/mem on its own memory, which say
whether the method itself is filtered inside.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import ctypes
import errno
import json
import os
import signal
import sys
import time

PROBE = "proc_cross_process"
START_MARKER = "SANDBOX-ATTEST-START"
MAILBOX_LEN = 64


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def carries(pid, marker):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return marker.encode() in fh.read().split(b"\0")
    except OSError:
        return False


def find(marker, hint):
    """The pid carrying `marker`: the host's pid if it is that process here, else a scan."""
    if carries(hint, marker):
        return hint
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if name.isdigit() and carries(int(name), marker):
            return int(name)
    return None


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def vm_call(name, pid, local, remote_addr, length):
    """process_vm_readv/writev through libc, in a forked child; (count, errno name, bytes).

    A seccomp filter may kill the caller instead of failing the call (nsjail's shipped
    configs: KILL_PROCESS for ptrace and process_vm_readv/writev): a child that dies of a
    signal is a refusal named by it ("SIGSYS"), and the probe lives to report it. A call on
    the payload's own pid (the control) is made on the child's own pid, whose memory is the
    same copy at the same addresses: a child may not read its parent where Yama restricts
    ptrace to descendants, and the control must not fail for that. The child sends back what
    it read into `local` (its copy of the buffer).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    func = getattr(libc, name, None)
    if func is None:
        return -1, "ENOSYS", b""
    func.restype = ctypes.c_ssize_t
    func.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong,
                     ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.c_ulong]
    on_self = pid == os.getpid()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            target = os.getpid() if on_self else pid
            lvec = IoVec(ctypes.addressof(local), length)
            rvec = IoVec(remote_addr, length)
            done = func(target, ctypes.byref(lvec), 1, ctypes.byref(rvec), 1, 0)
            code = ctypes.get_errno() if done < 0 else 0
            got = local.raw[:done] if done > 0 else b""
            os.write(write_end, ("%d %d " % (done, code)).encode() + got)
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return -1, signal.Signals(number).name, b""
        except ValueError:
            return -1, "signal %d" % number, b""
    try:
        done, code, got = b"".join(chunks).split(b" ", 2)
        done, code = int(done), int(code)
    except ValueError:
        return -1, "EIO", b""
    if done < 0:
        return -1, errno.errorcode.get(code, str(code)), b""
    return done, None, got


def vm_read(pid, addr, length):
    buf = ctypes.create_string_buffer(length)
    count, err, got = vm_call("process_vm_readv", pid, buf, addr, length)
    return (got[:count] if count >= 0 else None), err


def mem_read(pid, addr, length):
    fd = os.open("/proc/%d/mem" % pid, os.O_RDONLY)
    try:
        return os.pread(fd, length, addr)
    finally:
        os.close(fd)


def text(data):
    return data.decode("ascii", "replace") if data is not None else None


def controls(out):
    me = os.getpid()
    try:
        ok = str(me) in os.listdir("/proc") and os.path.getsize("/proc/%d/cmdline" % me) >= 0
    except OSError:
        ok = False
    out["attempts"].append(attempt("find-self", "control", "succeeded" if ok else "refused",
                                   None, None, "own pid %d in /proc: %s" % (me, ok)))
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    try:
        os.kill(me, signal.SIGUSR1)
        deadline = time.monotonic() + 1.0
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGUSR1, old)
    out["attempts"].append(attempt("signal-self", "control", "succeeded" if got else "refused",
                                   None, None, "SIGUSR1 to own pid delivered: %s" % bool(got)))
    own = ctypes.create_string_buffer(b"own-memory-check", 16)
    data, err = vm_read(me, ctypes.addressof(own), 16)
    out["attempts"].append(attempt("vm-readv-self", "context",
                                   "succeeded" if data == own.raw[:16] else "refused", err, None,
                                   "process_vm_readv of own memory"))
    try:
        same = mem_read(me, ctypes.addressof(own), 16) == own.raw[:16]
        out["attempts"].append(attempt("mem-read-self", "context",
                                       "succeeded" if same else "refused", None, None,
                                       "/proc/self/mem read"))
    except OSError as exc:
        out["attempts"].append(attempt("mem-read-self", "context", "refused", errno_name(exc),
                                       None, repr(exc)))


def tagged(pid, targets):
    """Whether `pid`'s memory at targets["tag_addr"] holds the marker (either way of reading)."""
    marker = targets["marker"].encode()
    addr = int(targets.get("tag_addr") or 0)
    if not addr:
        return False
    data, _ = vm_read(pid, addr, len(marker))
    if data == marker:
        return True
    try:
        return mem_read(pid, addr, len(marker)) == marker
    except OSError:
        return False


def escapes(task, out, pid, verified):
    targets, nonce, facts = task["targets"], str(task["nonce"]), out["facts"]
    addr, length = int(targets["secret_addr"]), int(targets["secret_len"])
    boxes = [int(b) for b in targets["mailboxes"]]
    add = out["attempts"].append
    if pid is None:
        why = "no process carrying the marker is visible here: nothing attempted"
        for what in ("vm-readv", "vm-writev", "mem-read", "mem-write", "signal-usr1"):
            add(attempt(what, "escape", "refused", "ESRCH", None, why))
        return
    data, err = vm_read(pid, addr, length)
    facts["vm_readv"] = text(data)
    add(attempt("vm-readv", "escape", "succeeded" if data else "refused", err, None,
                "pid %d, %d bytes" % (pid, len(data or b""))))
    payload = ("v:" + nonce).encode()[:MAILBOX_LEN]
    local = ctypes.create_string_buffer(payload, len(payload))
    count, err, _ = vm_call("process_vm_writev", pid, local, boxes[0], len(payload))
    add(attempt("vm-writev", "escape", "succeeded" if count > 0 else "refused", err, None,
                "pid %d mailbox 1, %d bytes" % (pid, max(count, 0))))
    try:
        facts["mem_read"] = text(mem_read(pid, addr, length))
        add(attempt("mem-read", "escape", "succeeded", None, None, "pid %d" % pid))
    except OSError as exc:
        add(attempt("mem-read", "escape", "refused", errno_name(exc), None, repr(exc)))
    try:
        fd = os.open("/proc/%d/mem" % pid, os.O_WRONLY)
        try:
            written = os.pwrite(fd, ("m:" + nonce).encode()[:MAILBOX_LEN], boxes[1])
        finally:
            os.close(fd)
        add(attempt("mem-write", "escape", "succeeded", None, None,
                    "pid %d mailbox 2, %d bytes" % (pid, written)))
    except OSError as exc:
        add(attempt("mem-write", "escape", "refused", errno_name(exc), None, repr(exc)))
    # Checked again right before the signal: SIGUSR1's default action ends a process, so it
    # goes only to the process that carries the marker now; unverified, signal 0 only.
    if not verified:
        try:
            os.kill(pid, 0)
            add(attempt("signal-usr1", "escape", "succeeded", None, None,
                        "kill(%d, 0) ok: unverified target, so no real signal" % pid))
        except OSError as exc:
            add(attempt("signal-usr1", "escape", "refused", errno_name(exc), None,
                        "kill(%d, 0), unverified target: %r" % (pid, exc)))
        return
    if not (carries(pid, targets["marker"]) or tagged(pid, targets)):
        add(attempt("signal-usr1", "escape", "refused", "ESRCH", None, "target gone"))
        return
    try:
        os.kill(pid, signal.SIGUSR1)
        add(attempt("signal-usr1", "escape", "succeeded", None, None, "pid %d" % pid))
    except OSError as exc:
        add(attempt("signal-usr1", "escape", "refused", errno_name(exc), None, repr(exc)))


def run(task, out):
    targets = task["targets"]
    facts = out["facts"]
    for kind in ("pid", "user"):
        try:
            facts[kind + "ns"] = os.readlink("/proc/self/ns/" + kind)
        except OSError:
            facts[kind + "ns"] = None
    controls(out)
    given = int(targets["target_pid"])
    pid = find(targets["marker"], given)
    facts["found_pid"] = pid
    verified = pid is not None
    if pid is None and given > 1 and given not in (os.getpid(), os.getppid()):
        # Not listed here: the host pid it was given (the module docstring's safety rules).
        pid = given
        verified = tagged(pid, targets)
    facts["attempted_pid"] = pid
    facts["verified"] = verified
    escapes(task, out, pid, verified)


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
