"""The deterministic blob: the committed digest, streaming and regeneration."""

from __future__ import annotations

import hashlib
import shutil
from typing import TYPE_CHECKING

import pytest

from sandbox_attest.errors import FixtureError
from sandbox_attest.paths import fixtures_dir
from sandbox_attest.world.blob import (
    BLOCK_SIZE,
    compute_sha256,
    iter_blob,
    load_blob_spec,
    write_blob_sha256,
)

if TYPE_CHECKING:
    from pathlib import Path


class TestSpec:
    def test_size_is_18_mib(self) -> None:
        """blob.toml defines exactly 18 MiB."""
        assert load_blob_spec().size == 18_874_368

    def test_generator_reproduces_committed_sha256(self) -> None:
        """Streaming the blob from its seed gives the sha256 committed in blob.toml."""
        spec = load_blob_spec()
        digest = hashlib.sha256()
        total = 0
        for piece in iter_blob(spec.size, spec.seed):
            digest.update(piece)
            total += len(piece)
        assert total == spec.size
        assert digest.hexdigest() == spec.sha256

    def test_write_updates_digest_after_seed_change(self, tmp_path: Path) -> None:
        """The documented regenerator rewrites sha256 to match a changed seed."""
        path = tmp_path / "blob.toml"
        shutil.copy(fixtures_dir() / "blob.toml", path)
        path.write_text(
            path.read_text()
            .replace("size = 18874368", "size = 3000000")
            .replace('seed = "', 'seed = "other-')
        )
        new = write_blob_sha256(path)
        spec = load_blob_spec(path)
        assert spec.sha256 == new == compute_sha256(3_000_000, spec.seed)
        assert new != load_blob_spec().sha256

    def test_malformed_spec_names_the_fix(self, tmp_path: Path) -> None:
        """A spec without sha256 raises FixtureError naming the regeneration command."""
        path = tmp_path / "blob.toml"
        path.write_text('[blob]\nseed = "x"\nsize = 1\n')
        with pytest.raises(FixtureError, match=r"python -m sandbox_attest\.world\.blob --write"):
            load_blob_spec(path)


class TestIterBlob:
    @pytest.mark.parametrize("chunk", [1000, 65536, BLOCK_SIZE, 3 * BLOCK_SIZE])
    def test_chunking_does_not_change_bytes(self, chunk: int) -> None:
        """Any chunk size yields the same bytes, in pieces no larger than the chunk."""
        size = 2 * BLOCK_SIZE + 12345
        pieces = list(iter_blob(size, "s", chunk))
        assert max(len(p) for p in pieces) <= chunk
        assert b"".join(pieces) == b"".join(iter_blob(size, "s", 4096))
        assert sum(map(len, pieces)) == size

    def test_prefix_is_stable(self) -> None:
        """A shorter blob is a prefix of a longer one with the same seed."""
        short = b"".join(iter_blob(BLOCK_SIZE + 7, "s"))
        long = b"".join(iter_blob(2 * BLOCK_SIZE, "s"))
        assert long.startswith(short)

    def test_seed_changes_bytes(self) -> None:
        """Different seeds give different bytes."""
        assert b"".join(iter_blob(64, "a")) != b"".join(iter_blob(64, "b"))

    def test_rejects_bad_arguments(self) -> None:
        """A non-positive chunk is refused."""
        with pytest.raises(ValueError, match="chunk"):
            list(iter_blob(10, "s", 0))
