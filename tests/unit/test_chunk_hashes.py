"""A small chunk given inline is hashed from memory: the same size, sha256, blake3 and block hashes as its file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gswarm_tasks.storage import HASH_BLOCK, hash_bytes, hash_file


@pytest.mark.parametrize("size", [0, 1, 4096, HASH_BLOCK, HASH_BLOCK + 5])
def test_bytes_hash_as_their_file_does(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert hash_bytes(data) == hash_file(tmp_path / "f", blocks=True)
