"""Probe net_ipv6_udp_icmp: the families and socket kinds a TCP-only filter may forget.

Escape attempts, every target a loopback literal the host chose (never a name):
  * ``tcp6-connect``: TCP to task["targets"]["tcp6"] (a host listener on [::1]), sends the
    nonce.
  * ``udp6-datagram`` / ``udp4-datagram``: one datagram carrying the nonce to the host's UDP
    listeners on [::1] and 127.0.0.1.
  * ``icmp-echo``: an echo request (nonce in its data) through an unprivileged ping socket
    (SOCK_DGRAM/IPPROTO_ICMP) to 127.0.0.1 only; succeeded when the reply came back.
  * ``raw-socket`` / ``packet-socket``: only CREATING an AF_INET SOCK_RAW (ICMP) socket and an
    AF_PACKET socket (protocol 0: receives nothing); nothing is ever sent on them.
A missing IPv6 target (the host has no IPv6 loopback) is reported as an `error` attempt.
facts["netns"] lets the host tell its own network namespace from the sandbox's.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import socket
import struct
import sys
import time

PROBE = "net_ipv6_udp_icmp"
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


def tcp(what, hostport, nonce):
    if not hostport:
        return attempt(what, "escape", "error", None, None, "no target: host has no IPv6 loopback")
    host, port = split(hostport)
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
        sock.sendall(("nonce=%s a=%s\n" % (nonce, what)).encode())
        return attempt(what, "escape", "succeeded", None, None, "connected, sent nonce")
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def udp(what, hostport, nonce):
    if not hostport:
        return attempt(what, "escape", "error", None, None, "no target: host has no IPv6 loopback")
    host, port = split(hostport)
    try:
        sock = socket.socket(family(host), socket.SOCK_DGRAM)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    sock.settimeout(0.5)
    try:
        sock.connect((host, port))
        sock.send(("nonce=%s a=%s\n" % (nonce, what)).encode())
        try:
            sock.recv(2048)  # a closed port answers ICMP unreachable: ECONNREFUSED here
        except socket.timeout:
            pass
        return attempt(what, "escape", "succeeded", None, None, "datagram sent (delivery unknown)")
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def icmp_echo(address, nonce):
    what = "icmp-echo"
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None,
                       "ping socket not permitted: %r" % exc)
    sock.settimeout(1.0)
    try:
        data = ("nonce=%s" % nonce).encode()
        header = struct.pack("!BBHHH", 8, 0, 0, 0, 1)  # the kernel sets the id on ping sockets
        packet = struct.pack("!BBHHH", 8, 0, checksum(header + data), 0, 1) + data
        sock.sendto(packet, (address, 0))
        deadline = time.time() + 1.0
        while time.time() < deadline:
            reply = sock.recv(2048)
            if reply[:1] == b"\0" and data in reply:
                return attempt(what, "escape", "succeeded", None, None,
                               "echo reply from %s" % address)
        return attempt(what, "escape", "refused", "ETIMEDOUT", None, "no echo reply")
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def create(what, fam_name, kind, proto):
    fam = getattr(socket, fam_name, None)
    if fam is None:
        return attempt(what, "escape", "refused", "EAFNOSUPPORT", None,
                       "%s does not exist on this platform" % fam_name)
    try:
        sock = socket.socket(fam, kind, proto)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    sock.close()  # creating it was the whole attempt: nothing is sent
    return attempt(what, "escape", "succeeded", None, None, "%s socket created" % fam_name)


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    netns_fact(out)
    out["attempts"].append(tcp("tcp6-connect", targets.get("tcp6"), nonce))
    out["attempts"].append(udp("udp6-datagram", targets.get("udp6"), nonce))
    out["attempts"].append(udp("udp4-datagram", targets["udp4"], nonce))
    out["attempts"].append(icmp_echo(targets["icmp"], nonce))
    out["attempts"].append(create("raw-socket", "AF_INET", socket.SOCK_RAW, socket.IPPROTO_ICMP))
    out["attempts"].append(create("packet-socket", "AF_PACKET", socket.SOCK_RAW, 0))


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
