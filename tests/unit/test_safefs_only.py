"""Root changes no payload-reachable path by path: sandbox_attest/host/safefs.py does (issue 23).

Every call under sandbox_attest/ that creates, writes, chmods, chowns, links, renames, binds or
removes by path is found with `ast` (nothing is imported), and each must sit in a module or
function listed below with the reason its paths are root's alone. Anything new fails here until
it goes through `sandbox_attest.host.safefs` (a `SafeDir`, `trust.give`) or is listed with a reason.

How a call is told from a SafeDir call without types: a `SafeDir` method takes the entry's name
as its first argument (`site.mkdir(name, mode)`, `site.unlink(name)`, `site.chmod(name,
mode)`), where `Path.mkdir` takes none or a mode, `Path.unlink`/`rmdir` none, `Path.chmod` one.
`write_text`, `write_bytes`, `touch`, `symlink_to`, `rename` have no SafeDir twin: always
path-based.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import sandbox_attest

PACKAGE = Path(sandbox_attest.__file__).resolve().parent

# Path methods that change the filesystem, and os/shutil functions that do.
METHODS: Final = frozenset(
    {"write_text", "write_bytes", "chmod", "lchmod", "mkdir", "unlink", "rmdir"}
    | {"symlink_to", "hardlink_to", "touch", "rename"}
)
FUNCTIONS: Final = frozenset(
    {f"os.{f}" for f in ("chown", "lchown", "chmod", "symlink", "link", "unlink", "remove")}
    | {f"os.{f}" for f in ("mkdir", "makedirs", "rename", "rmdir", "mkfifo")}
    | {f"shutil.{f}" for f in ("rmtree", "copy", "copy2", "copyfile", "copytree", "move")}
    | {"shutil.chown"}
)

# Modules whose every such path is root's alone (the payload user can write none of them).
ROOT_ONLY_MODULES: Final = {
    # The implementation itself: every call there is relative to a directory descriptor.
    "host/safefs.py": "the safe layer itself: names relative to held directory descriptors",
    # The report dir, keys, merge output: root's, 0700, written O_EXCL | O_NOFOLLOW.
    "attest/keys.py": "the key store: root's 0700 directories",
    "attest/merge.py": "the merged report dir: root's, made by the harness",
    "report/files.py": "the report dir: root's 0700, O_EXCL | O_NOFOLLOW writes",
    "attest/sigstore.py": "a root-made temp file for the keyless signature",
    # cgroup dirs: made by root with mode 0755 in cgroupfs; the payload user can write none.
    "host/cellgroup.py": "the per-run and per-cell cgroups: root's 0755 in cgroupfs",
    "host/cgroupfs.py": "cgroupfs control files and dirs: root's",
    # The proxy and the pipe broker live in the world's run dir (root's 0711).
    "world/egress/proxy.py": "the proxy's socket and config in the world run dir (root's 0711)",
    "world/egress/server.py": "the proxy's own socket in the world run dir (root's 0711)",
    "world/egress/pipe_broker.py": "the broker's socket in the world run dir (root's 0711)",
    # The harness's scratch root: made fresh per run, root's 0755 (traversable, not writable).
    "testing.py": "the plugin's scratch root: root's 0755, made per session",
    "run/world.py": "the run's scratch root and world dir: root's, made per run",
    "run/reach.py": "the payload copy under the scratch: root's 0755/0644",
    "payload.py": "the cell's input dir: root's 0755, written before the payload starts",
    "run/runner.py": "cell dirs under scratch/cells (root's 0755); the workspace is handed over "
    "by trust.give (safefs) only after prepare",
    "backends/seatbelt.py": "the cell dir (macOS; the harness's own)",
    "run/focus.py": "the derived matrix and policy, in a private temp dir the caller made",
    "report/explain.py": "a developer's tool rewriting probes/README.md in the checkout, no run's",
    "host/journal.py": "the journal dir (root's 0700) and its entries",
    "run/sweep.py": "journal entries; journalled paths are removed through safefs",
    # The world: its run dir (root's 0711), the PKI's files, the lab's private mount ns.
    "world/blob.py": "the blob's sha256 beside it in the world dir",
    "world/core.py": "the world run dir: root's 0711",
    "world/faults.py": "the fault injector's own files in the world dir",
    "world/lab.py": "resolv.conf/hosts in the lab's private mount namespace",
    "world/listeners.py": "listener sockets in the world run dir",
    "world/pki.py": "the session CA and leaf files: root's",
    "world/wheel.py": "the canary wheel build dir under the world dir",
    "host/trust.py": "the home's parent (/var/lib/...): root's; _ensure_home checks it right after",
}

# Single functions in modules that also touch payload-reachable paths (through safefs there).
ROOT_ONLY_FUNCTIONS: Final = {
    "catalog/controls.py:save_state": "the cell dir: root's",
    "host/as_user.py:write_each": "runs in a child as the payload user (call_as), never as root",
    "catalog/fs/write_outside.py:FsWriteOutside.prepare": "its baseline and plant list in the "
    "cell dir",
    "catalog/fs/read_secrets.py:FsReadSecrets.prepare": "the control canary in the workspace, "
    "which is root's while prepare runs (runner.py hands it over after)",
    "catalog/fs/protected.py:FsProtectedInWorkspace.prepare": "the workspace: root's during "
    "prepare",
    "catalog/ipc/proxy_socket.py:IpcProxySocketTamper.prepare": "the decoy route dir in the cell "
    "dir, made fresh (mkdir fails if it exists) and filled before it is given",
    "catalog/ipc/proxy_socket.py:IpcProxySocketTamper.cleanup": "the world's proxy socket "
    "(root's run dir)",
    "catalog/ipc/proxy_socket.py:IpcProxySocketTamper._restore_real_shim": "the harness's shim "
    "source",
    "catalog/ipc/proxy_socket.py:_bind_unix": "the decoy socket in the cell dir, bound before it "
    "is given",
    "catalog/controls.py:run_payload_on_host": "the host baseline's dir in the cell dir (root's); "
    "its workspace is made there before trust.give hands it over",
    "catalog/proc/anchor.py:AnchoredSpec._start_anchor": "the anchor dir in the cell dir: root's",
    "catalog/proc/namespace.py:ProcNamespaceEscape.prepare": "the ns-canary dir in the cell dir, "
    "made before it is given",
    "catalog/crossproc.py:_start_target": "the target's dir in the cell dir: root's",
    "catalog/socket_witness.py:bind_unix": "called with /proc/self/fd/N/name of a directory "
    "held by safefs (WitnessSockets._plant_at), or an abstract name",
    "backends/command/check.py:_check_context": "a fresh root temp dir for the availability check",
    "backends/command/backend.py:CommandBackend.prepare": "the cell's run dir, made fresh in "
    "the cell dir, filled before trust.give hands it over",
    "backends/command/wrapper.py:SpecWrapper.render_files": "the run dir, before it is given",
}

# Payload-reachable, not routed yet: each is a known gap, with what makes it narrow today.
# Listed so that a gap is visible here and nothing new joins it silently. None today.
KNOWN_GAPS: Final[dict[str, str]] = {}


@dataclass(frozen=True)
class Call:
    """One path-based call: where it is, and what it calls."""

    module: str  # relative to the package, "catalog/fs.py"
    scope: str  # "Class.method" or "function" ("" at module level)
    line: int
    what: str  # ".mkdir", "os.chown", ".bind"

    def key(self) -> str:
        """`module:scope`, as the allow-lists name it."""
        return f"{self.module}:{self.scope}"

    def __str__(self) -> str:
        """`catalog/fs.py:123 (FsReadSecrets.prepare) calls .write_text`."""
        return f"{self.module}:{self.line} ({self.scope or 'module level'}) calls {self.what}"


def _is_mode(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int | bool)


def _path_based(call: ast.Call) -> str | None:
    """The call's name when it changes the filesystem by path, else None."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if isinstance(func.value, ast.Name) and f"{func.value.id}.{func.attr}" in FUNCTIONS:
        return f"{func.value.id}.{func.attr}"
    if isinstance(func.value, ast.Name) and func.value.id in ("os", "shutil"):
        return None
    args = call.args
    if func.attr == "bind":
        # A (host, port) tuple is no path; anything else may name a unix socket's path.
        return None if args and isinstance(args[0], ast.Tuple) else ".bind"
    if func.attr not in METHODS:
        return None
    safe = (
        (func.attr in ("unlink", "rmdir", "mkdir") and bool(args) and not _is_mode(args[0]))
        or (func.attr == "chmod" and len(args) > 1)  # SafeDir.chmod(name, mode)
    )
    return None if safe else f".{func.attr}"


class _Finder(ast.NodeVisitor):
    """Collects the path-based calls of one module, each with its class/function scope."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.found: list[Call] = []

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped  # noqa: N815

    def visit_Call(self, node: ast.Call) -> None:
        """Record `node` when it changes the filesystem by path."""
        what = _path_based(node)
        if what is not None:
            self.found.append(Call(self.module, ".".join(self.scope), node.lineno, what))
        self.generic_visit(node)


def path_based_calls() -> list[Call]:
    """Every path-based call in the package, with its module and enclosing class/function."""
    found: list[Call] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        finder = _Finder(str(path.relative_to(PACKAGE)))
        finder.visit(ast.parse(path.read_text(), str(path)))
        found += finder.found
    return found


def allowed(call: Call) -> bool:
    """Whether a listed module, function (or a function nested in one) covers `call`."""
    if call.module in ROOT_ONLY_MODULES:
        return True
    listed = {**ROOT_ONLY_FUNCTIONS, **KNOWN_GAPS}
    parts = call.scope.split(".")
    return any(f"{call.module}:{'.'.join(parts[:n])}" in listed for n in range(1, len(parts) + 1))


def test_no_path_based_change_outside_the_lists() -> None:
    """Every path-based filesystem change is in a root-only module or function, or a named gap."""
    stray = [str(c) for c in path_based_calls() if not allowed(c)]
    assert stray == [], (
        "path-based filesystem changes outside the allow-lists; route them through "
        "sandbox_attest.host.safefs (a SafeDir, trust.give), or list them in "
        "tests/unit/test_safefs_only.py with why only root can write there:\n  "
        + "\n  ".join(stray)
    )


def test_every_listed_entry_still_has_a_call() -> None:
    """No entry of the lists outlives its calls: a stale reason would hide a future one."""
    calls = path_based_calls()
    modules = {c.module for c in calls}
    scopes = {f"{c.module}:{'.'.join(c.scope.split('.')[:n])}" for c in calls for n in range(1, 4)}
    # A module not in this checkout (another change adds it) is not stale, only absent.
    present = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    stale = sorted(set(ROOT_ONLY_MODULES) & present - modules) + sorted(
        k
        for k in {**ROOT_ONLY_FUNCTIONS, **KNOWN_GAPS}
        if k not in scopes and k.partition(":")[0] in present
    )
    assert stale == [], f"listed but no path-based call there any more: {stale}"


def test_the_scan_finds_a_planted_path_write() -> None:
    """The scan is not blind: `write_text`, `os.chown`, `Path.mkdir` found; SafeDir.mkdir not."""
    source = (
        "import os\n"
        "def plant(p, d):\n"
        "    p.write_text('x')\n"
        "    os.chown(p, 0, 0)\n"
        "    d.mkdir(p.name, 0o755)\n"
        "    p.mkdir(0o700)\n"
    )
    finder = _Finder("planted.py")
    finder.visit(ast.parse(source))
    assert [(c.scope, c.line, c.what) for c in finder.found] == [
        ("plant", 3, ".write_text"),
        ("plant", 4, "os.chown"),
        ("plant", 6, ".mkdir"),
    ]
