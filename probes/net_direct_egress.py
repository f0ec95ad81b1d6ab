"""Probe net_direct_egress: reach the host's direct-egress listener without the proxy.

Every proxy variable is removed first (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY, both cases) so
nothing but a direct socket is tried. Escape attempts: a TCP connect to targets["tcp"]
(127.0.0.1:PORT) sending the nonce, and a UDP datagram with the nonce to targets["udp"];
likewise for each address in targets["extra_addresses"] (in the lab: every address the
lab assigned, and the host's loopback), and for each address of the payload's own
interfaces, read from its own namespace (facts["own_addresses"]): the kernel delivers those
locally, so they never leave it, and a gateway that maps one of them to the host's services
is then seen by the host's witnesses. No other address is ever dialled: never a gateway or a
route the sandbox configured. The host control and the witnesses live on the host.
facts["netns"] lets the host tell its own loopback from the sandbox's.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import fcntl
import json
import os
import socket
import struct
import sys

PROBE = "net_direct_egress"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 3.0
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


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


def tcp(what, hostport, nonce):
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
        sock.sendall(("nonce=%s\n" % nonce).encode())
        peer = "%s:%s" % sock.getpeername()[:2]
        return attempt(what, "escape", "succeeded", None, None, "connected to %s, sent nonce" % peer)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


def udp(what, hostport, nonce, wait=0.5):
    host, port = split(hostport)
    try:
        # A seccomp filter or a missing address family refuses the socket itself:
        # that is the sandbox's refusal of this attempt, not a broken probe.
        sock = socket.socket(family(host), socket.SOCK_DGRAM)
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None,
                       "socket() refused: %r" % exc)
    sock.settimeout(wait)
    try:
        sock.connect((host, port))
        sock.send(("nonce=%s\n" % nonce).encode())
        try:
            # A closed port answers with ICMP unreachable, which shows up here as ECONNREFUSED.
            sock.recv(2048)
        except socket.timeout:
            pass
        return attempt(what, "escape", "succeeded", None, None, "datagram sent (delivery unknown)")
    except OSError as exc:
        return attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    finally:
        sock.close()


SIOCGIFADDR = 0x8915


def local_ipv4_from_fib():
    """Every local IPv4 address of this namespace, from the kernel's local routing table.

    /proc/net/fib_trie lists secondary addresses too (which SIOCGIFADDR does not), and needs
    no netlink socket (which a seccomp filter may refuse).
    """
    found, last = [], None
    try:
        with open("/proc/net/fib_trie") as fh:
            for line in fh:
                text = line.strip()
                if text.startswith("|--"):
                    last = text[3:].strip()
                elif text.startswith("/32 host LOCAL") and last:
                    found.append(last)
    except OSError:
        pass
    return found


def own_addresses():
    """The addresses of this namespace's own interfaces (IPv4 from the local table and by
    ioctl, IPv6 from /proc/net/if_inet6).

    Link-local IPv6 addresses are left out: they need a scope and reach only the link.
    """
    found = local_ipv4_from_fib()
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        # A sandbox that forbids AF_INET sockets outright (seccomp): the FIB and if_inet6
        # below still name the addresses, and the refusal itself is the attempts' business.
        names, probe = [], None
    try:
        for name in names:
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR,
                                     struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            found.append(socket.inet_ntoa(packed[20:24]))
    finally:
        if probe is not None:
            probe.close()
    try:
        with open("/proc/net/if_inet6") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 4 and fields[3] != "20":  # 0x20: link-local scope
                    raw = bytes.fromhex(fields[0])
                    found.append(socket.inet_ntop(socket.AF_INET6, raw))
    except (OSError, ValueError):
        pass
    return sorted(set(found))


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    removed = []
    for name in PROXY_VARS:
        for key in (name, name.lower()):
            if os.environ.pop(key, None) is not None:
                removed.append(key)
    out["facts"]["proxy_vars_removed"] = removed
    try:
        out["facts"]["netns"] = os.readlink("/proc/self/ns/net")
    except OSError as exc:
        out["facts"]["netns"] = None
        out["facts"]["netns_error"] = errno_name(exc)
    out["attempts"].append(tcp("tcp-direct", targets["tcp"], nonce))
    out["attempts"].append(udp("udp-direct", targets["udp"], nonce))
    tcp_port = split(targets["tcp"])[1]
    udp_port = split(targets["udp"])[1]
    given = [a for a in targets.get("extra_addresses") or []]
    own = own_addresses()
    out["facts"]["own_addresses"] = own
    tried = {split(targets["tcp"])[0]}
    for kind, addresses in (("", given), ("own-", own)):
        for address in addresses:
            if address in tried:
                continue
            tried.add(address)
            host = "[%s]" % address if ":" in address else address
            out["attempts"].append(tcp("tcp-" + kind + address, "%s:%d" % (host, tcp_port), nonce))
            # A short wait: an ICMP "port unreachable" from this host comes back at once, and
            # the witness, not this wait, decides whether the datagram got out.
            out["attempts"].append(udp("udp-" + kind + address, "%s:%d" % (host, udp_port), nonce,
                                       wait=0.05))


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
