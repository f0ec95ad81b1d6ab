"""Probe net_proxy_ignored: a runtime that ignores the *_PROXY variables reaches nothing.

Many runtimes and libraries do not read HTTP(S)_PROXY (Node's fetch, a raw socket, Python's
http.client, a library given an empty proxy map): a sandbox whose only cut is the proxy
variable lets them straight out. This payload goes to the ALLOWED host, the one destination
the proxy would admit, without the proxy, so only a cut below the proxy stops it:
  * ``raw-by-address``: a socket to the allowed origin's own address (targets["address"],
    harness-owned: 127.0.0.1 or a lab address), TLS with the CA bundle, GET /ok;
  * ``raw-by-name`` (lab only): the system resolver, then the same, to its answer (dialled only
    if it is on loopback or in the lab's 198.18.0.0/15);
  * ``urllib-no-proxy`` (lab only): urllib with an empty ProxyHandler, as a library that was
    told no proxy would.
Each GET carries the nonce and ``via=<attempt>`` in its query; the allowed origin's access log
is the witness. Control: the same host through the proxy answers 200 with the nonce.
The by-name attempts run only in the lab, where the system resolver is the DNS fixture.

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
import urllib.error
import urllib.request
from urllib.parse import unquote, urlsplit

PROBE = "net_proxy_ignored"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 5.0
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
    if isinstance(exc, socket.gaierror):
        names = {getattr(socket, n): n for n in dir(socket) if n.startswith("EAI_")}
        return names.get(exc.errno, str(exc.errno))
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return errno.errorcode.get(code)
    reason = getattr(exc, "reason", None)  # urllib wraps the socket's error
    return errno_name(reason) if isinstance(reason, OSError) else None


def harness_owned(address):
    try:
        a = [int(x) for x in address.split(".")]
    except ValueError:
        return False
    return len(a) == 4 and (a[0] == 127 or (a[0] == 198 and a[1] in (18, 19)))


def tls_get(what, address, allowed, nonce, ca_bundle):
    """GET /ok over TLS on a socket to `address`, SNI and Host the allowed name."""
    path = "/ok?nonce=%s&via=%s" % (nonce, what)
    try:
        sock = socket.create_connection((address, allowed["https_port"]), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    try:
        ctx = ssl.create_default_context(cafile=ca_bundle)
        conn = http.client.HTTPConnection(allowed["name"], allowed["https_port"], timeout=TIMEOUT)
        conn.sock = ctx.wrap_socket(sock, server_hostname=allowed["name"])
        conn.request("GET", path, headers={"X-Attest-Nonce": nonce})
        answer = conn.getresponse()
        body = answer.read(4096).decode("utf-8", "replace")
        conn.close()
        return attempt(what, "escape", "succeeded", None, answer.status,
                       "direct to %s: %s" % (address, body[:60]))
    except Exception as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def by_name(what, allowed, nonce, ca_bundle):
    try:
        found = socket.getaddrinfo(allowed["name"], allowed["https_port"], socket.AF_INET,
                                   socket.SOCK_STREAM)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    address = found[0][4][0]
    if not harness_owned(address):
        return attempt(what, "escape", "error", None, None,
                       "resolved to %s, not a lab address: not dialled" % address)
    return tls_get(what, address, allowed, nonce, ca_bundle)


def urllib_no_proxy(what, allowed, nonce, ca_bundle):
    url = "https://%s:%d/ok?nonce=%s&via=%s" % (allowed["name"], allowed["https_port"], nonce,
                                                 what)
    ctx = ssl.create_default_context(cafile=ca_bundle)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=ctx))
    request = urllib.request.Request(url, headers={"X-Attest-Nonce": nonce})
    try:
        with opener.open(request, timeout=TIMEOUT) as answer:
            return attempt(what, "escape", "succeeded", None, answer.status, "no proxy used")
    except urllib.error.HTTPError as exc:
        return attempt(what, "escape", "succeeded", None, exc.code, "answered without a proxy")
    except Exception as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))


def get_allowed(proxy_url, allowed, nonce, ca_bundle):
    what = "get-allowed"
    if not proxy_url:
        return attempt(what, "control", "error", None, None, "no proxy: no route")
    parts = urlsplit(proxy_url)
    auth = []
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        auth = ["Proxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode()]
    try:
        sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "control", "refused", errno_name(exc), None, repr(exc))
    try:
        target = "%s:%d" % (allowed["name"], allowed["https_port"])
        lines = ["CONNECT %s HTTP/1.1" % target, "Host: " + target,
                 "X-Attest-Nonce: " + nonce] + auth
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        buf = b""
        while b"\r\n\r\n" not in buf and len(buf) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
        words = buf.split(b"\r\n", 1)[0].split()
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
        if status != 200:
            return attempt(what, "control", "refused", None, status, "CONNECT answered %s" % status)
        ctx = ssl.create_default_context(cafile=ca_bundle)
        conn = http.client.HTTPConnection(allowed["name"], allowed["https_port"], timeout=TIMEOUT)
        conn.sock = ctx.wrap_socket(sock, server_hostname=allowed["name"])
        conn.request("GET", "/ok?nonce=" + nonce, headers={"X-Attest-Nonce": nonce})
        answer = conn.getresponse()
        body = answer.read(65536).decode("utf-8", "replace")
        conn.close()
        ok = answer.status == 200 and nonce in body
        return attempt(what, "control", "succeeded" if ok else "refused", None, answer.status,
                       body[:120])
    except Exception as exc:
        return attempt(what, "control", "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    allowed = targets["allowed"]
    ca_bundle = task["ca_bundle"]
    proxy_url = task_proxy(task)
    try:
        out["facts"]["netns"] = os.readlink("/proc/self/ns/net")
    except OSError:
        out["facts"]["netns"] = None
    address = targets["address"]
    if harness_owned(address):
        out["attempts"].append(tls_get("raw-by-address", address, allowed, nonce, ca_bundle))
    else:
        out["attempts"].append(attempt("raw-by-address", "escape", "error", None, None,
                                       "%s is not harness-owned: not dialled" % address))
    if targets.get("system_resolver") is True:
        out["attempts"].append(by_name("raw-by-name", allowed, nonce, ca_bundle))
        out["attempts"].append(urllib_no_proxy("urllib-no-proxy", allowed, nonce, ca_bundle))
    out["attempts"].append(get_allowed(proxy_url, allowed, nonce, ca_bundle))


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
