from __future__ import annotations

from pathlib import Path

import pytest

from gswarm_tasks.errors import InvalidRequest
from gswarm_tasks.models.sources import parse_source


@pytest.mark.parametrize(
    ("url", "repo", "rev"),
    [
        ("hf://sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", None),
        ("hf://meta-llama/Llama-3.1-8B-Instruct@main", "meta-llama/Llama-3.1-8B-Instruct", "main"),
        ("https://huggingface.co/meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-chat-hf", None),
        ("https://huggingface.co/org/repo/tree/v1.0", "org/repo", "v1.0"),
    ],
)
def test_hf_sources(url: str, repo: str, rev: str | None) -> None:
    s = parse_source(url, [])
    assert (s.scheme, s.repo_id, s.revision) == ("hf", repo, rev)


def test_file_sources_only_under_allowed_roots(tmp_path: Path) -> None:
    inside = tmp_path / "models" / "m"
    inside.mkdir(parents=True)
    assert parse_source(f"file://{inside}", [str(tmp_path / "models")]).path == str(inside)
    for bad in (f"file://{tmp_path}", f"file://{inside}/../../..", "file://otherhost/x"):
        with pytest.raises(InvalidRequest, match="source_url"):
            parse_source(bad, [str(tmp_path / "models")])


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/x",
        "http://huggingface.co/a/b",
        "https://example.com/a/b",
        "hf://noslash",
        "hf://../etc",
        "hf://a/b@..",
        "ftp://x/y",
        "",
        "https://huggingface.co/onlyorg",
    ],
)
def test_other_sources_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_source(url, ["/"])
