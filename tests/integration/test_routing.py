"""Node queues: a task for node1 runs only on node1; a task that kills its worker ends failed."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from celery import Celery

from gswarm_tasks import names
from gswarm_tasks.celery_app import send_to_node
from gswarm_tasks.errors import InvalidRequest
from tests.harness.procs import wait_for


def test_task_sent_to_node1_never_runs_on_node2(sender: Celery, start_worker: Any) -> None:
    start_worker("gswarm_tasks", "node1", "node1")
    start_worker("gswarm_tasks", "node2", "node2")
    results = [send_to_node(sender, "node1", names.NODE_PING) for _ in range(20)]
    answers = [r.get(timeout=30) for r in results]
    assert {a["node"] for a in answers} == {"node1"}
    # And the other way round, so both workers are shown to be consuming.
    assert send_to_node(sender, "node2", names.NODE_PING).get(timeout=30)["node"] == "node2"


def test_node_task_without_a_node_is_refused() -> None:
    from gswarm_tasks.node.worker import ping

    with pytest.raises(InvalidRequest):
        ping.delay()


def test_poison_task_ends_failed_after_the_redelivery_cap(
    sender: Celery, start_worker: Any, redis_url: str
) -> None:
    worker = start_worker("gswarm_tasks", "nodep", "nodep", extra=["-I", "tests.harness.poison_tasks"])
    key = f"poison:{uuid.uuid4().hex}"
    result = send_to_node(sender, "nodep", "gswarm.test.poison", args=[key])
    wait_for(lambda: result.state == "FAILURE", 60, "the poison task to end FAILURE")
    attempts = int(redis.Redis.from_url(redis_url).get(key) or 0)
    assert attempts == 1 + 2  # the first run and GSWARM_QUEUE_RETRY_COUNT=2 redeliveries, then no more
    assert "WorkerLostError" in repr(result.result) or "Worker exited" in str(result.result)
    # The worker itself survived its pool processes dying and still serves the queue.
    assert worker.proc is not None and worker.proc.poll() is None
    assert send_to_node(sender, "nodep", names.NODE_PING).get(timeout=30)["node"] == "nodep"


def test_priorities_are_served_in_order(sender: Celery, start_worker: Any) -> None:
    # Queue everything before any worker consumes, then let one single-process worker drain the queue.
    order = ["low", "normal", "high", "critical", "low", "critical", "normal", "high"]
    results = [(p, send_to_node(sender, "nodeq", names.NODE_PING, priority=p)) for p in order]
    start_worker("gswarm_tasks", "nodeq", "nodeq", concurrency=1)
    ran = sorted(((r.get(timeout=30)["time"], p) for p, r in results))
    served = [p for _, p in ran]
    rank = {"critical": 0, "high": 1, "normal": 2, "low": 3}
    assert served == sorted(order, key=rank.__getitem__), served
