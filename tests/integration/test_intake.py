"""The one intake of node reports, on a real control worker, Postgres and Redis: reports of an operation applied in
order and once, whatever order and however often they arrive; a status never leaves a terminal one; a report that
cannot be applied is kept aside without stopping the others; and a few hundred chunks made through the API by a
real node all end `available`."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from gswarm_tasks import names
from gswarm_tasks.reporting import report
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("intake"), nodes=("node1",)) as f:
        yield f


def _queued_chunk_create(fleet: Fleet, device: str = "node1:disk") -> tuple[str, str]:
    """A chunk and its create operation as POST /data records them, without sending anything to a node."""
    from gswarm_web.extensions import db
    from gswarm_web.tables import DataChunk, TaskRecord

    chunk_id, op_id = str(uuid.uuid4()), str(uuid.uuid4())
    db.session.add(
        DataChunk(id=chunk_id, status="queued", chunk_type="input", meta={}, created_at=datetime.now(UTC))
    )
    db.session.add(
        TaskRecord(
            id=op_id,
            kind="data_create",
            state="queued",
            node=device.split(":")[0],
            target_device=device,
            params={"chunk_id": chunk_id},
            attempts=0,
            created_at=datetime.now(UTC),
        )
    )
    db.session.commit()
    return chunk_id, op_id


def _landed(chunk_id: str, device: str = "node1:disk") -> dict[str, object]:
    return {
        "chunk_id": chunk_id,
        "device": device,
        "path": f"/nowhere/{chunk_id}",
        "size": 12,
        "checksum": "0" * 64,
        "blake3": "1" * 64,
        "blocks": ["1" * 64],
    }


def test_reports_reversed_and_duplicated_apply_once_in_order(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis_url)
    chunk_id, op_id = _queued_chunk_create(fleet)
    events = [("started", {"attempt": 1}), ("phase", {"phase": "creating"}), ("succeeded", _landed(chunk_id))]
    for event, data in [
        *reversed(events),
        *events,
        events[-1],
    ]:  # reversed, then again, then the end twice more
        report(client, names.REPORT_OPERATION, op_id, event, data)
    task = fleet.wait_task(op_id, 30, states=("succeeded",))
    assert task["status"] == "succeeded" and task["result"]["device"] == "node1:disk"
    marker = str(uuid.uuid4())  # a report sent after all of them: once it is applied, so were they
    report(client, names.REPORT_OPERATION, marker, "started", {})
    wait_for(lambda: _pending(client) == 0, 30, "the intake to apply every report")
    chunk = fleet.get(f"/data/{chunk_id}")[1]
    assert chunk["status"] == "available"
    assert [loc["device"] for loc in chunk["locations"]] == ["node1:disk"]
    assert (
        fleet.get(f"/queue/tasks/{op_id}")[1]["status"] == "succeeded"
    )  # the late `started` moved nothing back


def test_a_failed_operation_stays_failed_and_a_late_phase_changes_nothing(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis_url)
    chunk_id, op_id = _queued_chunk_create(fleet)
    error = {"code": "NETWORK_ERROR", "message": "source went away", "details": {}}
    for event, data in [
        ("started", {"attempt": 1}),
        ("failed", {"error": error}),
        ("phase", {"phase": "creating"}),
    ]:
        report(client, names.REPORT_OPERATION, op_id, event, data)
    task = fleet.wait_task(op_id, 30, states=("failed",))
    wait_for(lambda: _pending(client) == 0, 30, "the intake to apply every report")
    task = fleet.get(f"/queue/tasks/{op_id}")[1]
    assert task["status"] == "failed" and task["error"]["message"] == "source went away"
    assert fleet.get(f"/data/{chunk_id}")[1]["status"] == "failed"


def test_a_report_that_cannot_be_applied_is_kept_aside_and_the_rest_go_on(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis_url)
    chunk_id, op_id = _queued_chunk_create(fleet)
    bad = _landed(chunk_id)
    bad["device"] = "not a device"  # a node bug: this result cannot be recorded
    dead_before = client.xlen(names.DEAD_REPORTS_STREAM)
    report(client, names.REPORT_OPERATION, op_id, "succeeded", bad)
    good_chunk, good_op = _queued_chunk_create(fleet)
    report(client, names.REPORT_OPERATION, good_op, "succeeded", _landed(good_chunk))
    fleet.wait_task(good_op, 30, states=("succeeded",))
    wait_for(
        lambda: client.xlen(names.DEAD_REPORTS_STREAM) > dead_before, 30, "the bad report to be kept aside"
    )
    dead = json.loads(client.xrange(names.DEAD_REPORTS_STREAM)[-1][1][b"event"])
    assert dead["id"] == op_id and dead["event"] == "succeeded"
    assert fleet.get(f"/queue/tasks/{op_id}")[1]["status"] == "queued"  # nothing of it was recorded
    assert fleet.get(f"/data/{chunk_id}")[1]["locations"] == []


def test_hundreds_of_chunks_made_through_the_api_all_end_available(fleet: Fleet) -> None:
    ids = []
    for i in range(300):
        data = base64.b64encode(f"chunk {i} {uuid.uuid4()}".encode()).decode()
        code, body = fleet.post("/data", {"data": data, "device": "node1:disk", "type": "intermediate"})
        assert code == 202, body
        ids.append((body["chunk_id"], body["task_id"]))

    def settled() -> list[str]:
        states = [fleet.get(f"/queue/tasks/{tid}")[1]["status"] for _, tid in ids]
        return states if all(s in ("succeeded", "failed") for s in states) else []

    states = wait_for(settled, 120, "300 chunk creates to end")
    assert set(states) == {"succeeded"}
    chunks = [fleet.get(f"/data/{cid}")[1] for cid, _ in ids]
    assert {c["status"] for c in chunks} == {"available"}
    assert all([loc["device"] for loc in c["locations"]] == ["node1:disk"] for c in chunks)


def _pending(client: redis.Redis) -> int:
    """Reports read by the control worker's group and not acknowledged yet, plus those not read at all."""
    groups = {g["name"].decode(): g for g in client.xinfo_groups(names.REPORTS_STREAM)}
    group = groups[names.CONTROL_GROUP]
    return int(group["pending"]) + int(group.get("lag") or 0)
