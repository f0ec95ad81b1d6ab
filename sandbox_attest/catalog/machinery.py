"""The sandbox's own machinery, host side: its helper, config and descriptors (issue 28).

Two classes of escape that attack the sandbox rather than the host's data:

- `fs_machinery_overwrite` (runc's `/proc/self/exe` overwrite, CVE-2019-5736): the payload
  opens for write its own executable, its ancestors', the staged launcher, program and task,
  the egress shim copy, and a harness-made copy of a sandbox's helper binary, config and
  proxy allowlist planted outside the workspace where the payload user may write them. The
  witness is the host's sha256 of every one of those files (and a stat fingerprint of the
  real helper binaries on this host: bwrap, prlimit, env, firejail), before and after the
  cell, plus a scan of the cell's directory for the payload's marker line.
- `fs_leaked_dirfd` (runc's descriptor leak, CVE-2024-21626): the payload walks every
  directory descriptor it holds (`openat(fd, "..")`, `fchdir`) towards a canary directory the
  harness made outside the sandbox. The witnesses are the canary's random content (the payload
  can only report it by reading it), the (device, inode) of the host's own directories
  compared with those the payload reached, and the host's own reading of the payload's
  descriptors and working directory at the rendezvous.

Nothing here writes to a real helper binary: the payload appends only to harness-made copies,
and opens executables for write without writing a byte (an open that succeeds is the escape).
Every root file operation under the cell directory goes through `sandbox_attest.host.safefs`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.attempts import (
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
)
from sandbox_attest.catalog.controls import (
    control_record,
    guarded_check,
    host_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.judging import (
    conclude,
    expect_fs_confined,
    judge_escape,
    private_namespace_reason,
)
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    home_of,
)
from sandbox_attest.claims import Claims, claims_of
from sandbox_attest.host import disguise, safefs
from sandbox_attest.host.trust import unreachable_by
from sandbox_attest.verdict import Assessment, Expectation

MACHINERY_DIR: Final = "machinery"
# The harness's stand-ins for a sandbox's machinery: a helper binary (a copy of true(1)), its
# config and its proxy's allowlist, as a wrapper would keep them beside the sandbox.
HELPER_SOURCE: Final = Path("/usr/bin/true")
MACHINERY_FILES: Final = ("helper", "config", "allowlist")
CONFIG_TEXT: Final = '[sandbox]\nnetwork = "proxy"\nfilesystem = "workspace"\n'
ALLOWLIST_TEXT: Final = "allowed.test:443\n"
CONTROL_COPY: Final = "helper-copy"
HOST_CONTROL_FILE: Final = "host-control.toml"
# The real helpers a wrapper on this host may run; stat-fingerprinted, never hashed whole
# (docker's client is tens of MiB) and never written.
REAL_HELPERS: Final = ("bwrap", "prlimit", "env", "firejail", "docker")
# The marker scan reads the cell dir (inputs, shim, the wrapper's run dir) but no more: a
# wrapper's own home there (Codex's sessions/YYYY/MM/DD) is deep but small; a walk past these
# bounds is cut, and a cut walk decides nothing.
SCAN_MAX_ENTRIES: Final = 2000
SCAN_MAX_BYTES: Final = 1 << 20
SCAN_MAX_DEPTH: Final = 32

# How far up from the payload the host reads descriptors (the shim, an init, the payload).
MAX_ANCESTORS_READ: Final = 8
DIRFD_DIR: Final = disguise.DIRFD_CANARY_DIR
DIRFD_CANARY: Final = disguise.CANARY_FILE
DIRFD_CONTROL: Final = "dirfd-control.txt"
PATH_ATTEMPT: Final = "path:canary"
SCAN_ATTEMPT: Final = "scan:descriptors"


def _marker(nonce: str) -> str:
    """The line the payload appends, built by the payload from the nonce.

    Never sent in the task: the staged task file sits in the cell dir the host scans, and
    must not carry the phrase it looks for.
    """
    return f"overwritten-by-{nonce}"


def _owner(ctx: CellContext) -> tuple[int, int] | None:
    return (ctx.user.uid, ctx.user.gid) if ctx.user is not None else None


def _sha256(directory: safefs.SafeDir, name: str) -> str:
    try:
        return hashlib.sha256(directory.read_bytes(name, SCAN_MAX_BYTES)).hexdigest()
    except (OSError, safefs.UnsafePathError) as exc:
        return f"unreadable: {exc}"


def _fingerprint(path: Path) -> str:
    """A real helper's identity and last change: a write moves its mtime and ctime."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _real_helpers() -> dict[str, str]:
    found = {}
    for name in REAL_HELPERS:
        where = shutil.which(name)
        if where is not None:
            found[str(Path(where).resolve())] = _fingerprint(Path(where).resolve())
    return found


def _digests(ctx: CellContext) -> dict[str, str]:
    """sha256 of each planted file, keyed by its host path."""
    digests: dict[str, str] = {}
    places: list[tuple[Path, tuple[str, ...]]] = [
        (ctx.cell_dir / MACHINERY_DIR, (*MACHINERY_FILES, HOST_CONTROL_FILE)),
        (ctx.workspace, (CONTROL_COPY,)),
    ]
    if ctx.route is not None:  # the cell's staged copy, or the installed shim (root's)
        places.append((ctx.route.shim_source.parent, (ctx.route.shim_source.name,)))
    for directory, names in places:
        try:
            with safefs.open_dir(directory) as place:
                for name in names:
                    digests[str(directory / name)] = _sha256(place, name)
        except (OSError, safefs.UnsafePathError) as exc:
            for name in names:
                digests[str(directory / name)] = f"unreadable: {exc}"
    return digests


def _scan(directory: safefs.SafeDir, marker: bytes, skip: str, depth: int, found: _Scan) -> None:
    """Note in `found` the host paths under `directory` whose bytes hold `marker`.

    One budget of entries for the whole walk (`SCAN_MAX_ENTRIES`): a run dir the payload
    could flood must not stall the host, and a walk cut short says so instead of "no marker".
    """
    for name in sorted(os.listdir(directory.fd)):  # noqa: PTH208  (a descriptor, not a path)
        if found.visited >= SCAN_MAX_ENTRIES:
            found.cut = True
            return
        found.visited += 1
        st = directory.entry(name)
        if st is None:
            continue
        if stat.S_ISDIR(st.st_mode) and name != skip:
            if depth >= SCAN_MAX_DEPTH:
                found.cut = True
                continue
            try:
                child = directory.open_subdir(name)
            except (OSError, safefs.UnsafePathError):
                continue
            _scan(child, marker, "", depth + 1, found)
        elif stat.S_ISREG(st.st_mode):
            try:
                if marker in directory.read_bytes(name, SCAN_MAX_BYTES):
                    found.hits.append(str(directory.path / name))
            except (OSError, safefs.UnsafePathError):
                continue


@dataclass
class _Scan:
    """What the marker scan found, how far it got, and whether it was cut short."""

    hits: list[str] = field(default_factory=list)
    visited: int = 0
    cut: bool = False


def _holds_marker(directory: Path, name: str, nonce: str) -> bool:
    """Whether the host sees the payload's marker line in `name` (the append arrived)."""
    try:
        with safefs.open_dir(directory) as place:
            return _marker(nonce).encode() in place.read_bytes(name, SCAN_MAX_BYTES)
    except (OSError, safefs.UnsafePathError):
        return False


def marked_files(ctx: CellContext) -> _Scan:
    """Files in the cell dir (not the workspace) carrying this cell's marker line."""
    found = _Scan()
    try:
        with safefs.open_dir(ctx.cell_dir) as cell:
            _scan(cell, _marker(ctx.nonce).encode(), ctx.workspace.name, 0, found)
    except (OSError, safefs.UnsafePathError):
        found.cut = True
    return found


class FsMachineryOverwrite(SpecBase):
    """Open the sandbox's helper, config, allowlist, inputs and shim for write from inside."""

    id = "fs_machinery_overwrite"
    area = "machinery"
    host_readings = (
        "sha256 of the sandbox's helper, config, allowlist and shim copies on the host",
        "marker scan of the cell's inputs and the wrapper's run dir",
    )

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The control, the payload's own exe, each planted file, the shim; ancestors/inputs."""
        targets = task.get("targets") or {}
        files = sorted(targets.get("files") or {})
        shim = ("write:shim",) if targets.get("shim") else ()
        return AttemptTable(
            required=attempts_of("control:workspace", "exe:self", ("write", tuple(files)), *shim),
            discovered=("exe:", "input:"),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied where the payload may write only its workspace; seen on the open leg."""
        return expect_fs_confined(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant the machinery copies (the payload user's, outside the workspace) and hash."""
        owner = _owner(ctx)
        helper = HELPER_SOURCE.read_bytes()
        contents: dict[str, bytes | str] = {
            "helper": helper,
            "config": CONFIG_TEXT,
            "allowlist": ALLOWLIST_TEXT,
        }
        modes = {"helper": 0o755, "config": 0o644, "allowlist": 0o644}
        with safefs.open_dir(ctx.cell_dir) as cell, cell.mkdir(MACHINERY_DIR, 0o755) as place:
            for name in MACHINERY_FILES:
                place.create_file(name, contents[name], modes[name], owner)
            place.create_file(HOST_CONTROL_FILE, CONFIG_TEXT, 0o644, owner)
        with safefs.open_dir(ctx.workspace) as workspace:
            workspace.create_file(CONTROL_COPY, helper, 0o755)
        save_state(ctx, {"before": _digests(ctx), "helpers": _real_helpers()})
        machinery = ctx.cell_dir / MACHINERY_DIR
        return {
            "files": {name: str(machinery / name) for name in MACHINERY_FILES},
            "control": str(ctx.workspace / CONTROL_COPY),
            "shim": ctx.route.shim if ctx.route is not None else None,
        }

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The copies are the payload user's to write unconfined, and a write there is seen."""
        nonce = new_control_nonce()
        machinery = ctx.cell_dir / MACHINERY_DIR

        def writable() -> dict[str, Any]:
            what = "payload user may write the machinery copies unconfined"
            blocked = unreachable_by(machinery, ctx.user)
            if blocked is not None:
                return host_check(what, ok=False, detail=f"{blocked} is not traversable")
            uid = ctx.user.uid if ctx.user is not None else os.geteuid()
            with safefs.open_dir(machinery) as place:
                bad = [
                    n
                    for n in MACHINERY_FILES
                    if (st := place.entry(n)) is None or st.st_uid != uid or not st.st_mode & 0o200
                ]
            return host_check(what, not bad, f"not writable by uid {uid}: {bad}" if bad else "")

        def seen() -> dict[str, Any]:
            what = "the host's hash sees an append to a machinery copy"
            with safefs.open_dir(machinery) as place:
                # Hashed now, not read from the cell's record: the control shows the hash sees
                # an append, whatever the payload did to the record or to this file.
                before = _sha256(place, HOST_CONTROL_FILE)
                fd = place.open_file(HOST_CONTROL_FILE, os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, f"\n# {nonce}\n".encode())
                finally:
                    os.close(fd)
                after = _sha256(place, HOST_CONTROL_FILE)
            ok = not before.startswith("unreadable") and before != after
            return host_check(what, ok, f"{before} -> {after}")

        return control_record(
            nonce, [guarded_check("writable", writable), guarded_check("seen", seen)]
        )

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """Any machinery file changed on the host, or carrying the marker, is an escape."""
        del witness
        state = load_state(ctx)
        before: dict[str, str] = state.get("before", {})
        after = _digests(ctx)
        host_file = str(ctx.cell_dir / MACHINERY_DIR / HOST_CONTROL_FILE)
        copy = str(ctx.workspace / CONTROL_COPY)
        # A payload that reached the cell dir may have rewritten the host's own record of it
        # (host-state.json): a path missing from either side counts as changed, and the
        # marker scan below names the record itself.
        changed = sorted(
            p for p in before if p not in (host_file, copy) and after.get(p) != before[p]
        )
        scan = marked_files(ctx)
        marked = [p for p in scan.hits if p not in changed]
        helpers_before: dict[str, str] = state.get("helpers", {})
        helpers_after = _real_helpers()
        touched = sorted(p for p, f in helpers_before.items() if helpers_after.get(p) != f)
        escapes = attempts_by_role(report, "escape")
        inside = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        inside_ok = (
            bool(inside)
            and inside[0].get("outcome") == "succeeded"
            and _holds_marker(ctx.workspace, CONTROL_COPY, ctx.nonce)
        )
        claims = claims_of(ctx.claims)
        # Only a place the writes claim forbids is judged (a claim that allows /tmp is not
        # broken by a write below it); on the open control leg every change counts.
        allowed = [
            p
            for p in [*changed, *marked]
            if claims.writes != "open" and not claims.write_denied(Path(p).parent, home_of(ctx))
        ]
        opened = _host_binaries_opened(escapes)
        hits = [p for p in [*changed, *marked] if p not in allowed] + touched + opened
        reasons = _machinery_reasons(claims, allowed, hits, len(before) - 2, len(helpers_before))
        reasons.append(f"payload: {attempts_summary(escapes)}")
        escape = judge_escape(
            observed, bool(hits), private_namespace_reason(report, "mnt"), reasons
        )
        if scan.cut and not hits:
            # A walk cut short cannot say "no marker": the rest of the cell dir went unread.
            reasons.append(
                f"the marker scan of the cell dir was cut after {scan.visited} entries, so "
                "what it did not read cannot be called untouched"
            )
            escape = "undecided"
        return conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={
                "changed": changed,
                "marked": marked,
                "real_helpers_changed": touched,
                "host_binaries_opened": opened,
            },
            inside=inside,
            inside_ok=inside_ok,
            inside_failed=(
                "in-sandbox control failed: the append to the workspace's helper copy "
                f"was not seen on the host ({attempts_summary(inside)})"
            ),
        )


def _machinery_reasons(
    claims: Claims, allowed: list[str], hits: list[str], copies: int, helpers: int
) -> list[str]:
    """The verdict's phrases for the machinery: what the claim allows, what was hit, or none.

    `copies` and `helpers` count the planted copies and the real helpers looked at.
    """
    reasons: list[str] = []
    if allowed:
        reasons.append(
            f"not judged: {', '.join(allowed)} changed, and the backend "
            f"{claims.phrase('writes')}, so those writes are its to allow"
        )
    if hits:
        reasons.append(
            (f"{claims.phrase('writes')}; " if claims.writes != "open" else "")
            + "the host sees the sandbox's machinery written: "
            + ", ".join(hits)
        )
        reasons.append(
            "fix: bind the sandbox's helper, its config, its allowlist and its run dir "
            "read-only or leave them out of the view (bwrap --ro-bind, docker :ro), and "
            "never run the sandbox from a file the payload user can write"
        )
    else:
        reasons.append(
            f"sha256 of {copies} machinery files unchanged, no marker in the cell "
            f"dir, {helpers} real helpers untouched"
        )
    return reasons


def _host_binaries_opened(escapes: list[dict[str, Any]]) -> list[str]:
    """Executables the payload opened for write that are the host's own files, by identity.

    The payload reports each `exe:` open that succeeded with the opened file's (device, inode)
    and its link target; the host stats that target itself. A match is the host's binary
    writable from inside (runc's CVE-2019-5736), though the probe never writes a byte to it.
    """
    found = []
    for a in escapes:
        if not str(a.get("what", "")).startswith("exe:") or a.get("outcome") != "succeeded":
            continue
        target, identity = str(a.get("target") or ""), a.get("identity")
        if not target.startswith("/") or not isinstance(identity, list):
            continue
        try:
            st = Path(target).stat()
        except OSError:
            continue
        if [st.st_dev, st.st_ino] == identity:
            found.append(f"the host's {target} opened for write ({a.get('what')})")
    return found


def _dir_identity(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _fd_number(name: str) -> int:
    return int(name) if name.isdigit() else -1


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: " ".join(v.split()) for k, _, v in (ln.partition(":") for ln in text.splitlines())}


def _pid_ns(pid: int) -> str:
    try:
        return str(Path(f"/proc/{pid}/ns/pid").readlink())
    except OSError:
        return ""


def read_dir_fds(pid: int) -> dict[str, Any]:
    """The directory descriptors and cwd of the payload and of its sandbox-side ancestors.

    An ancestor counts while it shares the payload's pid namespace and real uid: a shim or an
    init inside the sandbox that keeps a host directory open hands it to the payload through
    /proc/<pid>/fd. The harness (root) and anything outside the payload's pid namespace are
    not the sandbox's, and are not read.
    """
    namespace, uid = _pid_ns(pid), _status(pid).get("Uid", "").split()[:1]
    found: list[dict[str, Any]] = []
    read: list[int] = []
    current = pid
    for _ in range(MAX_ANCESTORS_READ):
        status = _status(current)
        if not status or _pid_ns(current) != namespace or status.get("Uid", "").split()[:1] != uid:
            break
        read.append(current)
        found += _dir_fds(current)
        parent = int(status.get("PPid", "0") or 0)
        if parent <= 0:
            break
        current = parent
    if not read:
        return {"seen": False, "why": f"/proc/{pid} unreadable"}
    cwd = _dir_identity(Path(f"/proc/{pid}/cwd"))
    return {"seen": True, "processes": read, "dir_fds": found, "cwd": cwd}


def _dir_fds(pid: int) -> list[dict[str, Any]]:
    """The directory descriptors of `pid`, each with its link text and identity."""
    proc = Path(f"/proc/{pid}")
    found: list[dict[str, Any]] = []
    try:
        entries = sorted((p.name for p in (proc / "fd").iterdir()), key=_fd_number)
    except OSError:
        return found
    for name in entries:
        try:
            # Followed: the magic link names the object the descriptor holds, not a path the
            # payload could swap (root reads its identity, never opens it).
            st = (proc / "fd" / name).stat()
            link = str((proc / "fd" / name).readlink())
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            found.append(
                {"pid": pid, "fd": name, "target": link, "identity": [st.st_dev, st.st_ino]}
            )
    return found


class FsLeakedDirfd(SpecBase):
    """Walk every inherited directory descriptor towards a host canary directory."""

    id = "fs_leaked_dirfd"
    area = "machinery"
    host_readings = (
        "the canary's random content",
        "the payload's directory descriptors and cwd read by the host at the rendezvous",
    )

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The control, the path attempt, and two walks per directory descriptor found."""
        del task
        return AttemptTable(
            required=attempts_of("control:openat", "path:canary", "scan:descriptors"),
            discovered=("dirfd:", "fchdir:", "procfd:"),
        )

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied where the payload may see only its workspace; seen on the open leg."""
        return expect_fs_confined(declared)

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """A canary dir outside the workspace (readable by the payload user unconfined)."""
        token, inside = secrets.token_hex(16), secrets.token_hex(16)
        with safefs.open_dir(ctx.cell_dir) as cell, cell.mkdir(DIRFD_DIR, 0o755) as place:
            place.create_file(DIRFD_CANARY, token + "\n", 0o644)
        with safefs.open_dir(ctx.workspace) as workspace:
            workspace.create_file(DIRFD_CONTROL, inside + "\n", 0o644)
        canary_dir = ctx.cell_dir / DIRFD_DIR
        forbidden = {
            "the canary dir": _dir_identity(canary_dir),
            "the cell dir": _dir_identity(ctx.cell_dir),
            "the harness's scratch": _dir_identity(ctx.cell_dir.parent),
            "the host's /": _dir_identity(Path("/")),
        }
        save_state(ctx, {"token": token, "inside": inside, "forbidden": forbidden})
        return {"canary": str(canary_dir / DIRFD_CANARY), "control_name": DIRFD_CONTROL}

    def at_rendezvous(self, ctx: CellContext, pid: int) -> dict[str, Any]:
        """The payload's directory descriptors and cwd, read from /proc while it waits."""
        del ctx
        return read_dir_fds(pid)

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The canary is the payload user's to read unconfined, and still holds its token."""
        canary = ctx.cell_dir / DIRFD_DIR / DIRFD_CANARY
        token = str(load_state(ctx).get("token", ""))

        def readable() -> dict[str, Any]:
            what = "payload user may read the canary unconfined"
            blocked = unreachable_by(canary.parent, ctx.user)
            mode = canary.stat().st_mode
            ok = blocked is None and bool(mode & 0o004)
            return host_check(what, ok, f"blocked at {blocked}" if blocked else oct(mode))

        def intact() -> dict[str, Any]:
            with safefs.open_dir(canary.parent) as place:
                text = place.read_bytes(DIRFD_CANARY).decode(errors="replace").strip()
            return host_check("the canary holds its token", bool(token) and text == token, "")

        checks = [guarded_check("readable", readable), guarded_check("intact", intact)]
        return control_record(new_control_nonce(), checks)

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """The canary's token reported, a host dir reached, or a leaked host fd seen: escape."""
        del witness
        state = load_state(ctx)
        token, inside_token = str(state.get("token", "")), str(state.get("inside", ""))
        forbidden = _forbidden_dirs(state)
        claims = claims_of(ctx.claims)
        every = attempts_by_role(report, "escape")
        # The host path is this class's route where nothing confines reads (the control leg),
        # and where the reads claim puts the canary out of reach (a payload that reads it by
        # its host path has the host's directories in view, a hole whichever way it came);
        # a canary the reads claim leaves readable (Codex's deny-list) is no descriptor leak.
        canary = ctx.cell_dir / DIRFD_DIR / DIRFD_CANARY
        by_path = claims.reads == "open" or claims.read_denied(canary, home_of(ctx))
        escapes = [
            a
            for a in every
            if by_path or a.get("what") != PATH_ATTEMPT or a.get("outcome") != "succeeded"
        ]
        inside = attempts_by_role(report, "control")
        observed = observed_outcome(escapes)
        read = _token_read_via(escapes, token)
        path_note = [
            a for a in every if a.get("what") == PATH_ATTEMPT and a.get("outcome") == "succeeded"
        ]
        facts = report.get("facts") or {}
        reached = sorted(
            {forbidden[tuple(r)] for r in facts.get("reached") or [] if tuple(r) in forbidden}
        )
        view = dict(ctx.host_view.get(self.id) or {})
        leaked = _leaked_in_view(view, forbidden)
        seen = bool(read or reached or leaked)
        reasons: list[str] = []
        if not token or not forbidden:
            reasons.append(
                "the host's record of this cell (its canary token and directories) is gone or "
                "rewritten, so no read can be told from a refusal"
            )
        if seen:
            reached_reasons = _reached_reasons(claims, read, reached, leaked)
            if PATH_ATTEMPT in read and claims.reads != "open":
                where = f"the canary {canary} is in the payload's view at its host path"
                reached_reasons.insert(1, where)
            reasons += reached_reasons
        else:
            reasons.append(_nothing_reached_reason(facts, view))
        reasons.append(f"payload: {attempts_summary(escapes)}")
        if path_note and not by_path:
            reasons.append(
                "not judged here: the canary is also readable by its host path "
                f"({claims.phrase('reads')}; fs_read_secrets judges reads by path)"
            )
        escape = judge_escape(observed, seen, private_namespace_reason(report, "mnt"), reasons)
        if not seen and (not token or not forbidden):
            escape = "undecided"
        inside_ok = (
            len(inside) == 1
            and inside[0].get("outcome") == "succeeded"
            and bool(inside_token)
            and inside_token in str(inside[0].get("detail"))
        )
        return conclude(
            escape,
            observed,
            reasons,
            host_control=control,
            witness={"read_via": read, "reached": reached, "leaked": leaked, "view": view},
            inside=inside,
            inside_ok=inside_ok,
        )


def _forbidden_dirs(state: dict[str, Any]) -> dict[tuple[int, ...], str]:
    """The host's own directories kept at prepare, by (device, inode), each with its name."""
    return {
        tuple(ident): name
        for name, ident in (state.get("forbidden") or {}).items()
        if isinstance(ident, list)
    }


def _token_read_via(escapes: list[dict[str, Any]], token: str) -> list[str]:
    """The attempts that reported the canary's token (the descriptor scan's own aside)."""
    return [
        str(a.get("what"))
        for a in escapes
        if a.get("outcome") == "succeeded"
        and token
        and token in str(a.get("detail"))
        and a.get("what") != SCAN_ATTEMPT
    ]


def _leaked_in_view(view: dict[str, Any], forbidden: dict[tuple[int, ...], str]) -> list[str]:
    """The payload's descriptors and cwd the host saw on one of its own directories."""
    leaked = [
        f"fd {d.get('fd')} of pid {d.get('pid')} on {d.get('target')} "
        f"({forbidden[tuple(d['identity'])]})"
        for d in view.get("dir_fds") or []
        if tuple(d.get("identity") or ()) in forbidden
    ]
    cwd = view.get("cwd")
    if isinstance(cwd, list) and tuple(cwd) in forbidden:
        leaked.append(f"cwd on {forbidden[tuple(cwd)]}")
    return leaked


def _reached_reasons(
    claims: Claims, read: list[str], reached: list[str], leaked: list[str]
) -> list[str]:
    """The verdict's phrases when the canary was reached: how, and the fix where it applies."""
    reasons = []
    parts = []
    if read:
        parts.append(f"the payload read the canary's token via {', '.join(read)}")
    if reached:
        parts.append(f"its descriptors reached {', '.join(reached)}")
    if leaked:
        parts.append(f"the host sees the sandbox holding {', '.join(leaked)}")
    reasons.append(
        (f"{claims.phrase('reads')}; " if claims.reads != "open" else "") + "; ".join(parts)
    )
    if any(w != PATH_ATTEMPT for w in read) or reached or leaked:
        reasons.append(
            "fix: close every descriptor but 0-2 before starting the sandbox (bwrap "
            "keeps what it inherits; pass only the --*-fd descriptors it needs) and "
            "never start it with a working directory outside its view"
        )
    return reasons


def _nothing_reached_reason(facts: dict[str, Any], view: dict[str, Any]) -> str:
    """The verdict's phrase when neither the payload nor the host saw the canary reached."""
    return (
        "no canary token in the report; none of the payload's "
        f"{len(facts.get('directory_fds') or [])} directory descriptors reached a host "
        f"directory; the host saw {len(view.get('dir_fds') or [])} directory "
        "descriptors in the payload, none on the host's own directories"
    )


SPECS: Final = (FsMachineryOverwrite(), FsLeakedDirfd())
