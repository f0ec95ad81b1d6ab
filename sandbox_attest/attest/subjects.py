"""What an attestation covers: every file a person reads, named and digested one way.

Signer and verifier both import this, so the set of subjects and the digest of the allure
directory cannot drift apart. A person reads evidence.json, junit.xml, report.html and
summary.md, and a team reads allure-results/ through Allure; a signature that left any of
them out would let that file say something the signed gate does not.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from sandbox_attest.errors import ReportError

# The report's file names are the report's own (`report.files`); they are named here again as
# the signed subjects, so signer and verifier read `subjects.JUNIT` beside `FILE_SUBJECTS`.
from sandbox_attest.report.files import ALLURE_DIR, EVIDENCE, HTML, JUNIT, SARIF, SUMMARY

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows, where verify runs too

# A directory subject is named with a trailing slash, so a reader sees it is a tree digest.
ALLURE_SUBJECT = ALLURE_DIR + "/"
FILE_SUBJECTS = (EVIDENCE, JUNIT, HTML, SUMMARY, SARIF)
ALL_SUBJECTS = (*FILE_SUBJECTS, ALLURE_SUBJECT)
# A merged release's own pages, at the top of the merged directory beside legs/: signed
# subjects of the merged statement (sandbox_attest/report/views/release.py renders them).
RELEASE_SUBJECTS = (HTML, SUMMARY)

__all__ = [
    "ALLURE_DIR",
    "ALLURE_SUBJECT",
    "ALL_SUBJECTS",
    "EVIDENCE",
    "FILE_SUBJECTS",
    "HTML",
    "JUNIT",
    "RELEASE_SUBJECTS",
    "SARIF",
    "SUMMARY",
    "read_tree",
    "tree_digest_of",
    "tree_sha256",
]


def tree_sha256(root: Path) -> str:
    """Hex sha256 over a directory tree: each regular file's relative path and content digest.

    The lines `sha256(content) <TAB> relative/path <LF>`, sorted by path, are hashed once. A
    missing directory digests as the empty tree, so "no allure results" is also pinned.

    Raises:
        ReportError: the tree holds anything but directories and regular files (a symlink, a
            FIFO): nothing the harness writes is one, so such an entry was planted.
    """
    return tree_digest_of(read_tree(root))


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` by relative path, read once (a missing root is empty).

    Raises:
        ReportError: the tree holds a symlink, FIFO or other non-regular entry (as
            `subjects.tree_sha256` refuses it), or a file cannot be read.
    """
    out: dict[str, bytes] = {}
    if root.is_symlink():
        raise ReportError(f"{root} is a symlink; the report directory was tampered with")
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            rel = path.relative_to(root).as_posix()
            if not stat.S_ISREG(mode):
                raise ReportError(
                    f"{root}/{rel} is not a regular file; the report directory was tampered "
                    "with (re-run into a new --out directory)"
                )
            try:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
                with os.fdopen(fd, "rb") as handle:
                    out[rel] = handle.read()
            except OSError as exc:
                raise ReportError(f"{root}/{rel}: cannot read ({exc.strerror})") from exc
    return out


def tree_digest_of(files: dict[str, bytes]) -> str:
    """`subjects.tree_sha256` computed over files already in memory (relative path -> bytes)."""
    text = "".join(
        f"{hashlib.sha256(data).hexdigest()}\t{rel}\n" for rel, data in sorted(files.items())
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
