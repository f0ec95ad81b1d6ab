"""What the filesystem probes plant on the host, and how it is owned, journalled and removed.

Shared by `write_outside` and `link_escape` (canary dirs in host places, the canary file's
name, the payload user as their owner) and by `read_secrets` (the journal entry): each
probe plants its own canaries, and this module holds only what more than one of them does
the same way.
"""

from __future__ import annotations

import contextlib
import stat
from pathlib import Path

from sandbox_attest.catalog.spec import CellContext
from sandbox_attest.host import disguise, safefs

CANARY_NAME = disguise.CANARY_FILE


def payload_owner(ctx: CellContext) -> tuple[int, int] | None:
    """The payload user's (uid, gid) for what it must own; None without separation."""
    return (ctx.user.uid, ctx.user.gid) if ctx.user is not None else None


def remove_canary_dir(directory: Path) -> None:
    """Remove a canary dir and everything in it (a payload's nonce files too), never following.

    Through the place's descriptor, and only a directory: whatever the payload user put at
    the name instead (a symlink to a root dir) is left alone.
    """
    with (
        contextlib.suppress(OSError, safefs.UnsafePathError),
        safefs.open_dir(directory.parent) as place,
    ):
        st = place.entry(directory.name)
        if st is not None and stat.S_ISDIR(st.st_mode):
            made = {directory.name: (st.st_dev, st.st_ino)}
            place.rmtree(directory.name, made, also_foreign=True)


def canary_journal_key(probe: str, ctx: CellContext) -> str:
    """The journal entry of a cell's canaries outside the scratch (host/journal.py)."""
    return f"canary-{probe}-{ctx.nonce}"
