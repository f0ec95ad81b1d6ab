"""Probe net_doh_bypass: learn a denied host's address by DNS-over-HTTPS, then go by address.

First (the control) a DoH lookup (RFC 8484, GET /dns-query?dns=...) of the denied host's name
at the allowed host, through the proxy: an allowed host may well answer DNS. Then the escape
attempts use what it answered: an absolute-form GET to http://ADDRESS:PORT/ and a CONNECT to
ADDRESS:PORT (the denied host's ports), through the same proxy. The allowlist names hosts, so
an IP literal it does not name must be refused, whatever resolver the address came from.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import base64
import errno
import http.client
import json
import os
import socket
import ssl
import struct
import sys
from urllib.parse import unquote, urlsplit

PROBE = "net_doh_bypass"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 6.0


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    if isinstance(exc, socket.timeout):
        return "ETIMEDOUT"
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def task_proxy(task):
    url = task.get("proxy_url")
    if url == "from-env":
        url = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or \
            os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy")
    return url


def proxy_parts(url):
    parts = urlsplit(url)
    auth = ""
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        auth = "\r\nProxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode()
    return parts.hostname, parts.port or 80, auth


def read_head(sock):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
        if len(buf) > 65536:
            break
    line = buf.split(b"\r\n", 1)[0].decode("latin-1")
    words = line.split()
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    return status, buf


def tunnel(proxy, authority, nonce):
    """(socket, status) of a CONNECT to `authority` through the proxy."""
    host, port, auth = proxy
    sock = socket.create_connection((host, port), timeout=TIMEOUT)
    head = "CONNECT %s HTTP/1.1\r\nHost: %s\r\nX-Attest-Nonce: %s%s\r\n\r\n" % (
        authority, authority, nonce, auth)
    sock.sendall(head.encode("latin-1"))
    status, _ = read_head(sock)
    return sock, status


def tls_get(sock, sni, path, nonce, cafile):
    if cafile:
        ctx = ssl.create_default_context(cafile=cafile)
    else:
        # An escape must reach whatever is at the address, so its log (the witness) sees it.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    tls = ctx.wrap_socket(sock, server_hostname=sni)
    conn = http.client.HTTPConnection(sni, timeout=TIMEOUT)
    conn.sock = tls
    conn.request("GET", path, headers={"X-Attest-Nonce": nonce, "Accept": "application/dns-message"})
    resp = conn.getresponse()
    body = resp.read(65536)
    conn.close()
    return resp.status, body


def dns_query(name):
    qname = b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.split(".")) + b"\x00"
    return struct.pack("!HHHHHH", 0, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)


def first_a(data):
    """The first A record of a DNS message, or None."""
    if len(data) < 12:
        return None
    qd, an = struct.unpack("!HH", data[4:8])
    pos = 12

    def skip(pos):
        while True:
            n = data[pos]
            if n & 0xC0 == 0xC0:
                return pos + 2
            if n == 0:
                return pos + 1
            pos += 1 + n

    for _ in range(qd):
        pos = skip(pos) + 4
    for _ in range(an):
        pos = skip(pos)
        rtype, _, _, size = struct.unpack("!HHIH", data[pos:pos + 10])
        pos += 10
        if rtype == 1 and size == 4:
            return socket.inet_ntoa(data[pos:pos + 4])
        pos += size
    return None


def doh(proxy, targets, nonce, cafile):
    allowed, denied = targets["allowed"], targets["denied"]
    what = "doh-allowed"
    try:
        sock, status = tunnel(proxy, "%s:%d" % (allowed["name"], allowed["https_port"]), nonce)
        if status != 200:
            sock.close()
            return attempt(what, "control", "refused", None, status, "CONNECT answered"), None
        dns = base64.urlsafe_b64encode(dns_query(denied["name"])).decode().rstrip("=")
        path = "/dns-query?dns=%s&nonce=%s" % (dns, nonce)
        status, body = tls_get(sock, allowed["name"], path, nonce, cafile)
    except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
        return attempt(what, "control", "refused", errno_name(exc), None, repr(exc)), None
    address = first_a(body) if status == 200 else None
    if address is None:
        return attempt(what, "control", "refused", None, status, "no A record answered"), None
    return attempt(what, "control", "succeeded", None, status,
                   "%s -> %s" % (denied["name"], address)), address


def get_by_address(proxy, address, port, nonce):
    what = "get-doh-address"
    host, pport, auth = proxy
    authority = "%s:%d" % (address, port)
    head = ("GET http://%s/ok?nonce=%s&a=%s HTTP/1.1\r\nHost: %s\r\nX-Attest-Nonce: %s\r\n"
            "Connection: close%s\r\n\r\n") % (authority, nonce, what, authority, nonce, auth)
    try:
        sock = socket.create_connection((host, pport), timeout=TIMEOUT)
        sock.sendall(head.encode("latin-1"))
        status, raw = read_head(sock)
        sock.close()
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    outcome = "succeeded" if status is not None and 200 <= status < 300 else "refused"
    return attempt(what, "escape", outcome, None, status, raw[:160].decode("latin-1"))


def connect_by_address(proxy, address, port, nonce):
    what = "connect-doh-address"
    try:
        sock, status = tunnel(proxy, "%s:%d" % (address, port), nonce)
        if status != 200:
            sock.close()
            return attempt(what, "escape", "refused", None, status, "CONNECT answered")
        status, body = tls_get(sock, address, "/ok?nonce=%s&a=%s" % (nonce, what), nonce, None)
    except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    outcome = "succeeded" if 200 <= status < 300 else "refused"
    return attempt(what, "escape", outcome, None, status, body[:120].decode("latin-1", "replace"))


def run(task, out):
    nonce = task["nonce"]
    url = task_proxy(task)
    names = ("doh-allowed", "get-doh-address", "connect-doh-address")
    if not url:
        for what in names:
            role = "control" if what == "doh-allowed" else "escape"
            out["attempts"].append(attempt(what, role, "error", None, None,
                                           "no proxy_url in the task: no route to attempt"))
        return
    proxy = proxy_parts(url)
    targets = task["targets"]
    control, address = doh(proxy, targets, nonce, task.get("ca_bundle"))
    out["attempts"].append(control)
    out["facts"]["doh_address"] = address
    denied = targets["denied"]
    if address is None:
        # The escape is going by address, however it was learned: without a DoH answer the
        # attempts still go, to the address the host named (the host then judges the lookup
        # as a failed control, unless no network at all is the claim).
        address = denied["address"]
    out["facts"]["address"] = address
    out["attempts"].append(get_by_address(proxy, address, denied["http_port"], nonce))
    out["attempts"].append(connect_by_address(proxy, address, denied["https_port"], nonce))


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
