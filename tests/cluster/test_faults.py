"""Faults on the compose cluster, each with what must survive it, and each counted in the ledger (operations started,
finished, retried, lost: the goal is 0 lost). Runs after test_cluster.py on the same cluster."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from tests.cluster.compose import Cluster
from tests.cluster.faults import Ledger, Row
from tests.harness.procs import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.serial]

BLOB = "http://hub:8000/gswarm-test/blob/resolve/main/blob.bin"


def chain(name: str, nodes: list[str], duration_s: float = 1.0) -> dict[str, Any]:
    """A workflow of noop steps in a line, step i on nodes[i]."""
    actions = [
        {"action_id": f"s{i}", "action_type": "noop", "duration_s": duration_s, "node": node}
        | ({"dependencies": [f"s{i - 1}"]} if i else {})
        for i, node in enumerate(nodes)
    ]
    return {"name": name, "actions": actions}


def submit(cluster: Cluster, doc: dict[str, Any]) -> str:
    code, wf = cluster.post("/workflows", doc)
    assert code == 201, wf
    return str(wf["id"])


def steps_done(cluster: Cluster, wf_id: str) -> int:
    code, body = cluster.get(f"/workflows/{wf_id}")
    return sum(s["status"] == "succeeded" for s in body["steps"]) if code == 200 else 0


def count_workflow(row: Row, cluster: Cluster, wf_id: str, timeout: float = 300) -> dict[str, Any]:
    """Wait for the workflow; its steps go into the row (a step that did not succeed is lost)."""
    body = cluster.wait_workflow(wf_id, timeout)
    row.started += len(body["steps"])
    row.finished += sum(s["status"] == "succeeded" for s in body["steps"])
    row.retried += sum(max(0, (s.get("attempts") or 1) - 1) for s in body["steps"])
    row.lost += sum(s["status"] != "succeeded" for s in body["steps"])
    return body


def restart(cluster: Cluster, *services: str) -> float:
    t0 = time.monotonic()
    cluster.compose("restart", "-t", "5", *services)
    return t0


def running_with_bytes(cluster: Cluster, task_id: str) -> bool:
    t = cluster.task(task_id)
    assert t is None or t["status"] not in ("succeeded", "failed"), f"finished before the fault: {t}"
    return bool(t and t["status"] == "running" and ((t.get("progress") or {}).get("done_bytes") or 0) > 0)


def kill_and_start(cluster: Cluster, service: str) -> float:
    """Kill a node's container and start it again; return once its new worker heartbeats (the node reads healthy
    for a heartbeat timeout on the old worker's last heartbeat: that is not the new worker ready)."""
    before = cluster.node(service)["started_at"]
    cid = cluster.container(service)
    cluster.docker("kill", cid)
    t0 = time.monotonic()
    cluster.docker("start", cid)
    wait_for(
        lambda: cluster.node(service)["started_at"] != before,
        120,
        f"{service}'s new worker heartbeating",
        0.5,
    )
    cluster.wait_healthy()
    return t0


def outcome(cluster: Cluster, row: Row, task_id: str, again: Any, killed_at: float) -> None:
    """The operation cut in the middle finishes (run again: requeued by the node's new worker, resuming what is on
    disk) or fails cleanly, then `again()` retries it; recovery is from the kill to its success."""
    row.started += 1
    task = cluster.wait_task(task_id, 300)
    row.retried += max(1, (task.get("attempts") or 1) - 1)
    if task["status"] != "succeeded":
        row.retried += 1
        task = cluster.wait_task(again(), 300)
    if task["status"] == "succeeded":
        row.finished += 1
    else:
        row.lost += 1
    row.recovery_s = time.monotonic() - killed_at
    assert task["status"] == "succeeded", task


def test_node_killed_in_the_middle_of_a_model_copy(cluster: Cluster, ledger: Ledger) -> None:
    row = ledger.row("node2 killed mid model copy (destination)")
    code, body = cluster.post(
        "/models", {"model_name": "blob", "model_type": "other", "source_url": "hf://gswarm-test/blob"}
    )
    assert code == 201, body
    code, op = cluster.post("/models/blob/download", {"target_device": "node1:disk"})
    assert code == 202 and cluster.wait_task(op["task_id"], 300)["status"] == "succeeded", op
    copy = {"source_device": "node1:disk", "target_device": "node2:disk", "bandwidth_limit": 32 << 20}
    code, op = cluster.post("/models/blob/copy", copy)
    assert code == 202, op
    wait_for(lambda: running_with_bytes(cluster, op["task_id"]), 60, "the copy under way")
    killed_at = kill_and_start(cluster, "node2")
    code, model = cluster.get("/models/blob")
    half = [
        loc for loc in model["location_details"] if loc["device"] == "node2:disk" and loc["status"] == "ready"
    ]
    assert not half or cluster.task(op["task_id"])["status"] == "succeeded", (
        model
    )  # no partial copy marked ready

    def again() -> str:
        code, retry = cluster.post("/models/blob/copy", copy)
        assert code == 202, retry
        return str(retry["task_id"])

    outcome(cluster, row, op["task_id"], again, killed_at)
    assert "node2:disk" in cluster.get("/models/blob")[1]["locations"]


def files_named(cluster: Cluster, volume: str, name: str) -> dict[str, tuple[int, int]]:
    """{path: (size, bytes allocated)} of the files called `name` in a compose volume (read from a throwaway
    container, so it works while the node that owns the volume is dead)."""
    out = cluster.docker(
        "run", "--rm", "--user", "0", "-v", f"{cluster.network(volume)}:/v:ro", "--entrypoint", "find",
        "gswarm:latest", "/v", "-type", "f", "-name", name, "-printf", "%P %s %b\\n",
    )  # fmt: skip
    found = {}
    for line in out.splitlines():
        path, size, blocks = line.rsplit(" ", 2)
        found[path] = (int(size), int(blocks) * 512)
    return found


def test_node_killed_in_the_middle_of_a_chunk_transfer(cluster: Cluster, ledger: Ledger) -> None:
    row = ledger.row("node2 killed mid chunk transfer (destination)")
    code, made = cluster.post("/data", {"source": BLOB, "device": "node1:disk"})
    assert code == 202, made
    assert cluster.wait_task(made["task_id"], 300)["status"] == "succeeded"
    cid = made["chunk_id"]
    size = cluster.get(f"/data/{cid}")[1]["size"]
    node2 = cluster.container("node2")
    # node1's side held to 25 MB/s (unthrottled the pull takes about 1.5 s): the kill lands in the middle
    with cluster.throttled("node1", "200mbit"):
        code, op = cluster.post(f"/data/{cid}/transfer", {"target_device": "node2:disk"})
        assert code == 202, op
        wait_for(lambda: running_with_bytes(cluster, op["task_id"]), 60, "the transfer under way", 0.1)
        cluster.docker("kill", node2)
        killed_at = time.monotonic()
        done = cluster.task(op["task_id"])["progress"]["done_bytes"]
    on_node2 = files_named(cluster, "node2data", cid)
    row.note = f"killed at {done >> 20} of {size >> 20} MiB"
    assert 0 < done < size, (done, size)
    # the destination holds a partial file in its staging directory, never at the chunk's place
    assert on_node2 and all("staging" in p for p in on_node2), on_node2
    assert all(alloc < size for _, alloc in on_node2.values()), on_node2
    assert cluster.devices(cid) == ["node1:disk"]  # nothing recorded on node2
    before = cluster.node("node2")["started_at"]
    cluster.docker("start", node2)
    wait_for(
        lambda: cluster.node("node2")["started_at"] != before, 120, "node2's new worker heartbeating", 0.5
    )
    cluster.wait_healthy()

    def again() -> str:
        code, retry = cluster.post(f"/data/{cid}/transfer", {"target_device": "node2:disk"})
        assert code == 202, retry
        return str(retry["task_id"])

    outcome(cluster, row, op["task_id"], again, killed_at)
    assert cluster.devices(cid) == ["node1:disk", "node2:disk"]
    placed = files_named(cluster, "node2data", cid)
    assert [size] == [n for n, _ in placed.values()] and not any("staging" in p for p in placed), placed
    sums = cluster.docker(
        "run", "--rm", "--user", "0", "-v", f"{cluster.network('node1data')}:/n1:ro", "-v",
        f"{cluster.network('node2data')}:/n2:ro", "--entrypoint", "sh", "gswarm:latest", "-c",
        f"sha256sum $(find /n1 /n2 -type f -name {cid} -not -path '*staging*') | cut -d' ' -f1",
    ).split()  # fmt: skip
    assert len(sums) == 2 and sums[0] == sums[1], sums  # node2's copy is node1's bytes


def test_node_cut_off_past_the_heartbeat_timeout(cluster: Cluster, ledger: Ledger) -> None:
    row = ledger.row("node2 network disconnect 20 s, reconnected")
    name = f"outage_{int(time.time())}"
    code, body = cluster.post("/profiler/sessions", {"name": name, "freq_ms": 500})
    assert code in (200, 201), body
    wf = submit(cluster, chain("outage", ["node1", "node2", "node2", "node1", "node2"], 2.0))
    node2 = cluster.container("node2")
    wait_for(lambda: steps_done(cluster, wf) >= 1, 60, "the first step done")
    cluster.docker("network", "disconnect", cluster.network(), node2)
    cut = time.time()
    try:
        wait_for(lambda: cluster.node_status("node2") == "unhealthy", 30, "node2 unhealthy", 0.5)
        wait_for(lambda: time.time() - cut >= 20, 30, "the outage to last 20 s", 0.5)
    finally:
        cluster.docker("network", "connect", cluster.network(), node2)
    back = time.time()
    t0 = time.monotonic()
    wait_for(lambda: cluster.node_status("node2") == "healthy", 60, "node2 healthy again", 0.5)
    row.recovery_s = time.monotonic() - t0
    body = count_workflow(row, cluster, wf)
    assert body["status"] == "succeeded", [
        (s["action_id"], s["status"], s.get("error")) for s in body["steps"]
    ]
    assert cluster.node("node2")["address"] == cluster.ip(
        "node2"
    )  # a new address after the reconnect is announced

    def spilled() -> Any:  # the frames of the outage arrive once node2 has replayed its spill file
        _, doc = cluster.get(f"/profiler/sessions/{name}/export", params={"all": "true"})
        times = [f["time"] for f in doc["host_frames"] if f["node"] == "node2"]
        return times if sum(cut + 2 < t < back - 2 for t in times) >= 10 else None

    times = wait_for(spilled, 60, "node2's frames of the outage")
    assert times == sorted(times) and len(times) == len(set(times)), "frames out of order or twice"
    cluster.post(f"/profiler/sessions/{name}/stop")


def test_redis_restarted_in_the_middle_of_a_workflow(cluster: Cluster, ledger: Ledger) -> None:
    row = ledger.row("redis restarted mid workflow (AOF)")
    wf = submit(cluster, chain("redis-restart", ["node1", "node2"] * 4, 1.5))
    wait_for(lambda: steps_done(cluster, wf) >= 2, 60, "two steps done")
    restart(cluster, "redis")
    t0 = time.monotonic()
    body = count_workflow(row, cluster, wf)
    row.recovery_s = time.monotonic() - t0
    assert body["status"] == "succeeded", [
        (s["action_id"], s["status"], s.get("error")) for s in body["steps"]
    ]


def burst(cluster: Cluster, n: int, made: dict[str, bytes], row: Row) -> None:
    """n chunk creates, each retried by the client until the API accepts it (a 5xx or a refused connection)."""
    for i in range(n):
        raw = os.urandom(4096)
        while True:
            try:
                code, body = cluster.create_chunk_raw(raw, f"node{1 + i % 2}:disk")
            except Exception:
                code, body = 0, None
            if code == 202:
                made[body["chunk_id"]] = raw
                break
            row.retried += 1
            time.sleep(0.5)


def test_postgres_restarted_in_the_middle_of_a_workflow_and_of_chunk_creates(
    cluster: Cluster, ledger: Ledger
) -> None:
    row = ledger.row("postgres restarted mid workflow + 40 creates")
    wf = submit(cluster, chain("postgres-restart", ["node1", "node2"] * 4, 1.5))
    made: dict[str, bytes] = {}
    creates = threading.Thread(target=burst, args=(cluster, 40, made, row))
    creates.start()
    wait_for(lambda: len(made) >= 10 and steps_done(cluster, wf) >= 2, 60, "creates and steps under way")
    restart(cluster, "postgres")
    t0 = time.monotonic()
    creates.join(300)
    body = count_workflow(row, cluster, wf)
    assert not creates.is_alive() and len(made) == 40
    row.started += len(made)
    for cid, raw in made.items():
        try:
            wait_for(lambda cid=cid: cluster.devices(cid), 120, f"chunk {cid} recorded")
            assert cluster.content(cid) == raw
            row.finished += 1
        except AssertionError:
            row.lost += 1
    row.recovery_s = time.monotonic() - t0
    assert body["status"] == "succeeded" and row.lost == 0, (row, body["status"])


def test_control_worker_and_web_restarted(cluster: Cluster, ledger: Ledger) -> None:
    row = ledger.row("control + web restarted mid workflow")
    wf = submit(cluster, chain("control-restart", ["node1", "node2"] * 4, 1.5))
    raw = os.urandom(1 << 20)
    made = cluster.create_chunk(raw, "node1:disk")
    wait_for(lambda: steps_done(cluster, wf) >= 2, 60, "two steps done")
    restart(cluster, "control", "web")
    t0 = time.monotonic()
    body = count_workflow(row, cluster, wf)
    row.started += 1
    task = cluster.wait_task(made["task_id"])
    row.finished += task["status"] == "succeeded"
    row.lost += task["status"] != "succeeded"
    assert body["status"] == "succeeded" and task["status"] == "succeeded", (body["status"], task)
    assert cluster.content(made["chunk_id"]) == raw

    def idle() -> bool:
        code, body = cluster.get("/queue/tasks", params={"status": "running"})
        return code == 200 and body["total"] == 0

    wait_for(idle, 60, "no operation left running")
    row.recovery_s = time.monotonic() - t0
