"""A chain's next steps on the same node run in the message of the step before them (workflows/inline.py): real
control and node workers, the broker's own delivery counts as the witness of which steps went through it."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import redis

from gswarm_tasks import names
from gswarm_tasks.celery_app import make_celery
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for
from tests.integration.test_workflows import noop, run, steps, wait_done

HARD_LIMIT_S = 6  # every task's hard time limit in this fleet (GSWARM_QUEUE_TASK_TIMEOUT)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    env = {"GSWARM_QUEUE_TASK_TIMEOUT": str(HARD_LIMIT_S)}
    with running_fleet(tmp_path_factory.mktemp("inline"), extra_env=env) as f:
        yield f


def delivered(fleet: Fleet, body: dict[str, Any]) -> set[str]:
    """The steps whose message the broker delivered to a node (each delivery is counted before the step starts)."""
    client = redis.Redis.from_url(fleet.redis_url)
    return {s["action_id"] for s in body["steps"] if client.exists(names.deliveries_key(s["task_id"], 0))}


def chain_of(n: int, prefix: str, **kw: Any) -> list[dict[str, Any]]:
    return [noop(f"{prefix}{i}", *([f"{prefix}{i - 1}"] if i else []), **kw) for i in range(n)]


def test_a_chain_on_one_node_is_one_delivery_and_every_step_is_recorded(fleet: Fleet) -> None:
    actions = chain_of(30, "s")
    actions[10]["outputs"] = {"x": 7}
    actions[20]["outputs"] = {"y": "${s10.x}"}
    body = run(fleet, actions)
    assert body["status"] == "succeeded", body
    s = steps(body)
    assert all(s[f"s{i}"]["status"] == "succeeded" for i in range(30))
    assert s["s20"]["outputs"] == {"y": 7}  # an inlined step resolves an earlier inlined step's output
    ends = [s[f"s{i}"]["finished_at"] for i in range(30)]
    assert ends == sorted(ends)
    assert delivered(fleet, body) == {"s0"}


def test_the_chain_goes_through_the_broker_where_it_changes_node(fleet: Fleet) -> None:
    actions = [
        noop("a0"),
        noop("a1", "a0"),
        noop("b0", "a1", node="node2"),
        noop("b1", "b0", node="node2"),
        noop("c0", "b1"),
    ]
    body = run(fleet, actions)
    assert body["status"] == "succeeded", body
    assert delivered(fleet, body) == {"a0", "b0", "c0"}
    s = steps(body)
    ends = [s[x]["finished_at"] for x in ("a0", "a1", "b0", "b1", "c0")]
    assert ends == sorted(ends) and [s[x]["node"] for x in ("a1", "b1", "c0")] == ["node1", "node2", "node1"]


def test_a_step_with_its_own_time_limit_and_steps_past_the_budget_get_their_own_message(fleet: Fleet) -> None:
    actions = [
        noop("t0"),
        noop("t1", "t0", timeout_s=5),  # its limit is its own message's, which runs no other step under it
        noop("t2", "t1", duration_s=1.3),  # longer than one message runs its chain's steps itself
        noop("t3", "t2"),
        noop("t4", "t3"),
    ]
    body = run(fleet, actions)
    assert body["status"] == "succeeded", body
    assert delivered(fleet, body) == {"t0", "t1", "t2", "t3"}


def test_an_inlined_step_that_retries_goes_back_to_the_broker_with_the_rest_of_its_chain(
    fleet: Fleet,
) -> None:
    actions = [
        noop("r0"),
        noop("flaky", "r0", fail_times=2, retries=3, retry_backoff=0.1),
        noop("r2", "flaky"),
    ]
    body = run(fleet, actions)
    assert body["status"] == "succeeded", body
    s = steps(body)
    assert s["flaky"]["attempts"] == 3 and s["r2"]["status"] == "succeeded"
    client = redis.Redis.from_url(fleet.redis_url)
    assert not client.exists(names.deliveries_key(s["flaky"]["task_id"], 0))  # first tried inline
    assert client.exists(
        names.deliveries_key(s["flaky"]["task_id"], 2)
    )  # its retries came through the broker


def test_a_failed_inlined_step_stops_its_chain(fleet: Fleet) -> None:
    body = run(fleet, [noop("f0"), noop("bad", "f0", fail_times=5), noop("never", "bad")])
    s = steps(body)
    assert body["status"] == "failed"
    assert (s["f0"]["status"], s["bad"]["status"], s["never"]["status"]) == ("succeeded", "failed", "skipped")


def test_sigkill_of_the_worker_mid_inlined_step_runs_it_again(fleet: Fleet) -> None:
    code, body = fleet.post(
        "/workflows",
        {"name": "k", "actions": [noop("k0"), noop("victim", "k0", duration_s=3), noop("k2", "victim")]},
    )
    wf = body["id"]
    wait_for(
        lambda: steps(fleet.get(f"/workflows/{wf}")[1])["victim"]["status"] == "running", 20, "victim running"
    )
    fleet.procs["node1"].kill_group(signal.SIGKILL)
    fleet.start_node("node1")
    body = wait_done(fleet, wf, 30)
    assert body["status"] == "succeeded", body
    s = steps(body)
    started = [
        e
        for e in fleet.redis_events(wf)
        if e["event"] == "started" and e["task_id"] == s["victim"]["task_id"]
    ]
    assert len(started) == 2  # the redelivered message found k0 done and ran the victim again
    assert delivered(fleet, body) == {"k0", "k2"}  # the victim ran inline (twice); k2 came after the budget


def test_a_killed_pool_process_mid_inlined_step_is_requeued_at_once(fleet: Fleet) -> None:
    code, body = fleet.post(
        "/workflows", {"name": "p", "actions": [noop("p0"), noop("victim", "p0", duration_s=2)]}
    )
    wf = body["id"]
    wait_for(
        lambda: steps(fleet.get(f"/workflows/{wf}")[1])["victim"]["status"] == "running", 20, "victim running"
    )
    for child in psutil.Process(fleet.procs["node1"].pid).children():
        child.kill()
    body = wait_done(fleet, wf, 30)
    assert body["status"] == "succeeded", body
    assert fleet.procs["node1"].proc.poll() is None


def test_the_hard_time_limit_of_a_message_fails_the_inlined_step_it_killed(fleet: Fleet) -> None:
    t0 = time.monotonic()
    body = run(
        fleet, [noop("h0"), noop("slow", "h0", duration_s=HARD_LIMIT_S * 3), noop("h2", "slow")], timeout=60
    )
    s = steps(body)
    assert (s["h0"]["status"], s["slow"]["status"], s["h2"]["status"]) == (
        "succeeded",
        "failed",
        "skipped",
    ), body
    assert "TimeLimitExceeded" in str(s["slow"]["error"])
    assert time.monotonic() - t0 < HARD_LIMIT_S * 3  # failed by the limit, not after the step's own end


def revoked(fleet: Fleet) -> set[str]:
    """The task ids the fleet's workers hold revoked (Celery's own list, asked of every worker)."""
    answers = make_celery(fleet.settings).control.inspect(timeout=2).revoked() or {}
    return {tid for ids in answers.values() for tid in ids}


def test_cancelling_a_workflow_revokes_the_message_that_runs_its_inlined_step(fleet: Fleet) -> None:
    code, body = fleet.post(
        "/workflows",
        {"name": "c", "actions": [noop("m0"), noop("long", "m0", duration_s=30), noop("m2", "long")]},
    )
    wf = body["id"]
    wait_for(
        lambda: steps(fleet.get(f"/workflows/{wf}")[1])["long"]["status"] == "running", 20, "long running"
    )
    message = steps(fleet.get(f"/workflows/{wf}")[1])["m0"]["task_id"]  # the message that runs `long`
    t0 = time.monotonic()
    code, _ = fleet.post(f"/workflows/{wf}/cancel", {})
    assert code == 200
    wait_for(lambda: message in revoked(fleet), 20, "the message running the step revoked")
    body = wait_done(fleet, wf, 30)
    s = steps(body)
    assert (s["m0"]["status"], s["long"]["status"], s["m2"]["status"]) == (
        "succeeded",
        "cancelled",
        "cancelled",
    )
    assert time.monotonic() - t0 < 30


def test_cancelling_a_later_step_leaves_the_message_running_an_earlier_one(fleet: Fleet) -> None:
    code, body = fleet.post(
        "/workflows",
        {"name": "l", "actions": [noop("n0"), noop("mid", "n0", duration_s=2), noop("last", "mid")]},
    )
    wf = body["id"]
    wait_for(lambda: steps(fleet.get(f"/workflows/{wf}")[1])["mid"]["status"] == "running", 20, "mid running")
    s = steps(fleet.get(f"/workflows/{wf}")[1])
    code, task = fleet.post(f"/queue/tasks/{s['last']['task_id']}/cancel", {})
    assert code == 200 and task["status"] == "cancelled"
    body = wait_done(fleet, wf, 30)
    after = steps(body)
    assert (after["n0"]["status"], after["mid"]["status"], after["last"]["status"]) == (
        "succeeded",
        "succeeded",
        "cancelled",
    )
    assert s["n0"]["task_id"] not in revoked(fleet)
