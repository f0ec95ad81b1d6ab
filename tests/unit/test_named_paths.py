"""Every `sandbox_attest/....py` path the repository names exists.

Code, comments, docs and CI workflows point readers at modules by path. When modules move
(issue 25 moved most of them) a stale path sends a reviewer, or a CI step such as the Windows
type check, to a file that is not there; this test finds each one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"sandbox_attest/[a-z_/0-9]+\.py")
# Text the repository keeps; caches, venvs, reports and the VCS are not the repository's words.
SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".in", ".cfg", ".txt"}
SKIP = {".git", ".venv", ".state", "reports", "__pycache__", ".mypy_cache", ".ruff_cache"}


def named_paths(root: Path) -> list[tuple[str, str]]:
    """(file, named path) for every module path named in the repository's text files."""
    found = []
    for path in sorted(root.rglob("*")):
        if SKIP & set(path.relative_to(root).parts) or path.suffix not in SUFFIXES:
            continue
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = str(path.relative_to(root))
        found += [(rel, m) for m in sorted(set(NAMED.findall(text)))]
    return found


def test_every_named_module_path_exists() -> None:
    """No file names a module path that does not exist (a module moved, its mentions did not)."""
    missing = [
        f"{where}: {named}" for where, named in named_paths(ROOT) if not (ROOT / named).is_file()
    ]
    assert missing == []


def test_the_reader_finds_a_named_path(tmp_path: Path) -> None:
    """A path in a comment is found; one in a skipped directory is not."""
    (tmp_path / "a.py").write_text("# see sandbox_attest/host/trust.py\n")
    (tmp_path / ".venv").mkdir()
    gone = "sandbox_attest/" + "gone.py"  # split, so this file names no missing path itself
    (tmp_path / ".venv" / "b.py").write_text(f"# {gone}\n")
    assert named_paths(tmp_path) == [("a.py", "sandbox_attest/host/trust.py")]
