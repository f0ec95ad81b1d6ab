"""Whether a command wrapper is AVAILABLE here: it ran a test command, and that command started.

The harness runs a Python one-liner under the spec's own `[run] argv` and reads back what it saw
(namespaces, seccomp, NoNewPrivs, uid). Those are facts in the identity, not a verdict: a
wrapper that silently fell back to no sandbox at all (firejail inside a container) is
AVAILABLE, and its cells FAIL on their own host readings.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.backends.base import SHIM_PORT, Availability, Identity, shim_path
from sandbox_attest.backends.command.leftovers import LeftoverWatcher
from sandbox_attest.backends.command.spec import (
    HOST_ROLES,
    LIST_NAMES,
    CommandSpec,
    RenderContext,
    json_list,
    payload_ids,
    sample_context,
    shell_join,
)
from sandbox_attest.backends.none import platform_string
from sandbox_attest.claims import claims_of
from sandbox_attest.host import cellgroup, disguise, lifetime
from sandbox_attest.host.interpreter import run_interpreter
from sandbox_attest.host.platform import current_platform
from sandbox_attest.host.trust import give, payload_user
from sandbox_attest.payload import STAGED_SHIM, payload_env

if TYPE_CHECKING:
    from sandbox_attest.backends.command.wrapper import SpecWrapper

DETECT_TIMEOUT_S: Final = 30.0
# Run under the wrapper at availability time: what confinement the payload would get.
CONFINEMENT_PROBE: Final = (
    "import json, os\n"
    "ns = {}\n"
    "for n in ('net', 'mnt', 'pid', 'user', 'ipc', 'uts'):\n"
    "    try: ns[n] = os.readlink('/proc/self/ns/' + n)\n"
    "    except OSError: ns[n] = None\n"
    "st, proc = {}, ''\n"
    "try:\n"
    "    for line in open('/proc/self/status'):\n"
    "        k, _, v = line.partition(':')\n"
    "        if k in ('Seccomp', 'NoNewPrivs', 'CapEff'): st[k] = v.strip()\n"
    "except OSError as e: proc = str(e)\n"
    "null = ''\n"
    "try: open('/dev/null', 'r+b').close()\n"
    "except OSError as e: null = str(e)\n"
    # The check's own rendezvous (`_CheckLook`): a file in the workspace, then a short wait
    # for the host's answer, so the host can look for this process while it waits.
    "import sys, time\n"
    "if len(sys.argv) > 2:\n"
    "    try: open(sys.argv[1], 'w').close()\n"
    "    except OSError: pass\n"
    "    else:\n"
    "        end = time.monotonic() + 3\n"
    "        while not os.path.exists(sys.argv[2]) and time.monotonic() < end: time.sleep(0.01)\n"
    "print('confinement=' + json.dumps({'ns': ns, 'status': st, 'uid': os.getuid(),\n"
    "                                   'no_proc': proc, 'no_dev_null': null}))\n"
)
# What the payload needs inside that a wrapper may leave out (README.md, "Host paths a wrapper
# must expose"): the test command names the gap instead of failing on it without a word.
NEEDS_DEV_NULL: Final = (
    "lifecycle_orphans (its children's stdio), resource_limits (its descriptor loop) and "
    "dev_access (its control device)"
)
# Values for the world's placeholders at availability time, when no world runs: well-formed,
# so a wrapper that checks its arguments (a port is a number, a CA bundle a readable file, an
# --add-host an address) runs the test command as it will run the cells (issue 27).
CHECK_HOST_IP: Final = "127.0.0.1"
CONFINEMENT_LINE: Final = "confinement="
NAMESPACES: Final = ("net", "mnt", "pid", "user", "ipc", "uts")
# After the test command reported, how long its wrapper may take to exit by itself.
TEST_GRACE_S: Final = 5.0
KILL_WAIT_S: Final = 10.0


def check_availability(wrapper: SpecWrapper) -> Availability:
    """Find the wrapper on its PATH, run its check, then a test command under its argv.

    AVAILABLE means the test command started under the wrapper and reported what it
    saw; what it saw (a private network namespace or the harness's, seccomp, no new
    privileges) goes into the identity as facts, for the probes to judge.
    """
    spec = wrapper.spec
    path = wrapper.run_path()
    fix = spec.install or f"install it, or fix [detect] executables in {spec.source}"
    here = current_platform()
    if here not in spec.platforms:
        return _unavailable(
            f"{spec.name} is declared for {list(spec.platforms)} "
            f"in {spec.source}; this machine is {here}",
        )
    for exe in spec.executables:
        if wrapper.which(exe) is None:
            where = "[run] path" if spec.path else "the payload's PATH (set [run] path)"
            return _unavailable(
                f"{exe} not found on {where} {path} (needed by the {spec.name} spec "
                f"{spec.source}); {fix}",
            )
    # A neutral name: the test command's workspace is the wrapper's to see (issue 23).
    with (
        tempfile.TemporaryDirectory(prefix="agent-check-") as tmp,
        _held_ports() as ports,
    ):
        ctx, run_dir, cwd = _check_context(wrapper, Path(tmp), ports)
        env = wrapper.wrapper_env(_check_payload_env(wrapper, ctx), ctx, {})
        version, version_gap = _version(wrapper, env)
        failure = _detect_check(wrapper, env)
        if failure:
            return _unavailable(failure)
        wrapper.render_files(ctx, run_dir)
        give(Path(tmp), wrapper.user(), recursive=True)
        seen = _confinement_check(wrapper, ctx, env, cwd)
    if isinstance(seen, str):
        return _unavailable(seen)
    facts = _confinement_facts(seen)
    notes = [version_gap] if version_gap else []
    if facts["unconfined"]:
        notes.append(
            f"{spec.name} ran its test command with no confinement at all (the harness's "
            "namespaces, no seccomp filter, no NoNewPrivs), as a wrapper that silently "
            "falls back looks (firejail inside a container, its warning hidden by "
            "--quiet); its cells are judged on that, and each probe of a claim it "
            "cannot keep FAILs"
        )
    notes += _missing_inside(seen)
    refused, kernel_notes = _kernel_shape(spec, facts["host_process"], seen.get("host_look") or {})
    if refused:
        return _unavailable(refused)
    notes += kernel_notes
    identity = Identity(
        name=spec.name,
        version=version,
        platform=platform_string(),
        claims=spec.claims,
        profile={
            "kind": "command",
            "spec": json.loads(json.dumps(spec.raw, sort_keys=True, default=str)),
            "egress": wrapper.egress_mode,
            "path": path,
            "check": shell_join(wrapper.static_argv(spec.check_argv))
            if spec.check_argv
            else "none",
            # Stable facts only (no namespace inode numbers): the digest pins the profile.
            "test_command": facts,
        },
        executables=wrapper.executables(),
        spec_sha256=hashlib.sha256(spec.source.read_bytes()).hexdigest(),
        runs_as=wrapper.runs_as(),
    )
    return Availability(ok=True, reason="; ".join(notes), identity=identity)


def _version(wrapper: SpecWrapper, env: dict[str, str]) -> tuple[str, str]:
    """The wrapper's version as `[detect] version` printed it, and '' or why it is unknown.

    The version goes into the signed identity, so only a command that exited 0 and printed
    something names it; otherwise the identity says `unknown: <why>` (the command, its exit
    status, the first line it printed), never a failing command's error line as a version,
    and never a bare `unknown` that hides why. The wrapper stays AVAILABLE: no verdict rests on
    the version, and the identity pins what ran by digest (`executables`) regardless.
    """
    spec = wrapper.spec
    if not spec.version_argv:
        return "unknown: the spec has no [detect] version", ""
    command = shell_join(wrapper.static_argv(spec.version_argv))
    result = _detect(wrapper, spec.version_argv, env)
    if isinstance(result, str):
        said = f"could not run: {result}"
    elif result.returncode != 0:
        first = _first_line(result.stderr) or _first_line(result.stdout) or "no output"
        said = f"exit {result.returncode}: {first[:200]}"
    elif not (first := _first_line(result.stdout) or _first_line(result.stderr)):
        said = "exit 0 with no output"
    else:
        return first, ""
    why = f"`{command}` run as {wrapper.runs_as()} {said}"
    return f"unknown: {why}", (
        f"{spec.name}'s version is unknown in its identity: {why}; the wrapper runs as that "
        f"user, so let it read what the version command needs, or fix [detect] version in "
        f"{spec.source}"
    )


def _detect_check(wrapper: SpecWrapper, env: dict[str, str]) -> str:
    """Run [detect] check if the spec has one; '' if it passed, else the reason."""
    spec = wrapper.spec
    if not spec.check_argv:
        return ""
    result = _detect(wrapper, spec.check_argv, env)
    if isinstance(result, str):
        said = result
    elif result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-400:]
        said = f"exit {result.returncode}: {output or 'no output'}"
    else:
        return ""
    return (
        f"{spec.name} is installed but cannot confine here: "
        f"`{shell_join(wrapper.static_argv(spec.check_argv))}` failed ({said}); check the "
        f"wrapper works on this machine, or fix [detect] check in {spec.source}"
    )


def _confinement_check(
    wrapper: SpecWrapper, ctx: RenderContext, env: dict[str, str], cwd: Path
) -> dict[str, Any] | str:
    """Run a one-liner under the spec's own [run] argv: what it saw, or why it did not run.

    A wrapper's exit status does not show it started anything, so the one-liner must
    report back, run with the argv the cells will use: one extra process.
    """
    spec = wrapper.spec
    try:
        mine = {n: str(Path(f"/proc/self/ns/{n}").readlink()) for n in NAMESPACES}
    except OSError as exc:
        return (
            f"{spec.name}: cannot read the harness's own namespaces ({exc}), so cannot "
            "compare the wrapper's; run the harness on Linux with /proc mounted"
        )
    said, stdout, look = _run_test_command(wrapper, ctx.render_argv(spec), env, cwd, ctx)
    seen = _confinement_line(stdout)
    if seen is None:
        return _no_test_command(spec, said)
    seen["host_look"] = look
    if seen.get("no_proc"):
        # It started, but what it saw cannot be read: not the wrapper failing to run.
        return (
            f"{spec.name} ran the test command, but the payload has no /proc inside "
            f"({seen['no_proc']}): the harness reads the payload's namespaces and status "
            "there, and probes read /proc/self; mount a proc filesystem at /proc in [run] "
            f'argv (bwrap: --proc /proc) in {spec.source} (README.md, "Host paths a wrapper '
            'must expose")'
        )
    seen["harness_ns"] = mine
    return seen


def _missing_inside(seen: dict[str, Any]) -> list[str]:
    """What the test command found missing inside that some probes need (a note each)."""
    if not seen.get("no_dev_null"):
        return []
    why = seen["no_dev_null"]
    note = (
        f"the payload cannot open /dev/null inside ({why}): {NEEDS_DEV_NULL} need it and "
        "cannot decide without it; expose a minimal /dev (bwrap: --dev /dev) "
        '(README.md, "Host paths a wrapper must expose")'
    )
    return [note]


def _run_test_command(
    wrapper: SpecWrapper, argv: list[str], env: dict[str, str], cwd: Path, ctx: RenderContext
) -> tuple[str, str, dict[str, Any]]:
    """Run the test command as a cell runs: own session, own group, swept afterwards.

    It returns soon after the one-liner reported: a wrapper that lingers (a helper left
    running, a `wait` on a daemon) gets TEST_GRACE_S to exit, then its process group is
    killed and everything left in its cell group swept, so availability never waits on
    a leftover.

    Meanwhile `_CheckLook` watches for the test command's file in the workspace and looks for
    its process among the group's members (or, where the group holds none, all of /proc).

    Returns:
        (what happened in words, the stdout read, what the host saw of the test command).
    """
    with cellgroup.open_cell() as group:
        look = _CheckLook(ctx.payload, group)
        look.start()
        try:
            said, stdout = _run_test_command_in(wrapper, group, argv, env, cwd)
        finally:
            seen = look.finish()
        return said, stdout, seen


def _run_test_command_in(
    wrapper: SpecWrapper,
    group: cellgroup.CellGroup,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
) -> tuple[str, str]:
    watcher = LeftoverWatcher(group)
    watcher.start()
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            **wrapper.user_kwargs(),
            # In the group, and a killed harness takes the wrapper with it.
            **cellgroup.spawn_kwargs(argv, env),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        cellgroup.spawn_failed()
        watcher.finish()
        return f"{type(exc).__name__}: {exc}", ""
    cellgroup.started(proc.pid)
    readers = [
        threading.Thread(target=_read_all, args=(stream, sink), daemon=True)
        for stream, sink in ((proc.stdout, out), (proc.stderr, err))
    ]
    for reader in readers:
        reader.start()
    start = time.monotonic()
    _wait_for_report(proc, out)
    lingered = proc.poll() is None
    if lingered:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_WAIT_S)
    watcher.finish()
    for reader in readers:
        reader.join(timeout=2.0)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    stdout = b"".join(out).decode("utf-8", "replace")
    stderr = b"".join(err).decode("utf-8", "replace")
    output = (stderr.strip() or stdout.strip())[-400:] or "no output"
    if lingered:
        return f"killed after {time.monotonic() - start:.0f} s: {output}", stdout
    return f"exit {proc.returncode}: {output}", stdout


def _check_payload_env(wrapper: SpecWrapper, ctx: RenderContext) -> dict[str, str]:
    """The payload env the test command gets (as a cell's, with the check's workspace)."""
    proxy = {"harness-tcp": ctx.scalars["proxy_url"]}.get(wrapper.spec.egress)
    return payload_env(proxy, Path(ctx.scalars["workspace"]))


@contextlib.contextmanager
def _held_ports() -> Iterator[tuple[int, int]]:
    """A loopback TCP listener and UDP socket held for the check: (tcp port, udp port).

    The ports `{proxy_port}`, `{dns_port}` and the fixture ports name at availability time:
    real, and the harness's own while the test command runs, so a wrapper that checks or
    dials them meets no other service of the host. Nothing is served on them.
    """
    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
    ):
        tcp.bind((CHECK_HOST_IP, 0))
        tcp.listen(8)
        udp.bind((CHECK_HOST_IP, 0))
        yield tcp.getsockname()[1], udp.getsockname()[1]


def _check_world(ports: tuple[int, int], ca_bundle: Path) -> dict[str, str]:
    """The world's placeholders for the test command, well-formed (no world runs yet).

    Every one a cell renders has a value of its kind here: a port is a held loopback port, the
    CA bundle a readable file, a host a name, an address an address. A sample `<proxy_port>`
    made a wrapper that checks its arguments refuse a correct spec (issue 27).
    """
    tcp, udp = ports
    user, secret = "agent", secrets.token_hex(16)
    scalars = {
        "proxy_url": f"http://{user}:{secret}@{CHECK_HOST_IP}:{tcp}",
        "proxy_host": CHECK_HOST_IP,
        "proxy_port": str(tcp),
        "proxy_user": user,
        "proxy_secret": secret,
        "shim_port": str(SHIM_PORT),
        "ca_bundle": str(ca_bundle),
        "dns_host": CHECK_HOST_IP,
        "dns_port": str(udp),
    }
    for role in HOST_ROLES:
        scalars |= {
            f"{role}_host": f"{role}.test",
            f"{role}_ip": CHECK_HOST_IP,
            f"{role}_https_port": str(tcp),
            f"{role}_http_port": str(tcp),
        }
    return scalars


def _check_context(
    wrapper: SpecWrapper, root: Path, ports: tuple[int, int]
) -> tuple[RenderContext, Path, Path]:
    """A render context for the test command: real paths under `root`, real-shaped rest.

    Returns:
        (context, run dir, the wrapper's cwd).
    """
    spec = wrapper.spec
    workspace, run_dir, proxy_sock = root / "workspace", root / "run", root / "proxy.sock"
    workspace.mkdir()
    run_dir.mkdir()
    proxy_sock.touch()  # wrappers bind it in; nothing connects during the check
    ca_bundle = root / "ca.pem"  # no certificate: nothing dials TLS during the check
    ca_bundle.write_text("", encoding="utf-8")
    ca_bundle.chmod(0o644)
    # A spec may bind {shim}: a copy under the cells' neutral name (issue 23).
    shim = root / STAGED_SHIM
    shutil.copyfile(shim_path(), shim)
    shim.chmod(0o644)
    # The interpreter every cell's payload gets (sandbox_attest/host/interpreter.py).
    python = run_interpreter()
    # The ready and go files of the check's rendezvous, named as a cell's are (neutral).
    mark = secrets.token_hex(8)
    ready, go = workspace / disguise.ready_name(mark), workspace / disguise.go_name(mark)
    payload = [python.path, "-c", CONFINEMENT_PROBE, str(ready), str(go)]
    sample = sample_context()
    read_only = [str(p) for p in python.bind_paths()]
    env = [f"{k}={v}" for k, v in payload_env(None, workspace).items()]
    # No world at availability time: the host lists are empty (no network), the
    # value a wrapper's settings file can always take.
    lists = sample.lists | {"read_only": read_only, "payload_env": env}
    lists |= {name: [] for name in LIST_NAMES if name.startswith(("allowed_", "denied_"))}
    hosts = {
        f"{n}_{form}": "[]" if form == "json" else ""
        for n in lists
        if n.startswith(("allowed_", "denied_"))
        for form in ("json", "csv")
    }
    scalars = (
        sample.scalars
        | hosts
        | _check_world(ports, ca_bundle)
        | {
            "workspace": str(workspace),
            "run_dir": str(run_dir),
            "cell_id": f"{spec.name}-availability",
            "python": python.path,
            "probe_argv": shell_join(payload),
            "payload_shell": shell_join(payload),
            "proxy_socket": str(proxy_sock),
            "shim": str(shim),
            "world_dir": str(root),
            "read_only_json": json_list(read_only),
            "read_only_csv": ",".join(read_only),
            "payload_env_json": json_list(env),
            "payload_env_csv": ",".join(env),
            "wrapper_home": str(wrapper.wrapper_home()),
            **payload_ids(payload_user()),
            **spec.static_scalars(),
        }
    )
    base = RenderContext(scalars, lists, payload)
    scalars["proxy_socket_inside"] = base.render(
        spec.proxy_socket_inside, f"{spec.source}: [run] proxy_socket_inside"
    )
    scalars["shim_inside"] = base.render(spec.shim_inside, f"{spec.source}: [run] shim_inside")
    ctx = RenderContext(scalars, lists, payload).with_spec_lists(spec)
    return ctx, run_dir, wrapper.cwd(ctx)


def _detect(
    wrapper: SpecWrapper, argv: tuple[str, ...], env: dict[str, str]
) -> subprocess.CompletedProcess[str] | str:
    # The wrapper is third-party code under test: even its --version runs as the user its
    # cells run as, never as the harness's (root's) own, and on the PATH its cells use.
    # Its own session, and on timeout its whole group goes: a --version that forks a
    # helper must not leave it running, and a killed harness takes it along.
    try:
        proc = subprocess.Popen(
            wrapper.static_argv(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd="/",
            **wrapper.user_kwargs(),
            **lifetime.popen_kwargs(),
        )
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        stdout, stderr = proc.communicate(timeout=DETECT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"{type(exc).__name__}: {exc}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _wait_for_report(proc: subprocess.Popen[bytes], out: list[bytes]) -> None:
    """Wait for the test command's wrapper to exit: at most TEST_GRACE_S after it reported."""
    start, seen_at = time.monotonic(), None
    while proc.poll() is None and time.monotonic() - start < DETECT_TIMEOUT_S:
        if seen_at is None and CONFINEMENT_LINE.encode() in b"".join(out):
            seen_at = time.monotonic()
        if seen_at is not None and time.monotonic() - seen_at > TEST_GRACE_S:
            return
        time.sleep(0.05)


def _read_all(stream: Any, sink: list[bytes]) -> None:
    """Read a pipe to EOF into `sink` (a daemon thread: a leftover may hold it open)."""
    with contextlib.suppress(OSError, ValueError):
        while chunk := stream.read1(65536):
            sink.append(chunk)


def _confinement_line(stdout: str) -> dict[str, Any] | None:
    """What CONFINEMENT_PROBE printed, or None if it printed nothing readable."""
    for line in stdout.splitlines():
        if line.startswith(CONFINEMENT_LINE):
            with contextlib.suppress(ValueError):
                seen = json.loads(line.removeprefix(CONFINEMENT_LINE))
                if isinstance(seen, dict):
                    return seen
    return None


def _confinement_facts(seen: dict[str, Any]) -> dict[str, Any]:
    """The test command's readings as stable facts for the identity (no inode numbers).

    `unconfined` is the silent fall-back: every namespace the harness's, no seccomp filter,
    no NoNewPrivs. It is a fact, not a verdict: the probes FAIL what that leaves open.
    """
    ns, mine = seen.get("ns") or {}, seen.get("harness_ns") or {}
    status = seen.get("status") or {}
    shared = sorted(n for n in NAMESPACES if ns.get(n) is not None and ns.get(n) == mine.get(n))
    seccomp = str(status.get("Seccomp", "unknown"))
    no_new_privs = str(status.get("NoNewPrivs", "unknown"))
    return {
        "started": True,
        "network_namespace": "the harness's own" if "net" in shared else "private",
        "namespaces_shared_with_harness": shared,
        "seccomp": seccomp,
        "no_new_privs": no_new_privs,
        "uid": seen.get("uid"),
        "unconfined": set(shared) == set(NAMESPACES) and seccomp == "0" and no_new_privs == "0",
        "host_process": _host_process_fact(seen.get("host_look") or {}),
    }


def _host_process_fact(look: dict[str, Any]) -> str:
    """Whether the host read the test command as a process of its own, in one stable phrase."""
    if look.get("host_pids"):
        return "seen"
    if look.get("landed"):
        return "not seen; its workspace file landed"
    return "unknown: its workspace file never reached the host"


def _no_test_command(spec: CommandSpec, said: str) -> str:
    return (
        f"{spec.name} did not run a test command under its [run] argv ({said}); "
        f"check the wrapper works on this machine, or fix [run] argv in {spec.source}"
    )


def _unavailable(reason: str) -> Availability:
    return Availability(ok=False, reason=reason, identity=None)


def _kernel_shape(spec: CommandSpec, fact: str, look: dict[str, Any]) -> tuple[str, list[str]]:
    """The kernel claim against the test command's behaviour: (why UNAVAILABLE or "", notes).

    A sandbox with its own kernel (gVisor's Sentry, a microVM) shows the host no process of
    the payload's: the test command's file lands in the workspace, yet no host process runs
    it. Seen without `kernel = "own"`, the note says so and names the claim (the cells would
    otherwise wait for a host reading that never comes). Claimed while the host reads the
    test command as its own process, the claim is false, and a false claim would take the
    probes only a host view could judge off the table: UNAVAILABLE, naming the fix.
    """
    own = claims_of(spec.claims).own_kernel
    if own and fact == "seen":
        pids = ", ".join(str(p) for p in look.get("host_pids", []))
        return (
            f'{spec.name} claims kernel = "own", but the host reads its test command as a host '
            f"process (pid {pids}): a payload the host can read runs on the host's kernel; drop "
            f"kernel from [claims] in {spec.source}"
        ), []
    if own and fact != "not seen; its workspace file landed":
        note = (
            f'{spec.name} claims kernel = "own", and its test command\'s file in the workspace '
            "never reached the host: under that claim the workspace is the rendezvous and the "
            "witness that the payload ran, so make the workspace writable through to the host "
            "or no cell can be judged"
        )
        return "", [note]
    if not own and fact == "not seen; its workspace file landed":
        note = (
            f"{spec.name} ran its test command where the host sees no process of it, yet its "
            "file landed in the workspace: the shape of a sandbox with a kernel of its own "
            f'(gVisor, a microVM); claim kernel = "own" in [claims] of {spec.source} so its '
            "cells are judged by the effects outside the sandbox (README, Claims)"
        )
        return "", [note]
    return "", []


class _CheckLook:
    """The availability check's rendezvous: did the host see the test command as a process?

    The one-liner (CONFINEMENT_PROBE) writes its ready file into the workspace and waits for
    the go file; on seeing the ready file the host looks, for at most FIND_S, for a process
    whose command line is the one-liner's own (`python -c PROBE READY GO`: a wrapper's
    command line carries the same words later on, and is the wrapper), in the cell's group
    and then anywhere on the host, then answers.
    """

    FIND_S: Final = 1.0

    def __init__(self, payload: list[str], group: cellgroup.CellGroup) -> None:
        """Watch for `payload`'s ready file (its argv[3]) in `group`."""
        self.ready, self.go = Path(payload[3]), Path(payload[4])
        self.group = group
        self.landed = False
        self.host_pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="check-look", daemon=True)

    def start(self) -> None:
        """Begin watching in a background thread."""
        self._thread.start()

    def finish(self) -> dict[str, Any]:
        """Stop watching; whether the file landed and which host pids ran the one-liner."""
        self._stop.set()
        self._thread.join(self.FIND_S + 1.0)
        return {"landed": self.landed, "host_pids": list(self.host_pids)}

    def _watch(self) -> None:
        while not self.ready.exists():
            if self._stop.wait(0.005):
                return
        self.landed = True
        deadline = time.monotonic() + self.FIND_S
        while not self.host_pids and time.monotonic() < deadline:
            # The group first; then every host process: an engine's daemon starts the
            # container outside the group (docker, podman), and it is still a host process.
            found = [pid for pid in self.group.pids() if self._runs_it(pid)]
            self.host_pids = found or [pid for pid in _all_pids() if self._runs_it(pid)]
            if not self.host_pids:
                time.sleep(0.02)
        with contextlib.suppress(OSError):
            os.close(os.open(self.go, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))

    def _runs_it(self, pid: int) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return len(argv) >= 4 and argv[1] == b"-c" and argv[3] == str(self.ready).encode()


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
