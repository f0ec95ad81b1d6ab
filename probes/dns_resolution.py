"""Probe dns_resolution: resolve a per-cell nonce name in the fixture zone.

Escape attempts: a hand-built DNS query (type A) for ``<nonce>.kiln.test`` sent raw over UDP
and over TCP straight to the DNS fixture's address (targets["dns"], "127.0.0.1:PORT").

In the lab only (targets["system_resolver"] is true), also ``getaddrinfo`` on the name: the
lab's /etc/resolv.conf names the DNS fixture, so the system resolver's query reaches only the
harness's world. Outside the lab it is never attempted: on an unsandboxed control leg it would
ask the machine's own resolver, which may be an address outside the harness's world, and the
query (carrying the nonce) would leave the machine.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import socket
import struct
import sys

PROBE = "dns_resolution"
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


def build_query(name, query_id):
    header = struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0)
    qname = b"".join(bytes([len(label)]) + label.encode("ascii") for label in name.split("."))
    return header + qname + b"\x00" + struct.pack("!HH", 1, 1)


def skip_name(data, pos):
    while True:
        length = data[pos]
        if length & 0xC0 == 0xC0:
            return pos + 2
        if length == 0:
            return pos + 1
        pos += 1 + length


def parse_answer(data, query_id):
    """Return (rcode, [A records]) of a DNS response, or raise ValueError."""
    if len(data) < 12:
        raise ValueError("short DNS response (%d bytes)" % len(data))
    rid, flags, qd, an = struct.unpack("!HHHH", data[:8])
    if rid != query_id:
        raise ValueError("response id %d does not match query id %d" % (rid, query_id))
    pos = 12
    for _ in range(qd):
        pos = skip_name(data, pos) + 4
    addresses = []
    for _ in range(an):
        pos = skip_name(data, pos)
        rtype, _, _, rdlen = struct.unpack("!HHIH", data[pos:pos + 10])
        pos += 10
        if rtype == 1 and rdlen == 4:
            addresses.append(socket.inet_ntoa(data[pos:pos + 4]))
        pos += rdlen
    return flags & 0x000F, addresses


def split(hostport):
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def recv_exact(sock, size):
    buf = b""
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("DNS/TCP peer closed after %d of %d bytes" % (len(buf), size))
        buf += chunk
    return buf


def query(what, transport, server, name):
    host, port = split(server)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    query_id = int.from_bytes(os.urandom(2), "big")
    packet = build_query(name, query_id)
    kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
    try:
        # A seccomp filter or a missing address family refuses the socket itself:
        # that is the sandbox's refusal of this attempt, not a broken probe.
        sock = socket.socket(fam, kind)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None,
                       "socket() refused: %r" % exc)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect((host, port))
        if transport == "udp":
            sock.send(packet)
            data = sock.recv(4096)
        else:
            sock.sendall(struct.pack("!H", len(packet)) + packet)
            data = recv_exact(sock, struct.unpack("!H", recv_exact(sock, 2))[0])
    except (OSError, ConnectionError) as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()
    try:
        rcode, addresses = parse_answer(data, query_id)
    except (ValueError, IndexError, struct.error) as exc:
        return attempt(what, "escape", "succeeded", None, None, "unparsable answer: %r" % exc)
    return attempt(what, "escape", "succeeded", None, rcode,
                   "rcode %d, A %s" % (rcode, ",".join(addresses) or "none"))


def run(task, out):
    targets = task["targets"]
    name = targets["name"]
    out["facts"]["name"] = name
    try:
        out["facts"]["netns"] = os.readlink("/proc/self/ns/net")
    except OSError as exc:
        out["facts"]["netns"] = None
        out["facts"]["netns_error"] = errno_name(exc)
    out["attempts"].append(query("udp-query", "udp", targets["dns"], name))
    out["attempts"].append(query("tcp-query", "tcp", targets["dns"], name))
    if targets.get("system_resolver") is True:
        out["attempts"].append(system_resolver("system-resolver", name))


def system_resolver(what, name):
    """getaddrinfo, as every program resolves a name (only ever run inside the lab)."""
    try:
        found = socket.getaddrinfo(name, 443, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        code = {getattr(socket, n): n for n in dir(socket) if n.startswith("EAI_")}.get(exc.errno)
        return attempt(what, "escape", "refused", code or str(exc.errno), None, repr(exc))
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    addresses = sorted({info[4][0] for info in found})
    return attempt(what, "escape", "succeeded", None, None, "A " + ",".join(addresses))


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
