"""The filesystem probes, host side: canaries planted where a sandbox must not reach.

One module per mechanism, each with its spec and the helpers only it uses:

- `write_outside` (`fs_write_outside`): canary dirs in every class of host place the payload
  user can write unconfined, held by the harness's descriptors from plant time.
- `writable`: what the payload user may write unconfined (the scan for writable places and
  the host control's write test), run as that user in a child.
- `read_secrets` (`fs_read_secrets`): canary secrets in the payload home and a project's .env.
- `protected` (`fs_protected_in_workspace`): git hooks, git config and rc files in the
  workspace, which run code outside the sandbox later.
- `link_escape` (`fs_link_escape`): symlinks, hardlinks and renames between the workspace and
  host canaries.
- `canaries`: what several of them plant the same way (the canary file's name, its owner, the
  sweep's journal entry, the removal of a canary dir).

The four spec classes and `CANARY_NAME` are re-exported here because the catalogue's index
(`sandbox_attest/catalog/__init__.py`) and the tests name them as `catalog.fs`'s, as they did
when this was one module; everything else is imported from its own module.
"""

from __future__ import annotations

from sandbox_attest.catalog.fs.canaries import CANARY_NAME
from sandbox_attest.catalog.fs.link_escape import FsLinkEscape
from sandbox_attest.catalog.fs.protected import FsProtectedInWorkspace
from sandbox_attest.catalog.fs.read_secrets import FsReadSecrets
from sandbox_attest.catalog.fs.write_outside import FsWriteOutside

__all__ = [
    "CANARY_NAME",
    "FsLinkEscape",
    "FsProtectedInWorkspace",
    "FsReadSecrets",
    "FsWriteOutside",
]
