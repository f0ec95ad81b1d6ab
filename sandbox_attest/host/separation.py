"""Trust domains as measured: who every sandboxed process of a run actually ran as.

Issue 23: `trust_domains()` used to say "separated" because the harness was root and had a
payload user, whatever ran. A spec with `[run] user = "root"` ran its wrapper as root under
that claim, and a non-root harness ran every wrapper as its own uid, which can read
`--key PATH` in `/proc/<harness>/cmdline` and the key variable in `/proc/<harness>/environ`.
So the fact is now measured, per backend, from two sources:

- the host's readings of each cell's processes (`sandbox_attest/run/hostview.py`): the uids and
  gids (real, effective, saved, fs) from `/proc/<pid>/status`, of every process of the cell
  where the host view lists `processes`, else of the one payload it read (and `others`);
- the uid and gid the harness itself started the backend's commands with (`launch_of`): the
  payload user's, a spec's `[run] user`, or the harness's own where it cannot switch users.

A backend is separated only when it ran something, at least one of its processes has a known
uid (read by the host, or started by the harness itself with the uid it chose: `launches`),
and no uid or gid of any of them is root's or the harness's. The run is separated only when
every backend that ran anything is. What cannot be decided (no reading and no launch of known
uid: a docker backend whose containers the host never saw) is "unmeasured", never
"separated".

What this does not see: processes the host cannot read (a VM's, a payload that left before
the rendezvous, or a wrapper that never ran the payload). Those cells are counted
(`cells_unread`); they rest on the uid the harness started the wrapper with, which an
unprivileged process keeps unless a setuid program on the host lifts it (the control leg's
privilege probes measure whether one can).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.host.trust import separation_possible

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sandbox_attest.host.trust import PayloadUser

# Per-backend statuses. Only SEPARATED and RAN_NOTHING let a run be separated.
SEPARATED: Final = "separated"
SHARED: Final = "shared"  # a process (or the launch) ran as root or as the harness's uid
UNMEASURED: Final = "unmeasured"  # it ran cells, but the host read none of their processes
RAN_NOTHING: Final = "ran nothing"  # every cell was UNAVAILABLE / NOT_APPLICABLE / not run


@dataclass(frozen=True)
class Launch:
    """The uid and gid the harness started a backend's commands with (None: not the harness).

    `how` says where the numbers come from, for the reader of the statement.
    """

    uid: int | None
    gid: int | None
    how: str

    def as_dict(self) -> dict[str, Any]:
        """As it goes into the signed fact."""
        return {"uid": self.uid, "gid": self.gid, "how": self.how}


def harness_ids() -> tuple[int, int]:
    """The harness's own effective uid and gid (-1 where the platform has none)."""
    uid = os.geteuid() if hasattr(os, "geteuid") else -1
    gid = os.getegid() if hasattr(os, "getegid") else -1
    return uid, gid


def launch_of(backend: object, user: PayloadUser | None) -> Launch:
    """Who the harness starts `backend`'s commands as: the same choice its Popen makes.

    A command wrapper (`backends/command.py`) runs as its spec's `[run] user` ("root" keeps
    the harness's root), else the run's payload user; docker's commands are the engine's
    client, and the engine starts the container (its uid is in the readings); every other
    backend starts its command as the payload user (`backends/process.py`).
    """
    h_uid, h_gid = harness_ids()
    spec = getattr(backend, "spec", None)
    chooser = getattr(backend, "user", None)
    if spec is not None and callable(chooser):
        run_user = str(getattr(spec, "run_user", "") or "")
        if run_user == "root":
            return Launch(h_uid, h_gid, f'the spec\'s [run] user = "root" ({spec_source(spec)})')
        chosen = chooser()
        if chosen is None:
            return Launch(h_uid, h_gid, "the harness's own uid: it cannot switch users here")
        where = f"the spec's [run] user {run_user!r}" if run_user else "the run's payload user"
        return Launch(int(chosen.uid), int(chosen.gid), f"{where} {chosen.name}")
    if getattr(backend, "name", "") == "docker":
        return Launch(None, None, "the docker engine starts the container; its readings decide")
    if user is None:
        return Launch(h_uid, h_gid, "the harness's own uid: it cannot switch users here")
    return Launch(user.uid, user.gid, f"the run's payload user {user.name}")


def spec_source(spec: object) -> str:
    """The spec file a wrapper came from, for messages."""
    return str(getattr(spec, "source", "") or getattr(spec, "path", "") or "its spec")


def _ids(value: object) -> list[int] | None:
    """uids/gids as the kernel lists them: "0 0 0 0" (status) or [0, 0, 0, 0]; None if unread."""
    if isinstance(value, str):
        parts = value.split()
    elif isinstance(value, list | tuple):
        parts = [str(v) for v in value]
    else:
        return None
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        return None
    return ids or None


def _reading(view: Mapping[str, Any]) -> dict[str, Any] | None:
    """One process's {pid, uids, gids} from a hostview reading, or None if it has none."""
    if "uids" in view or "gids" in view:
        uids, gids = _ids(view.get("uids")), _ids(view.get("gids"))
    else:
        status = view.get("status")
        if not isinstance(status, dict):
            return None
        uids, gids = _ids(status.get("Uid")), _ids(status.get("Gid"))
    if uids is None or gids is None:
        return None
    return {"pid": view.get("pid"), "uids": uids, "gids": gids}


def cell_processes(host_view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every process of one cell the host read: its `processes`, else the payload (+ others).

    Args:
        host_view: a cell's `host_view` (sandbox_attest/run/hostview.py).

    Returns:
        `{pid, uids, gids}` per process read; empty when the host read none.
    """
    listed = host_view.get("processes")
    if isinstance(listed, list):
        # Every process of the cell, read even where the payload itself was not seen.
        views: Iterable[Any] = listed
    elif host_view.get("seen") is False:
        return []
    else:
        others = host_view.get("others")
        views = [host_view, *(others if isinstance(others, list) else [])]
    return [r for r in (_reading(v) for v in views if isinstance(v, dict)) if r is not None]


def cell_refused(host_view: Mapping[str, Any]) -> list[str]:
    """Processes of the cell the host was refused reading (not those that had exited): why."""
    listed = host_view.get("processes")
    return [
        f"pid {p.get('pid')}: {p['unread']}"
        for p in (listed if isinstance(listed, list) else [])
        if isinstance(p, dict)
        and isinstance(p.get("unread"), str)
        and not p["unread"].startswith("exited")
    ]


def _ran(cell: Mapping[str, Any]) -> bool:
    """Whether a cell started anything: the runner records a host view for every run."""
    return isinstance(cell.get("host_view"), dict)


def backend_fact(
    name: str,
    cells: Iterable[Mapping[str, Any]],
    launch: Launch | None,
    harness: tuple[int, int],
) -> dict[str, Any]:
    """The measured fact of one backend: every uid and gid its processes ran as, and a verdict.

    Args:
        name: the backend's name.
        cells: this backend's evidence cells.
        launch: who the harness started its commands as (None: not known).
        harness: the harness's (uid, gid).
    """
    ran = [c for c in cells if _ran(c)]
    read = _read_ids(ran)
    known_launch = launch is not None and launch.uid is not None
    # One command per cell that ran, started by the harness with this uid: the kernel set it
    # at exec, so each is a process whose uid is known without a reading.
    launches = len(ran) if known_launch else 0
    fact: dict[str, Any] = {
        "uids": sorted(read.uids),
        "gids": sorted(read.gids),
        "processes_read": read.processes,
        "processes_refused": len(read.refused),
        "launches": launches,
        "cells_ran": len(ran),
        "cells_read": read.cells,
        "cells_unread": len(ran) - read.cells,
        "launched_as": launch.as_dict() if launch is not None else None,
    }
    status, reason = _status(name, len(ran), read, launch, launches, harness)
    fact["status"] = status
    fact["separated"] = status == SEPARATED
    fact["reason"] = reason
    return fact


@dataclass
class _ReadIds:
    """Every uid and gid the host read of one backend's cells, and how many it read."""

    uids: set[int]
    gids: set[int]
    processes: int
    cells: int
    refused: list[str]


def _read_ids(ran: list[Mapping[str, Any]]) -> _ReadIds:
    """The uids and gids of every process the host read in the cells that ran."""
    read = _ReadIds(set(), set(), 0, 0, [])
    for cell in ran:
        read.refused += cell_refused(cell["host_view"])
        found = cell_processes(cell["host_view"])
        if found:
            read.cells += 1
        read.processes += len(found)
        for proc in found:
            read.uids.update(proc["uids"])
            read.gids.update(proc["gids"])
    return read


def _status(
    name: str,
    ran: int,
    read: _ReadIds,
    launch: Launch | None,
    launches: int,
    harness: tuple[int, int],
) -> tuple[str, str]:
    """One backend's status (SEPARATED, SHARED, ...) and the reason that names its numbers."""
    h_uid, h_gid = harness
    uids, gids, processes, read_cells, refused = (
        read.uids,
        read.gids,
        read.processes,
        read.cells,
        read.refused,
    )
    launched_uids = {launch.uid} if launch is not None and launch.uid is not None else set()
    launched_gids = {launch.gid} if launch is not None and launch.gid is not None else set()
    bad_uids = sorted((uids | launched_uids) & {0, h_uid})
    bad_gids = sorted((gids | launched_gids) & {0, h_gid})
    if not ran:
        status, reason = RAN_NOTHING, f"{name} ran no cell, so no process of it was judged"
    elif bad_uids or bad_gids:
        status = SHARED
        launched = (
            f"; its commands were started as uid {launch.uid} ({launch.how})"
            if launch is not None and launch.uid in bad_uids
            else ""
        )
        reason = (
            f"{name}'s processes ran as uid {_listed(bad_uids)} / gid {_listed(bad_gids)}, "
            f"which is root or the harness's own (uid {h_uid}, gid {h_gid}){launched}"
        )
    elif refused:
        # A process the host could not read may have run as anyone: never separated.
        status = UNMEASURED
        reason = (
            f"the host was refused reading {len(refused)} of {name}'s processes "
            f"({'; '.join(refused[:3])}), so who they ran as is unknown"
        )
    elif processes + launches == 0:
        status = UNMEASURED
        reason = (
            f"the host read none of {name}'s processes in {ran} cells (see each cell's "
            "host_view `why`), and the harness did not start them itself, so who they ran as "
            "is unknown"
        )
    else:
        status = SEPARATED
        ids = sorted(uids | launched_uids)
        reason = (
            f"{name}: {processes} processes read in {read_cells} of {ran} cells and "
            f"{launches} started by the harness ran as uid {_listed(ids)}, gid "
            f"{_listed(sorted(gids | launched_gids))}"
        )
    return status, reason


def _listed(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids) or "none"


def measure(
    user: PayloadUser | None,
    backends: Mapping[str, object],
    cells: Iterable[Mapping[str, Any]],
    *,
    unsupported: str = "",
) -> dict[str, Any]:
    """The run's measured trust domains: one fact per backend and the run's verdict.

    Args:
        user: the run's payload user (None: there is none).
        backends: name -> backend object, every backend the run selected.
        cells: the run's evidence cells.
        unsupported: why the harness could not separate at all ("" if it could).

    Returns:
        `{"separated", "measured": True, "harness_uid", "harness_gid", "payload_uid",
        "payload_user", "reason", "backends": {name: backend_fact}}`.
    """
    harness = harness_ids()
    by_backend: dict[str, list[Mapping[str, Any]]] = {name: [] for name in backends}
    for cell in cells:
        by_backend.setdefault(str(cell.get("backend", "")), []).append(cell)
    facts = {
        name: backend_fact(
            name, rows, launch_of(backends[name], user) if name in backends else None, harness
        )
        for name, rows in sorted(by_backend.items())
    }
    return summarize(facts, harness, user, unsupported)


def trust_domains(
    user: PayloadUser | None,
    backends: Mapping[str, object] | None = None,
    cells: Iterable[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The fact the signed statement records: who judged, and who ran the judged code.

    Measured, not declared (issue 23): with the run's `backends` and judged `cells`, every
    uid and gid the host read of each backend's processes, and the uid the harness started
    its commands with, decide (`measure`). Without them (the run
    has not judged anything yet) the fact says "not measured" and is never separated.

    Args:
        user: the run's payload user (None: the harness cannot switch users).
        backends: name -> backend object, every backend the run selected.
        cells: the run's evidence cells, each with its `host_view`.
    """
    ok, reason = separation_possible()
    unsupported = "" if ok else reason
    if ok and user is None:
        unsupported = "uid separation was turned off for this run"
    if backends is None or cells is None:
        uid, _ = harness_ids()
        return {
            "separated": False,
            "measured": False,
            "harness_uid": uid,
            "payload_uid": user.uid if user is not None else uid,
            "payload_user": user.name if user is not None else None,
            "reason": "not measured yet: the run has judged no cell"
            + (f" ({unsupported})" if unsupported else ""),
        }
    return measure(user, backends, cells, unsupported=unsupported)


def summarize(
    facts: Mapping[str, Mapping[str, Any]],
    harness: tuple[int, int],
    user: PayloadUser | None,
    unsupported: str = "",
) -> dict[str, Any]:
    """The run's fact from its backends' facts (`verify` re-derives `separated` with `decide`)."""
    separated, why = decide(facts, harness)
    if separated and user is not None:
        reason = (
            f"every sandboxed process the host read ran as {user.name} (uid {user.uid}), the "
            f"harness and its signer as uid {harness[0]}"
        )
    elif separated:
        reason = f"every sandboxed process the host read ran apart from the harness: {why}"
    else:
        reason = "; ".join(r for r in (unsupported, why) if r)
    return {
        "separated": separated,
        "measured": True,
        "harness_uid": harness[0],
        "harness_gid": harness[1],
        "payload_uid": user.uid if user is not None else harness[0],
        "payload_user": user.name if user is not None else None,
        "reason": reason,
        "backends": {name: dict(fact) for name, fact in facts.items()},
    }


def decide(
    facts: Mapping[str, Mapping[str, Any]], harness: tuple[int, int] | None = None
) -> tuple[bool, str]:
    """Separated iff every backend that ran is SEPARATED and at least one is; and why (not).

    With `harness`, a SEPARATED status is held to its own numbers too: a uid or gid of root
    or of the harness among them, or no process read, makes it not separated whatever the
    status says (so `verify` re-derives the fact instead of trusting one word).

    Args:
        facts: name -> a `backend_fact` (as signed: plain JSON).
        harness: the harness's (uid, gid) as the fact records them.
    """
    if not facts:
        return False, "no backend ran, so no sandboxed process was measured"
    bad = []
    for name, fact in sorted(facts.items()):
        status = fact.get("status")
        if status not in (SEPARATED, RAN_NOTHING):
            bad.append(str(fact.get("reason") or f"{name} is {status}"))
        elif status == SEPARATED and harness is not None:
            contradiction = _contradiction(name, fact, harness)
            if contradiction:
                bad.append(contradiction)
    if bad:
        return False, "; ".join(bad)
    if not any(f.get("status") == SEPARATED for f in facts.values()):
        return False, "no backend ran a cell whose processes the host read"
    return True, "; ".join(str(f.get("reason", "")) for f in facts.values() if f.get("separated"))


def _contradiction(name: str, fact: Mapping[str, Any], harness: tuple[int, int]) -> str:
    """Why a backend fact that says SEPARATED does not hold by its own numbers ("" if it does)."""
    launched = fact.get("launched_as")
    extra_uid = launched.get("uid") if isinstance(launched, dict) else None
    extra_gid = launched.get("gid") if isinstance(launched, dict) else None
    uids = set(_ids(fact.get("uids")) or []) | (
        {extra_uid} if isinstance(extra_uid, int) else set()
    )
    gids = set(_ids(fact.get("gids")) or []) | (
        {extra_gid} if isinstance(extra_gid, int) else set()
    )
    if uids & {0, harness[0]} or gids & {0, harness[1]}:
        return (
            f"{name} is recorded as separated, but its uids {sorted(uids)} / gids "
            f"{sorted(gids)} include root's or the harness's (uid {harness[0]}, gid "
            f"{harness[1]})"
        )
    counts = [n for n in (fact.get("processes_read"), fact.get("launches")) if isinstance(n, int)]
    if len(counts) != 2 or sum(counts) < 1:
        return f"{name} is recorded as separated, but no process of it was read or started"
    return ""


def recheck(domains: Mapping[str, Any], cells: Iterable[Mapping[str, Any]]) -> list[str]:
    """Why a signed trust-domains fact does not follow from the signed cells ([] if it does).

    `verify` calls it: the per-backend uids, gids and statuses are derived again from each
    cell's host readings and the recorded launch, so a fact that says "separated" over
    readings of root (a bug, or a forged fact under a stolen key) is named.
    """
    facts = domains.get("backends")
    if not isinstance(facts, dict):
        return []
    h_uid, h_gid = domains.get("harness_uid"), domains.get("harness_gid")
    if not isinstance(h_uid, int) or not isinstance(h_gid, int):
        return ["the trust-domains fact records no harness uid and gid to measure against"]
    by_backend: dict[str, list[Mapping[str, Any]]] = {}
    for cell in cells:
        by_backend.setdefault(str(cell.get("backend", "")), []).append(cell)
    problems = []
    for name in sorted(set(by_backend) | set(facts)):
        fact = facts.get(name)
        if not isinstance(fact, dict):
            problems.append(f"backend {name} has cells but no trust-domains fact")
            continue
        launched = fact.get("launched_as")
        launch = (
            Launch(launched.get("uid"), launched.get("gid"), str(launched.get("how", "")))
            if isinstance(launched, dict)
            else None
        )
        again = backend_fact(name, by_backend.get(name, []), launch, (h_uid, h_gid))
        problems.extend(
            f"the trust-domains fact of {name} says {key} {fact.get(key)!r}, but its "
            f"signed cells give {again[key]!r}"
            for key in ("status", "uids", "gids", "processes_read", "processes_refused", "launches")
            if again[key] != fact.get(key)
        )
    return problems
