"""The scheduler over the HTTP API (SQLite app, no broker): simulate and validate as the CLI does, refusals that
name the field, and the fleet as the scheduler sees it from heartbeats and the model registry."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from flask import Flask
from flask.testing import FlaskClient

from tests.harness.app import bearer

DATA = Path(__file__).parent / "scheduling_data"


def _inputs() -> dict[str, Any]:
    return {
        "config": json.loads((DATA / "tiny_config.json").read_text()),
        "requests": yaml.safe_load((DATA / "hand_requests.yaml").read_text()),
        "gpus": 2,
    }


def test_simulate_and_validate_through_the_api(client: FlaskClient, admin_token: str) -> None:
    for policy in ("fifo", "gswarm"):
        r = client.post(
            "/api/v1/scheduling/simulate", json={**_inputs(), "policy": policy}, headers=bearer(admin_token)
        )
        assert r.status_code == 200, r.json
        out = r.json
        assert out["summary"]["policy"] == policy and out["executions"]
        assert {"request_id", "node_id", "gpu_id", "gpus", "switch_time", "loaded_from"} <= set(
            out["executions"][0]
        )
        r = client.post(
            "/api/v1/scheduling/validate", json={**_inputs(), "schedule": out}, headers=bearer(admin_token)
        )
        assert r.status_code == 200 and r.json == {"valid": True, "violations": []}
    broken = json.loads(json.dumps(out))
    broken["executions"] = broken["executions"][1:]  # a step that never ran
    r = client.post(
        "/api/v1/scheduling/validate", json={**_inputs(), "schedule": broken}, headers=bearer(admin_token)
    )
    assert r.status_code == 200 and not r.json["valid"] and r.json["violations"]


def test_bad_inputs_are_refused_naming_the_field(client: FlaskClient, admin_token: str) -> None:
    dangling = json.loads((DATA / "dangling_config.json").read_text())
    cases = [
        ({**_inputs(), "policy": "magic"}, "policy"),
        ({**_inputs(), "gpus": 0}, "gpus"),
        ({**_inputs(), "config": dangling}, "config.workflows.code_analysis.edges[1]"),
        ({**_inputs(), "requests": {"requests": [{"request_id": "x"}]}}, "requests"),
    ]
    for body, field in cases:
        r = client.post("/api/v1/scheduling/simulate", json=body, headers=bearer(admin_token))
        assert r.status_code == 422, (field, r.json)
        err = r.json["error"]
        named = err["details"].get("field") or ",".join(err["details"].get("fields", {}))
        assert field in named or field in err["message"], (field, err)


def test_the_fleet_as_the_scheduler_sees_it(app: Flask, client: FlaskClient, admin_token: str) -> None:
    from gswarm_web.control.nodes.state import apply_heartbeats
    from gswarm_web.extensions import db
    from gswarm_web.tables import Model, ModelLocation

    gpu = {
        "index": 0,
        "uuid": "GPU-1",
        "name": "H100",
        "memory_total_bytes": 80 * 2**30,
        "memory_used_bytes": 2**30,
    }
    beat = {
        "node": "node1",
        "gpus": [gpu],
        "dram_total_bytes": 2**36,
        "dram_available_bytes": 2**35,
        "storage": {},
    }
    ms = int(datetime.now(UTC).timestamp() * 1000)
    apply_heartbeats([(f"{ms}-0".encode(), {b"data": json.dumps(beat).encode()})])
    model = Model(name="m", model_type="llm", model_size=3 * 2**30, meta={}, locations=[])
    db.session.add(model)
    db.session.flush()
    model.locations.append(ModelLocation(model_id=model.id, device="node1:dram", node="node1", tier="dram"))
    db.session.add(Model(name="never-downloaded", model_type="llm", meta={}, locations=[]))
    db.session.commit()
    r = client.get("/api/v1/scheduling/fleet", headers=bearer(admin_token))
    assert r.status_code == 200, r.json
    view = r.json
    node = view["nodes"][0]
    assert node["name"] == "node1" and node["status"] == "healthy" and node["schedulable"]
    assert node["gpus"][0]["memory_free_bytes"] == 79 * 2**30 and node["gpus"][0]["device"] == "node1:gpu0"
    assert view["gpus"] == 1 and view["models"] == {
        "m": {"size_bytes": 3 * 2**30, "gpu": [], "dram": ["node1"], "disk": []}
    }
