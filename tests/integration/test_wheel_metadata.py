"""The wheel's metadata is what PyPI shows: classifiers, URLs, keywords, authors, the README.

The README is the long description, so it must not point anywhere outside the repository
(a `../shared/...` link is broken on PyPI); the metadata is read from a freshly built wheel,
not from pyproject.toml, so what a build backend drops is caught too.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def metadata(tmp_path_factory: pytest.TempPathFactory) -> Message:
    """METADATA of the project's wheel, built offline (hatchling is a test dependency)."""
    out = tmp_path_factory.mktemp("dist")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--no-index", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("sandbox_attest-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(zf.read(name).decode())


class TestMetadata:
    @pytest.mark.parametrize(
        "classifier",
        [
            "Framework :: Pytest",
            "Topic :: Security",
            "Operating System :: POSIX :: Linux",
            "Operating System :: MacOS",
            "Operating System :: Microsoft :: Windows",
            "Programming Language :: Python :: 3.11",
        ],
    )
    def test_classifier(self, metadata: Message, classifier: str) -> None:
        """The wheel declares the classifier."""
        assert classifier in metadata.get_all("Classifier", [])

    def test_urls_keywords_and_authors(self, metadata: Message) -> None:
        """Project URLs, keywords and an author are in the wheel's metadata."""
        urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL", []))
        assert {"Homepage", "Source", "Issues"} <= set(urls)
        assert all(u.startswith("https://") for u in urls.values())
        assert "pytest" in metadata["Keywords"].split(",")
        assert "sandbox-attest maintainers" in metadata["Author-email"]

    def test_plugin_and_script_entry_points(self) -> None:
        """The pytest11 entry point and the console script name the modules that exist."""
        text = (ROOT / "pyproject.toml").read_text()
        assert 'sandbox_attest = "sandbox_attest.plugin"' in text
        assert 'sandbox-attest = "sandbox_attest.cli:main"' in text


class TestReadmeIsPypiSafe:
    def test_no_link_leaves_the_repository(self) -> None:
        """No README link or file reference climbs out of the repository (`../`)."""
        text = (ROOT / "README.md").read_text()
        assert "../" not in text

    def test_every_relative_link_is_a_file_of_the_repository(self) -> None:
        """Every relative Markdown link in the README names a file that exists in the tree."""
        text = (ROOT / "README.md").read_text()
        targets = re.findall(r"\]\(([^)#][^)]*)\)", text)
        relative = [t for t in targets if not t.startswith(("http://", "https://", "#"))]
        missing = [t for t in relative if not (ROOT / t).exists()]
        assert missing == []
