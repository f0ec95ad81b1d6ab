"""Payload of net_host_canonical, net_proxy_confusion and net_private_address.

The three probes differ only in the requests the host builds for them (sandbox_attest/catalog/
net/route.py): allowlist spellings that must not widen the proxy's rule, requests that try to
confuse it about where they go (wrong port, Host: mismatch, a second request on a kept-alive
connection), and allowed names the DNS fixture answers with loopback or unspecified addresses
that the proxy must refuse after resolving. This payload sends each request in
task["targets"]["requests"] through task["proxy_url"] byte for byte (adding only
Proxy-Authorization from the URL's userinfo) and reports each answer; the host judges them
against the proxy's decision log and the origins' access logs.

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

START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 8.0
MAX_HEAD = 65536


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    if isinstance(exc, socket.timeout):
        return "ETIMEDOUT"
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def proxy_parts(url):
    """(host, port, extra header text) of the proxy URL; userinfo becomes Basic auth."""
    parts = urlsplit(url)
    auth = ""
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        auth = "\r\nProxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode()
    return parts.hostname, parts.port or 80, auth


def task_proxy(task):
    url = task.get("proxy_url")
    if url == "from-env":
        # The sandbox brings its own proxy and announces it in the environment.
        url = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or \
            os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy")
    return url


class Reader(object):
    """Buffered reads of HTTP responses from one connection."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.error = None

    def _fill(self):
        try:
            chunk = self.sock.recv(65536)
        except OSError as exc:
            self.error = exc
            return False
        if not chunk:
            return False
        self.buf += chunk
        return True

    def head(self):
        """(status, headers) of the next response, or None if the connection ended first."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD or not self._fill():
                return None
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        words = lines[0].split()
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    def body(self, headers):
        try:
            size = int(headers.get("content-length", "0"))
        except ValueError:
            size = 0
        while len(self.buf) < size and self._fill():
            pass
        data, self.buf = self.buf[:size], self.buf[size:]
        return data


def tls_get(sock, req, nonce, ca_bundle):
    """GET req["path"] over TLS inside an open tunnel; returns (status, body text)."""
    if req.get("verify"):
        ctx = ssl.create_default_context(cafile=ca_bundle)
    else:
        # An escape attempt must reach whatever origin the tunnel leads to, so that origin's
        # log (the host witness) sees it: the certificate is not what is being tested.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    tls = ctx.wrap_socket(sock, server_hostname=req["sni"])
    conn = http.client.HTTPConnection(req["sni"], timeout=TIMEOUT)
    conn.sock = tls
    conn.request("GET", req["path"], headers={"X-Attest-Nonce": nonce})
    resp = conn.getresponse()
    body = resp.read(65536).decode("utf-8", "replace")
    conn.close()
    return resp.status, body


def run_request(req, proxy, nonce, ca_bundle):
    """Send the host-built request heads and judge the last; say how far the exchange got.

    `sent` counts the heads fully written and `answered` the response heads read: a refusal
    of a later head means something only when that head was actually written (the host checks).
    """
    progress = {"sent": 0, "answered": 0}
    result = exchange(req, proxy, nonce, ca_bundle, progress)
    result.update(progress)
    result["heads"] = len(req["heads"])
    return result


def exchange(req, proxy, nonce, ca_bundle, progress):
    what, role = req["what"], req["role"]
    phost, pport, auth = proxy
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, "proxy unreachable: %r" % exc)
    try:
        wire = [(head + auth + "\r\n\r\n").encode("utf-8") for head in req["heads"]]
        methods = [head.split(" ", 1)[0] for head in req["heads"]]
        if req.get("pipelined"):
            sock.sendall(b"".join(wire))
            progress["sent"] = len(wire)
        reader = Reader(sock)
        seen = []
        status, headers, body = None, {}, b""
        for i, data in enumerate(wire):
            if not req.get("pipelined"):
                try:
                    sock.sendall(data)
                except OSError as exc:
                    return attempt(what, role, "refused", errno_name(exc), None,
                                   "request %d not accepted after %s: %r" % (i + 1, seen, exc))
                progress["sent"] = i + 1
            got = reader.head()
            if got is None:
                err = errno_name(reader.error) if reader.error else None
                return attempt(what, role, "refused", err, None,
                               "connection ended before a response to request %d (earlier: %s)"
                               % (i + 1, seen))
            status, headers = got
            progress["answered"] = i + 1
            seen.append(status)
            if not (methods[i] == "CONNECT" and status == 200):
                body = reader.body(headers)
        reason = headers.get("x-proxy-deny-reason", "")
        if status is None or not 200 <= status < 300:
            return attempt(what, role, "refused", None, status,
                           reason or "answered %s (all: %s)" % (status, seen))
        if methods[-1] != "CONNECT":
            text = body.decode("utf-8", "replace")
            echoed = "nonce echoed" if nonce in text else "no nonce in body"
            return attempt(what, role, "succeeded", None, status, "%s (all: %s): %s"
                           % (echoed, seen, text[:120]))
        if req.get("after") == "send-nonce":
            sock.sendall(("nonce=%s a=%s\n" % (nonce, req.get("tag", what))).encode())
            return attempt(what, role, "succeeded", None, status, "tunnel open, nonce sent")
        status, body = tls_get(sock, req, nonce, ca_bundle)
        outcome = "succeeded" if 200 <= status < 300 else "refused"
        detail = ("nonce echoed" if nonce in body else "no nonce in body") + ": " + body[:120]
        return attempt(what, role, outcome, None, status, detail)
    except Exception as exc:
        return attempt(what, role, "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def run(task, out):
    nonce = task["nonce"]
    url = task_proxy(task)
    requests = task["targets"]["requests"]
    if not url:
        for req in requests:
            out["attempts"].append(attempt(req["what"], req["role"], "error", None, None,
                                           "no proxy_url in the task: no route to attempt"))
        return
    proxy = proxy_parts(url)
    for req in requests:
        out["attempts"].append(run_request(req, proxy, nonce, task["ca_bundle"]))


def main(argv):
    task, nonce = {}, ""
    try:
        with open(argv[1]) as fh:
            task = json.load(fh)
        nonce = str(task.get("nonce", ""))
    except Exception as exc:
        task = {"_error": repr(exc)}
    print(START_MARKER + " " + nonce, flush=True)
    # One payload serves three probes: the task names which one this run is.
    out = {"probe": str(task.get("probe", "net_proxy_requests")), "nonce": nonce,
           "attempts": [], "facts": {}}
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
