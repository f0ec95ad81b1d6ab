"""Probe net_denied_host: the egress proxy must refuse the denied fixture host.

Escape attempts (through task["proxy_url"], the only egress route of every leg):
  * absolute-form ``GET http://denied.test:<http_port>/ok?nonce=N``
  * ``CONNECT denied.test:<https_port>`` (then, if it were admitted, GET /ok over TLS)
Both carry ``X-Attest-Nonce: N``; the expected answer is 403 with ``X-Proxy-Deny-Reason``.
Control: ``CONNECT allowed.test:<https_port>`` + TLS (verified with task["ca_bundle"]) +
``GET /ok?nonce=N`` answers 200 with the nonce, through the same proxy, in the same run.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import base64
import errno
import http.client
import json
import os
import socket
import ssl
import sys
from urllib.parse import unquote, urlsplit

PROBE = "net_denied_host"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 8.0


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


def proxy_parts(url):
    parts = urlsplit(url)
    headers = {}
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    return parts.hostname, parts.port or 80, headers


def read_head(sock):
    """Read a status line and headers (max 64 KiB); returns (status, headers)."""
    buf = b""
    while b"\r\n\r\n" not in buf and len(buf) < 65536:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    lines = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if len(lines[0].split()) > 1 else None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def send_head(sock, first_line, headers):
    lines = [first_line] + ["%s: %s" % kv for kv in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def tls_get_ok(sock, host, port, nonce, ca_bundle):
    ctx = ssl.create_default_context(cafile=ca_bundle)
    tls = ctx.wrap_socket(sock, server_hostname=host)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    conn.sock = tls
    conn.request("GET", "/ok?nonce=" + nonce, headers={"X-Attest-Nonce": nonce})
    resp = conn.getresponse()
    body = resp.read(65536).decode("utf-8", "replace")
    conn.close()
    return resp.status, body


def via_connect(what, role, proxy, host, port, nonce, ca_bundle):
    phost, pport, auth = proxy
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, "proxy unreachable: %r" % exc)
    try:
        target = "%s:%d" % (host, port)
        headers = {"Host": target, "X-Attest-Nonce": nonce}
        headers.update(auth)
        send_head(sock, "CONNECT %s HTTP/1.1" % target, headers)
        status, resp_headers = read_head(sock)
        reason = resp_headers.get("x-proxy-deny-reason", "")
        if status != 200:
            return attempt(what, role, "refused", None, status, reason or "CONNECT answered %s" % status)
        status, body = tls_get_ok(sock, host, port, nonce, ca_bundle)
        outcome = "succeeded" if status == 200 else "refused"
        detail = ("nonce echoed" if nonce in body else "no nonce in body") + ": " + body[:120]
        return attempt(what, role, outcome, None, status, detail)
    except Exception as exc:
        return attempt(what, role, "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def absolute_form(what, proxy, host, port, nonce):
    phost, pport, auth = proxy
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, "proxy unreachable: %r" % exc)
    try:
        target = "%s:%d" % (host, port)
        headers = {"Host": target, "X-Attest-Nonce": nonce, "Connection": "close"}
        headers.update(auth)
        send_head(sock, "GET http://%s/ok?nonce=%s HTTP/1.1" % (target, nonce), headers)
        status, resp_headers = read_head(sock)
        reason = resp_headers.get("x-proxy-deny-reason", "")
        outcome = "succeeded" if status is not None and 200 <= status < 300 else "refused"
        return attempt(what, "escape", outcome, None, status, reason or "answered %s" % status)
    except Exception as exc:
        return attempt(what, "escape", "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    proxy_url = task_proxy(task)
    if not proxy_url:
        out["facts"]["proxy"] = "no proxy (task proxy_url %r): no route to attempt" % (
            task.get("proxy_url"),)
        out["attempts"].append(attempt("get-denied-absolute", "escape", "error", None, None,
                                       "no proxy_url"))
        return
    proxy = proxy_parts(proxy_url)
    denied, allowed = targets["denied"], targets["allowed"]
    # Fixture names go on the wire as names: in the lab world the system resolver gives them
    # lab addresses, so a wrapper's own proxy resolves them as it would real hosts.
    out["attempts"].append(absolute_form("get-denied-absolute", proxy, denied["name"],
                                         denied["http_port"], nonce))
    out["attempts"].append(via_connect("connect-denied", "escape", proxy, denied["name"],
                                       denied["https_port"], nonce, task["ca_bundle"]))
    out["attempts"].append(via_connect("get-allowed", "control", proxy, allowed["name"],
                                       allowed["https_port"], nonce, task["ca_bundle"]))


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
