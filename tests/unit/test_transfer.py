"""Transfer tokens, the file server's refusals, and pulls that resume and verify (real HTTP on loopback)."""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gswarm_tasks.errors import NetworkError, VerificationError
from gswarm_tasks.storage import build_manifest, hash_file, install, verified_copy
from gswarm_tasks.transfer.client import BLOCK, pull_files
from gswarm_tasks.transfer.server import FileServer
from gswarm_tasks.transfer.tokens import sign_token, verify_token

SECRET = b"s" * 32


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FileServer, Path, dict]]:
    root = tmp_path / "src"
    model = root / "models" / "m"
    (model / "sub").mkdir(parents=True)
    (model / "big.bin").write_bytes(os.urandom(2 * BLOCK + 12345))
    (model / "sub" / "small.json").write_text('{"a": 1}')
    (root / "secret.txt").write_text("not for you")
    server = FileServer("n1", {"disk": root}, lambda: SECRET, "127.0.0.1", 0).start()
    yield server, root, build_manifest(model)
    server.stop()


def get(server: FileServer, path: str, token: str | None, rng: str | None = None) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if rng:
        headers["Range"] = rng
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    return r.status, r.read()


def test_tokens_are_checked_for_signature_expiry_node_and_prefix() -> None:
    tok = sign_token(SECRET, "n1", "disk/models/m", 60)
    verify_token(SECRET, tok, "n1", "disk/models/m/big.bin")
    for secret, token, node, path, why in [
        (b"x" * 32, tok, "n1", "disk/models/m/big.bin", "signature"),
        (SECRET, tok, "n2", "disk/models/m/big.bin", "another node"),
        (SECRET, tok, "n1", "disk/models/other/big.bin", "cover"),
        (SECRET, tok, "n1", "disk/models/mx/big.bin", "cover"),
        (SECRET, sign_token(SECRET, "n1", "disk/models/m", -1), "n1", "disk/models/m/a", "expired"),
        (SECRET, tok[:-2] + "AA", "n1", "disk/models/m/big.bin", "signature"),
        (SECRET, "garbage", "n1", "disk/models/m/big.bin", "malformed"),
    ]:
        with pytest.raises(PermissionError, match=why):
            verify_token(secret, token, node, path)


def test_file_server_serves_ranges_and_refuses_the_rest(served: tuple[FileServer, Path, dict]) -> None:
    server, root, _ = served
    tok = sign_token(SECRET, "n1", "disk/models/m", 60)
    status, body = get(server, "/files/disk/models/m/big.bin", tok, "bytes=10-19")
    assert status == 206 and body == (root / "models/m/big.bin").read_bytes()[10:20]
    assert get(server, "/files/disk/models/m/big.bin", None)[0] == 403
    assert get(server, "/files/disk/secret.txt", tok)[0] == 403
    assert get(server, "/files/disk/models/m/../../secret.txt", tok)[0] == 403
    assert get(server, "/files/disk/models/m/%2e%2e/%2e%2e/secret.txt", tok)[0] == 403
    assert get(server, "/files/disk/models/m/missing.bin", tok)[0] == 404
    assert (
        get(server, "/files/dram/models/m/big.bin", sign_token(SECRET, "n1", "dram/models/m", 60))[0] == 403
    )


def test_pull_verifies_and_resumes_after_an_interruption(
    served: tuple[FileServer, Path, dict], tmp_path: Path
) -> None:
    server, root, manifest = served
    tok = sign_token(SECRET, "n1", "disk/models/m", 60)
    dest = tmp_path / "dest"
    total = manifest["total_bytes"]
    # The connection breaks once the first block is in: the pull fails with a network error.
    calls = {"n": 0}

    def die_after_first(n: int) -> None:
        calls["n"] += n
        if calls["n"] > BLOCK:
            raise ConnectionResetError("simulated: the source went away")

    with pytest.raises(NetworkError):
        pull_files(
            "127.0.0.1",
            server.port,
            tok,
            "disk/models/m",
            manifest,
            dest,
            streams=1,
            progress=die_after_first,
        )
    assert (dest / ".gswarm-transfer.json").exists()
    fetched = pull_files("127.0.0.1", server.port, tok, "disk/models/m", manifest, dest, streams=2)
    assert BLOCK <= total - fetched  # at least the first block was not fetched again
    for entry in manifest["files"]:
        assert hash_file(dest / entry["path"])["sha256"] == entry["sha256"]
    assert not (dest / ".gswarm-transfer.json").exists()


def test_pull_rejects_a_corrupted_source(served: tuple[FileServer, Path, dict], tmp_path: Path) -> None:
    server, root, manifest = served
    with open(root / "models/m/big.bin", "r+b") as f:
        f.seek(BLOCK + 7)
        f.write(b"\x00\x01")
    tok = sign_token(SECRET, "n1", "disk/models/m", 60)
    with pytest.raises(VerificationError, match="big.bin"):
        pull_files("127.0.0.1", server.port, tok, "disk/models/m", manifest, tmp_path / "d", streams=3)
    assert not (tmp_path / "d" / "big.bin").exists()


def test_bandwidth_limit_is_honoured(served: tuple[FileServer, Path, dict], tmp_path: Path) -> None:
    server, _, manifest = served
    tok = sign_token(SECRET, "n1", "disk/models/m", 60)
    t0 = time.monotonic()
    pull_files(
        "127.0.0.1",
        server.port,
        tok,
        "disk/models/m",
        manifest,
        tmp_path / "d",
        streams=4,
        bandwidth_limit=20_000_000,
    )
    assert time.monotonic() - t0 >= manifest["total_bytes"] / 20_000_000 - 0.3


def test_verified_copy_and_atomic_install(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(3_000_000))
    expected = hash_file(src)
    verified_copy(src, tmp_path / "stage" / "a.bin", expected)
    with pytest.raises(VerificationError):
        verified_copy(src, tmp_path / "x.bin", {**expected, "blake3": "0" * 64})
    final = tmp_path / "final"
    final.mkdir()
    (final / "old.txt").write_text("old")
    install(tmp_path / "stage", final, {"files": [{"path": "a.bin", **expected}]})
    assert sorted(p.name for p in final.iterdir()) == ["a.bin"]
    assert not any(p.name.startswith(".final") for p in tmp_path.iterdir())


def test_install_refuses_a_staging_that_differs_from_its_manifest(tmp_path: Path) -> None:
    """A staging directory missing a file, with one too many, one of another size or (when not hashed as it was
    written) other bytes replaces nothing."""
    stage, final = tmp_path / "stage", tmp_path / "final"
    final.mkdir()
    (final / "good.bin").write_text("the complete copy")
    files = {"a.bin": os.urandom(1000), "b.bin": os.urandom(2000)}
    stage.mkdir()
    for name, data in files.items():
        (stage / name).write_bytes(data)
    manifest = {"files": [{"path": n, **hash_file(stage / n)} for n in sorted(files)]}
    (stage / "b.bin").unlink()
    with pytest.raises(VerificationError, match="b.bin: missing"):
        install(stage, final, manifest)
    (stage / "b.bin").write_bytes(files["b.bin"][:-1])
    with pytest.raises(VerificationError, match="b.bin: size"):
        install(stage, final, manifest)
    (stage / "b.bin").write_bytes(bytes(len(files["b.bin"])))
    with pytest.raises(VerificationError, match="b.bin: blake3 mismatch"):
        install(stage, final, manifest, hashed=False)
    (stage / "b.bin").write_bytes(files["b.bin"])
    (stage / "stray.bin").write_bytes(b"x")
    with pytest.raises(VerificationError, match="stray.bin: not in the manifest"):
        install(stage, final, manifest)
    assert [p.name for p in final.iterdir()] == ["good.bin"]
    (stage / "stray.bin").unlink()
    install(stage, final, manifest, hashed=False)
    assert sorted(p.name for p in final.iterdir()) == ["a.bin", "b.bin"]
