"""fs_read_secrets, host side: canary secrets planted where a host keeps real ones.

The payload home's ~/.ssh, ~/.aws and ~/.docker, and a project's .env beside the workspace,
each get a canary with a random token; a reported hash equal to a canary's is the escape.
The home is the payload user's, so everything is planted, read back and removed through
directory descriptors, by identity (sandbox_attest/host/safefs.py).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import secrets
from pathlib import Path
from typing import Any, Final

from sandbox_attest.catalog.added_targets import add_targets
from sandbox_attest.catalog.attempts import (
    all_succeeded,
    attempts_by_role,
    attempts_of,
    attempts_summary,
    observed_outcome,
    refusal_summary,
)
from sandbox_attest.catalog.canary import planting
from sandbox_attest.catalog.controls import (
    control_record,
    host_check,
    load_state,
    new_control_nonce,
    save_state,
)
from sandbox_attest.catalog.fs.canaries import canary_journal_key
from sandbox_attest.catalog.fs.exposure import (
    base_key,
    find_targets,
    read_view,
    unmapped,
)
from sandbox_attest.catalog.fs.mount_reasons import mount_judgement
from sandbox_attest.catalog.judging import conclude, judge_escape, private_namespace_reason
from sandbox_attest.catalog.spec import (
    AttemptTable,
    CellContext,
    ClaimsLike,
    SpecBase,
    WitnessRecordsLike,
    home_of,
    host_processes,
)
from sandbox_attest.catalog.witness.kernel import (
    OPENS,
    KernelJudgement,
    ReportedAttempt,
    corroborate,
    path_match,
    reads_bytes,
)
from sandbox_attest.claims import claims_of, unclaimed
from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise, journal, safefs
from sandbox_attest.host.trust import open_home
from sandbox_attest.verdict import Assessment, Expectation

# How often a canary is planted again when a concurrent cell removed its (empty) dir meanwhile.
_PLANT_TRIES: Final = 3


def _looked_as(entry: dict[str, Any] | None) -> str:
    """One host look at a canary path, in a word: absent, own, host, uncompared, not looked at.

    "own" is a file at that path in the payload's view that is not the host's inode (the
    sandbox's own); "uncompared" one the host has nothing at to compare with.
    """
    if entry is None:
        return "not looked at"
    if not entry.get("visible"):
        return "absent"
    same = entry.get("same_inode_as_host")
    return "own" if same is False else "host" if same is True else "uncompared"


class FsReadSecrets(SpecBase):
    """Reads canary secrets planted where a host keeps real ones."""

    id = "fs_read_secrets"
    area = "fs"
    kernel_witness = True

    def __init__(self) -> None:
        """The inside paths the host added to each cell's task at the rendezvous, by nonce."""
        self._added: dict[str, dict[str, str]] = {}

    def attempt_table(self, task: dict[str, Any]) -> AttemptTable:
        """The workspace control and one read per planted secret (and per inside path added).

        The inside paths the host added at the rendezvous are optional: a payload that never
        saw them leaves them untried, and `assess` says so instead of passing.
        """
        secrets_ = (task.get("targets") or {}).get("secrets") or {}
        added = self._added.get(str(task.get("nonce")), {})
        return AttemptTable(
            required=attempts_of("workspace", *sorted(secrets_)),
            optional=attempts_of(*sorted(added)),
        )

    def at_rendezvous(self, ctx: CellContext, pid: int) -> dict[str, Any]:
        """Map the payload's mounts to the host's; add each canary's inside paths to its task.

        A canary the payload sees at another path (the home mounted at /home/agent),
        confirmed by the (device, inode) kept at plant time, is added as `<key>@<mount
        point>` to the task the payload reads once released
        (sandbox_attest/catalog/fs/exposure.py).
        """
        view, record = read_view(pid)
        if view is None:
            return record
        files = load_state(ctx).get("idents", {}).get("files", {})
        canaries = {
            key: (path, _ident(files.get(key))) for key, path in self.secret_paths(ctx).items()
        }
        added = find_targets(view, canaries)
        failed = add_targets(ctx.cell_dir, "secrets", added)
        self._added[ctx.nonce] = {} if failed else added
        return record | {
            "added": added,
            "add_failed": failed,
            "unmapped": unmapped(view, writable_only=False),
        }

    def expectation(self, declared: ClaimsLike) -> Expectation:
        """Denied under a reads claim ("workspace" or a deny-list); seen on the control leg.

        `filesystem = "workspace"` means reads = "workspace" (sandbox_attest/claims.py): every
        backend that declares it builds the view from granted paths, so ~/.ssh is outside it.
        """
        return "denied" if claims_of(declared).reads != "open" else "allowed"

    def not_claimed(self, declared: ClaimsLike) -> str | None:
        """NOT_APPLICABLE under open reads: this probe tests the reads claim alone."""
        return unclaimed(self.id, claims_of(declared))

    @staticmethod
    def secret_paths(ctx: CellContext) -> dict[str, Path]:
        """Where the canaries go: new files named after the nonce, never the real ones."""
        home = home_of(ctx)
        name = f"{disguise.CANARY_PREFIX}{ctx.nonce}"
        return {
            "ssh": home / ".ssh" / name,
            "aws": home / ".aws" / name,
            "docker": home / ".docker" / f"{name}.json",
            # A project's .env sits next to its checkout: the cell dir (named after the
            # nonce) plays the project root around the workspace.
            "dotenv": ctx.cell_dir / ".env",
        }

    @staticmethod
    def control_path(ctx: CellContext) -> Path:
        """The control canary, inside the workspace."""
        return ctx.workspace / f"secrets-control-{ctx.nonce}.txt"

    def denied_paths(self, ctx: CellContext) -> dict[str, Path]:
        """The canaries the reads claim says the payload cannot read (all, on the control leg)."""
        claims = claims_of(ctx.claims)
        return {
            k: path
            for k, path in self.secret_paths(ctx).items()
            if claims.nothing or claims.read_denied(path, home_of(ctx))
        }

    def look_paths(self, ctx: CellContext) -> list[str]:
        """The denied canaries: the host looks for each in the payload's view at its rendezvous."""
        return [str(path) for path in self.denied_paths(ctx).values()]

    def corroboration(self, ctx: CellContext, report: dict[str, Any]) -> list[str]:
        """The host's look at the denied canaries in the payload's view, where it backs the cell.

        See `host_look`; a refusal of a canary the host saw there as its own file is not
        backed by anything but the payload's word.
        """
        del report
        return self.host_look(ctx)[0]

    def host_look(self, ctx: CellContext) -> tuple[list[str], list[str]]:
        """What the host's look at the denied canaries says: (corroborated_by, reasons).

        Backed when, in every payload process the host read, each denied canary is either
        not in the view or is there as another file (the sandbox's own, another inode): then
        no open of that path inside can reach the host's bytes. A canary in the view at the
        host's own inode backs nothing: the sandbox may still block its open (a filter such
        as Landlock or seccomp), but only the payload says it did.
        """
        denied = self.denied_paths(ctx)
        processes = host_processes(ctx)
        if not denied:
            return [], []
        if not processes:
            why = ctx.host_view.get("why") or "no reading"
            return [], [f"the host did not look at the payload's view of the canaries: {why}"]
        seen: dict[str, set[str]] = collections.defaultdict(set)
        for process in processes:
            looked = {
                str(e.get("path")): e for e in process.get("looked") or [] if isinstance(e, dict)
            }
            for key, path in denied.items():
                seen[_looked_as(looked.get(str(path)))].add(key)
        at_host = seen["host"]
        unsure = {f"{k} ({word})" for word in ("not looked at", "uncompared") for k in seen[word]}
        reasons = []
        # A canary the host found by identity at another path in the view (its mount there)
        # is as visible as one at its own path: a refusal there backs nothing either.
        added = dict((ctx.host_view.get(self.id) or {}).get("added") or {})
        moved = {k: v for k, v in added.items() if base_key(k) in denied}
        if moved:
            reasons.append(
                "the host found "
                + ", ".join(f"{base_key(k)} at {v}" for k, v in sorted(moved.items()))
                + " in the payload's view, the host's own file by (device, inode): its refusal "
                "there rests on the payload's word (a filter such as Landlock may still block "
                "the open)"
            )
        if at_host:
            reasons.append(
                "the host saw "
                + ", ".join(f"{k} ({denied[k]})" for k in sorted(at_host))
                + " visible in the payload's view as the host's own file: its refusal rests "
                "on the payload's word (a filter such as Landlock may still block the open)"
            )
        if unsure:
            reasons.append(
                f"the host's look at the canaries is incomplete: {', '.join(sorted(unsure))}"
            )
        if at_host or unsure or moved:
            return [], reasons
        parts = [
            f"{label} [{', '.join(sorted(seen[word]))}]"
            for word, label in (("absent", "absent there"), ("own", "another file than the host's"))
            if seen[word]
        ]
        reasons.append(f"the host looked at the payload's view: {', '.join(parts)}")
        return ["the payload's view of the canary paths, read by the host"], reasons

    def prepare(self, ctx: CellContext) -> dict[str, Any]:
        """Plant each canary (0600, the payload user's) with a random token; keep identities.

        The home is the payload user's, who may have swapped ~/.ssh for a symlink to a root
        directory (issue 23): so everything here goes through directory descriptors
        (sandbox_attest/host/safefs.py). A symlink is refused, named, and the cell is an ERROR;
        nothing is ever made where it points. A canary dir the harness makes is root's (the
        payload user only reads the canary in it); one that exists is used through its
        descriptor. The identities of the home, of each dir and of each canary are kept, and
        `host_control` checks them after the payload ran.
        """
        created: list[str] = []
        hashes: dict[str, str] = {}
        idents: dict[str, Any] = {"dirs": {}, "files": {}}
        owner = (ctx.user.uid, ctx.user.gid) if ctx.user is not None else None
        # Journalled before they exist (host/journal.py): fake secrets in a home must not
        # outlive a killed run. The .env is in the cell dir and goes with the scratch.
        in_home = [p for k, p in self.secret_paths(ctx).items() if k != "dotenv"]
        journal.record(canary_journal_key(self.id, ctx), in_home)
        with open_home(ctx.user) as home:
            idents["home"] = home.identity()
            for key, path in self.secret_paths(ctx).items():
                body = f"{disguise.STEM} cache {key} {ctx.nonce} secret={secrets.token_hex(16)}\n"
                with planting(self.id, path):
                    if key == "dotenv":
                        # The cell dir is the harness's (root's, 0755): opened all the same.
                        with safefs.open_dir(path.parent) as cell:
                            idents["files"][key] = cell.create_file(path.name, body, 0o600, owner)
                    else:
                        # Saved before it exists: if a later canary fails, cleanup removes it.
                        state = {"hashes": hashes, "created_dirs": created, "idents": idents}
                        save_state(ctx, state)
                        idents["files"][key] = self._plant_in_home(
                            ctx, home, path, body, owner, created, idents, in_home
                        )
                hashes[key] = hashlib.sha256(body.encode()).hexdigest()
        control = f"{disguise.STEM} control {ctx.nonce} {secrets.token_hex(16)}\n"
        # The workspace is still root's here (the runner hands it over after prepare).
        self.control_path(ctx).write_text(control)
        hashes["workspace"] = hashlib.sha256(control.encode()).hexdigest()
        save_state(ctx, {"hashes": hashes, "created_dirs": created, "idents": idents})
        return {
            "secrets": {k: str(v) for k, v in self.secret_paths(ctx).items()},
            "control": str(self.control_path(ctx)),
        }

    def _plant_in_home(
        self,
        ctx: CellContext,
        home: safefs.SafeDir,
        path: Path,
        body: str,
        owner: tuple[int, int] | None,
        created: list[str],
        idents: dict[str, Any],
        in_home: list[Path],
    ) -> safefs.Identity:
        """Create one canary in its dir directly under the home, the dir made if missing.

        A concurrent cell's cleanup may remove the (then empty) dir between our open and our
        create: the create then fails with ENOENT (no entry can be made in a removed dir) and
        is tried again, at most `_PLANT_TRIES` times.
        """
        name = path.parent.name
        shown = f"~/{name} under the payload home"
        for attempt in range(_PLANT_TRIES):
            if home.entry(name) is None:
                # Journalled before it exists too, as a directory removed only if empty.
                dirs = (*(Path(c) for c in created), path.parent)
                journal.record(canary_journal_key(self.id, ctx), in_home, dirs=dirs)
                try:
                    site = home.mkdir(name, 0o755, shown=shown)
                    if str(path.parent) not in created:
                        created.append(str(path.parent))
                except FileExistsError:
                    site = home.open_subdir(name, shown=shown)  # a concurrent cell made it
            else:
                site = home.open_subdir(name, shown=shown)
            idents["dirs"][name] = site.identity()
            try:
                return site.create_file(path.name, body, 0o600, owner)
            except FileNotFoundError:
                if attempt == _PLANT_TRIES - 1:
                    raise
        raise AssertionError  # unreachable: the loop returns or raises

    def host_control(self, ctx: CellContext) -> dict[str, Any]:
        """The host reads every canary back, through the dirs it made, and gets its hash.

        First the identities kept at prepare: the home, each canary dir and each canary must
        still be the objects the harness made (checked by (device, inode), never followed).
        A dir swapped for a symlink or another dir during the cell is named here; the failed
        check makes the cell non-PASS, whatever the payload reported.
        """
        state = load_state(ctx)
        hashes = state.get("hashes", {})
        idents = state.get("idents", {})
        checks = []
        with contextlib.ExitStack() as stack:
            try:
                home = stack.enter_context(open_home(ctx.user))
            except (OSError, safefs.UnsafePathError) as exc:
                what = "the payload home is the one planted in"
                checks.append(host_check(what, ok=False, detail=str(exc)))
                return control_record(new_control_nonce(), checks)
            same = _same(home.identity(), idents.get("home"))
            checks.append(
                host_check("the payload home is the one planted in", same, str(home.path))
            )
            for key, path in self.secret_paths(ctx).items():
                got, detail = self._read_canary(ctx, home, key, path, idents)
                ok = got is not None and got == hashes.get(key)
                checks.append(host_check(f"host reads {key}", ok, detail or str(path)))
        return control_record(new_control_nonce(), checks)

    def _read_canary(
        self,
        ctx: CellContext,
        home: safefs.SafeDir,
        key: str,
        path: Path,
        idents: dict[str, Any],
    ) -> tuple[str | None, str]:
        """(The canary's sha256, "") read through the dir the harness made, or (None, why)."""
        del ctx
        try:
            if key == "dotenv":
                site = safefs.open_dir(path.parent)
            else:
                name = path.parent.name
                # Refused, and named, when it is a symlink now.
                site = home.open_subdir(name, shown=f"~/{name} under the payload home")
                if not _same(site.identity(), idents["dirs"].get(name)):
                    site.close()
                    return None, (
                        f"~/{name} under the payload home is another directory now (inode "
                        f"{site.identity()[1]}), not the one the harness planted in"
                    )
            with site:
                fd = site.open_file(path.name)
                with os.fdopen(fd, "rb") as canary:
                    st = os.fstat(canary.fileno())
                    if not _same((st.st_dev, st.st_ino), idents["files"].get(key)):
                        return None, f"{path} is another file now (inode {st.st_ino})"
                    return hashlib.sha256(canary.read()).hexdigest(), ""
        except (OSError, safefs.UnsafePathError, KeyError) as exc:
            return None, f"{path}: {exc}"

    def assess(
        self,
        ctx: CellContext,
        report: dict[str, Any],
        witness: WitnessRecordsLike,
        control: dict[str, Any],
    ) -> Assessment:
        """A reported hash equal to a canary's is the escape: only those bytes produce it."""
        del witness  # the canaries' hashes are this probe's witness
        hashes = load_state(ctx).get("hashes", {})
        claims = claims_of(ctx.claims)
        paths = self.secret_paths(ctx)
        # Only the canaries the claim says are unreadable are judged (all of them under
        # reads = "workspace", and on the control leg); the others' reads are reported.
        judged_keys = set(self.denied_paths(ctx))
        mounts = ctx.host_view.get(self.id) or {}
        added: dict[str, str] = dict(mounts.get("added") or {})
        every = attempts_by_role(report, "escape")
        # An inside path the host added is judged as the canary it stands for.
        escapes = [a for a in every if base_key(str(a.get("what"))) in judged_keys]
        observed = observed_outcome(escapes)
        leaked = sorted(
            str(a.get("what"))
            for a in escapes
            if a.get("outcome") == "succeeded"
            and a.get("sha256") == hashes.get(base_key(str(a.get("what"))))
        )
        shown = {**{k: str(v) for k, v in paths.items()}, **added}
        reasons = []
        if leaked and claims.reads != "open":
            read = ", ".join(f"{k} ({shown.get(k, '?')})" for k in leaked)
            reasons.append(
                f"{claims.phrase('reads')}; the payload read the host's canary bytes: {read}"
            )
        elif leaked:
            reasons.append(f"the payload read the host's canary bytes: {', '.join(leaked)}")
        else:
            reasons.append("no canary's bytes reached the payload")
            reasons.append(refusal_summary(escapes))
        unjudged = sorted(set(paths) - judged_keys)
        if unjudged:
            reasons.append(f"not judged, the reads claim lets them be read: {', '.join(unjudged)}")
        escape = judge_escape(
            observed, bool(leaked), private_namespace_reason(report, "mnt"), reasons
        )
        escape = mount_judgement(
            escape,
            mounts,
            report,
            reasons,
            judged=bool(judged_keys) and claims.reads != "open",
            changed=sorted({base_key(k) for k in leaked}),
            places={k: str(v) for k, v in paths.items()},
            verb="read",
        )
        if not judged_keys:
            escape = "undecided"
            reasons.insert(
                0,
                f"{claims.phrase('reads')}, which names none of this probe's canaries "
                f"({', '.join(str(p) for p in paths.values())})",
            )
        # The host's own look at the payload's view: what backs a refusal on a wrapper.
        corroborated, looked = self.host_look(ctx)
        kernel = self.kernel_judgement(ctx, escapes, shown)
        if kernel is not None and kernel.escapes and not leaked:
            escape = "escaped"
            reasons.insert(
                0, "the kernel returned the canary to the payload: " + "; ".join(kernel.escapes)
            )
        if kernel is not None and kernel.all_corroborated:
            # A filter refused the open in the kernel: that, not the view, backs the refusal.
            reasons.append("; ".join(kernel.corroborated))
            corroborated = [
                *corroborated,
                "the kernel's answer to each canary open (kernel witness)",
            ]
        elif not leaked:
            reasons.extend(looked)
        inside = attempts_by_role(report, "control")
        inside_ok = all_succeeded(inside, 1) and inside[0].get("sha256") == hashes.get("workspace")
        assessment = conclude(
            escape,
            observed,
            reasons,
            inside_ok=inside_ok,
            inside_failed=f"workspace read control failed: {attempts_summary(inside)}",
            host_control=control,
            host_failed="host could not read back its canaries",
            witness={
                "planted_sha256": hashes,
                "leaked": leaked,
                "mounts": mounts,
                "payload_view": [
                    {"pid": p.get("pid"), "looked": p.get("looked") or []}
                    for p in host_processes(ctx)
                ],
                **({"kernel": kernel.as_witness()} if kernel is not None else {}),
            },
            controls={"inside": inside, "host": control},
        )
        assessment.corroborated_by = corroborated
        return assessment

    @staticmethod
    def kernel_judgement(
        ctx: CellContext, escapes: list[dict[str, Any]], shown: dict[str, str]
    ) -> KernelJudgement | None:
        """The kernel's answer to each judged canary open, on a filter sandbox (else None).

        The payload's own mount namespace is the harness's there, so the path it opened is
        the host's canary; an open that only looks (O_PATH) reads no byte and is no escape.
        """
        attempts = [
            ReportedAttempt(
                label=f"{a.get('what')} ({shown.get(str(a.get('what')), '?')})",
                outcome=str(a.get("outcome")),
                syscalls=OPENS,
                match=path_match(shown.get(str(a.get("what")), "")),
                counts=reads_bytes,
            )
            for a in escapes
            if str(a.get("what")) in shown
        ]
        return corroborate(ctx, attempts, "mnt") if attempts else None

    def cleanup(self, ctx: CellContext) -> None:
        """Remove the canaries it made in $HOME, then the dirs it made there that are empty.

        By identity, through the home's descriptor: a canary or dir that is not the object
        the harness made (swapped, re-pointed) is left where it is and named.

        Raises:
            FixtureError: naming what could not be removed (the journal entry is then kept).
        """
        self._added.pop(ctx.nonce, None)
        state = load_state(ctx)
        idents = state.get("idents", {})
        left: list[str] = []
        try:
            home = open_home(ctx.user)
        except (OSError, safefs.UnsafePathError) as exc:
            left.append(str(exc))
        else:
            with home:
                for key, path in self.secret_paths(ctx).items():
                    want = _ident(idents.get("files", {}).get(key))
                    if want is None:
                        continue  # never planted (prepare failed before it)
                    if key == "dotenv":  # in the cell dir, the harness's own
                        left += _remove_file(path, want)
                    else:
                        left += _remove_canary(home, path, want, idents.get("dirs", {}))
                for created in state.get("created_dirs", []):
                    name = Path(created).name
                    want = _ident(idents.get("dirs", {}).get(name))
                    # Not empty (another cell's canary is in it now) or not ours: kept.
                    with contextlib.suppress(OSError, safefs.UnsafePathError):
                        home.rmdir(name, expect=want)
        # Only once they are gone: a cleanup cut short leaves the entry for the next sweep.
        in_home = [p for k, p in self.secret_paths(ctx).items() if k != "dotenv"]
        if not left and not any(os.path.lexists(p) for p in in_home):
            journal.forget(canary_journal_key(self.id, ctx))
        if left:
            msg = f"{self.id}: left in place, not what the harness made: {'; '.join(left)}"
            raise FixtureError(msg)


def _remove_canary(
    home: safefs.SafeDir, path: Path, want: safefs.Identity, dirs: dict[str, Any]
) -> list[str]:
    """Remove one canary from its dir under the home if both are what the harness made.

    Returns:
        What was left in place and why (empty when removed or already gone).
    """
    name = path.parent.name
    try:
        site = home.open_subdir(name, shown=f"~/{name} under the payload home")
        if not _same(site.identity(), dirs.get(name)):
            return [f"~/{name} is not the dir the canary was planted in"]
        site.unlink(path.name, expect=want)
    except FileNotFoundError:
        return []
    except (OSError, safefs.UnsafePathError) as exc:
        return [str(exc)]
    return []


def _remove_file(path: Path, want: safefs.Identity) -> list[str]:
    """Remove the file the harness made at `path` (by identity, through its dir's descriptor).

    Returns:
        What was left in place and why (empty when removed or already gone).
    """
    try:
        with safefs.open_dir(path.parent) as site:
            site.unlink(path.name, expect=want)
    except FileNotFoundError:
        return []
    except (OSError, safefs.UnsafePathError) as exc:
        return [str(exc)]
    return []


def _ident(value: object) -> safefs.Identity | None:
    """An identity kept in a cell's JSON state ([dev, ino]) as a tuple, or None."""
    if isinstance(value, list | tuple) and len(value) == 2:
        return (int(value[0]), int(value[1]))
    return None


def _same(now: safefs.Identity, kept: object) -> bool:
    """Whether `now` is the identity kept at prepare (None kept: never the same)."""
    return _ident(kept) == now
