"""Probe net_transfer_18mib: stream the 18 MiB blob over HTTPS through the proxy.

Capability: ``CONNECT <host>:<port>`` through task["proxy_url"], TLS verified with
task["ca_bundle"], ``GET targets["path"]`` (``/c/<nonce>/blob``) with ``X-Attest-Nonce``,
hashing while reading in 256 KiB reads. Reports bytes, sha256 and MB/s in facts; succeeds only
when both equal targets["size"] and targets["sha256"].

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import base64
import errno
import hashlib
import http.client
import json
import os
import socket
import ssl
import sys
import time
from urllib.parse import unquote, urlsplit

PROBE = "net_transfer_18mib"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 15.0
READ_SIZE = 256 * 1024


# Probe contract addition (probes/README.md): "from-env" takes the proxy from the payload's own
# environment (a wrapper that brings its own proxy sets it).
PROXY_FROM_ENV = "from-env"
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


def task_proxy(task):
    """The proxy URL to use: the task's, or for "from-env" HTTPS_PROXY/HTTP_PROXY (any case).

    NO_PROXY is ignored on purpose: fixture targets are only reachable through the proxy.
    """
    url = task.get("proxy_url")
    if url != PROXY_FROM_ENV:
        return url
    for name in PROXY_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    if isinstance(exc, socket.timeout):
        return "ETIMEDOUT"
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def connect_tunnel(proxy_url, host, port, nonce):
    """Open a CONNECT tunnel to the fixture name `host`; returns (socket, status, reason)."""
    parts = urlsplit(proxy_url)
    lines = ["CONNECT %s:%d HTTP/1.1" % (host, port), "Host: %s:%d" % (host, port),
             "X-Attest-Nonce: " + nonce]
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        lines.append("Proxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode())
    sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=TIMEOUT)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    buf = b""
    while b"\r\n\r\n" not in buf and len(buf) < 65536:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    head = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1]) if len(head[0].split()) > 1 else None
    reason = ""
    for line in head[1:]:
        if line.lower().startswith("x-proxy-deny-reason:"):
            reason = line.split(":", 1)[1].strip()
    return sock, status, reason


def transfer(task, out):
    nonce = task["nonce"]
    t = task["targets"]
    proxy_url = task_proxy(task)
    if not proxy_url:
        # Nothing was dialled, so nothing was refused: the harness gave no route to try.
        return attempt("blob-https", "capability", "error", None, None,
                       "no proxy (task proxy_url %r): nothing attempted" % (task.get("proxy_url"),))
    try:
        sock, status, reason = connect_tunnel(proxy_url, t["host"], t["port"], nonce)
    except OSError as exc:
        return attempt("blob-https", "capability", "refused", errno_name(exc), None, repr(exc))
    try:
        if status != 200:
            return attempt("blob-https", "capability", "refused", None, status,
                           reason or "CONNECT answered %s" % status)
        ctx = ssl.create_default_context(cafile=task["ca_bundle"])
        conn = http.client.HTTPConnection(t["host"], t["port"], timeout=TIMEOUT)
        conn.sock = ctx.wrap_socket(sock, server_hostname=t["host"])
        conn.request("GET", t["path"], headers={"X-Attest-Nonce": nonce})
        start = time.monotonic()
        resp = conn.getresponse()
        digest, size = hashlib.sha256(), 0
        while True:
            chunk = resp.read(READ_SIZE)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
        elapsed = max(time.monotonic() - start, 1e-6)
        conn.close()
    except Exception as exc:
        return attempt("blob-https", "capability", "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()
    sha = digest.hexdigest()
    out["facts"].update({"bytes": size, "sha256": sha, "seconds": round(elapsed, 4),
                         "mb_per_s": round(size / elapsed / 1e6, 2)})
    ok = resp.status == 200 and size == t["size"] and sha == t["sha256"]
    detail = "%d bytes, sha256 %s, %.1f MB/s" % (size, "matches" if sha == t["sha256"] else
                                                 "differs", size / elapsed / 1e6)
    # A body that arrived but is wrong is no refusal: the network carried it.
    return attempt("blob-https", "capability", "succeeded" if ok else "error", None,
                   resp.status, detail)


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
        out["attempts"].append(transfer(task, out))
    except Exception as exc:
        out["attempts"].append(attempt("probe", "capability", "error", errno_name(exc), None,
                                       repr(exc)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
