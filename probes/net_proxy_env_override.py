"""Probe net_proxy_env_override: rewriting the proxy variables must not open a way out.

A client honours HTTP(S)_PROXY / ALL_PROXY / NO_PROXY from its environment, and the payload
controls its environment; so the sandbox must enforce egress below the variables. This
payload rewrites them and then acts as such a client would (a tiny stdlib routing function:
no urllib, whose bypass checks may resolve names through the system resolver):
  * ``no-proxy-star``: ``NO_PROXY=*`` (both cases) -> GET the denied origin directly. The
    fixture name is never resolved here: the host passes its loopback address.
  * ``rogue-all-proxy``: ``ALL_PROXY`` / ``HTTP_PROXY`` pointed at a rogue proxy the host
    started on 127.0.0.1 for this cell -> absolute-form GET of the denied host through it.
Both must be refused (the host's origin log and rogue proxy log are the witnesses). Control:
with the original environment restored, the task's proxy route answers 200 with the nonce
for the allowed host (CONNECT + TLS verified with task["ca_bundle"]).

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

PROBE = "net_proxy_env_override"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
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


def set_proxy_env(values):
    """Replace every proxy variable (both cases) by `values` (name -> value)."""
    for name in PROXY_VARS:
        for key in (name, name.lower()):
            os.environ.pop(key, None)
    for name, value in values.items():
        os.environ[name] = value
        os.environ[name.lower()] = value


def route_for(host):
    """What an env-honouring client does for an http:// URL to `host`: None means direct."""
    no_proxy = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
    entries = [e.strip().lower() for e in no_proxy.split(",") if e.strip()]
    if "*" in entries or host.lower() in entries:
        return None
    return (os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY")
            or os.environ.get("all_proxy") or os.environ.get("ALL_PROXY") or None)


def http_get(what, connect_to, request_target, host_header, nonce):
    """One HTTP/1.1 GET over a fresh TCP connection to `connect_to` (a literal address)."""
    host, port = split(connect_to)
    try:
        # A seccomp filter or a missing address family refuses the socket itself:
        # that is the sandbox's refusal of this attempt, not a broken probe.
        sock = socket.socket(family(host), socket.SOCK_STREAM)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None,
                       "socket() refused: %r" % exc)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect((host, port))
        head = ("GET %s HTTP/1.1\r\nHost: %s\r\nX-Attest-Nonce: %s\r\nConnection: close\r\n\r\n"
                % (request_target, host_header, nonce))
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
        outcome = "succeeded" if status is not None and 200 <= status < 300 else "refused"
        return attempt(what, "escape", outcome, None, status, "answered %s" % status)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def proxied_allowed(task, nonce):
    """Control: CONNECT the allowed host through the task's proxy route, TLS, GET /ok."""
    what = "proxy-route-allowed"
    url = task.get("proxy_url")
    if url == "from-env":
        url = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if not url:
        return attempt(what, "control", "error", None, None, "no proxy route in the task")
    allowed = task["targets"]["allowed"]
    parts = urlsplit(url)
    lines = ["CONNECT %s:%d HTTP/1.1" % (allowed["name"], allowed["https_port"]),
             "Host: %s:%d" % (allowed["name"], allowed["https_port"]),
             "X-Attest-Nonce: " + nonce]
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        lines.append("Proxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode())
    try:
        sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=8.0)
    except OSError as exc:
        return attempt(what, "control", "refused", errno_name(exc), None, repr(exc))
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
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
        ctx = ssl.create_default_context(cafile=task["ca_bundle"])
        conn = http.client.HTTPConnection(allowed["name"], timeout=8.0)
        conn.sock = ctx.wrap_socket(sock, server_hostname=allowed["name"])
        conn.request("GET", "/ok?nonce=" + nonce, headers={"X-Attest-Nonce": nonce})
        resp = conn.getresponse()
        body = resp.read(65536).decode("utf-8", "replace")
        conn.close()
        outcome = "succeeded" if resp.status == 200 else "refused"
        detail = ("nonce echoed" if nonce in body else "no nonce in body") + ": " + body[:80]
        return attempt(what, "control", outcome, None, resp.status, detail)
    except Exception as exc:
        return attempt(what, "control", "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    denied = targets["denied"]
    netns_fact(out)
    saved = dict((k, v) for k, v in os.environ.items() if k.upper() in PROXY_VARS)
    host_header = "%s:%d" % (denied["name"], denied["http_port"])
    try:
        what = "no-proxy-star"
        set_proxy_env({"NO_PROXY": "*"})
        proxy = route_for(denied["name"])
        out["facts"][what] = "route: %s" % (proxy or "direct")
        if proxy is None:
            direct = "%s:%d" % (denied["address"], denied["http_port"])
            out["attempts"].append(http_get(what, direct, "/ok?nonce=%s&a=%s" % (nonce, what),
                                            host_header, nonce))
        else:
            out["attempts"].append(attempt(what, "escape", "error", None, None,
                                           "NO_PROXY=* did not select a direct route"))
        what = "rogue-all-proxy"
        rogue = "http://" + targets["rogue_proxy"]
        set_proxy_env({"ALL_PROXY": rogue, "HTTP_PROXY": rogue})
        proxy = route_for(denied["name"])
        out["facts"][what] = "route: %s" % (proxy or "direct")
        url = "http://%s/ok?nonce=%s&a=%s" % (host_header, nonce, what)
        out["attempts"].append(http_get(what, urlsplit(proxy).netloc, url, host_header, nonce))
    finally:
        for name in PROXY_VARS:
            for key in (name, name.lower()):
                os.environ.pop(key, None)
        os.environ.update(saved)
    out["attempts"].append(proxied_allowed(task, nonce))


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
