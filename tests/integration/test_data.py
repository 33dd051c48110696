"""The data pool's first part on real workers: create from base64 and from a file, dedup, refusals, delete."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator

import pytest

from tests.integration.fleet import Fleet
from tests.integration.procs import wait_for


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("data")
    (tmp / "allowed").mkdir()
    f = Fleet(tmp, redis_db=9, extra_env={"GSWARM_MODELS_ALLOWED_ROOTS": str(tmp / "allowed")})
    try:
        f.start("control", "control", app_module="gswarm_web.celery_app")
        f.start_node("node1")
        yield f
    finally:
        f.close()


def created(fleet: Fleet, body: dict) -> dict:
    code, resp = fleet.post("/data", body)
    assert code in (200, 202), resp
    if resp.get("task_id"):
        task = fleet.wait_task(resp["task_id"])
        assert task["status"] == "succeeded", task
    return fleet.get(f"/data/{resp['chunk_id']}")[1] | {"deduplicated": resp["deduplicated"]}


def test_base64_chunk_lands_on_the_tier_and_equal_content_is_stored_once(fleet: Fleet) -> None:
    raw = os.urandom(100_000)
    body = {"data": base64.b64encode(raw).decode(), "device": "node1:dram", "type": "input", "format": "bytes"}
    chunk = created(fleet, body)
    assert chunk["status"] == "available" and chunk["size"] == len(raw)
    assert chunk["metadata"]["checksum"] == hashlib.sha256(raw).hexdigest()
    assert [loc["device"] for loc in chunk["locations"]] == ["node1:dram"]
    stored = fleet.dram("node1") / "data" / chunk["chunk_id"]
    assert stored.read_bytes() == raw
    again = created(fleet, body)
    assert again["deduplicated"] is True and again["chunk_id"] == chunk["chunk_id"]
    other_tier = created(fleet, {**body, "device": "node1:disk"})
    assert other_tier["chunk_id"] != chunk["chunk_id"]  # dedup is per device
    listed = fleet.get("/data?device=node1:dram")[1]
    assert [c["chunk_id"] for c in listed["chunks"]] == [chunk["chunk_id"]]


def test_chunk_from_a_file_and_delete(fleet: Fleet) -> None:
    src = fleet.tmp / "allowed" / "input.jsonl"
    src.write_text('{"text": "hello"}\n')
    chunk = created(fleet, {"source": f"file://{src}", "device": "node1:disk"})
    stored = fleet.storage("node1") / "data" / chunk["chunk_id"]
    assert stored.read_text() == src.read_text()
    code, resp = fleet.api("DELETE", f"/data/{chunk['chunk_id']}")
    assert code == 202
    for tid in resp["tasks"]:
        fleet.wait_task(tid)
    wait_for(lambda: fleet.get(f"/data/{chunk['chunk_id']}")[0] == 404, 10, "the chunk to be gone")
    assert not stored.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source": "s3://bucket/x", "device": "node1:dram"}, "source"),
        ({"source": "file:///etc/passwd", "device": "node1:dram"}, "source"),
        ({"data": "not base64!", "device": "node1:dram"}, "data"),
        ({"data": "aGk=", "device": "node1:gpu0"}, "device"),
        ({"data": "aGk=", "device": "node1/../x:dram"}, "device"),
        ({"data": "aGk=", "source": "file:///x", "device": "node1:dram"}, "data"),
        ({"data": "A" * (23 * 1024 * 1024), "device": "node1:dram"}, "data"),  # 17.25 MiB once decoded
    ],
)
def test_bad_chunks_are_refused_and_nothing_is_written(fleet: Fleet, body: dict, field: str) -> None:
    def snapshot() -> tuple[set[str], int]:
        files = {
            str(p)
            for root in (fleet.storage("node1"), fleet.dram("node1"))
            for p in root.rglob("*")
            if "data" in p.parts
        }
        return files, fleet.get("/data")[1]["total"]

    before = snapshot()
    code, resp = fleet.post("/data", body)
    assert code == 422, resp
    assert resp["error"]["message"].startswith(field), resp
    assert snapshot() == before


def test_unknown_chunk_is_404(fleet: Fleet) -> None:
    assert fleet.get("/data/nope")[0] == 404
