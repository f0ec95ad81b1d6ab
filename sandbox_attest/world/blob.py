"""The deterministic transfer blob: 18 MiB that any host can regenerate from a seed.

The origins stream it at `/blob`; the transfer probe hashes it while reading and compares with
the sha256 committed in `fixtures/blob.toml`. The bytes come from `random.Random`, seeded per
block, so a block can be produced without the ones before it and the whole blob is never held
in memory. `random` is not a CSPRNG, and that is the point: the bytes must be reproducible, not
secret (hence the S311 ignore below).

To change the seed or size, edit `fixtures/blob.toml` and run
`python -m sandbox_attest.world.blob --write` to recompute and commit the sha256; a test checks it.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox_attest.errors import FixtureError
from sandbox_attest.paths import fixtures_dir

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

BLOCK_SIZE = 1 << 20  # one generator block per MiB: block i is Random(f"{seed}:{i}")
DEFAULT_CHUNK = 64 * 1024


@dataclass(frozen=True)
class BlobSpec:
    """The blob's definition from `fixtures/blob.toml`: seed, size and expected digest."""

    seed: str
    size: int
    sha256: str


def _block(seed: str, index: int) -> bytes:
    """Block `index` of the blob (BLOCK_SIZE bytes)."""
    return random.Random(f"{seed}:{index}").randbytes(BLOCK_SIZE)  # noqa: S311  (reproducible, not secret)


def iter_blob(size: int, seed: str, chunk: int = DEFAULT_CHUNK) -> Iterator[bytes]:
    """Yield the blob's bytes in pieces of at most `chunk` bytes, generating block by block.

    Args:
        size: total bytes to produce (need not be a multiple of BLOCK_SIZE).
        seed: the seed from blob.toml.
        chunk: the largest piece yielded; the memory held is one block plus one piece.

    Raises:
        ValueError: `size` is negative or `chunk` is not positive.
    """
    if size < 0 or chunk <= 0:
        raise ValueError(f"iter_blob needs size >= 0 and chunk > 0 (got {size=}, {chunk=})")
    remaining = size
    index = 0
    while remaining > 0:
        block = memoryview(_block(seed, index))[: min(BLOCK_SIZE, remaining)]
        for start in range(0, len(block), chunk):
            yield bytes(block[start : start + chunk])
        remaining -= len(block)
        index += 1


def compute_sha256(size: int, seed: str) -> str:
    """The hex sha256 of the blob defined by `size` and `seed`."""
    digest = hashlib.sha256()
    for piece in iter_blob(size, seed, BLOCK_SIZE):
        digest.update(piece)
    return digest.hexdigest()


def load_blob_spec(path: Path | None = None) -> BlobSpec:
    """Read `fixtures/blob.toml` (or `path`).

    Raises:
        FixtureError: the file is missing or lacks `seed`, `size` or `sha256`.
    """
    path = path or fixtures_dir() / "blob.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        table = data["blob"]
        spec = BlobSpec(
            seed=str(table["seed"]), size=int(table["size"]), sha256=str(table["sha256"])
        )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise FixtureError(
            f"{path}: cannot read the blob spec ({exc!r}); it needs a [blob] table with "
            "seed, size and sha256 (regenerate sha256 with "
            "`python -m sandbox_attest.world.blob --write`)"
        ) from exc
    if not re.fullmatch(r"[0-9a-f]{64}", spec.sha256):
        raise FixtureError(f"{path}: sha256 = {spec.sha256!r} is not 64 lowercase hex digits")
    return spec


def write_blob_sha256(path: Path | None = None) -> str:
    """Recompute the sha256 for the spec's seed and size and write it back into the file.

    This is the only supported way to change the committed digest.

    Returns:
        The new hex digest.
    """
    path = path or fixtures_dir() / "blob.toml"
    spec = load_blob_spec(path)
    digest = compute_sha256(spec.size, spec.seed)
    text = path.read_text(encoding="utf-8")
    new_text, count = re.subn(
        r'(?m)^sha256\s*=\s*"[0-9a-f]*"', f'sha256 = "{digest}"', text, count=1
    )
    if count != 1:
        raise FixtureError(f'{path}: no `sha256 = "..."` line to update')
    path.write_text(new_text, encoding="utf-8")
    return digest


def main(argv: list[str] | None = None) -> int:
    """`python -m sandbox_attest.world.blob [--write]`: check (or rewrite) the blob digest."""
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_attest.world.blob", description=main.__doc__
    )
    parser.add_argument("--write", action="store_true", help="write the recomputed sha256")
    args = parser.parse_args(argv)
    if args.write:
        print(write_blob_sha256())
        return 0
    spec = load_blob_spec()
    actual = compute_sha256(spec.size, spec.seed)
    print(actual)
    return 0 if actual == spec.sha256 else 1


if __name__ == "__main__":
    sys.exit(main())
