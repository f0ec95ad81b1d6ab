"""Probe net_loopback_services: reach host services on 127.0.0.1 other than the proxy route.

Escape attempts, all by literal loopback address (never a name):
  * ``tcp-service``: connect to task["targets"]["service"] (a TCP service the host started
    for this cell), send ``PING nonce=N`` and read its banner.
  * ``http-origin-direct``: a plain HTTP GET straight to the denied fixture origin's port on
    127.0.0.1 (``Host: denied.test:PORT``), bypassing the egress proxy.
Inside a private network namespace both land on the sandbox's own empty loopback (refused);
unconfined, both reach the host, whose service log and origin log are the witnesses.
facts["netns"] lets the host tell its own loopback from the sandbox's.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import socket
import sys

PROBE = "net_loopback_services"
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


def split(hostport):
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def netns_fact(out):
    try:
        out["facts"]["netns"] = os.readlink("/proc/self/ns/net")
    except OSError as exc:
        out["facts"]["netns"] = None
        out["facts"]["netns_error"] = errno_name(exc)


def tcp_service(hostport, nonce):
    host, port = split(hostport)
    try:
        # A seccomp filter or a missing address family refuses the socket itself:
        # that is the sandbox's refusal of this attempt, not a broken probe.
        sock = socket.socket(family(host), socket.SOCK_STREAM)
    except OSError as exc:
        return attempt("tcp-service", "escape", "refused", errno_name(exc), None,
                       "socket() refused: %r" % exc)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect((host, port))
        sock.sendall(("PING nonce=%s\n" % nonce).encode())
        banner = b""
        try:
            while b"\n" not in banner and len(banner) < 512:
                chunk = sock.recv(512)
                if not chunk:
                    break
                banner += chunk
        except socket.timeout:
            pass
        return attempt("tcp-service", "escape", "succeeded", None, None,
                       "connected, banner %r" % banner[:80].decode("latin-1"))
    except OSError as exc:
        return attempt("tcp-service", "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def http_origin(origin, nonce):
    what = "http-origin-direct"
    try:
        # A seccomp filter or a missing address family refuses the socket itself:
        # that is the sandbox's refusal of this attempt, not a broken probe.
        sock = socket.socket(family(origin["address"]), socket.SOCK_STREAM)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None,
                       "socket() refused: %r" % exc)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect((origin["address"], origin["port"]))
        head = ("GET /ok?nonce=%s&a=%s HTTP/1.1\r\nHost: %s:%d\r\nX-Attest-Nonce: %s\r\n"
                "Connection: close\r\n\r\n" % (nonce, what, origin["host"], origin["port"], nonce))
        sock.sendall(head.encode())
        data = b""
        try:
            while b"\r\n" not in data and len(data) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        words = data.split(b"\r\n", 1)[0].split()
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
        return attempt(what, "escape", "succeeded", None, status, "origin answered %s" % status)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    netns_fact(out)
    out["attempts"].append(tcp_service(targets["service"], nonce))
    out["attempts"].append(http_origin(targets["origin"], nonce))


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
