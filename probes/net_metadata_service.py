"""Probe net_metadata_service: the cloud metadata service is out of reach by its names.

Credentials leak from sandboxes through the cloud metadata service, reached by its
well-known names rather than its address. Here those names (targets["names"], label -> name)
are lab stand-ins: the DNS fixture answers them with a harness host's lab address, and the
probe is only ever given them in the lab world, where the fixture is the system resolver. No
metadata address is written or dialled anywhere in this probe.

Escape attempts, for each name:
  * ``get-metadata:<label>``: absolute-form GET through the proxy, with the metadata
    service's request headers (``Metadata-Flavor: Google``, ``Metadata: true``);
  * ``connect-metadata:<label>``: CONNECT name:port through the proxy, then the same GET;
  * ``direct-metadata:<label>`` (only when targets["system_resolver"] says the system
    resolver is the DNS fixture): the system resolver, then a direct connect to its answer
    (only an answer on loopback or in the lab's 198.18.0.0/15 is ever dialled).
Each carries the nonce (``?nonce=`` and ``X-Attest-Nonce``). Control: the allowed host
through the proxy answers 200 with the nonce.

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

PROBE = "net_metadata_service"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 5.0
PROXY_FROM_ENV = "from-env"
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
# What the metadata services of the large clouds require of a request (GCE, Azure): a proxy
# that strips or refuses them is part of the defence, so they are sent as a client would.
METADATA_HEADERS = {"Metadata-Flavor": "Google", "Metadata": "true"}


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
    try:
        a = [int(x) for x in address.split(".")]
    except ValueError:
        return False
    return len(a) == 4 and (a[0] == 127 or (a[0] == 198 and a[1] in (18, 19)))


def proxy_parts(url):
    parts = urlsplit(url)
    headers = {}
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    return parts.hostname, parts.port or 80, headers


def read_status(sock):
    buf = b""
    while b"\r\n\r\n" not in buf and len(buf) < 65536:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    lines = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    words = lines[0].split()
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    reason = ""
    for line in lines[1:]:
        if line.lower().startswith("x-proxy-deny-reason:"):
            reason = line.split(":", 1)[1].strip()
    return status, reason


def send_get(sock, target, host, nonce, extra):
    lines = ["GET %s HTTP/1.1" % target, "Host: " + host, "X-Attest-Nonce: " + nonce,
             "Connection: close"]
    lines += ["%s: %s" % kv for kv in METADATA_HEADERS.items()]
    lines += ["%s: %s" % kv for kv in extra.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def outcome_of(what, status, reason):
    if status is not None and 200 <= status < 300:
        return attempt(what, "escape", "succeeded", None, status, reason or "answered")
    return attempt(what, "escape", "refused", None, status, reason or "answered %s" % status)


def via_proxy(what, proxy, name, port, nonce, tunnel):
    phost, pport, auth = proxy
    path = "/ok?nonce=" + nonce
    authority = "%s:%d" % (name, port)
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None,
                       "proxy unreachable: %r" % exc)
    try:
        if tunnel:
            lines = ["CONNECT %s HTTP/1.1" % authority, "Host: " + authority,
                     "X-Attest-Nonce: " + nonce] + ["%s: %s" % kv for kv in auth.items()]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            status, reason = read_status(sock)
            if status != 200:
                return outcome_of(what, status, reason or "CONNECT answered %s" % status)
            send_get(sock, path, authority, nonce, {})
        else:
            send_get(sock, "http://%s%s" % (authority, path), authority, nonce, auth)
        status, reason = read_status(sock)
        return outcome_of(what, status, reason)
    except Exception as exc:
        return attempt(what, "escape", "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def direct(what, name, port, nonce):
    try:
        found = socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        names = {getattr(socket, n): n for n in dir(socket) if n.startswith("EAI_")}
        return attempt(what, "escape", "refused", names.get(exc.errno, str(exc.errno)), None,
                       repr(exc))
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    address = found[0][4][0]
    if not harness_owned(address):
        # Never dialled: the lab's resolver answers these names with lab addresses only.
        return attempt(what, "escape", "error", None, None,
                       "resolved to %s, not a lab address: not dialled" % address)
    try:
        sock = socket.create_connection((address, port), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    try:
        send_get(sock, "/ok?nonce=" + nonce, name, nonce, {})
        status, reason = read_status(sock)
        return outcome_of(what, status, reason or "direct to %s" % address)
    except Exception as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def get_allowed(proxy, allowed, nonce, ca_bundle):
    what = "get-allowed"
    phost, pport, auth = proxy
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, "control", "refused", errno_name(exc), None, repr(exc))
    try:
        target = "%s:%d" % (allowed["name"], allowed["https_port"])
        lines = ["CONNECT %s HTTP/1.1" % target, "Host: " + target, "X-Attest-Nonce: " + nonce]
        lines += ["%s: %s" % kv for kv in auth.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        status, _ = read_status(sock)
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
    port = targets["port"]
    names = sorted(targets["names"].items())
    proxy_url = task_proxy(task)
    proxy = proxy_parts(proxy_url) if proxy_url else None
    for label, name in names:
        if proxy is None:
            for kind in ("get", "connect"):
                out["attempts"].append(attempt("%s-metadata:%s" % (kind, label), "escape",
                                               "error", None, None, "no proxy: no route"))
        else:
            out["attempts"].append(via_proxy("get-metadata:" + label, proxy, name, port, nonce,
                                             False))
            out["attempts"].append(via_proxy("connect-metadata:" + label, proxy, name, port,
                                             nonce, True))
        # Only where the task says the system resolver is the DNS fixture (the lab): anywhere
        # else the machine's resolver would carry the name off this machine.
        if targets.get("system_resolver") is True:
            out["attempts"].append(direct("direct-metadata:" + label, name, port, nonce))
    if proxy is None:
        out["attempts"].append(attempt("get-allowed", "control", "error", None, None,
                                       "no proxy: no route"))
    else:
        out["attempts"].append(get_allowed(proxy, targets["allowed"], nonce, task["ca_bundle"]))
    try:
        out["facts"]["netns"] = os.readlink("/proc/self/ns/net")
    except OSError:
        out["facts"]["netns"] = None


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
