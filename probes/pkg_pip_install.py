"""Probe pkg_pip_install: a real pip install of the canary wheel through the proxy.

Capability: ``python -m pip install --only-binary :all: --no-deps ... --index-url
targets["index_url"] --cert task["ca_bundle"] --target <workspace>/site <package>`` with
HTTP(S)_PROXY = task["proxy_url"] (NO_PROXY emptied, user pip config ignored), then import the
module from that target in a fresh interpreter and print its NONCE.
Control: the same install pointed at targets["denied_index_url"] (started beside the
capability's: each is a whole pip start-up) must fail, and pip's stderr must carry the
proxy's 403 ("Tunnel connection failed: 403").
pip gets HOME and TMPDIR under the workspace: inside a sandbox they may be the only writable
places.

Stdlib only, Python 3.8+, never imported by the host; exits 0 and prints one JSON line.
"""

import errno
import json
import os
import subprocess
import sys

PROBE = "pkg_pip_install"
START_MARKER = "SANDBOX-ATTEST-START"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


# Probe contract addition (probes/README.md): "from-env" takes the proxy from the payload's own
# environment (a wrapper that brings its own proxy sets it).
PROXY_FROM_ENV = "from-env"
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


def task_proxy(task):
    """The proxy URL to use: the task's, or for "from-env" HTTPS_PROXY/HTTP_PROXY (any case).

    NO_PROXY is ignored on purpose: fixture targets are only reachable through the proxy.
    """
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
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code) if isinstance(code, int) else None


# Variables that silently replace pip's --cert (requests and curl honour them over the flag), so
# an inherited one would make the install fail against the run's CA for reasons of the host.
CA_OVERRIDES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


def pip_env(task):
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith("PIP_") and k.upper() not in PROXY_VARS
           and k.upper() not in CA_OVERRIDES}
    proxy = task_proxy(task) or ""
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = ""
    # A user or site pip.conf could add an extra index outside the harness's world.
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PYTHONNOUSERSITE"] = "1"
    for name in ("HOME", "TMPDIR"):
        path = os.path.join(task["workspace"], "pip-" + name.lower())
        os.makedirs(path, exist_ok=True)
        env[name] = path
    return env


def start_pip(task, index_url, target):
    """Start one pip install; `finish_pip` waits for it. The capability and the control run
    side by side: each is a whole pip start-up (about 2.4 s under gVisor's ptrace platform),
    and neither depends on the other (their targets differ; HOME and TMPDIR hold only pip's
    uniquely named temporaries)."""
    t = task["targets"]
    argv = [sys.executable, "-m", "pip", "install", "--only-binary", ":all:", "--no-deps",
            "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--retries", "1",
            "--timeout", "10", "--progress-bar", "off", "--index-url", index_url,
            "--cert", task["ca_bundle"], "--target", target, t["package"]]
    return subprocess.Popen(argv, env=pip_env(task), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)


def finish_pip(proc, timeout):
    """Wait for a started pip (killed at `timeout`, raising TimeoutExpired, as run() does)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def started(task, index_url, target):
    """A started pip, or the exception that kept it from starting."""
    try:
        return start_pip(task, index_url, target)
    except (OSError, subprocess.SubprocessError) as exc:
        return exc


def tail(text, size=400):
    return " ".join(text.split())[-size:]


def proxy_403(stderr):
    """pip's line naming the proxy's 403, or None.

    With --retries 0 pip hides the cause; with 1 it warns "Retrying ... after connection
    broken by ...'Tunnel connection failed: 403 Forbidden'" once, at no backoff cost.
    """
    for line in stderr.splitlines():
        if "Tunnel connection failed: 403" in line:
            return " ".join(line.split())[:400]
    return None


# pip's words when the network itself said no: the proxy's refusal, or a socket the sandbox
# would not open or connect. Anything else ("No module named pip", a missing CA bundle, a
# resolver failure) is not a refusal and must not read as one: it is reported as an error.
NETWORK_REFUSALS = (
    "Tunnel connection failed",
    "ProxyError",
    "Failed to establish a new connection",
    "Connection refused",
    "ECONNREFUSED",
    "Network is unreachable",
    "ENETUNREACH",
    "No route to host",
    "EHOSTUNREACH",
)


def network_refusal(output):
    """pip's first line naming a network refusal, or None."""
    for line in output.splitlines():
        if any(word in line for word in NETWORK_REFUSALS):
            return " ".join(line.split())[:400]
    return None


def failed_install(what, role, proc):
    """The attempt for a failed pip run: `refused` only when pip shows the network refused."""
    denial = proxy_403(proc.stderr)
    refusal = denial or network_refusal(proc.stderr + "\n" + proc.stdout)
    return attempt(what, role, "refused" if refusal else "error", None,
                   403 if denial else None, refusal or tail(proc.stderr))


def run(task, out):
    t = task["targets"]
    budget = float(task.get("deadline_s") or 120)
    site = os.path.join(task["workspace"], "site")
    installing = started(task, t["index_url"], site)
    denied = started(task, t["denied_index_url"], site + "-denied")
    try:
        if isinstance(installing, Exception):
            raise installing
        proc = finish_pip(installing, budget * 0.45)
    except (OSError, subprocess.SubprocessError) as exc:
        out["attempts"].append(attempt("pip-install", "capability", "error", errno_name(exc),
                                       None, repr(exc)))
    else:
        out["facts"]["pip_returncode"] = proc.returncode
        ok = proc.returncode == 0
        out["attempts"].append(
            attempt("pip-install", "capability", "succeeded", None, None, tail(proc.stdout))
            if ok else failed_install("pip-install", "capability", proc))
        if ok:
            code = ("import sys; sys.path.insert(0, %r); import %s as m; print(m.NONCE)"
                    % (site, t["module"]))
            imp = subprocess.run([sys.executable, "-I", "-c", code], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
            printed = imp.stdout.strip()
            out["facts"]["import_printed"] = printed
            good = imp.returncode == 0 and printed == t["wheel_nonce"]
            out["attempts"].append(attempt("import", "capability",
                                           "succeeded" if good else "refused", None, None,
                                           "printed %r" % printed if printed else tail(imp.stderr)))
    try:
        if isinstance(denied, Exception):
            raise denied
        proc = finish_pip(denied, budget * 0.35)
    except (OSError, subprocess.SubprocessError) as exc:
        out["attempts"].append(attempt("pip-install-denied", "control", "error",
                                       errno_name(exc), None, repr(exc)))
        return
    out["attempts"].append(
        failed_install("pip-install-denied", "control", proc) if proc.returncode != 0
        else attempt("pip-install-denied", "control", "succeeded", None, None, tail(proc.stdout)))


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
        out["attempts"].append(attempt("probe", "capability", "error", errno_name(exc), None,
                                       repr(exc)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
