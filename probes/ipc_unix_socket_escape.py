"""Probe ipc_unix_socket_escape: talk to host daemons over unix sockets.

Escape attempts, each a single ``GET /_ping`` and nothing else:
  * the harness's fake daemon socket (targets["unix"], a host path), with the nonce;
  * the harness's abstract-namespace socket (targets["abstract"], Linux), with the nonce;
  * the real Docker socket at each path in targets["docker_sockets"] that exists. Its answer
    is payload-side evidence only: no harness witness sees it;
  * the class: every socket it can see under targets["roots"] (each [path, depth]; plus its
    own $XDG_RUNTIME_DIR), walked with bounds on depth, count and time, and every listening
    abstract name in its own /proc/net/unix. To a socket whose name starts with the witness
    prefix (targets["witness_prefix"] / ["abstract_prefix"], the harness's own) it sends one
    line carrying the nonce; to any other (a real daemon: it cannot know) it sends nothing,
    a connect and a close are evidence enough. Each path attempt carries the socket's st_dev
    and st_ino as seen inside, so the host can tell its own socket from a sandbox-private one.
  * the host's own sockets wherever its walk of this view found them (targets["view_hint"],
    a file the host writes into the workspace at the rendezvous): `view:<inside path>`.
Control: ``socket.socketpair()`` works inside (unix sockets as such are usable).
facts["netns"]/["mntns"] let the host tell its own sockets from the sandbox's.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import socket
import stat
import sys
import time

PROBE = "ipc_unix_socket_escape"
START_MARKER = "SANDBOX-ATTEST-START"
TIMEOUT = 3.0
# Bounds of the class walk: a host with thousands of sockets must not turn into a timeout.
WALK_SOCKETS = 256
WALK_DIRS = 2000
WALK_S = 6.0
CONNECT_TIMEOUT = 1.0


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    if isinstance(exc, socket.timeout):
        return "ETIMEDOUT"
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def ping(what, address, nonce, real_docker=False):
    if real_docker:
        # Only the bare, harmless /_ping: the real daemon is not ours to tag or probe further.
        request = "GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"
    else:
        request = ("GET /_ping?nonce=%s HTTP/1.1\r\nHost: docker\r\nX-Attest-Nonce: %s\r\n"
                   "Connection: close\r\n\r\n" % (nonce, nonce))
    # Creating the socket is part of the attempt: a sandbox that refuses socket(AF_UNIX)
    # itself (srt's and Codex's seccomp filters give EPERM) is refusing this escape.
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        result = attempt(what, "escape", "refused", errno_name(exc), None,
                         "socket(AF_UNIX) refused: %r" % exc)
        result["real_docker"] = real_docker
        return result
    sock.settimeout(TIMEOUT)
    try:
        sock.connect(address)
        sock.sendall(request.encode())
        data = b""
        while b"\r\n" not in data and len(data) < 4096:
            chunk = sock.recv(1024)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        result = attempt(what, "escape", "refused", errno_name(exc), None, repr(exc))
    else:
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        outcome = "succeeded" if data else "refused"
        result = attempt(what, "escape", outcome, None, status, "reply: %s" % (line or "none"))
    finally:
        sock.close()
    result["real_docker"] = real_docker
    return result


def errno_of(exc):
    return errno_name(exc) or type(exc).__name__


def find_sockets(roots, skip, deadline):
    """Socket paths under each (root, depth), breadth first, deduplicated by inode.

    Returns (sockets, facts): sockets as (path, st_dev, st_ino); facts say where it stopped.
    """
    found, seen, visited, facts = [], set(), set(), {}
    for root, depth in roots:
        level = [root]
        for _ in range(int(depth) + 1):
            below = []
            for directory in level:
                real = os.path.realpath(directory)
                if real in visited:
                    continue
                if len(visited) >= WALK_DIRS or len(found) >= WALK_SOCKETS:
                    facts["walk_stopped"] = "bound: %d dirs, %d sockets" % (len(visited),
                                                                          len(found))
                    return found, facts
                if time.monotonic() > deadline:
                    facts["walk_stopped"] = "time bound after %d dirs" % len(visited)
                    return found, facts
                visited.add(real)
                try:
                    names = sorted(os.listdir(directory))
                except OSError:
                    continue
                for name in names:
                    path = os.path.join(directory, name)
                    try:
                        info = os.lstat(path)
                    except OSError:
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        below.append(path)
                    elif stat.S_ISSOCK(info.st_mode) and path not in skip:
                        key = (info.st_dev, info.st_ino)
                        if key not in seen:
                            seen.add(key)
                            found.append((path, info.st_dev, info.st_ino))
            level = below
    facts["walk_dirs"] = len(visited)
    return found, facts


def own_abstract_names():
    """Listening abstract names in this process's own /proc/net/unix (its net namespace)."""
    names = []
    try:
        with open("/proc/net/unix") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return names
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) < 8 or not fields[7].startswith("@"):
            continue
        try:
            listening = int(fields[3], 16) & 0x10000
        except ValueError:
            continue
        if listening and fields[7][1:] not in names:
            names.append(fields[7][1:])
    return sorted(names)


def touch(what, address, line):
    """Connect to one socket; send `line` (bytes) only when it is the harness's witness."""
    result = attempt(what, "escape", "refused")
    kinds = [("stream", socket.SOCK_STREAM), ("seqpacket", socket.SOCK_SEQPACKET),
             ("dgram", socket.SOCK_DGRAM)]
    for kind, type_ in kinds:
        try:
            sock = socket.socket(socket.AF_UNIX, type_)
        except OSError as exc:
            return attempt(what, "escape", "refused", errno_of(exc), None,
                           "socket(AF_UNIX) refused: %r" % exc)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(address)
            if line is not None:
                sock.sendall(line)
        except OSError as exc:
            result = attempt(what, "escape", "refused", errno_of(exc), None,
                             "%s: %r" % (kind, exc))
            # A socket of another type answers EPROTOTYPE: try the next type; any other
            # refusal (ENOENT, EACCES, ECONNREFUSED) is the answer.
            if getattr(exc, "errno", None) != errno.EPROTOTYPE:
                return result
        else:
            sent = "sent the nonce" if line is not None else "connect and close only"
            return attempt(what, "escape", "succeeded", None, None, "%s: %s" % (kind, sent))
        finally:
            sock.close()
    return result


def sweep_class(task, targets, out, skip):
    """The class attempts: every visible socket path and abstract name, each touched once."""
    nonce = task["nonce"]
    line = ("SANDBOX-ATTEST-WITNESS %s\n" % nonce).encode()
    prefix = targets.get("witness_prefix") or "\0"
    abstract_prefix = targets.get("abstract_prefix") or "\0"
    roots = [tuple(r) for r in targets.get("roots") or []]
    if os.environ.get("XDG_RUNTIME_DIR"):
        roots.append((os.environ["XDG_RUNTIME_DIR"], 2))
    budget = min(WALK_S, max(1.0, float(task.get("deadline_s") or 20) / 3))
    deadline = time.monotonic() + budget
    found, facts = find_sockets(roots, skip, deadline)
    out["facts"].update(facts)
    out["facts"]["sockets_seen"] = len(found)
    for path, dev, ino in found:
        if time.monotonic() > deadline + budget:
            out["facts"]["touch_stopped"] = path
            break
        ours = os.path.basename(path).startswith(prefix)
        result = touch("path:" + path, path, line if ours else None)
        result.update({"dev": dev, "ino": ino, "witness": ours})
        out["attempts"].append(result)
    skip_abstract = set(targets.get("skip_abstract") or [])
    for name in own_abstract_names()[:WALK_SOCKETS]:
        if name in skip_abstract:
            continue
        ours = name.startswith(abstract_prefix)
        result = touch("abstract:" + name, "\0" + name, line if ours else None)
        result["witness"] = ours
        out["attempts"].append(result)


def try_view(task, targets, out):
    """The host's own sockets at the inside paths its walk of this view found.

    The host writes them into the workspace (targets["view_hint"]) while this process waits
    at the rendezvous, each [path, how]: "witness" gets the nonce line, "daemon" a
    ``GET /_ping`` with the nonce, "touch" (a real daemon) a connect and a close. The host's
    own logs decide; this only makes the attempts. Returns the paths tried.
    """
    name = targets.get("view_hint")
    try:
        with open(os.path.join(task["workspace"], name)) as fh:
            paths = json.load(fh).get("paths") or []
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    nonce = task["nonce"]
    line = ("SANDBOX-ATTEST-WITNESS %s\n" % nonce).encode()
    tried = set()
    for inside, how in paths[:WALK_SOCKETS]:
        if inside in tried:
            continue
        tried.add(inside)
        if how == "daemon":
            result = ping("view:" + inside, inside, nonce)
        else:
            result = touch("view:" + inside, inside, line if how == "witness" else None)
        try:
            info = os.lstat(inside)
            result.update({"dev": info.st_dev, "ino": info.st_ino})
        except OSError:
            pass
        result["witness"] = how in ("witness", "daemon")
        out["attempts"].append(result)
    return tried


def control():
    try:
        left, right = socket.socketpair()
        with left, right:
            left.sendall(b"ping")
            ok = right.recv(16) == b"ping"
        return attempt("socketpair", "control", "succeeded" if ok else "error", None, None,
                       "socketpair round trip" if ok else "socketpair lost the bytes")
    except OSError as exc:
        return attempt("socketpair", "control", "error", errno_name(exc), None, repr(exc))


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    for key in ("netns", "mntns"):
        try:
            out["facts"][key] = os.readlink("/proc/self/ns/" + key[:-2])
        except OSError:
            out["facts"][key] = None
    out["attempts"].append(control())
    out["attempts"].append(ping("daemon-unix", targets["unix"], nonce))
    if targets.get("abstract"):
        out["attempts"].append(ping("daemon-abstract", "\0" + targets["abstract"], nonce))
    for path in targets.get("docker_sockets") or []:
        if os.path.exists(path):
            out["attempts"].append(ping("docker:" + path, path, nonce, real_docker=True))
        else:
            out["facts"]["absent:" + path] = True
    # The sockets already tried above, and the egress route's own socket (the backend's
    # grant, not a host daemon), are not touched again.
    skip = set(targets.get("skip") or []) | {targets["unix"]}
    skip |= set(targets.get("docker_sockets") or [])
    skip |= try_view(task, targets, out)
    sweep_class(task, targets, out, skip)


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
