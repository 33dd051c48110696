"""`make test-cluster`: the project's docker-compose.yml, up as a user brings it up (images built by
tests/cluster/images.sh, generated secrets), checked through its published ports: nodes at their own container
addresses, Flower behind its auth, a model from the hub container copied node to node and served by two replicas
answering the official `openai` client through the gateway, a chunk carried between nodes, a profiling session of
both nodes. The modules here share one cluster (tests/cluster/conftest.py) and run in file order."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import requests

from tests.cluster.compose import API, FLOWER, MODEL_REPO, Cluster
from tests.harness.procs import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.serial]


def test_health_through_the_proxy(cluster: Cluster) -> None:
    r = requests.get(f"{API}/api/v1/health", timeout=10)
    assert r.status_code == 200, r.text
    assert requests.get(f"{API}/api/v1/nodes", timeout=10).status_code == 401  # nothing without the token
    code, body = cluster.get("/tokens/self")
    assert code == 200 and body["role"] == "admin", body


def test_nodes_advertise_their_own_container_addresses(cluster: Cluster) -> None:
    """No GSWARM_NODE_ADDRESS in compose: each node finds the address that routes to the broker, which is its own
    address on the broker network, and its peers reach its file server there."""
    n1, n2 = cluster.node("node1"), cluster.node("node2")
    assert n1["status"] == n2["status"] == "healthy", (n1, n2)
    assert n1["address"] == cluster.ip("node1") and n2["address"] == cluster.ip("node2"), (n1, n2)
    assert n1["address"] != n2["address"] and not n1["address"].startswith("127.")
    assert n1["file_port"] and n2["file_port"]


def test_flower_lists_both_workers_behind_its_auth(cluster: Cluster) -> None:
    assert requests.get(f"{FLOWER}/api/workers", timeout=10).status_code == 401

    def workers() -> Any:
        r = requests.get(f"{FLOWER}/api/workers?refresh=1", auth=cluster.flower_auth, timeout=30)
        names = set(r.json()) if r.status_code == 200 else set()
        return names if {"node1@node1", "node2@node2"} <= names else None

    names = wait_for(workers, 60, "Flower to list node1 and node2", 2.0)
    assert any(n.startswith("control@") for n in names), names


def test_model_from_the_hub_copied_verified_and_served_by_two_replicas(cluster: Cluster) -> None:
    code, body = cluster.post(
        "/models", {"model_name": "minilm", "model_type": "embedding", "source_url": f"hf://{MODEL_REPO}"}
    )
    assert code == 201, body
    doc = {
        "name": "cluster-minilm",
        "actions": [
            {"action_id": "get", "action_type": "download", "model_name": "minilm", "target_device": "node1:disk"},
            {"action_id": "copy", "action_type": "copy", "model_name": "minilm", "source_device": "node1:disk",
             "target_device": "node2:disk", "dependencies": ["get"]},
        ],
    }  # fmt: skip
    wf = cluster.run_workflow(doc)
    assert wf["status"] == "succeeded", [(s["action_id"], s.get("error")) for s in wf["steps"]]
    code, model = cluster.get("/models/minilm")
    assert sorted(model["locations"]) == ["node1:disk", "node2:disk"], model
    code, svc = cluster.post("/services", {"model_name": "minilm", "nodes": ["node1", "node2"]})
    assert code == 202, svc

    def running() -> Any:
        body = cluster.get(f"/services/{svc['id']}")[1]
        return body if body["ready_replicas"] == 2 else None

    body = wait_for(running, 240, "both replicas of minilm running", 1.0)
    assert sorted(i["node"] for i in body["instances"]) == ["node1", "node2"]
    cluster.service_id = svc["id"]


def test_the_gateway_answers_the_openai_client_from_both_replicas(cluster: Cluster) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{API}/v1", api_key=cluster.token, max_retries=0, timeout=60)
    assert "minilm" in [m.id for m in client.models.list().data]
    seen: set[str] = set()
    for i in range(20):
        raw = client.embeddings.with_raw_response.create(model="minilm", input=[f"hello {i}", "world"])
        out = raw.parse()
        assert len(out.data) == 2 and len(out.data[0].embedding) == 384
        seen.add(raw.headers["x-gswarm-replica"])
        if len(seen) == 2:
            break
    assert len(seen) == 2, seen


def test_a_chunk_made_on_node1_reads_back_identical_from_node2(cluster: Cluster) -> None:
    raw = os.urandom(3 << 20)
    made = cluster.create_chunk(raw, "node1:disk")
    assert cluster.wait_task(made["task_id"])["status"] == "succeeded"
    cid = made["chunk_id"]
    code, op = cluster.post(f"/data/{cid}/transfer", {"target_device": "node2:disk", "delete_source": True})
    assert code == 202 and op["source_device"] == "node1:disk", op
    assert cluster.wait_task(op["task_id"])["status"] == "succeeded"
    wait_for(lambda: cluster.devices(cid) == ["node2:disk"], 30, "node1's copy removed after the transfer")
    assert cluster.content(cid) == raw  # only node2 holds it: the bytes crossed the network twice


def test_a_profiling_session_records_both_nodes(cluster: Cluster) -> None:
    name = f"cluster_{int(time.time())}"
    code, body = cluster.post("/profiler/sessions", {"name": name, "freq_ms": 200})
    assert code in (200, 201), body

    def both() -> Any:
        status = cluster.get(f"/profiler/sessions/{name}")[1]
        return status if (status.get("host_frame_count") or 0) >= 10 else None

    wait_for(both, 60, "host frames from the nodes", 1.0)
    code, body = cluster.post(f"/profiler/sessions/{name}/stop")
    assert code == 200, body
    code, doc = cluster.get(f"/profiler/sessions/{name}/export", params={"all": "true"})
    assert code == 200, doc
    nodes = {f["node"] for f in doc["host_frames"]}
    assert nodes == {"node1", "node2"}, nodes
    for node in nodes:
        times = [f["time"] for f in doc["host_frames"] if f["node"] == node]
        assert times == sorted(times) and len(times) >= 3, (node, times)
