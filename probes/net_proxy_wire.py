"""Payload of net_proxy_smuggling, net_proxy_upgrade, net_proxy_relay and net_dns_rebinding.

The three probes differ only in the bytes the host builds for them (sandbox_attest/catalog/net/
protocol.py): a request to an allowed origin that carries a second request to the denied host
in its body or after an `Upgrade:` (request smuggling, WebSocket and h2c upgrades), the HTTP/2
connection preface sent to the proxy, and a request for a planted name whose DNS answer changes
between the proxy's check and its dial. Each request in task["targets"]["requests"] is one
connection to the proxy: its `parts` are written in order, byte for byte (latin-1), with
`{auth}` replaced by the Proxy-Authorization line from the proxy URL's userinfo (and `{proxy}`
by the proxy's own host:port, for the relay back into it); after each
part but the last one response is read, after the last everything until the proxy closes or
goes quiet. The payload reports each response's status; the host judges the proxy's decision
log and the origins' access logs, which are the witnesses.

An escape attempt "succeeded" when more answers came back than the request had carriers (the
smuggled request was answered) and the extra one was a 2xx; otherwise it is "refused", with
the first refusal status seen, if any.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import base64
import errno
import json
import os
import socket
import sys
import time
from urllib.parse import unquote, urlsplit

START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 6.0
# After the last part: how long a quiet connection is waited on for a late answer. Our proxy
# closes at once, and reading stops once the escaping request has its answer; only a proxy
# that keeps the connection open and never answers it costs this, once per attempt.
QUIET = 0.5
MAX_READ = 262144
REFUSALS = (400, 403, 405, 407, 421, 431, 501, 502, 504)


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
        # The sandbox brings its own proxy and announces it in the environment.
        url = os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy") or \
            os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    return url


def proxy_parts(url):
    """(host, port, auth line text) of the proxy URL; userinfo becomes Basic auth."""
    parts = urlsplit(url)
    auth = ""
    if parts.username is not None:
        cred = unquote(parts.username) + ":" + unquote(parts.password or "")
        auth = "\r\nProxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode()
    return parts.hostname, parts.port or 80, auth


class Reader(object):
    """Buffered reads of HTTP/1.x responses; `raw` keeps every byte for the report."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.raw = b""
        self.closed = False
        self.error = None

    def fill(self, timeout):
        if self.closed or len(self.raw) > MAX_READ:
            return False
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            return False
        except OSError as exc:
            self.error = exc
            self.closed = True
            return False
        if not chunk:
            self.closed = True
            return False
        self.buf += chunk
        self.raw += chunk
        return True

    def response(self, timeout):
        """The status of the next response (its body consumed), or None."""
        while b"\r\n\r\n" not in self.buf:
            if not self.fill(timeout):
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        words = lines[0].split()
        if len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
            return -1  # not HTTP/1: an HTTP/2 frame or garbage; reported as such
        status = int(words[1])
        size = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length" and value.strip().isdigit():
                size = int(value.strip())
        while len(self.buf) < size and self.fill(timeout):
            pass
        self.buf = self.buf[size:]
        return status


def run_request(req, proxy, nonce):
    what, role = req["what"], req["role"]
    phost, pport, auth = proxy
    try:
        sock = socket.create_connection((phost, pport), timeout=TIMEOUT)
    except OSError as exc:
        return attempt(what, role, "refused", errno_name(exc), None, "proxy unreachable: %r" % exc)
    statuses = []
    sent = 0
    reader = Reader(sock)
    try:
        parts = req["parts"]
        for i, part in enumerate(parts):
            try:
                text = part.replace("{auth}", auth).replace("{proxy}", "%s:%d" % (phost, pport))
                sock.sendall(text.encode("latin-1"))
            except OSError as exc:
                reader.error = exc
                break
            sent = i + 1
            if i < len(parts) - 1:
                got = reader.response(TIMEOUT)
                if got is None:
                    break
                statuses.append(got)
        if sent == len(parts):
            deadline = time.time() + TIMEOUT
            # Every answer that can matter: the carriers' and the escaping request's.
            wanted = int(req.get("carriers", 0)) + 1
            while time.time() < deadline and len(statuses) < wanted:
                got = reader.response(QUIET if statuses else TIMEOUT)
                if got is None:
                    break
                statuses.append(got)
    except Exception as exc:
        return attempt(what, role, "error", errno_name(exc), None, repr(exc))
    finally:
        sock.close()
    text = reader.raw.decode("latin-1")
    detail = "sent %d of %d parts; statuses %s; %s" % (
        sent, len(req["parts"]), statuses, "closed" if reader.closed else "quiet")
    out = attempt(what, role, "refused", errno_name(reader.error) if reader.error else None,
                  statuses[0] if statuses else None, detail)
    out["sent"] = sent
    out["parts"] = len(req["parts"])
    out["statuses"] = statuses
    if role == "control":
        ok = bool(statuses) and statuses[0] == 200 and nonce in text
        out["outcome"] = "succeeded" if ok else "refused"
        out["detail"] = ("nonce echoed; " if nonce in text else "no nonce in answer; ") + detail
        return out
    refusal = [s for s in statuses if s in REFUSALS]
    extra = statuses[int(req.get("carriers", 0)):]
    if any(200 <= s < 300 or s == 101 for s in extra):
        out["outcome"] = "succeeded"
        out["detail"] = ("the request past the carrier was answered; " if req.get("carriers")
                         else "answered; ") + detail
    elif refusal:
        out["status"] = refusal[0]
    return out


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
        out["attempts"].append(run_request(req, proxy, nonce))


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
    out = {"probe": str(task.get("probe", "net_proxy_wire")), "nonce": nonce,
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
