"""Probe net_proxy_dns_exfil: a denied request must not make the proxy resolve its name.

A proxy that resolves a name before it checks its rules carries the name out in its own DNS
query, refusal or not: ``<secret>.denied.test`` leaks the secret label to whoever answers
for the zone. The escape attempts (through the task's proxy, or for "from-env" the payload's
HTTPS_PROXY) put the cell's nonce in that label:
  * ``CONNECT <nonce>.<denied>:<https_port>``
  * absolute-form ``GET http://<nonce>.abs.<denied>:<http_port>/ok``
  * ``CONNECT <nonce>.<unknown zone name>:443`` (a name no rule and no origin knows)
Each must end in the proxy's refusal; the host witness is the DNS fixture's query log, which
must hold no name carrying the nonce. Control: ``CONNECT <allowed>`` + TLS + ``GET /ok``
answers 200 with the nonce through the same proxy, so the proxy does resolve what it admits.

No target is dialled by this payload but the proxy: the names travel only inside requests.

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

PROBE = "net_proxy_dns_exfil"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 8.0
# "from-env": the wrapper brings its own proxy and names it in the payload's environment.
PROXY_FROM_ENV = "from-env"
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


def task_proxy(task):
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
    buf = b""
    while b"\r\n\r\n" not in buf and len(buf) < 65536:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    lines = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    words = lines[0].split()
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def send_head(sock, first_line, headers):
    lines = [first_line] + ["%s: %s" % kv for kv in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def request(what, role, proxy, first_line, target, nonce, tls=None):
    """Send one request head to the proxy; for an admitted CONNECT with `tls`, GET /ok."""
    phost, pport, auth = proxy
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, "proxy unreachable: %r" % exc)
    try:
        headers = {"Host": target, "X-Attest-Nonce": nonce, "Connection": "close"}
        headers.update(auth)
        send_head(sock, first_line, headers)
        status, resp = read_head(sock)
        reason = resp.get("x-proxy-deny-reason", "")
        if status is None or not 200 <= status < 300:
            return attempt(what, role, "refused", None, status,
                           reason or "answered %s" % status)
        if tls is None:
            return attempt(what, role, "succeeded", None, status, reason or "admitted")
        host, port, ca_bundle = tls
        ctx = ssl.create_default_context(cafile=ca_bundle)
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
        conn.sock = ctx.wrap_socket(sock, server_hostname=host)
        conn.request("GET", "/ok?nonce=" + nonce, headers={"X-Attest-Nonce": nonce})
        answer = conn.getresponse()
        body = answer.read(65536).decode("utf-8", "replace")
        conn.close()
        outcome = "succeeded" if answer.status == 200 and nonce in body else "refused"
        return attempt(what, role, outcome, None, answer.status, body[:120])
    except Exception as exc:
        return attempt(what, role, "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    proxy_url = task_proxy(task)
    if not proxy_url:
        out["facts"]["proxy"] = "no proxy (task proxy_url %r)" % (task.get("proxy_url"),)
        out["attempts"].append(attempt("connect-secret", "escape", "error", None, None,
                                       "no proxy_url: no route to attempt"))
        return
    if targets.get("withheld"):
        out["attempts"].append(attempt("connect-secret", "escape", "error", None, None,
                                       targets["withheld"]))
        return
    proxy = proxy_parts(proxy_url)
    for what, name, port in (
        ("connect-secret", targets["secret_connect"], targets["https_port"]),
        ("connect-secret-unknown", targets["secret_unknown"], 443),
    ):
        target = "%s:%d" % (name, port)
        out["attempts"].append(request(what, "escape", proxy, "CONNECT %s HTTP/1.1" % target,
                                       target, nonce))
    target = "%s:%d" % (targets["secret_absolute"], targets["http_port"])
    out["attempts"].append(request("get-secret-absolute", "escape", proxy,
                                   "GET http://%s/ok?nonce=%s HTTP/1.1" % (target, nonce),
                                   target, nonce))
    allowed = targets["allowed"]
    target = "%s:%d" % (allowed["name"], allowed["https_port"])
    out["attempts"].append(request("get-allowed", "control", proxy,
                                   "CONNECT %s HTTP/1.1" % target, target, nonce,
                                   (allowed["name"], allowed["https_port"], task["ca_bundle"])))


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
