"""Probe ipc_proxy_socket_tamper: chmod, replace or unlink the egress route's socket and shim.

The egress proxy's unix socket is shared by every cell of a run; a payload that can unlink or
replace it cuts (or hijacks) the route of every other cell. Targets:
  targets["decoy"]    {"socket", "shim"}: a bound socket and a shim copy the host planted in
                      this cell's scratch dir, standing in for the host side of the route. On
                      the control leg (unsandboxed, often as root) only these are touched.
  targets["sandbox"]  {"socket", "shim"}: where this backend shows the payload the real socket
                      and shim (the backend's own inside paths: /run/kiln/ for
                      bubblewrap and docker, a wrapper's [run] *_inside).
                      Tried ONLY when task["proxy_url"] == targets["shim_url"], i.e. the task
                      says the route is a bound socket re-exposed by the in-sandbox shim; on
                      any other route these paths mean nothing and are left alone.
Escape attempts per target: socket chmod 0777 / replace (bind a rogue socket beside it and
rename it over) / unlink; shim chmod 0777 / append / replace (rename a new file over it).
Controls: the same socket operations on a socket the probe binds in the workspace succeed, and
after all attempts the proxy still answers a CONNECT to the allowed fixture host (200).

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import base64
import errno
import json
import os
import socket
import sys

from urllib.parse import unquote, urlsplit

PROBE = "ipc_proxy_socket_tamper"
START_MARKER = "SANDBOX-ATTEST-START"


def attempt(what, role, outcome, err=None, status=None, detail=""):
    return {"what": what, "role": role, "outcome": outcome, "errno": err, "status": status,
            "detail": detail}


def errno_name(exc):
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


def bind_beside(path, name):
    """Bind a listening unix socket named `name` in `path`'s directory (short relative path)."""
    here = os.getcwd()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # chdir keeps the bind path short: AF_UNIX paths are capped near 108 bytes.
        os.chdir(os.path.dirname(path))
        sock.bind(name)
        sock.listen(1)
    except BaseException:
        sock.close()
        raise
    finally:
        os.chdir(here)
    return sock


def sock_chmod(path, nonce, held):
    os.chmod(path, 0o777)
    return "mode now %o" % (os.stat(path).st_mode & 0o777)


def sock_replace(path, nonce, held):
    rogue = "rogue-%s.sock" % nonce
    held.append(bind_beside(path, rogue))
    os.rename(os.path.join(os.path.dirname(path), rogue), path)
    return "a rogue socket now answers at the path"


def sock_unlink(path, nonce, held):
    os.unlink(path)
    return "gone: %s" % (not os.path.exists(path))


def shim_chmod(path, nonce, held):
    os.chmod(path, 0o777)
    return "mode now %o" % (os.stat(path).st_mode & 0o777)


def shim_append(path, nonce, held):
    with open(path, "a") as fh:
        fh.write("\n# sandbox-attest %s\n" % nonce)
    return "appended"


def shim_replace(path, nonce, held):
    new = os.path.join(os.path.dirname(path), "shim-%s.py" % nonce)
    with open(new, "w") as fh:
        fh.write("# replaced by sandbox-attest %s\n" % nonce)
    os.rename(new, path)
    return "replaced"


SOCKET_OPS = (("socket-chmod", sock_chmod), ("socket-replace", sock_replace),
              ("socket-unlink", sock_unlink))
SHIM_OPS = (("shim-chmod", shim_chmod), ("shim-append", shim_append),
            ("shim-replace", shim_replace))


def try_ops(key, ops, path, role, nonce, held):
    results = []
    for name, op in ops:
        what = "%s:%s" % (key, name)
        try:
            detail = op(path, nonce, held)
        except OSError as exc:
            results.append(attempt(what, role, "refused", errno_name(exc), None, repr(exc)))
        except Exception as exc:
            results.append(attempt(what, role, "error", None, None, repr(exc)))
        else:
            results.append(attempt(what, role, "succeeded", None, None, detail))
    return results


def connect_allowed(proxy_url, hostport, nonce, timeout):
    """CONNECT through the task's proxy; returns the status code (0 if none was parsed)."""
    parts = urlsplit(proxy_url)
    lines = ["CONNECT %s HTTP/1.1" % hostport, "Host: %s" % hostport,
             "X-Attest-Nonce: %s" % nonce]
    if parts.username is not None:
        cred = "%s:%s" % (unquote(parts.username), unquote(parts.password or ""))
        lines.append("Proxy-Authorization: Basic " + base64.b64encode(cred.encode()).decode())
    sock = socket.create_connection((parts.hostname, parts.port or 80), timeout)
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        buf = b""
        while b"\r\n" not in buf and len(buf) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    finally:
        sock.close()
    words = buf.split(b"\r\n", 1)[0].split()
    return int(words[1]) if len(words) > 1 and words[1].isdigit() else 0


def run(task, out):
    nonce = task["nonce"]
    targets = task["targets"]
    workspace = task["workspace"]
    held = []  # rogue listeners stay bound until the report is printed
    try:
        out["facts"]["mntns"] = os.readlink("/proc/self/ns/mnt")
    except OSError:
        out["facts"]["mntns"] = None
    # Control: the same operations on a socket and a file the probe owns in the workspace.
    try:
        control_sock = os.path.join(workspace, "control.sock")
        held.append(bind_beside(control_sock, "control.sock"))
        control_shim = os.path.join(workspace, "control-shim.py")
        with open(control_shim, "w") as fh:
            fh.write("# control shim\n")
    except OSError as exc:
        out["attempts"].append(attempt("workspace:setup", "control", "error", errno_name(exc),
                                       None, repr(exc)))
    else:
        out["attempts"].extend(try_ops("workspace", SOCKET_OPS, control_sock, "control", nonce,
                                       held))
        out["attempts"].extend(try_ops("workspace", SHIM_OPS, control_shim, "control", nonce,
                                       held))
    routes = [("decoy", targets["decoy"])]
    bound_route = task.get("proxy_url") == targets["shim_url"]
    out["facts"]["sandbox_route_tried"] = bound_route
    if bound_route:
        routes.append(("sandbox", targets["sandbox"]))
    for key, paths in routes:
        out["facts"]["visible:" + key] = os.path.exists(paths["socket"])
        out["attempts"].extend(try_ops(key, SOCKET_OPS, paths["socket"], "escape", nonce, held))
        out["attempts"].extend(try_ops(key, SHIM_OPS, paths["shim"], "escape", nonce, held))
    proxy_url = task.get("proxy_url")
    if proxy_url and proxy_url != "from-env":
        try:
            status = connect_allowed(proxy_url, targets["allowed"], nonce, 10)
        except OSError as exc:
            out["attempts"].append(attempt("route-after", "control", "refused",
                                           errno_name(exc), None, repr(exc)))
        else:
            out["attempts"].append(attempt("route-after", "control",
                                           "succeeded" if status == 200 else "refused",
                                           None, status, "CONNECT %s" % targets["allowed"]))
    for sock in held:
        sock.close()


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
