"""What the payload user may write unconfined: the scan for writable places, the write test.

Both run as the payload user in a child (`measure_as`, `call_as` name this module and the
function), so what they find is that user's reach on this host, not the harness's (root's).
`fs_write_outside` plants a canary in every place the scan finds, and its host control writes
in each planted dir with `sandbox_attest.host.as_user.write_each`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import time
from typing import Any, Final

from sandbox_attest.host.trust import PayloadUser, measure_as

# The scan: breadth first from /, as the payload user, for the topmost directories it may
# write (a writable directory's subtree is the same class). Bounded in time and size, and run
# once per harness process: which places are writable does not change between cells.
SCAN_BUDGET_S: Final = 10.0
SCAN_MAX_DIRS: Final = 200_000
SCAN_PRUNE: Final = ("/proc", "/sys")
# A place the payload user's own permissions close to it: out of its reach unconfined.
OUT_OF_REACH: Final = frozenset({"place:EACCES", "place:EPERM", "place:EROFS"})


def writable_places(
    root: str = "/", budget_s: float = SCAN_BUDGET_S, max_dirs: int = SCAN_MAX_DIRS
) -> dict[str, Any]:
    """The topmost directories under `root` that THIS process may create entries in.

    `os.access` with the real uid, so run it as the payload user (`payload_writable_places`).
    Symlinks are not followed; /proc and /sys are not walked.

    Returns:
        `{"found": [...], "complete": bool, "visited": n, "elapsed_s": s}`; `complete` is
        False when the budget ran out first (the found list is then a lower bound).
    """
    start = time.monotonic()
    found: list[str] = []
    queue: collections.deque[str] = collections.deque([root])
    visited = 0
    while queue and time.monotonic() - start < budget_s and visited < max_dirs:
        directory = queue.popleft()
        visited += 1
        if directory in SCAN_PRUNE:
            continue
        if os.access(directory, os.W_OK | os.X_OK):
            found.append(directory)
            continue
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        queue.append(entry.path)
    return {
        "found": sorted(found),
        "complete": not queue,
        "visited": visited,
        "elapsed_s": round(time.monotonic() - start, 2),
    }


# One scan at a time: `functools.cache` alone would let two first callers both scan.
_SCAN_LOCK = threading.Lock()


@functools.cache
def _scan_as(user: PayloadUser | None) -> dict[str, Any]:
    if user is None:
        return writable_places()
    scanned, why = measure_as(user, __name__, "writable_places", SCAN_BUDGET_S * 3)
    if why:
        return {"found": [], "complete": False, "error": why}
    return dict(scanned)


def start_scan(user: PayloadUser | None) -> None:
    """Begin `payload_writable_places(user)` in the background (a run's cells wait for it).

    The scan takes 1 to 2.5 s here; begun when the run knows its cells, it is done (or
    nearly) when the first fs_write_outside cell plants, instead of holding up that cell.
    """
    threading.Thread(
        target=payload_writable_places, args=(user,), daemon=True, name="writable-scan"
    ).start()


def payload_writable_places(user: PayloadUser | None) -> dict[str, Any]:
    """`writable_places()` as the payload user, once per process (see SCAN_BUDGET_S).

    Callers at the same time wait for the one scan (`start_scan` may have begun it).

    Without a payload user the payload runs as the harness's own user, and the scan does too;
    except as root, which may write everywhere, and off POSIX: no scan then (only the named
    classes).
    """
    if os.name != "posix":
        # On Windows os.access reads the read-only attribute, not the ACL, so it would call
        # the system drive's root writable. The named classes stand alone there.
        return {"found": [], "complete": False, "error": f"not scanned on {os.name}"}
    if user is None and hasattr(os, "geteuid") and os.geteuid() == 0:
        return {"found": [], "complete": False, "error": "not scanned as root"}
    with _SCAN_LOCK:
        return _scan_as(user)
