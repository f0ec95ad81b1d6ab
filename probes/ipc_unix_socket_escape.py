"""Probe ipc_unix_socket_escape: talk to host daemons over unix sockets.

Escape attempts, each a single ``GET /_ping`` and nothing else:
  * the harness's fake daemon socket (targets["unix"], a host path), with the nonce;
  * the harness's abstract-namespace socket (targets["abstract"], Linux), with the nonce;
  * the real Docker socket at each path in targets["docker_sockets"] that exists. Its answer
    is payload-side evidence only: no harness witness sees it.
Control: ``socket.socketpair()`` works inside (unix sockets as such are usable).
facts["netns"]/["mntns"] let the host tell its own sockets from the sandbox's.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import socket
import sys

PROBE = "ipc_unix_socket_escape"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 3.0


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    if isinstance(exc, socket.timeout):
        return "ETIMEDOUT"
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def ping(what, address, nonce, real_docker=False):
    if real_docker:
        # Only the bare, harmless /_ping: the real daemon is not ours to tag or probe further.
        request = "GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"
    else:
        request = ("GET /_ping?nonce=%s HTTP/1.1\r\nHost: docker\r\nX-Attest-Nonce: %s\r\n"
                   "Connection: close\r\n\r\n" % (nonce, nonce))
    # Creating the socket is part of the attempt: a sandbox that refuses socket(AF_UNIX)
    # itself (srt's and Codex's seccomp filters give EPERM) is refusing this escape.
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        result = attempt(what, "escape", "refused", errno_name(exc), None,
                         "socket(AF_UNIX) refused: %r" % exc)
        result["real_docker"] = real_docker
        return result
    sock.settimeout(TIMEOUT)
    try:
        sock.connect(address)
        sock.sendall(request.encode())
        data = b""
        while b"\r\n" not in data and len(data) < 4096:
            chunk = sock.recv(1024)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        result = attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    else:
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        outcome = "succeeded" if data else "refused"
        result = attempt(what, "escape", outcome, None, status, "reply: %s" % (line or "none"))
    finally:
        sock.close()
    result["real_docker"] = real_docker
    return result


def control():
    try:
        left, right = socket.socketpair()
        with left, right:
            left.sendall(b"ping")
            ok = right.recv(16) == b"ping"
        return attempt("socketpair", "control", "succeeded" if ok else "error", None, None,
                       "socketpair round trip" if ok else "socketpair lost the bytes")
    except OSError as exc:
        return attempt("socketpair", "control", "error", errno_name(exc), None, repr(exc))


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    for key in ("netns", "mntns"):
        try:
            out["facts"][key] = os.readlink("/proc/self/ns/" + key[:-2])
        except OSError:
            out["facts"][key] = None
    out["attempts"].append(control())
    out["attempts"].append(ping("daemon-unix", targets["unix"], nonce))
    if targets.get("abstract"):
        out["attempts"].append(ping("daemon-abstract", "\0" + targets["abstract"], nonce))
    for path in targets.get("docker_sockets") or []:
        if os.path.exists(path):
            out["attempts"].append(ping("docker:" + path, path, nonce, real_docker=True))
        else:
            out["facts"]["absent:" + path] = True


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
