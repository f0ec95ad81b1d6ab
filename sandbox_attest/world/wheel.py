"""Build the canary wheel from `fixtures/canary_wheel/` with the stdlib only.

There is no network during a run, so no build backend can be fetched; a pure-Python wheel is a
zip with three metadata files, which `zipfile` writes directly. The build is deterministic
(sorted entries, fixed timestamps), so the same nonce yields the same bytes and sha256.

Spec: https://packaging.python.org/en/latest/specifications/binary-distribution-format/
"""

from __future__ import annotations

import base64
import hashlib
import re
import tomllib
import zipfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox_attest.errors import FixtureError
from sandbox_attest.host import disguise

if TYPE_CHECKING:
    from pathlib import Path

NONCE_PLACEHOLDER = "@NONCE@"
_METADATA_FILE = "wheel.toml"
# The zip epoch: a wheel built at any time has identical bytes.
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
# A nonce is pasted into Python source; allow nothing that could end the string literal.
_NONCE_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(frozen=True)
class CanaryMetadata:
    """The `[metadata]` table of `wheel.toml`."""

    name: str  # distribution name, e.g. "kiln-helpers"
    version: str
    summary: str
    requires_python: str
    license: str

    @property
    def wheel_stem(self) -> str:
        """The escaped distribution name used in file names (`kiln_helpers`)."""
        return re.sub(r"[-_.]+", "_", self.name).lower()

    @property
    def filename(self) -> str:
        """The wheel file name: `<stem>-<version>-py3-none-any.whl`."""
        return f"{self.wheel_stem}-{self.version}-py3-none-any.whl"


def load_canary_metadata(src: Path) -> CanaryMetadata:
    """Read `src/wheel.toml`.

    Raises:
        FixtureError: the file is missing or incomplete.
    """
    path = src / _METADATA_FILE
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))["metadata"]
        return CanaryMetadata(
            name=str(table["name"]),
            version=str(table["version"]),
            summary=str(table["summary"]),
            requires_python=str(table["requires_python"]),
            license=str(table["license"]),
        )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise FixtureError(
            f"{path}: cannot read the canary metadata ({exc!r}); it needs a [metadata] table "
            "with name, version, summary, requires_python and license"
        ) from exc


def _record_hash(data: bytes) -> str:
    # RECORD: "sha256=" + urlsafe base64 without padding (the wheel spec, "The .dist-info
    # directory").
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_canary_wheel(src: Path, out_dir: Path, nonce: str) -> Path:
    """Build the canary wheel (`kiln_helpers-1.0.0-py3-none-any.whl`) with `nonce` baked in.

    Args:
        src: the canary source tree (`fixtures/canary_wheel`).
        out_dir: where the wheel is written (created if missing).
        nonce: replaces `@NONCE@` in every source file; letters, digits, `_.-` only.

    Returns:
        The path of the wheel.

    Raises:
        FixtureError: bad nonce, unreadable source, or the wheel cannot be written.
    """
    if not _NONCE_RE.fullmatch(nonce):
        raise FixtureError(
            f"canary nonce {nonce!r} must be 1-128 characters of letters, digits, '_', '.', '-'"
        )
    meta = load_canary_metadata(src)
    files: dict[str, bytes] = {}
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if not path.is_file() or rel == _METADATA_FILE or "__pycache__" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise FixtureError(f"cannot read canary source {path}: {exc}") from exc
        files[rel] = data.replace(NONCE_PLACEHOLDER.encode(), nonce.encode())
    if not files:
        raise FixtureError(f"{src} holds no package files for the canary wheel")

    dist_info = f"{meta.wheel_stem}-{meta.version}.dist-info"
    files[f"{dist_info}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        f"Name: {meta.name}\n"
        f"Version: {meta.version}\n"
        f"Summary: {meta.summary}\n"
        f"License: {meta.license}\n"
        f"Requires-Python: {meta.requires_python}\n"
    ).encode()
    # The generator is named neutrally: the payload installs the wheel and can read this.
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\n"
        f"Generator: {disguise.STEM}\n"
        "Root-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    ).encode()
    record_name = f"{dist_info}/RECORD"
    record_lines = [f"{name},{_record_hash(data)},{len(data)}" for name, data in files.items()]
    record_lines.append(f"{record_name},,")  # RECORD cannot hash itself
    files[record_name] = ("\n".join(record_lines) + "\n").encode()

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        wheel_path = out_dir / meta.filename
        with zipfile.ZipFile(wheel_path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, data in files.items():
                info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, data)
    except OSError as exc:
        raise FixtureError(f"cannot write the canary wheel into {out_dir}: {exc}") from exc
    return wheel_path
