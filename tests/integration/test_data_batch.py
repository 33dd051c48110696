"""Small chunks on real workers: `POST /data/batch` (every id in one answer, one operation per device for inline
bytes, stored once, all or nothing, limits named), bytes above data.inline_max_bytes waiting in Redis instead of
the message, and what the fleet no longer stores (Celery results of steps and operations)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from gswarm_tasks import names
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for

INLINE_MAX = 1024
BATCH_MAX = 20
MAX_INLINE = 64 * 1024


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    env = {
        "GSWARM_DATA_INLINE_MAX_BYTES": str(INLINE_MAX),
        "GSWARM_DATA_BATCH_MAX_COUNT": str(BATCH_MAX),
        "GSWARM_DATA_MAX_INLINE": str(MAX_INLINE),
    }
    with running_fleet(tmp_path_factory.mktemp("batch"), nodes=("node1",), extra_env=env) as f:
        yield f


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def item(raw: bytes, device: str = "node1:dram", **kw: Any) -> dict[str, Any]:
    return {"data": b64(raw), "device": device, **kw}


def counts(fleet: Fleet) -> tuple[int, int]:
    from gswarm_web.extensions import db
    from gswarm_web.tables import DataChunk, TaskRecord

    db.session.remove()
    return (
        int(db.session.scalar(db.select(db.func.count()).select_from(DataChunk)) or 0),
        int(db.session.scalar(db.select(db.func.count()).select_from(TaskRecord)) or 0),
    )


def available(fleet: Fleet, chunk_id: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> Any:
        code, c = fleet.get(f"/data/{chunk_id}")
        if code == 200 and c["status"] == "failed":
            raise AssertionError(c)
        return c if code == 200 and c["status"] == "available" else None

    return wait_for(done, timeout, f"chunk {chunk_id} to be available")


def message_of(task_id: str) -> dict[str, Any]:
    from gswarm_web.extensions import db
    from gswarm_web.tables import TaskRecord

    db.session.remove()
    rec = db.session.get(TaskRecord, task_id)
    assert rec is not None
    return dict(rec.message or {})


def test_a_batch_answers_every_id_in_order_and_stores_every_chunk(fleet: Fleet) -> None:
    raws = [os.urandom(100 + i) for i in range(12)]
    body = {
        "chunks": [
            item(r, type="intermediate", format=f"f{i}", metadata={"i": i}) for i, r in enumerate(raws)
        ]
    }
    code, resp = fleet.post("/data/batch", body)
    assert code == 202, resp
    out = resp["chunks"]
    assert len(out) == len(raws) and len({o["chunk_id"] for o in out}) == len(raws)
    assert all(o["deduplicated"] is False and o["device"] == "node1:dram" for o in out)
    # small inline chunks bound for one device go as one operation
    assert len({o["task_id"] for o in out}) == 1
    task = fleet.wait_task(out[0]["task_id"])
    assert task["status"] == "succeeded", task
    for i, (o, raw) in enumerate(zip(out, raws, strict=True)):
        c = available(fleet, o["chunk_id"])
        assert c["size"] == len(raw) and c["chunk_type"] == "intermediate" and c["format"] == f"f{i}"
        assert c["metadata"]["i"] == i and c["metadata"]["checksum"] == hashlib.sha256(raw).hexdigest()
        assert [loc["device"] for loc in c["locations"]] == ["node1:dram"]
        assert (fleet.dram("node1") / "data" / o["chunk_id"]).read_bytes() == raw
        r = fleet.client.get(f"/api/v1/data/{o['chunk_id']}/content", headers=fleet.auth())
        assert r.status_code == 200 and r.data == raw


def test_equal_bytes_are_stored_once_within_a_batch_and_across(fleet: Fleet) -> None:
    """Every item is a chunk of its own; equal bytes on one device share one file (within a batch and across)."""
    raw, other = os.urandom(300), os.urandom(300)
    code, first = fleet.post("/data/batch", {"chunks": [item(raw), item(raw), item(other)]})
    assert code == 202, first
    a, b, c = first["chunks"]
    assert len({a["chunk_id"], b["chunk_id"], c["chunk_id"]}) == 3
    assert b["deduplicated"] and not a["deduplicated"] and not c["deduplicated"]
    for x in (a, b, c):
        available(fleet, x["chunk_id"])
    path = fleet.dram("node1") / "data"
    assert (path / a["chunk_id"]).stat().st_ino == (path / b["chunk_id"]).stat().st_ino
    code, again = fleet.post("/data/batch", {"chunks": [item(other), item(raw)]})
    assert code == 202, again
    assert all(
        x["deduplicated"] and x["chunk_id"] not in (a["chunk_id"], c["chunk_id"]) for x in again["chunks"]
    )
    for x, want in zip(again["chunks"], (other, raw), strict=True):
        available(fleet, x["chunk_id"])
        assert (path / x["chunk_id"]).read_bytes() == want
    assert (path / again["chunks"][1]["chunk_id"]).stat().st_nlink == 3  # three chunks, one file
    # the same bytes on another device are another file
    code, disk = fleet.post("/data/batch", {"chunks": [item(raw, "node1:disk")]})
    assert code == 202 and not disk["chunks"][0]["deduplicated"]
    available(fleet, disk["chunks"][0]["chunk_id"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"chunks": []}, "chunks"),
        ({"chunks": [item(b"x")] * (BATCH_MAX + 1)}, "chunks"),
        ({"chunks": [item(os.urandom(MAX_INLINE // 2)), item(os.urandom(MAX_INLINE // 2 + 1))]}, "chunks"),
        ({"chunks": [item(b"ok"), {"data": "not base64!", "device": "node1:dram"}]}, "chunks[1].data"),
        ({"chunks": [item(b"ok"), {"device": "node1:dram"}]}, "chunks[1].data"),
        ({"chunks": [item(b"ok"), item(b"gpu", "node1:gpu0")]}, "chunks[1].device"),
        ({"chunks": [item(b"ok"), item(b"who", "node9:dram")]}, "chunks[1].device"),
        (
            {"chunks": [item(b"ok"), {"source": "file:///etc/passwd", "device": "node1:dram"}]},
            "chunks[1].source",
        ),
    ],
)
def test_a_refused_batch_names_the_field_and_creates_nothing(fleet: Fleet, body: dict, field: str) -> None:
    before = counts(fleet)
    code, resp = fleet.post("/data/batch", body)
    assert 400 <= code < 500, resp
    assert field in (resp["error"]["details"].get("field") or "") or field in resp["error"]["message"], resp
    assert counts(fleet) == before


def test_bytes_above_the_inline_size_wait_in_redis_not_in_the_message(fleet: Fleet) -> None:
    small, large = os.urandom(INLINE_MAX), os.urandom(INLINE_MAX + 1)
    code, s = fleet.post("/data", item(small))
    assert code == 202, s
    assert message_of(s["task_id"])["kwargs"]["data_b64"] == b64(small)  # travels in the message
    code, big = fleet.post("/data", item(large))
    assert code == 202, big
    kwargs = message_of(big["task_id"])["kwargs"]
    assert "data_b64" not in kwargs and kwargs["data_key"] == names.chunk_bytes_key(big["chunk_id"])
    for cid, raw in ((s["chunk_id"], small), (big["chunk_id"], large)):
        c = available(fleet, cid)
        assert c["size"] == len(raw)
        assert (fleet.dram("node1") / "data" / cid).read_bytes() == raw
    client = redis.Redis.from_url(fleet.redis_url)
    assert client.exists(names.chunk_bytes_key(big["chunk_id"])) == 0  # stored: the staged bytes are gone
    # in a batch, the small ones go together and the large one on its own
    code, resp = fleet.post(
        "/data/batch", {"chunks": [item(os.urandom(10)), item(os.urandom(4000)), item(b"z")]}
    )
    assert code == 202, resp
    a, b, c = resp["chunks"]
    assert a["task_id"] == c["task_id"] != b["task_id"]
    assert "data_key" in message_of(b["task_id"])["kwargs"]
    for x in resp["chunks"]:
        available(fleet, x["chunk_id"])


def test_a_batch_that_cannot_be_written_fails_every_chunk_and_records_no_copy(fleet: Fleet) -> None:
    data_dir = fleet.dram("node1") / "data"
    saved = fleet.dram("node1") / "data.saved"
    data_dir.rename(saved)
    data_dir.write_bytes(b"not a directory")  # the node cannot write into its dram tier
    try:
        code, resp = fleet.post("/data/batch", {"chunks": [item(os.urandom(50)), item(os.urandom(60))]})
        assert code == 202, resp
        task = fleet.wait_task(resp["chunks"][0]["task_id"])
        assert task["status"] == "failed", task
        for o in resp["chunks"]:
            code, c = fleet.get(f"/data/{o['chunk_id']}")
            assert code == 200 and c["status"] == "failed" and c["locations"] == [], c
    finally:
        data_dir.unlink()
        saved.rename(data_dir)


def test_steps_and_operations_leave_no_celery_results(fleet: Fleet) -> None:
    code, wf = fleet.post(
        "/workflows",
        {
            "name": "r",
            "actions": [
                {"action_id": "a", "action_type": "noop", "node": "node1"},
                {"action_id": "b", "action_type": "noop", "node": "node1", "dependencies": ["a"]},
            ],
        },
    )
    assert code == 201, wf

    def done() -> Any:
        code, body = fleet.get(f"/workflows/{wf['id']}")
        return body if body["status"] != "running" else None

    body = wait_for(done, 60, "the workflow")
    assert body["status"] == "succeeded", body
    code, op = fleet.post("/data", item(os.urandom(20)))
    assert fleet.wait_task(op["task_id"])["status"] == "succeeded"
    client = redis.Redis.from_url(fleet.redis_url)
    ids = [s["task_id"] for s in body["steps"]] + [op["task_id"]]
    assert [client.exists(f"celery-task-meta-{i}") for i in ids] == [0] * len(ids)


def test_many_single_posts_are_recorded_by_the_intake_in_batches(fleet: Fleet) -> None:
    raws = [os.urandom(64) for _ in range(60)]
    ids = []
    for raw in raws:
        code, resp = fleet.post("/data", item(raw, "node1:disk"))
        assert code == 202, resp
        ids.append(resp["chunk_id"])
    for cid, raw in zip(ids, raws, strict=True):
        c = available(fleet, cid)
        assert c["metadata"]["checksum"] == hashlib.sha256(raw).hexdigest()
        assert (fleet.storage("node1") / "data" / cid).read_bytes() == raw


def test_a_batch_above_the_inline_size_waits_in_redis_under_one_key(fleet: Fleet) -> None:
    raws = [os.urandom(400) for _ in range(8)]  # 3,200 bytes together, above data.inline_max_bytes (1,024)
    code, resp = fleet.post("/data/batch", {"chunks": [item(r) for r in raws]})
    assert code == 202, resp
    out = resp["chunks"]
    assert len({o["task_id"] for o in out}) == 1  # still one operation
    kwargs = message_of(out[0]["task_id"])["kwargs"]
    key = names.chunk_batch_key(out[0]["chunk_id"])
    assert (
        "chunks" not in kwargs and kwargs["chunks_key"] == key
    )  # neither the message nor the row holds bytes
    for o, raw in zip(out, raws, strict=True):
        c = available(fleet, o["chunk_id"])
        assert c["size"] == len(raw) and c["metadata"]["checksum"] == hashlib.sha256(raw).hexdigest()
        assert (fleet.dram("node1") / "data" / o["chunk_id"]).read_bytes() == raw
    assert redis.Redis.from_url(fleet.redis_url).exists(key) == 0  # stored: the staged batch is gone
    # within the size, a batch still travels in its message
    code, small = fleet.post("/data/batch", {"chunks": [item(os.urandom(100)), item(os.urandom(100))]})
    assert code == 202, small
    assert [c["chunk_id"] for c in message_of(small["chunks"][0]["task_id"])["kwargs"]["chunks"]] == [
        c["chunk_id"] for c in small["chunks"]
    ]
