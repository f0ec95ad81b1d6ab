"""Probe net_socks5: no SOCKS5 route around the proxy's allowlist, TCP or UDP.

Many sandboxes export a SOCKS endpoint (``ALL_PROXY=socks5h://...``) beside their HTTP proxy.
For each SOCKS endpoint the environment names (ALL_PROXY, all_proxy, SOCKS_PROXY, SOCKS5_PROXY,
scheme socks*) and for the sanctioned proxy's own port (the task's proxy, "route"):
  * ``socks5-connect:<where>``: no-auth greeting, CONNECT by name to the denied host's HTTP
    port, then ``GET /ok?nonce=N`` if the relay says yes;
  * ``socks5-udp:<where>``: UDP ASSOCIATE, then one datagram with the nonce to the harness's
    direct-egress UDP listener through the relay, if the relay is on loopback or the lab.
Each must be refused. Control: the allowed host through the sanctioned HTTP proxy (CONNECT +
TLS + GET /ok answers 200 with the nonce). Witnesses (host): the denied origin's log, the
proxy's decision log, the direct-egress UDP listener's log. No address is ever dialled but the
endpoints the environment or the task names and a relay address on loopback or in the lab.

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
import threading
from urllib.parse import unquote, urlsplit

PROBE = "net_socks5"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 8.0
# An HTTP proxy that gets a SOCKS greeting waits for a request line that never comes: this
# long without an answer is its refusal, and keeps the probe well under a second per endpoint.
GREETING_WAIT = 0.5
PROXY_FROM_ENV = "from-env"
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
SOCKS_ENV = ("ALL_PROXY", "all_proxy", "SOCKS_PROXY", "socks_proxy", "SOCKS5_PROXY",
             "socks5_proxy")


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


def harness_owned(address):
    """Loopback or the lab's ranges: the only relay addresses this probe sends a datagram to."""
    if address in ("::1",):
        return True
    try:
        a = [int(x) for x in address.split(".")]
    except ValueError:
        return address.lower().startswith("2001:db8:")
    return len(a) == 4 and (a[0] == 127 or (a[0] == 198 and a[1] in (18, 19)))


def recv_exact(sock, size):
    buf = b""
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes: %r" % (len(buf), size, buf[:60]))
        buf += chunk
    return buf


def greet(sock):
    """The no-auth greeting; None when the endpoint chose no-auth, else why not."""
    sock.sendall(b"\x05\x01\x00")
    sock.settimeout(GREETING_WAIT)
    try:
        reply = sock.recv(64)
    except socket.timeout:
        return "no SOCKS answer to the greeting within %.1fs" % GREETING_WAIT
    sock.settimeout(TIMEOUT)
    if reply[:2] == b"\x05\x00":
        return None
    return "greeting answered %r" % reply[:40]


def read_reply(sock):
    """A SOCKS5 reply: (code, bound address, bound port)."""
    _, code, _, atyp = recv_exact(sock, 4)
    if atyp == 1:
        address = socket.inet_ntoa(recv_exact(sock, 4))
    elif atyp == 4:
        address = socket.inet_ntop(socket.AF_INET6, recv_exact(sock, 16))
    else:
        address = recv_exact(sock, recv_exact(sock, 1)[0]).decode("latin-1")
    port = struct.unpack("!H", recv_exact(sock, 2))[0]
    return code, address, port


def socks_connect(what, endpoint, denied, nonce):
    host, port = endpoint
    try:
        sock = socket.create_connection((host, port), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, "unreachable: %r" % exc)
    try:
        why = greet(sock)
        if why:
            return attempt(what, "escape", "refused", None, None, why)
        name = denied["name"].encode()
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name
                     + struct.pack("!H", denied["http_port"]))
        code, _, _ = read_reply(sock)
        if code != 0:
            return attempt(what, "escape", "refused", None, code, "SOCKS reply %d" % code)
        sock.sendall(("GET /ok?nonce=%s HTTP/1.1\r\nHost: %s\r\nX-Attest-Nonce: %s\r\n"
                      "Connection: close\r\n\r\n" % (nonce, denied["name"], nonce)).encode())
        head = sock.recv(4096).decode("latin-1")
        return attempt(what, "escape", "succeeded", None, 0, "relayed: %r" % head[:80])
    except Exception as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def socks_udp(what, endpoint, udp_target, nonce):
    host, port = endpoint
    try:
        sock = socket.create_connection((host, port), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, "unreachable: %r" % exc)
    try:
        why = greet(sock)
        if why:
            return attempt(what, "escape", "refused", None, None, why)
        sock.sendall(b"\x05\x03\x00\x01" + b"\x00" * 6)
        code, relay, relay_port = read_reply(sock)
        if code != 0:
            return attempt(what, "escape", "refused", None, code, "SOCKS reply %d" % code)
        if relay in ("0.0.0.0", "::"):
            relay = host
        if not harness_owned(relay):
            return attempt(what, "escape", "succeeded", None, 0,
                           "association granted; relay %s not dialled (not harness-owned)" % relay)
        thost, _, tport = udp_target.rpartition(":")
        header = (b"\x00\x00\x00\x01" + socket.inet_aton(thost) + struct.pack("!H", int(tport)))
        fam = socket.AF_INET6 if ":" in relay else socket.AF_INET
        udp = socket.socket(fam, socket.SOCK_DGRAM)
        try:
            udp.sendto(header + ("socks5-udp %s\n" % nonce).encode(), (relay, relay_port))
        finally:
            udp.close()
        return attempt(what, "escape", "succeeded", None, 0, "datagram sent via %s:%d" % (
            relay, relay_port))
    except Exception as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def proxy_parts(url):
    parts = urlsplit(url)
    headers = {}
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    return parts.hostname, parts.port or 80, headers


def get_allowed(proxy_url, allowed, nonce, ca_bundle):
    what = "get-allowed"
    phost, pport, auth = proxy_parts(proxy_url)
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "control", "refused", errno_name(exc), None, repr(exc))
    try:
        target = "%s:%d" % (allowed["name"], allowed["https_port"])
        lines = ["CONNECT %s HTTP/1.1" % target, "Host: %s" % target, "X-Attest-Nonce: " + nonce]
        lines += ["%s: %s" % kv for kv in auth.items()]
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


def socks_endpoints(proxy_url):
    """(label, (host, port)): each SOCKS endpoint of the environment, then the route's port."""
    found, seen = [], set()
    for name in SOCKS_ENV:
        parts = urlsplit(os.environ.get(name) or "")
        if parts.scheme.startswith("socks") and parts.hostname and parts.port:
            key = (parts.hostname, parts.port)
            if key not in seen:
                seen.add(key)
                found.append(("env-%d" % len(found), key))
    parts = urlsplit(proxy_url)
    found.append(("route", (parts.hostname, parts.port or 80)))
    return found


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    proxy_url = task_proxy(task)
    if not proxy_url:
        out["facts"]["proxy"] = "no proxy (task proxy_url %r)" % (task.get("proxy_url"),)
        out["attempts"].append(attempt("socks5-connect:route", "escape", "error", None, None,
                                       "no proxy_url: no route to attempt"))
        return
    endpoints = socks_endpoints(proxy_url)
    out["facts"]["socks_endpoints"] = ["%s=%s:%d" % (label, h, p) for label, (h, p) in endpoints]
    jobs = []
    for label, endpoint in endpoints:
        if label != "route" and not (endpoint[0] == "localhost" or harness_owned(endpoint[0])):
            # An endpoint the environment names elsewhere is never dialled (the network rules:
            # loopback and the lab only); the cell cannot be judged on it, and says so.
            for kind in ("socks5-connect:", "socks5-udp:"):
                why = "%s:%d is not on loopback or in the lab: not dialled" % endpoint
                jobs.append((attempt, (kind + label, "escape", "error", None, None, why)))
            continue
        jobs.append((socks_connect, ("socks5-connect:" + label, endpoint, targets["denied"], nonce)))
        jobs.append((socks_udp, ("socks5-udp:" + label, endpoint, targets["udp"], nonce)))
    # Side by side: an HTTP proxy answers a SOCKS greeting with silence, and waiting for each
    # silence in turn would cost GREETING_WAIT per attempt.
    results = [None] * len(jobs)

    def work(i, fn, args):
        try:
            results[i] = fn(*args)
        except Exception as exc:
            results[i] = attempt(args[0], "escape", "error", errno_name(exc), None, repr(exc))

    threads = [threading.Thread(target=work, args=(i, fn, args)) for i, (fn, args) in
               enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out["attempts"].extend(results)
    out["attempts"].append(get_allowed(proxy_url, targets["allowed"], nonce, task["ca_bundle"]))


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
