"""Provenance: git commit and dirtiness of a real checkout, tree digests, executables on PATH."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import sandbox_attest
from sandbox_attest import __version__
from sandbox_attest.host.provenance import (
    NOT_FOUND,
    executable_facts,
    git_facts,
    harness_provenance,
    tree_digest,
)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(root: Path, *args: str) -> str:
    """Run git in `root` with a fixed identity and return its stdout."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    git_exe = shutil.which("git")
    assert git_exe is not None
    done = subprocess.run(
        [git_exe, "-C", str(root), *args], capture_output=True, text=True, check=True, env=env
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git repository with one committed file."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "a.py").write_text("x = 1\n")
    git(root, "add", "a.py")
    git(root, "commit", "-q", "-m", "one")
    return root


def write_exe(path: Path, text: str) -> Path:
    """Write an executable file."""
    path.write_text(text)
    path.chmod(0o755)
    return path


@needs_git
class TestGitFacts:
    def test_clean_checkout_gives_head_and_not_dirty(self, repo: Path) -> None:
        """A clean checkout reports its HEAD commit and dirty False."""
        assert git_facts(repo) == (git(repo, "rev-parse", "HEAD"), False)

    def test_edited_tracked_file_is_dirty(self, repo: Path) -> None:
        """An uncommitted edit to a tracked file makes the checkout dirty."""
        (repo / "a.py").write_text("x = 2\n")
        assert git_facts(repo)[1] is True

    def test_untracked_file_is_not_dirty(self, repo: Path) -> None:
        """An untracked file does not make the checkout dirty."""
        (repo / "stray.txt").write_text("?")
        assert git_facts(repo)[1] is False

    def test_subdirectory_of_a_checkout_has_no_commit(self, repo: Path) -> None:
        """A folder inside some other checkout (a venv's site-packages) has no commit."""
        inner = repo / "venv" / "site-packages"
        inner.mkdir(parents=True)
        assert git_facts(inner) == (None, None)

    def test_plain_folder_has_no_commit(self, tmp_path: Path) -> None:
        """A folder outside any checkout (a wheel install) has commit and dirty None."""
        assert git_facts(tmp_path) == (None, None)


class TestTreeDigest:
    def test_content_change_changes_digest(self, tmp_path: Path) -> None:
        """Editing one file changes the tree digest; caches and _data do not count."""
        (tmp_path / "m.py").write_text("a")
        before = tree_digest(tmp_path)
        (tmp_path / "__pycache__").mkdir()
        (tmp_path / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
        (tmp_path / "_data").mkdir()
        (tmp_path / "_data" / "p.py").write_text("p")
        assert tree_digest(tmp_path) == before
        (tmp_path / "m.py").write_text("b")
        assert tree_digest(tmp_path) != before

    def test_line_format(self, tmp_path: Path) -> None:
        """The digest is sha256 over sorted `sha256<TAB>path<LF>` lines."""
        (tmp_path / "b").write_bytes(b"2")
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "a").write_bytes(b"1")
        lines = "".join(
            f"{hashlib.sha256(data).hexdigest()}\t{rel}\n"
            for rel, data in (("b", b"2"), ("d/a", b"1"))
        )
        assert tree_digest(tmp_path) == hashlib.sha256(lines.encode()).hexdigest()

    def test_repointed_symlink_changes_digest(self, tmp_path: Path) -> None:
        """A symlink is pinned by its target, so repointing it changes the digest."""
        (tmp_path / "link").symlink_to("one")
        before = tree_digest(tmp_path)
        (tmp_path / "link").unlink()
        (tmp_path / "link").symlink_to("two")
        assert tree_digest(tmp_path) != before


class TestHarnessProvenance:
    def test_fields_and_digests(self) -> None:
        """The harness entry names the version and 64-hex digests of the package and probes."""
        facts = harness_provenance()
        assert set(facts) == {"version", "commit", "dirty", "package_sha256", "probes_sha256"}
        assert facts["version"] == __version__
        for key in ("package_sha256", "probes_sha256"):
            assert len(facts[key]) == 64
            int(facts[key], 16)
        assert facts["commit"] is None or len(facts["commit"]) == 40

    def test_package_digest_covers_every_floor(self) -> None:
        """package_sha256 is the digest of the whole package, not of the floor it sits on."""
        whole = Path(sandbox_attest.__file__).resolve().parent
        assert harness_provenance()["package_sha256"] == tree_digest(whole)
        assert tree_digest(whole) != tree_digest(whole / "host")

    def test_copy_per_call(self) -> None:
        """Editing one returned dict does not change the next call's answer."""
        harness_provenance()["version"] = "edited"
        assert harness_provenance()["version"] == __version__


class TestExecutableFacts:
    def test_binary_is_resolved_through_symlinks_and_hashed(self, tmp_path: Path) -> None:
        """A program found through a symlink on PATH records its real path and sha256."""
        real = tmp_path / "real"
        real.mkdir()
        exe = write_exe(real / "tool", "\x7fELF not really\n")
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "tool").symlink_to(exe)
        facts = executable_facts("tool", str(bindir))
        assert facts == {
            "argv0": "tool",
            "path": str(bindir / "tool"),
            "realpath": str(exe),
            "sha256": hashlib.sha256(exe.read_bytes()).hexdigest(),
        }

    def test_env_shebang_resolves_interpreter_on_same_path(self, tmp_path: Path) -> None:
        """`#!/usr/bin/env NAME` records NAME's facts as found on the same PATH, once."""
        bindir = tmp_path / "bin"
        bindir.mkdir()
        interp = write_exe(bindir / "myinterp", "#!/bin/sh\nexec cat\n")
        script = write_exe(bindir / "wrap", "#!/usr/bin/env -S myinterp -u\nprint(1)\n")
        facts = executable_facts("wrap", str(bindir))
        assert facts["sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
        inner = facts["interpreter"]
        assert inner["via"] == "/usr/bin/env"
        assert inner["realpath"] == str(interp)
        assert inner["sha256"] == hashlib.sha256(interp.read_bytes()).hexdigest()
        assert "interpreter" not in inner  # followed once: /bin/sh is not chased

    def test_absolute_shebang_interpreter(self, tmp_path: Path) -> None:
        """`#!/abs/path` records that interpreter's facts."""
        interp = write_exe(tmp_path / "interp", "binary")
        write_exe(tmp_path / "s", f"#!{interp} -x\nbody\n")
        facts = executable_facts("s", str(tmp_path))
        assert facts["interpreter"]["realpath"] == str(interp)

    def test_missing_program(self, tmp_path: Path) -> None:
        """A program not on PATH gives argv0 and the error, nothing else."""
        assert executable_facts("no-such-tool", str(tmp_path)) == {
            "argv0": "no-such-tool",
            "error": NOT_FOUND,
        }

    def test_missing_env_interpreter(self, tmp_path: Path) -> None:
        """A script whose env-named interpreter is missing records that interpreter's error."""
        write_exe(tmp_path / "s", "#!/usr/bin/env nothere\n")
        facts = executable_facts("s", str(tmp_path))
        assert facts["interpreter"]["error"] == NOT_FOUND
