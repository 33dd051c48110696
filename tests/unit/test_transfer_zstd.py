"""zstd on the node-to-node stream: a real file server compresses ranges for a client that asks, the client
decompresses as it receives, verifies each block's blake3 on the identity bytes and resumes as without it."""

from __future__ import annotations

import http.client
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from gswarm_tasks.errors import NetworkError, VerificationError
from gswarm_tasks.storage import build_manifest, hash_file
from gswarm_tasks.transfer.client import BLOCK, pull_files
from gswarm_tasks.transfer.server import FileServer, wants_zstd
from gswarm_tasks.transfer.tokens import sign_token

SECRET = b"z" * 32


def compressible(n: int) -> bytes:
    """Bytes that shrink a lot: tensor-like runs of zeros with a little structure."""
    row = (b"\x00" * 900) + bytes(range(100)) + b"weights!" * 3
    return (row * (n // len(row) + 1))[:n]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FileServer, Path, dict]]:
    root = tmp_path / "src"
    model = root / "models" / "m"
    model.mkdir(parents=True)
    (model / "dense.bin").write_bytes(compressible(2 * BLOCK + 4321))
    (model / "noise.bin").write_bytes(os.urandom(BLOCK + 99))
    (model / "config.json").write_text('{"hidden_size": 8}')
    server = FileServer("n1", {"disk": root}, lambda: SECRET, "127.0.0.1", 0).start()
    yield server, root, build_manifest(model)
    server.stop()


def token() -> str:
    return sign_token(SECRET, "n1", "disk/models/m", 60)


def test_accept_encoding_is_read_as_http_says() -> None:
    assert wants_zstd("zstd") and wants_zstd("gzip, zstd;q=0.5") and wants_zstd("ZSTD")
    assert not wants_zstd(None) and not wants_zstd("gzip, br") and not wants_zstd("zstd;q=0")


def test_a_range_comes_compressed_and_the_connection_serves_the_next(
    served: tuple[FileServer, Path, dict],
) -> None:
    server, root, _ = served
    data = (root / "models/m/dense.bin").read_bytes()
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for a, b in ((0, BLOCK - 1), (BLOCK, 2 * BLOCK - 1), (10, 20)):
        headers = {"Authorization": f"Bearer {token()}", "Range": f"bytes={a}-{b}", "Accept-Encoding": "zstd"}
        c.request("GET", "/files/disk/models/m/dense.bin", headers=headers)
        r = c.getresponse()
        body = r.read()
        assert r.status == 206 and r.getheader("Content-Encoding") == "zstd"
        assert r.getheader("Content-Range") == f"bytes {a}-{b}/{len(data)}"
        assert zstandard.ZstdDecompressor().decompress(body) == data[a : b + 1]
        if b - a > 1000:
            assert len(body) < (b - a) // 20
    c.request("GET", "/files/disk/models/m/dense.bin", headers={"Authorization": f"Bearer {token()}",
                                                              "Range": "bytes=0-99"})  # fmt: skip
    r = c.getresponse()
    assert r.getheader("Content-Encoding") is None and r.read() == data[:100]  # asked for nothing: identity


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_pull_with_and_without_zstd_is_byte_identical(
    served: tuple[FileServer, Path, dict], tmp_path: Path, compression: str
) -> None:
    server, _, manifest = served
    stats: dict[str, int] = {}
    dest = tmp_path / "dest"
    fetched = pull_files(
        "127.0.0.1", server.port, token(), "disk/models/m", manifest, dest, streams=3, compression=compression,
        stats=stats,
    )  # fmt: skip
    total = manifest["total_bytes"]
    assert fetched == total
    for entry in manifest["files"]:
        assert hash_file(dest / entry["path"])["sha256"] == entry["sha256"]
    dense = next(e["size"] for e in manifest["files"] if e["path"] == "dense.bin")
    if compression == "zstd":  # the dense file shrinks, the noise crosses at about its size
        assert stats["wire_bytes"] < total - dense * 0.9
    else:
        assert stats["wire_bytes"] == total


def test_a_zstd_pull_resumes_after_an_interruption(
    served: tuple[FileServer, Path, dict], tmp_path: Path
) -> None:
    server, _, manifest = served
    dest = tmp_path / "dest"
    seen = {"n": 0}

    def die_after_first(n: int) -> None:
        seen["n"] += n
        if seen["n"] > BLOCK + 1000:  # config.json and the first block of dense.bin are in
            raise ConnectionResetError("simulated: the source went away")

    with pytest.raises(NetworkError):
        pull_files("127.0.0.1", server.port, token(), "disk/models/m", manifest, dest, streams=1,
                   progress=die_after_first, compression="zstd")  # fmt: skip
    assert (dest / ".gswarm-transfer.json").exists()
    fetched = pull_files(
        "127.0.0.1", server.port, token(), "disk/models/m", manifest, dest, compression="zstd"
    )
    assert BLOCK <= manifest["total_bytes"] - fetched  # the first block was kept
    for entry in manifest["files"]:
        assert hash_file(dest / entry["path"])["sha256"] == entry["sha256"]


def test_a_corrupted_source_fails_verification_through_zstd(
    served: tuple[FileServer, Path, dict], tmp_path: Path
) -> None:
    server, root, manifest = served
    with open(root / "models/m/dense.bin", "r+b") as f:
        f.seek(BLOCK + 7)
        f.write(b"\xff\xfe")
    with pytest.raises(VerificationError, match="dense.bin"):
        pull_files(
            "127.0.0.1", server.port, token(), "disk/models/m", manifest, tmp_path / "d", compression="zstd"
        )
    assert not (tmp_path / "d" / "dense.bin").exists()
