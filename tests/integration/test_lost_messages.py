"""An operation whose message a dying node worker took with it (Redis handed it to a connection that was gone) is
sent again by the beat sweep once no node took it for two heartbeat timeouts, and runs once; one that waits in a
busy queue, or that a worker holds, is never sent twice. Real Redis, Postgres, control worker, beat and node."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator

import pytest
import redis

from gswarm_tasks import names
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for

QUEUE_KEYS = [
    "node1",
    *(f"node1:{p}" for p in names.PRIORITY_STEPS if p),
]  # kombu's lists of node1's priorities


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("lost"), nodes=("node1",)) as f:
        f.start_beat()
        yield f


def worker_of(fleet: Fleet) -> str:
    from gswarm_web.extensions import sender

    replies = sender().control.ping(timeout=2.0)
    names_ = [name for reply in replies for name in reply if name.startswith("node1@")]
    assert len(names_) == 1, replies
    return names_[0]


def consume(fleet: Fleet, on: bool) -> None:
    """Make node1's worker stop (or start again) reading its queue; it keeps heartbeating (healthy all along)."""
    from gswarm_web.extensions import sender

    control = sender().control
    call = control.add_consumer if on else control.cancel_consumer
    assert call("node1", destination=[worker_of(fleet)], reply=True, timeout=5.0)


def create_chunk(fleet: Fleet) -> tuple[str, str]:
    """A small chunk on node1: its operation's id and the chunk's."""
    raw = os.urandom(2000)
    code, body = fleet.post("/data", {"data": base64.b64encode(raw).decode(), "device": "node1:disk"})
    assert code == 202 and body["task_id"], body
    return str(body["task_id"]), str(body["chunk_id"])


def resent(fleet: Fleet, task_id: str) -> bool:
    return f"operation {task_id} (data_create) was taken by no worker" in fleet.procs["control"].log()


def sweeps(fleet: Fleet) -> int:
    """Outbox sweeps the control worker has finished (beat sends one every 10 s)."""
    return sum(
        1
        for line in fleet.procs["control"].log().splitlines()
        if f"{names.SWEEP_OUTBOX}[" in line and " succeeded " in line
    )


def test_a_message_taken_by_a_dead_connection_is_sent_again_and_runs_once(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis_url)
    consume(fleet, False)
    task_id, chunk_id = create_chunk(fleet)
    # What Redis does for a worker killed in its blocking read: the message goes to that connection, and is gone.
    popped = client.brpop(QUEUE_KEYS, timeout=10)
    assert popped is not None and json.loads(popped[1])["headers"]["id"] == task_id
    consume(fleet, True)
    assert fleet.get(f"/queue/tasks/{task_id}")[1]["status"] == "queued"
    wait_for(lambda: resent(fleet, task_id), 60, "the sweep to send the untaken operation again")
    task = fleet.wait_task(task_id, 60)
    assert task["status"] == "succeeded", task
    assert client.get(names.deliveries_key(task_id, 0)) == b"1"  # it ran once
    assert fleet.get(f"/data/{chunk_id}")[1]["status"] == "available"
    assert not client.exists(names.untaken_key(task_id))


def test_a_message_waiting_in_a_busy_queue_is_never_sent_twice(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis_url)
    consume(fleet, False)
    task_id, chunk_id = create_chunk(fleet)
    # Past the bound (two heartbeat timeouts: 10 s here) and three sweeps more, the message waits in node1's queue.
    wait_for(lambda: fleet.get(f"/queue/tasks/{task_id}")[1]["created_at"] and True, 5, "the task listed")
    first = sweeps(fleet)
    wait_for(lambda: sweeps(fleet) >= first + 3, 60, "three outbox sweeps", interval=0.5)
    assert sum(client.llen(k) for k in QUEUE_KEYS) == 1
    assert not resent(fleet, task_id) and fleet.get(f"/queue/tasks/{task_id}")[1]["status"] == "queued"
    consume(fleet, True)
    task = fleet.wait_task(task_id, 60)
    assert task["status"] == "succeeded", task
    assert (
        client.get(names.deliveries_key(task_id, 0)) == b"1" and sum(client.llen(k) for k in QUEUE_KEYS) == 0
    )
    assert fleet.get(f"/data/{chunk_id}")[1]["status"] == "available"


def test_operations_that_ran_are_never_sent_again(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis_url)
    before = fleet.procs["control"].log().count("was taken by no worker")
    ids = [create_chunk(fleet)[0] for _ in range(5)]
    for task_id in ids:
        assert fleet.wait_task(task_id, 60)["status"] == "succeeded"
    first = sweeps(fleet)
    wait_for(lambda: sweeps(fleet) >= first + 2, 40, "two outbox sweeps", interval=0.5)
    assert all(client.get(names.deliveries_key(t, 0)) == b"1" for t in ids)
    assert fleet.get(f"/queue/tasks/{ids[0]}")[1]["status"] == "succeeded"
    assert fleet.procs["control"].log().count("was taken by no worker") == before
