"""Chunk sources are checked before anything is written: schemes, hosts, roots; merges and inference bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gswarm_tasks.data.compute import _texts, merge_chunks
from gswarm_tasks.data.sources import parse_data_source
from gswarm_tasks.errors import InvalidRequest
from gswarm_tasks.settings import Settings


def settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(home=str(tmp_path), allowed_roots=(str(tmp_path / "in"),), **kw)  # type: ignore[arg-type]


def test_http_only_to_allowed_hosts(tmp_path: Path) -> None:
    s = settings(tmp_path, data_allowed_hosts=("data.internal", "127.0.0.1:8000"))
    assert parse_data_source("https://data.internal/a.bin", s).scheme == "https"
    assert (
        parse_data_source("http://data.internal:9999/a.bin", s).scheme == "http"
    )  # a bare host allows any port
    assert parse_data_source("http://127.0.0.1:8000/x", s).scheme == "http"
    for url in ("http://127.0.0.1:8001/x", "http://evil.example/x", "http://data.internal.evil.example/x"):
        with pytest.raises(InvalidRequest, match=r"^source: host .* not in data.allowed_hosts"):
            parse_data_source(url, s)


def test_file_sources_stay_under_the_roots(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "ok.txt").write_text("x")
    (tmp_path / "in" / "escape").symlink_to("/etc")
    s = settings(tmp_path)
    assert parse_data_source(f"file://{tmp_path}/in/ok.txt", s).path == str(tmp_path / "in" / "ok.txt")
    for url in (
        f"file://{tmp_path}/in/../secret",
        "file:///etc/passwd",
        f"file://{tmp_path}/in/escape/passwd",
    ):
        with pytest.raises(InvalidRequest, match="^source: .* not under an allowed root"):
            parse_data_source(url, s)


def test_other_schemes_and_s3_unless_enabled_are_refused(tmp_path: Path) -> None:
    s = settings(tmp_path)
    with pytest.raises(InvalidRequest, match="^source: s3:// sources are not enabled"):
        parse_data_source("s3://bucket/key", s)
    for url in ("ftp://host/x", "gopher://x", "/etc/passwd", ""):
        with pytest.raises(InvalidRequest, match="^source: "):
            parse_data_source(url, s)


def test_merge_makes_a_json_array_or_joins_bytes() -> None:
    parts = [(b'{"a": 1}', "json"), (b"[2, 3]", "json")]
    data, fmt = merge_chunks(parts, None)
    assert fmt == "json" and json.loads(data) == [{"a": 1}, [2, 3]]
    data, fmt = merge_chunks([(b"ab", None), (b"cd", "json")], None)
    assert (data, fmt) == (b"abcd", "concat")
    with pytest.raises(InvalidRequest, match="^format: "):
        merge_chunks([(b"not json", None)], "json")


def test_inference_sends_lines_or_a_json_request() -> None:
    assert _texts(b"one\n\ntwo\n", "c") == ["one", "two"]
    assert _texts(b'{"input": ["x"]}', "c") == {"input": ["x"]}
    assert _texts(b'["x", "y"]', "c") == ["x", "y"]
    with pytest.raises(InvalidRequest):
        _texts(b"\xff\xfe", "c")


def test_range_headers_the_file_server_accepts() -> None:
    from gswarm_tasks.transfer.server import parse_range

    assert parse_range("bytes=0-9", 100) == (0, 9)
    assert parse_range("bytes=90-", 100) == (90, 99)
    assert parse_range("bytes=-10", 100) == (90, 99)
    assert parse_range("bytes=95-200", 100) == (95, 99)
    for bad in ("bytes=abc", "bytes=0-1,5-6", "items=0-1", "bytes=-", "bytes=9-3", "bytes=1-x"):
        with pytest.raises(ValueError):
            parse_range(bad, 100)
