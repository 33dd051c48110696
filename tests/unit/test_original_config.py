"""The original's config.yaml (000 "Example Configuration", 003 "Shared Configuration") as written: every key honoured,
any other key refused naming it; `nodes:` declares nodes, listed as `missing` until they join."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gswarm_tasks.errors import ConfigError
from gswarm_tasks.settings import load_settings
from tests.harness.app import bearer, build_app

# 000's "Example Configuration", verbatim (less the blank lines' trailing spaces)
ORIGINAL = """\
cluster:
  host: "master.cluster.local"
  port: 8090

profiling:
  default_frequency: 1000
  enable_bandwidth: true
  enable_nvlink: false

models:
  storage_path: "/data/models"
  cache_size: "100GB"

queue:
  max_concurrent_tasks: 4
  task_timeout: 3600
  retry_count: 3

nodes:
  - name: "node1"
    address: "192.168.1.101"
    capabilities:
      gpus: ["gpu0", "gpu1"]
      storage:
        disk: 1000000000000
        dram: 64000000000

  - name: "node2"
    address: "192.168.1.102"
    capabilities:
      gpus: ["gpu0"]
      storage:
        disk: 500000000000
        dram: 32000000000
"""
# 003's "Shared Configuration": the same nodes, the cluster on port 8000
SHARED = ORIGINAL.split("profiling:")[0].replace("8090", "8000") + "nodes:" + ORIGINAL.split("nodes:")[1]


def load(tmp_path: Path, text: str, **env: str):  # type: ignore[no-untyped-def]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    return load_settings({"GSWARM_HOME": str(tmp_path / "home"), "GSWARM_CONFIG": str(cfg), **env})


def test_the_original_ports_are_the_defaults(tmp_path: Path) -> None:
    s = load_settings({"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": ""})
    assert (s.broker_port, s.api_port, s.model_port, s.api_host) == (8090, 8091, 9010, "127.0.0.1")


def test_every_key_of_the_original_example_is_honoured(tmp_path: Path) -> None:
    s = load(tmp_path, ORIGINAL)
    assert (s.api_host, s.broker_port, s.api_port, s.model_port) == ("master.cluster.local", 8090, 8091, 9010)
    assert s.effective_api_url == "http://master.cluster.local:8091"  # the CLI calls the host
    assert (s.profiling_frequency_ms, s.profiling_bandwidth, s.profiling_nvlink) == (1000, True, False)
    assert (s.storage_root, s.cache_size) == ("/data/models", 100 * 10**9)
    assert (s.max_concurrent_tasks, s.task_timeout_s, s.retry_count) == (4, 3600, 3)
    assert s.nodes == [
        {"name": "node1", "address": "192.168.1.101",
         "capabilities": {"gpus": ["gpu0", "gpu1"], "storage": {"disk": 10**12, "dram": 64 * 10**9}}},
        {"name": "node2", "address": "192.168.1.102",
         "capabilities": {"gpus": ["gpu0"], "storage": {"disk": 5 * 10**11, "dram": 32 * 10**9}}},
    ]  # fmt: skip
    shared = load(tmp_path, SHARED)
    assert shared.broker_port == 8000 and [n["name"] for n in shared.nodes] == ["node1", "node2"]
    # the environment still wins over the file
    assert load(tmp_path, ORIGINAL, GSWARM_BROKER_PORT="7000", GSWARM_API_PORT="7001").broker_port == 7000


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("cluster:\n  hots: a\n", "cluster.hots", "did you mean cluster.host?"),
        ("cluster:\n  grpc_port: 8090\n", "cluster.grpc_port", "`cluster` takes: "),
        ("profiler:\n  default_frequency: 10\n", "profiler", "did you mean profiling?"),
        ("queue:\n  max_concurrent: 4\n", "queue.max_concurrent", "did you mean queue.max_concurrent_tasks?"),
        ("models: /data\n", "models", "must be a section"),
        ("nodes:\n  - name: node1\n    gpus: [gpu0]\n", "nodes[0].gpus",
         "`nodes[0]` takes: address, capabilities, name"),
        ("nodes:\n  - name: node1\n    capabilities:\n      gpu: [gpu0]\n", "nodes[0].capabilities.gpu",
         "did you mean nodes[0].capabilities.gpus?"),
        ("nodes:\n  - name: node1\n    capabilities:\n      gpus: [cuda0]\n", "nodes[0].capabilities.gpus",
         "like [gpu0, gpu1]"),
        ("nodes:\n  - name: node1\n    capabilities:\n      storage: {disk: lots}\n",
         "nodes[0].capabilities.storage.disk", "not a size"),
        ("nodes:\n  - name: Node_1\n", "nodes[0].name", "not a valid node name"),
        ("nodes:\n  - name: node1\n  - name: node1\n", "nodes[1].name", "declared twice"),
        ("nodes:\n  - address: 10.0.0.1\n", "nodes[0].name", "is required"),
    ],
)  # fmt: skip
def test_any_other_key_is_refused_naming_it(tmp_path: Path, text: str, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    assert exc.value.details["field"] == field
    assert field in exc.value.message and says in exc.value.message, exc.value.message


def test_declared_nodes_are_missing_until_they_join(tmp_path: Path) -> None:
    settings = load(tmp_path, ORIGINAL.replace('  storage_path: "/data/models"\n', ""))
    app = build_app(settings)
    with app.app_context():
        from gswarm_web.api.auth import create_token
        from gswarm_web.control.nodes.state import apply_heartbeats
        from gswarm_web.extensions import db

        auth = bearer(create_token("t", "read-only"))
        client = app.test_client()
        body = client.get("/api/v1/nodes", headers=auth).get_json()
        assert [(n["name"], n["status"], n["address"]) for n in body["nodes"]] == [
            ("node1", "missing", "192.168.1.101"),
            ("node2", "missing", "192.168.1.102"),
        ]
        assert body["total"] == 2 and body["nodes"][0]["seconds_since_seen"] is None
        assert body["nodes"][0]["declared"]["capabilities"]["gpus"] == ["gpu0", "gpu1"]
        # node2 joins; an undeclared node joins too
        beat = {"node": "node2", "address": "10.9.9.2", "gpus": [], "storage": {}}
        apply_heartbeats([("1700000000000-0", {"data": json.dumps(beat)}), ("1700000000000-1",
                          {"data": json.dumps({**beat, "node": "extra"})})])  # fmt: skip
        db.session.remove()
        body = client.get("/api/v1/nodes", headers=auth).get_json()
        assert [(n["name"], n["status"]) for n in body["nodes"]] == [
            ("extra", "offline"), ("node1", "missing"), ("node2", "offline")
        ]  # fmt: skip
        assert (
            body["nodes"][0]["declared"] is None
            and body["nodes"][2]["declared"]["address"] == "192.168.1.102"
        )
        page = client.get("/api/v1/nodes?per_page=2&page=2", headers=auth).get_json()
        assert [n["name"] for n in page["nodes"]] == ["node2"] and page["total"] == 3
        only = client.get("/api/v1/nodes?status=missing", headers=auth).get_json()
        assert [n["name"] for n in only["nodes"]] == ["node1"] and only["total"] == 1
        offline = client.get("/api/v1/nodes?status=offline", headers=auth).get_json()
        assert [n["name"] for n in offline["nodes"]] == ["extra", "node2"]
        one = client.get("/api/v1/nodes/node1", headers=auth)
        assert one.status_code == 200 and one.get_json()["status"] == "missing"
        assert client.get("/api/v1/nodes/node9", headers=auth).status_code == 404
        bad = client.get("/api/v1/nodes?status=absent", headers=auth)
        assert bad.status_code == 422 and "status" in json.dumps(bad.get_json()["error"]["details"])
        db.session.remove()
        db.engine.dispose()
