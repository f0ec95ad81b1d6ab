"""Targets the host adds to a cell's task at the rendezvous, and whether the payload tried them.

Several probes learn only at the rendezvous, from the host's reading of the payload's view,
where the objects they test really are: a canary mounted at `/home/agent` (the fs probes), a
host device node at `/host/dev/fuse` (dev_access). The payload reads its task after the
rendezvous, so the host writes those inside paths into it (`add_targets`), and the
assessment then checks that the report tried each one (`untried`): a report that skips an
added path is not what ran.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Final

from sandbox_attest.host import safefs
from sandbox_attest.payload import INPUT_DIR, STAGED_TASK

if TYPE_CHECKING:
    from pathlib import Path

# How big a staged task may be for the host to rewrite it (it is a few KiB).
TASK_CAP: Final = 1 << 20


def add_targets(cell_dir: Path, field: str, added: dict[str, str]) -> str:
    """Add `added` to the staged task's `targets[field]`, in place; "" or why it failed.

    The payload reads its task after the rendezvous, so it tries these paths too. Through
    the input dir's descriptor (root's, 0755), the file rewritten in place (same inode: a
    wrapper that bound the file itself sees the new bytes too).
    """
    if not added:
        return ""
    try:
        with safefs.open_dir(cell_dir / INPUT_DIR) as site:
            task = json.loads(site.read_bytes(STAGED_TASK, TASK_CAP))
            task["targets"][field] = {**task["targets"][field], **added}
            fd = site.open_file(STAGED_TASK, os.O_WRONLY | os.O_TRUNC)
            try:
                view = memoryview(json.dumps(task, indent=1).encode())
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
    except (OSError, ValueError, KeyError, TypeError, safefs.UnsafePathError) as exc:
        return f"the host could not add the inside paths to the task: {exc}"
    return ""


def untried(added: dict[str, str], report: dict[str, Any]) -> list[str]:
    """The added targets the payload's report has no attempt at (`key` or `key:op`)."""
    names = {str(a.get("what")) for a in report.get("attempts") or []}
    tried = {n.rsplit(":", 1)[0] for n in names} | names
    return sorted(k for k in added if k not in tried)
